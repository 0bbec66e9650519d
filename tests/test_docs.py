"""The documentation site: it builds with warnings as errors, every public name has an API page,
and every page's code runs as a user would run it (only the runtime dependencies installed)."""

import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest
from runtime_only import run_as_user
from runtime_only import runtime_view

import paramreg_jax
import paramreg_jax.errors
import paramreg_jax.recipes
import paramreg_jax.sources

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(
  p for p in DOCS.rglob("*.md") if "_build" not in p.parts and "_autosummary" not in p.parts
)
CODE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


@pytest.fixture(scope="session")
def view(tmp_path_factory):
  return runtime_view(tmp_path_factory.mktemp("runtime-site-packages"))


def test_the_docs_build_with_warnings_as_errors(tmp_path):
  out = tmp_path / "html"
  env = {**os.environ, "PARAMREG_DOCS_EXECUTE": "1"}  # the notebooks run, and must not fail
  done = subprocess.run(
    [
      sys.executable,
      "-m",
      "sphinx",
      "-W",
      "--keep-going",
      "-q",
      "-b",
      "html",
      "-d",
      str(tmp_path / "doctrees"),
      str(DOCS),
      str(out),
    ],
    capture_output=True,
    text=True,
    timeout=900,
    env=env,
  )
  assert done.returncode == 0, done.stderr[-8000:]
  for page in [
    "index",
    "getting_started",
    "api",
    "concepts/match",
    "howto/hf_to_nnx",
    "notebooks/keyed_optax",
    "changelog",
    "_autosummary/paramreg_jax.keyed",
  ]:
    assert (out / f"{page}.html").is_file(), page
  notebook = re.sub(r"<[^>]+>", "", (out / "notebooks" / "keyed_optax.html").read_text())
  assert "resumed, loss" in notebook  # rendered with the outputs of its run
  keyed = re.sub(r"<[^>]+>", "", (out / "_autosummary" / "paramreg_jax.keyed.html").read_text())
  assert "Examples" in keyed and "sorted(state_keys(state, params))" in keyed  # the docstring's


def _documented():
  """``{module: names}`` listed by the API reference's autosummary blocks."""
  documented: dict[str, set[str]] = {}
  module = None
  for line in (DOCS / "api.md").read_text().splitlines():
    if m := re.match(r"\.\. currentmodule:: (\S+)", line.strip()):
      module = m.group(1)
    elif module and re.fullmatch(r"   [A-Za-z_][A-Za-z0-9_]*", line):
      documented.setdefault(module, set()).add(line.strip())
  return documented


@pytest.mark.parametrize(
  "module",
  [paramreg_jax, paramreg_jax.recipes, paramreg_jax.sources, paramreg_jax.errors],
  ids=lambda m: m.__name__,
)
def test_every_public_name_has_an_api_page(module):
  documented = _documented()
  pages = {
    id(getattr(sys.modules[m], n))
    for m, names in documented.items()
    for n in names
    if not isinstance(getattr(sys.modules[m], n), str)
  }
  missing = []
  for name in module.__all__:
    obj = getattr(module, name)
    if name in documented.get(module.__name__, set()):
      continue
    if isinstance(obj, str) or id(obj) not in pages:  # re-exports are documented once
      missing.append(name)
  assert not missing, f"add these to docs/api.md: {missing}"
  for m, names in documented.items():
    for n in names:
      assert n in sys.modules[m].__all__, f"docs/api.md lists {m}.{n}, which is not public"


def test_every_public_function_and_class_page_has_a_runnable_example():
  for m, names in _documented().items():
    for n in names:
      obj = getattr(sys.modules[m], n)
      if isinstance(obj, str) or (inspect.isclass(obj) and issubclass(obj, BaseException)):
        continue
      assert ">>>" in (inspect.getdoc(obj) or ""), f"{m}.{n} has no runnable example"


@pytest.mark.parametrize(
  "page", [p for p in PAGES if CODE.search(p.read_text())], ids=lambda p: str(p.relative_to(DOCS))
)
def test_page_code_runs_with_only_runtime_dependencies(page, view, tmp_path):
  """A page's ```python blocks run in order in one interpreter, like a notebook."""
  code = "\n".join(CODE.findall(page.read_text()))
  run_as_user(code, view=view, cwd=tmp_path, name=f"docs/{page.relative_to(DOCS)}")
