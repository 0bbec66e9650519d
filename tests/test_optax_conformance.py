"""optax's own alias tests pass with every optimizer wrapped in keyed(): the definition of
drop-in. Reproduce alone with ``python -m pytest tests/test_optax_conformance.py`` (3 to 5 min
on 2 cores: the tests are split between two processes, each printing its progress).

The test file ships in the optax wheel (``optax/_src/alias_test.py``); a copy is run with its
``from optax._src import alias`` pointing at ``tests/keyed_alias_shim.py``.
"""

import os
import pathlib
import re
import subprocess
import sys
import threading

import optax
import pytest

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


# the child processes split optax's tests between them (every test runs in exactly one): the
# parent only waits, so two children keep both cores busy
SHARDS = 2
_SHARD_PLUGIN = """
import os, zlib

def pytest_collection_modifyitems(config, items):
  shard, of = map(int, os.environ["PRJ_OPTAX_SHARD"].split("/"))
  keep = [i for i in items if zlib.crc32(i.nodeid.encode()) % of == shard]
  config.hook.pytest_deselected(items=[i for i in items if i not in keep])
  items[:] = keep
"""


@pytest.mark.slow
def test_optax_alias_tests_pass_through_keyed(tmp_path, request):
  """Prints its progress (each child's pytest line) while it runs: 3 to 5 minutes."""
  source = SHIPPED.read_text()
  assert source.count(IMPORT) == 1, f"{SHIPPED}: the alias import moved; update the shim"
  test_file = tmp_path / "keyed_alias_test.py"
  test_file.write_text(source.replace(IMPORT, "import keyed_alias_shim as alias\n"))
  (tmp_path / "conftest.py").write_text(_SHARD_PLUGIN)
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one device, as upstream
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
  say = _progress(request)
  children = [
    subprocess.Popen(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
      cwd=tmp_path,
      env={**env, "PRJ_OPTAX_SHARD": f"{j}/{SHARDS}", "PYTHONUNBUFFERED": "1"},
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for j in range(SHARDS)
  ]
  outputs = [_relay(child, j, say) for j, child in enumerate(children)]
  passed = 0
  for child, (thread, lines) in zip(children, outputs):
    thread.join(timeout=1800)
    code = child.wait(timeout=60)
    text = "".join(lines)
    summary = text.strip().splitlines()[-1] if text.strip() else ""
    assert code == 0, f"{summary}\n{text[-6000:]}"
    assert "failed" not in summary, summary
    passed += int(re.search(r"(\d+) passed", summary).group(1))
  assert passed >= 500, passed


def _progress(request):
  """A line to the terminal even while pytest captures output."""
  reporter = request.config.pluginmanager.get_plugin("terminalreporter")
  capture = request.config.pluginmanager.get_plugin("capturemanager")
  lock = threading.Lock()

  def say(line):
    if reporter is None or capture is None:
      return
    with lock, capture.global_and_fixture_disabled():
      reporter.write_line(f"  optax alias_test.py through keyed: {line}")

  return say


def _relay(child, j, say):
  """Reads a child's output on a thread, passing its progress lines (``[ 40%]``) on; returns
  the thread and the lines it collects."""
  lines: list[str] = []

  def run():
    for line in child.stdout:
      lines.append(line)
      if m := re.search(r"\[\s*\d+%\]\s*$", line):
        say(f"shard {j + 1}/{SHARDS} {m.group(0).strip()}")

  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  return thread, lines
