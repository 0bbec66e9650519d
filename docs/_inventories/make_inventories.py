"""Writes the intersphinx inventories of jax, flax, optax and orbax that the docs link against.

The docs build offline, so these inventories are committed. They are made from each project's own
documentation sources (a git checkout), not by hand: every ``autosummary`` (with a ``:toctree:``),
``autofunction``/``autoclass``/``autodata``/``automodule`` and flax's ``flax_module`` entry becomes
the address that project's Sphinx build gives it, and the installed package says whether the
name is a function, a class, a module or data (class members documented with ``:members:`` are
added too). Run it again after an upgrade::

  python docs/_inventories/make_inventories.py --jax ../jax --flax ../flax \
    --optax ../optax --orbax ../orbax
"""

import argparse
import importlib
import inspect
import pathlib
import re
import subprocess
import zlib

HERE = pathlib.Path(__file__).resolve().parent

# project: (base URL of its published docs, docs folder in its repository, the modules to keep)
PROJECTS = {
  "jax": ("https://docs.jax.dev/en/latest/", "docs", ("jax",)),
  "flax": ("https://flax.readthedocs.io/en/latest/", "docs_nnx", ("flax",)),
  "optax": ("https://optax.readthedocs.io/en/latest/", "docs", ("optax",)),
  "orbax": ("https://orbax.readthedocs.io/en/latest/", "docs", ("orbax",)),
}
# the modules users import a documented object from, when its page names another module
# (``nnx.Optimizer`` is documented as ``flax.nnx.optimizer.Optimizer``)
ALIASES = {
  "jax": ("jax", "jax.sharding", "jax.tree"),
  "flax": ("flax.nnx",),
  "optax": ("optax", "optax.tree"),
  "orbax": ("orbax.checkpoint",),
}

DIRECTIVE = re.compile(r"^\s*\.\. (\w+)::\s*(\S*)\s*$")
OPTION = re.compile(r"^\s+:(\w+):\s*(.*?)\s*$")
AUTO = {
  "autofunction",
  "autoclass",
  "autodata",
  "autoexception",
  "autodecorator",
  "automethod",
}


def _files(repo: pathlib.Path, folder: str) -> dict[str, str]:
  """``{page: text}`` of the ``.rst``/``.md`` files under ``folder`` at the checkout's HEAD."""
  listing = subprocess.run(
    ["git", "-C", str(repo), "ls-tree", "-r", "--name-only", "HEAD", folder],
    capture_output=True,
    text=True,
    check=True,
  ).stdout.split()
  out = {}
  for path in listing:
    if path.endswith((".rst", ".md")) and "/_" not in path:
      text = subprocess.run(
        ["git", "-C", str(repo), "show", f"HEAD:{path}"],
        capture_output=True,
        check=True,
      ).stdout.decode("utf-8", "replace")
      out[path[len(folder) + 1 :].rsplit(".", 1)[0]] = text
  return out


def _entries(page: str, text: str) -> list[tuple[str, str]]:
  """``(full name, uri)`` for each object the page documents."""
  out: list[tuple[str, str]] = []
  module, block, toctree, flax = "", None, None, {}
  folder = page.rsplit("/", 1)[0] + "/" if "/" in page else ""
  for line in text.splitlines():
    if m := DIRECTIVE.match(line):
      kind, arg = m.groups()
      block, toctree = kind, None
      if kind in ("currentmodule", "module"):
        module = arg
      elif kind == "automodule":
        module = arg
        out.append((arg, f"{page}.html#module-{arg}"))
      elif kind in AUTO and arg:
        full = (
          arg
          if "." in arg and arg.split(".")[0] in ("jax", "flax", "optax", "orbax")
          else (f"{module}.{arg}" if module else arg)
        )
        out.append((full, f"{page}.html#{full}"))
    elif m := OPTION.match(line):
      if block == "autosummary" and m.group(1) == "toctree":
        toctree = folder + m.group(2).strip("/") + "/"
      elif block == "flax_module":
        flax[m.group(1)] = m.group(2)
        if "module" in flax and "class" in flax:
          full = f"{flax.pop('module')}.{flax.pop('class')}"
          out.append((full, f"{page}.html#{full}"))
    elif block == "autosummary" and toctree and re.fullmatch(r"\s+~?[\w.]+", line):
      name = line.strip().lstrip("~")
      full = f"{module}.{name}" if module else name
      out.append((full, f"{toctree}{full}.html#{full}"))
  return out


def resolve(full: str):
  """The installed object named ``full`` (or ``None``)."""
  parts = full.split(".")
  for cut in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:cut]))
    except Exception:
      continue
    try:
      for attr in parts[cut:]:
        obj = getattr(obj, attr)
    except AttributeError:
      return None
    return obj
  return None


def _role(obj) -> str:
  if inspect.ismodule(obj):
    return "py:module"
  if inspect.isclass(obj):
    return "py:exception" if issubclass(obj, BaseException) else "py:class"
  if callable(obj):
    return "py:function"
  return "py:data"


def _members(full: str, uri: str, cls) -> list[tuple[str, str, str]]:
  page = uri.split("#")[0]
  out = []
  for name, value in vars(cls).items():
    if name.startswith("_") or not (getattr(value, "__doc__", None) or "").strip():
      continue
    if isinstance(value, property):
      out.append((f"{full}.{name}", "py:property", f"{page}#{full}.{name}"))
    elif callable(value) or isinstance(value, (classmethod, staticmethod)):
      out.append((f"{full}.{name}", "py:method", f"{page}#{full}.{name}"))
  return out


def _add_aliases(project: str, rows: dict[str, tuple[str, str]]) -> None:
  """Each documented object under the names its users import it by, at the same address."""
  by_id = {}
  for full, row in rows.items():
    obj = resolve(full)
    if obj is not None and not isinstance(obj, (str, int, float, bool)):
      by_id.setdefault(id(obj), row)
  for module in ALIASES[project]:
    mod = importlib.import_module(module)
    for name in getattr(mod, "__all__", None) or [
      n for n in dir(mod) if not n.startswith("_")
    ]:
      obj = getattr(mod, name, None)
      if obj is not None and id(obj) in by_id:
        rows.setdefault(f"{module}.{name}", by_id[id(obj)])


def inventory(project: str, repo: pathlib.Path) -> bytes:
  _, folder, keep = PROJECTS[project]
  rows: dict[str, tuple[str, str]] = {}
  for page, text in _files(repo, folder).items():
    for full, uri in _entries(page, text):
      obj = resolve(full)
      if obj is None or not full.startswith(keep):
        continue
      rows.setdefault(full, (_role(obj), uri))
      if inspect.isclass(obj):
        for name, role, muri in _members(full, uri, obj):
          rows.setdefault(name, (role, muri))
  _add_aliases(project, rows)
  lines = [f"{n} {role} 1 {uri} -" for n, (role, uri) in sorted(rows.items())]
  head = f"# Sphinx inventory version 2\n# Project: {project}\n# Version: \n"
  head += "# The remainder of this file is compressed using zlib.\n"
  return head.encode() + zlib.compress(("\n".join(lines) + "\n").encode())


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  for project in PROJECTS:
    parser.add_argument(
      f"--{project}", type=pathlib.Path, required=True, help="git checkout"
    )
  args = parser.parse_args()
  for project in PROJECTS:
    data = inventory(project, getattr(args, project))
    (HERE / f"{project}.inv").write_bytes(data)
    print(
      project, len(zlib.decompress(data.split(b"zlib.\n", 1)[1]).splitlines()), "names"
    )


if __name__ == "__main__":
  main()
