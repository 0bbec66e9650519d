"""The documentation site: it builds with warnings as errors, every public name has an API page,
and every page's code runs as a user would run it (only the runtime dependencies installed)."""

import html
import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest
from runtime_only import CODE
from runtime_only import page_code
from runtime_only import run_as_user
from runtime_only import runtime_view

import paramreg_jax
import paramreg_jax.errors
import paramreg_jax.recipes
import paramreg_jax.sources
import paramreg_jax.typing

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
EARLY_BUILD = pytest.StashKey[tuple]()  # (work folder, the build's process), set by conftest
PAGES = sorted(
  p for p in DOCS.rglob("*.md") if "_build" not in p.parts and "_autosummary" not in p.parts
)


@pytest.fixture(scope="session")
def view(tmp_path_factory):
  return runtime_view(tmp_path_factory.mktemp("runtime-site-packages"))


def start_build(work: pathlib.Path) -> subprocess.Popen:
  """The docs build as its own process, into ``work/html``, its messages in ``work/log``.
  ``conftest.py`` starts it when the suite's collection ends (the suite's tests run in one
  process: this one uses the other core) and the test below waits for it."""
  env = {**os.environ, "PARAMREG_DOCS_EXECUTE": "1"}  # the notebooks run, and must not fail
  command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
  command += ["-d", str(work / "doctrees"), str(DOCS), str(work / "html")]
  with open(work / "log", "w") as log:
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)


@pytest.mark.slow
def test_the_docs_build_with_warnings_as_errors(tmp_path, request):
  started = request.config.stash.get(EARLY_BUILD, None)  # conftest.py: begun at collection
  work, build = started if started is not None else (tmp_path, start_build(tmp_path))
  out = work / "html"
  code = build.wait(timeout=900)
  assert code == 0, (work / "log").read_text()[-8000:]
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
  _check_the_site(out)


def _article(path: pathlib.Path) -> str:
  """The page's own content (without the navigation every page repeats)."""
  text = path.read_text()
  start = text.find("<article")
  return text[start : text.find("</article>")] if start >= 0 else ""  # search.html has none


CODE_WIDTH = 88  # columns a code block shows without scrolling (docs/_static/paramreg.css)


_COLUMNS = re.compile(r"[^\s-]  +\S")  # two spaces between words (a bullet's "-   " is none)
_CODE = re.compile(r"^\s*(R\.|prj\.|hints = |\w+ = )")  # lines of to_python() and hints


def _outputs(article: str) -> list[str]:
  """The lines executed cells printed on a page (their ``<pre>`` blocks, tags removed)."""
  lines = []
  for chunk in article.split('class="cell_output')[1:]:
    chunk = re.split(r'class="cell(?:_input| docutils)', chunk)[0]  # up to the next cell
    for pre in re.findall(r"<pre[^>]*>(.*?)</pre>", chunk, re.S):
      lines += html.unescape(re.sub(r"<[^>]+>", "", pre)).splitlines()
  return lines


def _check_the_site(out: pathlib.Path) -> None:
  """Guides link into the API reference and to jax/flax/optax/orbax; how-tos show executed
  output; API pages name no private module and list the guides that use them."""
  guides = [out / "getting_started.html", *(out / "concepts").glob("*.html")]
  howtos = sorted((out / "howto").glob("*.html"))
  for page in guides + howtos:
    assert re.search(r'href="[^"]*(_autosummary|api/)[^"]*"', _article(page)), page.name
  outside = [
    p
    for p in out.rglob("*.html")
    if "_modules" not in p.parts
    and re.search(r'href="https://(docs\.jax\.dev|flax|optax|orbax)[^"]*"', _article(p))
  ]
  assert len(outside) >= 5, outside
  for page in howtos:
    assert 'class="cell_output' in _article(page), f"{page.name} shows no executed output"
  css = (out / "_static" / "paramreg.css").read_text()
  assert re.search(r"\.cell_output pre \{\s*white-space: pre-wrap;", css)  # prose wraps
  wide = [  # a line with columns (two spaces inside it) or code would wrap into nonsense
    f"{page.relative_to(out)}: {line}"
    for page in out.rglob("*.html")
    for line in _outputs(_article(page))
    if len(line) > CODE_WIDTH and (_COLUMNS.search(line.strip()) or _CODE.search(line))
  ]
  assert not wide, "executed output with columns wider than the code column:\n" + "\n".join(wide)
  warned = [
    f"{page.relative_to(out)}: {line}"
    for page in out.rglob("*.html")
    for line in _outputs(_article(page))
    if re.search(r"\w+Warning: ", line)
  ]
  assert not warned, "a page shows a warning:\n" + "\n".join(warned)
  for page in [*(out / "_autosummary").glob("*.html"), *(out / "api").glob("*.html")]:
    text = re.sub(r"<[^>]+>", "", _article(page))
    assert not re.search(r"_src\.|\b\w+_lib\.|api_types\.", text), page.name
    assert "str(object=" not in text, page.name  # a constant showing str's own docstring
  keys = re.sub(r"<[^>]+>", "", _article(out / "api" / "keys.html"))
  assert "The prefix of a named key" in keys
  restore = _article(out / "_autosummary" / "paramreg_jax.restore.html")
  assert "Used in" in restore and "hf_to_nnx.html" in restore


def _documented():
  """``{module: names}`` the API reference documents: autosummary entries (each gets a page),
  ``autoexception``/``autoclass`` entries and ``py:data`` entries (with their ``:module:``)."""
  documented: dict[str, set[str]] = {}
  for page in sorted((DOCS / "api").glob("*.md")):
    module, data = None, None
    for line in page.read_text().splitlines():
      if m := re.match(r"\.\. currentmodule:: (\S+)", line.strip()):
        module = m.group(1)
      elif module and re.fullmatch(r"   [A-Za-z_][A-Za-z0-9_]*", line):
        documented.setdefault(module, set()).add(line.strip())
      elif m := re.match(r"\.\. auto(?:exception|class):: (\S+)", line.strip()):
        full = m.group(1) if "." in m.group(1) else f"{module}.{m.group(1)}"
        documented.setdefault(full.rsplit(".", 1)[0], set()).add(full.rsplit(".", 1)[1])
      elif m := re.match(r"\.\. py:data:: (\S+)", line.strip()):
        data = m.group(1)
      elif data and (m := re.match(r":module: (\S+)", line.strip())):
        documented.setdefault(m.group(1), set()).add(data)
        data = None
  return documented


@pytest.mark.parametrize(
  "module",
  [
    paramreg_jax,
    paramreg_jax.recipes,
    paramreg_jax.sources,
    paramreg_jax.errors,
    paramreg_jax.typing,
  ],
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
    if isinstance(obj, str) or module is paramreg_jax.typing or id(obj) not in pages:
      missing.append(name)
  assert not missing, f"add these to a page in docs/api/: {missing}"
  for m, names in documented.items():
    for n in names:
      assert n in sys.modules[m].__all__, f"docs/api/ lists {m}.{n}, which is not public"


def test_every_public_function_and_class_page_has_a_runnable_example():
  for m, names in _documented().items():
    for n in names:
      obj = getattr(sys.modules[m], n)
      if isinstance(obj, str) or (inspect.isclass(obj) and issubclass(obj, BaseException)):
        continue
      if not getattr(obj, "__module__", "").startswith("paramreg_jax"):
        continue  # an alias (``Any``, a string): its entry is written on the page
      assert ">>>" in (inspect.getdoc(obj) or ""), f"{m}.{n} has no runnable example"


@pytest.mark.parametrize(
  "page", [p for p in PAGES if CODE.search(p.read_text())], ids=lambda p: str(p.relative_to(DOCS))
)
def test_page_code_runs_with_only_runtime_dependencies(page, view, tmp_path):
  """A page's ```python blocks run in order in one interpreter, like a notebook."""
  run_as_user(page_code(page), view=view, cwd=tmp_path, name=f"docs/{page.relative_to(DOCS)}")


def _section(doc: str, title: str) -> str:
  """The body of a Google-style docstring section (``Args:``), or ``""``."""
  m = re.search(rf"^{title}:\n((?:[ \t]+.*\n|\n)*)", doc + "\n", re.M)
  return m.group(1) if m else ""


def _public_callables():
  for module in (paramreg_jax, paramreg_jax.recipes, paramreg_jax.sources, paramreg_jax.typing):
    for name in module.__all__:
      obj = getattr(module, name)
      if inspect.isclass(obj) and issubclass(obj, BaseException):
        continue
      if callable(obj) and getattr(obj, "__module__", "").startswith("paramreg_jax"):
        yield f"{module.__name__}.{name}", obj


def _parameters(obj) -> list[str]:
  target = obj.__init__ if inspect.isclass(obj) else obj
  try:
    sig = inspect.signature(target)
  except (TypeError, ValueError):
    return []
  return [
    p.name
    for p in sig.parameters.values()
    if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
  ]


@pytest.mark.parametrize("name, obj", list(_public_callables()), ids=lambda x: x)
def test_each_public_callable_documents_its_own_parameters_result_and_errors(name, obj):
  """Args (each parameter, described here, not "see plan_restore()"), Returns and Raises on
  every function; Args or Attributes for each constructor parameter of a class."""
  doc = inspect.getdoc(obj) or ""
  args = _section(doc, "Args") + _section(doc, "Attributes")
  for p in _parameters(obj):
    m = re.search(rf"^\s+(?:\w+, )*{p}(?:, \w+)*(?: \(.*?\))?: (.*)$", args, re.M)
    assert m, f"{name}: parameter {p!r} is not described under Args:"
    assert not re.match(r"see :\w+:`[^`]+`\.?$", m.group(1)), f"{name}: {p!r} only says 'see'"
  if inspect.isclass(obj):
    return
  assert _section(doc, "Returns") or _section(doc, "Yields"), f"{name}: no Returns: section"
  assert _section(doc, "Raises"), f"{name}: no Raises: section"


SHOWN = re.compile(
  r"^```(?:python|\{code-cell\} ipython3|\{code-block\} python)\n(.*?)^```", re.S | re.M
)


def test_page_code_fits_in_the_code_column():
  """Code on the pages fits the page without scrolling (the CSS makes room for 88 columns)."""
  long = [
    f"{page.relative_to(DOCS)}: {line}"
    for page in PAGES
    for cell in SHOWN.findall(page.read_text())
    for line in cell.splitlines()
    if len(line) > CODE_WIDTH
  ]
  assert not long, "\n".join(long)
