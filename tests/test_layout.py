"""The layout keeps showing the design (docs/architecture.md): rooms of bounded size, no private
name used across modules, packages whose ``__init__`` only gathers names, imports that flow one
way, and one file per recipe op holding all of its rules."""

import ast
import importlib.util
import inspect
import pathlib

import pytest

import paramreg_jax
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.recipes.ops import base

ROOT = pathlib.Path(paramreg_jax.__file__).parent
MODULES = sorted(ROOT.rglob("*.py"))
LOOK_AT_LINES = 500  # a module longer than this is a prompt to look, not a limit
# Modules past LOOK_AT_LINES that were looked at: each holds the one concept named here.
LONG_MODULES: dict[str, str] = {
  # one concept: every way checkpoint tensors become one target parameter (one tensor, a
  # layer of a stacked one, one expert's, a fused tensor's part, parts joined, layers
  # stacked); the ways call each other (a stacked leaf is each layer's single tensor, a
  # joined part one too), so a cut between them would be a cycle. How one tensor's shape
  # becomes the leaf's is its own module (layouts.py)
  "paramreg_jax/_src/match/candidates.py": "the ways tensors become one parameter",
  # one concept: how a name reads as concepts (its words' table, and how its numbers,
  # containers and places are read); the table and its reader change together
  "paramreg_jax/_src/match/vocabulary.py": "how a name reads as concepts",
}
MAX_FUNCTION_LINES = 60  # docstring excluded
LONG_OK = "(long:"  # a docstring that says why a function needs more

# Each folder of _src may import only those before it (api_types: type aliases for signatures).
LAYERS = [
  {"errors", "devices", "api_types", "surface", "html_table", "text_width", "progress"},
  {"registry"},
  {"sources", "patterns", "optim"},
  {"recipes"},
  {"restore"},
  {"match"},
  {"export"},
  {"load"},  # open, match, restore in one call
  {"demo", "cli"},
]


def _rel(path):
  return path.relative_to(ROOT.parent)


def _function_lines(node):
  body = node.body
  doc = 0
  if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
    if isinstance(body[0].value.value, str):
      doc = body[0].end_lineno - body[0].lineno + 1
  return node.end_lineno - node.lineno + 1 - doc, ast.get_docstring(node) or ""


def test_a_long_module_was_looked_at():
  """Rooms are cut by concept, never by line count: a long module holding one concept stays
  whole (listed in LONG_MODULES with its concept); one holding several is cut between them."""
  unseen = [
    f"{_rel(p)} ({n} lines)"
    for p in MODULES
    if (n := len(p.read_text().splitlines())) > LOOK_AT_LINES and str(_rel(p)) not in LONG_MODULES
  ]
  assert not unseen, (
    f"modules over {LOOK_AT_LINES} lines: {unseen}. If one holds several concepts, give each "
    "its own module; if it holds one, add it to LONG_MODULES in tests/test_layout.py with "
    "that concept (never split a module only to get under the number)"
  )
  gone = [m for m in LONG_MODULES if not (ROOT.parent / m).is_file()]
  assert not gone, f"LONG_MODULES lists modules that no longer exist: {gone}"


def test_no_function_is_over_60_lines_unless_its_docstring_says_why():
  long = []
  for path in MODULES:
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n, doc = _function_lines(node)
        if n > MAX_FUNCTION_LINES and LONG_OK not in doc:
          long.append(f"{_rel(path)}:{node.lineno} {node.name} ({n} lines)")
  assert not long, long


def _imported_modules(tree):
  """Local names bound to paramreg_jax modules, and the private names imported directly."""
  modules, private = set(), []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("paramreg_jax"):
      for alias in node.names:
        if alias.name.startswith("_") and not alias.name.startswith("__"):
          private.append(f"from {node.module} import {alias.name}")
        if _is_module(f"{node.module}.{alias.name}"):
          modules.add(alias.asname or alias.name)
    elif isinstance(node, ast.Import):
      modules.update(a.asname or a.name for a in node.names if a.name.startswith("paramreg_jax"))
  return modules, private


def _is_module(name):
  try:
    return importlib.util.find_spec(name) is not None
  except (ModuleNotFoundError, AttributeError, ValueError):  # a name inside a module
    return False


def test_no_private_name_is_used_across_modules():
  found = []
  for path in MODULES:
    tree = ast.parse(path.read_text())
    modules, private = _imported_modules(tree)
    found += [f"{_rel(path)}: {p}" for p in private]
    for node in ast.walk(tree):
      if (
        isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and isinstance(node.value, ast.Name)
        and node.value.id in modules
      ):
        found.append(f"{_rel(path)}:{node.lineno}: {node.value.id}.{node.attr}")
  assert not found, found


def test_package_inits_only_gather_names():
  """Logic lives in named modules; an ``__init__`` has a docstring, imports and ``__all__``
  (and, for the public modules, the ``__getattr__`` that keeps moved names importable)."""
  for path in ROOT.rglob("__init__.py"):
    for node in ast.parse(path.read_text()).body:
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        continue
      if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        continue  # the docstring
      if isinstance(node, ast.Assign) and all(
        isinstance(t, ast.Name) and t.id in ("__all__", "__getattr__", "__version__")
        for t in node.targets
      ):
        continue
      pytest.fail(f"{_rel(path)}:{node.lineno}: move this into a module of the package")


def _layer(name):
  return next(i for i, layer in enumerate(LAYERS) if name in layer)


def test_imports_flow_one_way():
  src = ROOT / "_src"
  wrong = []
  for path in sorted(src.rglob("*.py")):
    rel = path.relative_to(src)
    if rel.name == "__init__.py" and len(rel.parts) == 1:
      continue
    mine = rel.parts[0].removesuffix(".py")
    tree = ast.parse(path.read_text())
    checking = {id(n) for n in ast.walk(tree) if _is_type_checking_block(n)}
    skip = {id(c) for n in ast.walk(tree) if id(n) in checking for c in ast.walk(n)}
    for node in ast.walk(tree):
      if id(node) in skip or not isinstance(node, ast.ImportFrom):
        continue
      module = node.module or ""
      if not module.startswith("paramreg_jax._src"):
        continue
      targets = (
        [a.name for a in node.names] if module == "paramreg_jax._src" else [module.split(".")[2]]
      )
      for other in targets:
        if other != mine and other != "api_types" and _layer(other) > _layer(mine):
          wrong.append(f"_src/{rel}:{node.lineno}: {mine} imports {other}")
  assert not wrong, wrong


def _is_type_checking_block(node):
  return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def test_every_folder_of_src_has_a_layer():
  names = {p.name.removesuffix(".py") for p in (ROOT / "_src").iterdir() if p.name != "__init__.py"}
  names.discard("__pycache__")
  assert names <= set().union(*LAYERS), names - set().union(*LAYERS)


@pytest.mark.parametrize("op", ops.OPS, ids=lambda op: op.__name__)
def test_each_recipe_op_holds_its_rules_in_its_own_file(op):
  """Inference, the forward program, the inverse and the printed code are abstract in
  ``Recipe``: each op defines them in its own file, or takes them from ``Elementwise`` and
  defines what that asks (a new op is one new file). Every op inverts, or refuses by an
  explicit ``NotInvertible``."""
  assert not inspect.isabstract(op), f"{op.__name__} leaves {sorted(op.__abstractmethods__)}"
  own = set(vars(op))
  if issubclass(op, base.Elementwise):
    assert {"apply", "check", "name", "inverse_steps"} <= own, op.__name__
  else:
    assert {"infer", "program", "invert", "code", "__str__"} <= own, op.__name__
  module = inspect.getmodule(op)
  others = [c for c in ops.OPS if c is not op and inspect.getmodule(c) is module]
  assert not others, f"{op.__name__} shares {module.__name__} with {others}"
  assert pathlib.Path(module.__file__).stem == _snake(op.__name__)


def _snake(name):
  return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))


def test_every_inverse_step_belongs_to_one_op():
  names = [s.name for op in ops.OPS for s in op.inverse_steps]
  assert len(names) == len(set(names)) == len(ops.INVERSE_STEPS)


def test_the_neutral_restore_pipeline_uses_the_jax_backend_only_as_its_default():
  """``restore/`` beside ``jax_backend/`` reaches the engine through ``ParameterBackend``:
  it takes the default backend from ``backend.default()`` (one place), and ``R.evaluate``
  is that backend's ``evaluate``; nothing else of the engine is used there (a new backend
  needs nothing more)."""
  allowed = {"backend": {"default"}}
  found = []
  for path in sorted((ROOT / "_src" / "restore").glob("*.py")):
    tree = ast.parse(path.read_text())
    aliases = {}
    for node in ast.walk(tree):
      if (
        isinstance(node, ast.ImportFrom) and node.module == "paramreg_jax._src.restore.jax_backend"
      ):
        for a in node.names:
          if a.name not in allowed:
            found.append(f"{_rel(path)} imports jax_backend.{a.name}")
          aliases[a.asname or a.name] = a.name
    for node in ast.walk(tree):
      if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        module = aliases.get(node.value.id)
        if module is not None and node.attr not in allowed[module]:
          found.append(f"{_rel(path)} uses {module}.{node.attr}")
  assert not found, found


def _src_modules():
  return [p for p in MODULES if "_src" in p.parts and p.name != "__init__.py"]


def test_different_things_have_different_names():
  """A module's name and a class's name each mean one thing in the package: two modules
  called ``report.py`` (or two classes called ``Layout``) make a reader guess which one an
  import or a message means."""
  modules: dict[str, list[str]] = {}
  classes: dict[str, list[str]] = {}
  for p in _src_modules():
    modules.setdefault(p.name, []).append(str(_rel(p)))
    for node in ast.parse(p.read_text()).body:
      if isinstance(node, ast.ClassDef):
        classes.setdefault(node.name, []).append(str(_rel(p)))
  same = {n: w for n, w in modules.items() if len(w) > 1}
  assert not same, f"modules that share a name (name each for what it holds): {same}"
  same = {n: w for n, w in classes.items() if len(w) > 1}
  assert not same, f"classes that share a name (name each for what it is): {same}"
