"""The declared floors are the tested ones: pyproject.toml's lower bounds equal .ci/floors.txt's
pins (which `bash .ci/floors` installs and runs the whole suite against), and the README and
docs state them."""

import pathlib
import re
import tomllib

from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _floors_txt():
  pins = {}
  for line in (ROOT / ".ci" / "floors.txt").read_text().splitlines():
    if line.strip() and not line.startswith("#"):
      name, version = line.strip().split("==")
      pins[name.lower().replace("_", "-")] = version
  return pins


def _declared():
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  floors = {}
  for line in project["dependencies"]:
    req = Requirement(line)
    lower = [s.version for s in req.specifier if s.operator == ">="]
    assert len(lower) == 1, f"{line}: declare exactly one floor (>=)"
    floors[req.name.lower().replace("_", "-")] = lower[0]
  return floors


def test_every_runtime_floor_is_pinned_in_the_floors_run():
  assert _declared() == _floors_txt()


def test_the_readme_and_the_docs_state_the_supported_range():
  readme = (ROOT / "README.md").read_text()
  versions = (ROOT / "docs" / "versions.md").read_text()
  for name, version in _floors_txt().items():
    assert re.search(rf"{re.escape(name)}\s*(>=|≥)\s*{re.escape(version)}", readme, re.I), name
    assert f"| {name} | {version} |" in versions, name
