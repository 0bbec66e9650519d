"""Sphinx configuration: myst-nb pages and notebooks, an API reference from the docstrings.

Built by ``python -m sphinx -W -b html docs docs/_build/html`` (README) and by
``tests/test_docs.py``, with warnings as errors. No network: intersphinx reads the inventories
committed in ``_inventories/`` (made by ``_inventories/make_inventories.py``); the guides and the
notebooks (``notebooks/`` is a symbolic link) are executed during the build.
"""

import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
sys.path.insert(0, str(ROOT / "docs" / "_inventories"))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("PJRT_NPROC", "16")

from make_inventories import PROJECTS  # noqa: E402

import paramreg_jax  # noqa: E402

project = "paramreg_jax"
author = "paramreg_jax developers"
copyright = "2026, paramreg_jax developers"
release = paramreg_jax.__version__
version = release

extensions = [
  "myst_nb",
  "sphinx.ext.autodoc",
  "sphinx.ext.autosummary",
  "sphinx.ext.intersphinx",
  "sphinx.ext.napoleon",
  "sphinx.ext.viewcode",
  "paramreg_links",
]

intersphinx_mapping = {
  name: (url, f"_inventories/{name}.inv") for name, (url, _, _) in PROJECTS.items()
}

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = [
  "_build",
  "**.ipynb_checkpoints",
  "notebooks/README.md",
  "_inventories",
]
templates_path = ["_templates"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Notebooks are committed with outputs cleared; the build runs them (about 20 s on 2 cores) so the
# site shows their outputs, and fails on an error. PARAMREG_DOCS_EXECUTE=0 renders them as is.
nb_execution_mode = "off" if os.environ.get("PARAMREG_DOCS_EXECUTE") == "0" else "cache"
nb_execution_raise_on_error = True
nb_execution_timeout = 300
nb_execution_in_temp = True


def _quiet_kernel() -> None:
  """This interpreter's kernel, logging errors only: the build executes each page over a
  loopback TCP kernel, and ipykernel warns of that once per page ("running over TCP without
  encryption"), 18 lines that say nothing about the pages. Found first on ``JUPYTER_PATH``."""
  import json

  spec = ROOT / "docs" / "_build" / "jupyter" / "kernels" / "python3"
  spec.mkdir(parents=True, exist_ok=True)
  argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
  kernel = {"argv": [*argv, "--IPKernelApp.log_level=ERROR"], "language": "python"}
  (spec / "kernel.json").write_text(json.dumps({**kernel, "display_name": "Python 3"}))
  paths = [str(spec.parent.parent), os.environ.get("JUPYTER_PATH", "")]
  os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, paths))


_quiet_kernel()

autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
# the signatures' aliases, shown (and linked) as the public names in paramreg_jax.typing
autodoc_type_aliases = {
  **{
    f"api_types.{n}": f"~paramreg_jax.typing.{n}" for n in paramreg_jax.typing.__all__
  },
  **{
    f"source_lib.{n}": f"~paramreg_jax.sources.{n}"
    for n in paramreg_jax.sources.__all__
  },
  "plan_lib.RestorePlan": "~paramreg_jax.RestorePlan",
}
add_module_names = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

html_theme = "sphinx_book_theme"
html_title = "paramreg_jax"
html_static_path = ["_static"]
html_css_files = ["paramreg.css"]
html_theme_options = {"show_toc_level": 2}
# one search box: the header's button (at every width); the theme's sidebar adds a second field
html_sidebars = {"**": ["navbar-logo.html", "icon-links.html", "sbt-sidebar-nav.html"]}
