"""optax's own alias tests pass with every optimizer wrapped in keyed(): the definition of
drop-in. Reproduce alone with ``python -m pytest tests/test_optax_conformance.py`` (5 to 8 min on 2 cores).

The test file ships in the optax wheel (``optax/_src/alias_test.py``); a copy is run with its
``from optax._src import alias`` pointing at ``tests/keyed_alias_shim.py``.
"""

import os
import pathlib
import re
import subprocess
import sys

import optax

from paramreg_jax._src.optim import keyed as keyed_lib

HERE = pathlib.Path(__file__).parent
SHIPPED = pathlib.Path(optax.__file__).parent / "_src" / "alias_test.py"
IMPORT = "from optax._src import alias\n"


def test_the_shim_wraps_every_factory():
  sys.path.insert(0, str(HERE))
  try:
    import keyed_alias_shim as alias
  finally:
    sys.path.remove(str(HERE))
  for name in ("adam", "sgd", "adafactor", "lion"):
    assert keyed_lib.keyed_info(getattr(alias, name)(1e-3)) is not None, name
  assert keyed_lib.keyed_info(alias.lbfgs()) is not None
  assert alias.adam is not optax.adam and alias.base is optax._src.base  # modules pass through


def test_optax_alias_tests_pass_through_keyed(tmp_path):
  source = SHIPPED.read_text()
  assert source.count(IMPORT) == 1, f"{SHIPPED}: the alias import moved; update the shim"
  test_file = tmp_path / "keyed_alias_test.py"
  test_file.write_text(source.replace(IMPORT, "import keyed_alias_shim as alias\n"))
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one device, as upstream
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
  r = subprocess.run(
    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=1800,
  )
  summary = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-2000:]
  assert r.returncode == 0, f"{summary}\n{r.stdout[-6000:]}"
  passed = int(re.search(r"(\d+) passed", summary).group(1))
  assert passed >= 500 and "failed" not in summary, summary
