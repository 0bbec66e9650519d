"""Links for the docs: every ``prj.*``/``jax.*``/``optax.*``/``nnx.*``/``ocp.*`` name links to its
page, API pages list the guides that use them, and no page names a private module.

- Inline code that names a public object (``prj.restore``, ``R.fused_split``, ``jax.Array``,
  ``nnx.Optimizer``) becomes a cross-reference: ours to the API reference, jax/flax/optax/orbax
  names through intersphinx (only names their inventories hold, so nothing links to a 404).
- Each API page ends with "Used in": the guides that mention the object, linked.
- Type hints and base classes that point into ``paramreg_jax._src`` are shown and linked as the
  public name of the same object (``CheckpointSource``, not ``source_lib.CheckpointSource``).

Names are resolved to objects by ``make_inventories.resolve`` (``conf.py`` puts
``docs/_inventories`` on the path), the same function that builds the inventories.
"""

from __future__ import annotations

import importlib
import re

from docutils import nodes
from make_inventories import resolve
from sphinx import addnodes
from sphinx.transforms import SphinxTransform
from sphinx.util import inspect as sphinx_inspect

# Sphinx prints an alias inside a union (``Recipes | None``) by its repr; print its name, so the
# type is shown and linked like any other
sphinx_inspect.TypeAliasForwardRef.__repr__ = lambda self: self.name  # type: ignore[method-assign]

# what the docs write -> the module it stands for
ABBREVIATIONS = {
  "prj": "paramreg_jax",
  "R": "paramreg_jax.recipes",
  "recipes": "paramreg_jax.recipes",
  "nnx": "flax.nnx",
  "ocp": "orbax.checkpoint",
  "jnp": "jax.numpy",
}
# where each public object is documented, in the order a name is looked for
HOMES = (
  "paramreg_jax.errors",
  "paramreg_jax.recipes",
  "paramreg_jax.sources",
  "paramreg_jax.typing",
  "paramreg_jax",
)
PRIVATE = re.compile(r"paramreg_jax\._src(?:\.\w+)*\.(\w+)")
NAME = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(.*\))?$", re.S)
BARE = re.compile(r"^([A-Za-z_]\w*)(?:\(.*\))?$", re.S)
EXTERNAL = ("jax", "flax", "optax", "orbax")


def public_name(dotted: str) -> str | None:
  """The documented name of the paramreg_jax object ``dotted`` names (any import path)."""
  head, _, rest = dotted.partition(".")
  dotted = f"{ABBREVIATIONS.get(head, head)}.{rest}" if rest else dotted
  if not dotted.startswith("paramreg_jax"):
    return None
  parts = dotted.split(".")
  for cut in range(len(parts), 1, -1):  # the object, then a member of it (a method)
    obj = resolve(".".join(parts[:cut]))
    if obj is None or isinstance(obj, (str, int)):
      continue
    for home in HOMES:
      module = importlib.import_module(home)
      for name in module.__all__:
        if getattr(module, name) is obj:
          return ".".join([home, name, *parts[cut:]])
    if type(obj).__name__ == "module" and obj.__name__ in HOMES:
      return ".".join([obj.__name__, *parts[cut:]])
  return None


def _external(env, dotted: str) -> str | None:
  head, _, rest = dotted.partition(".")
  dotted = f"{ABBREVIATIONS.get(head, head)}.{rest}"
  if dotted.split(".")[0] not in EXTERNAL:
    return None
  inventory = getattr(env, "intersphinx_inventory", {})
  return dotted if any(dotted in names for names in inventory.values()) else None


def _target(env, text: str) -> str | None:
  """What the inline code ``text`` names: a documented object (``prj.restore``, ``BindError``,
  ``restore()``) or a name in the jax/flax/optax/orbax inventories."""
  if m := NAME.match(text):
    return public_name(m.group(1)) or _external(env, m.group(1))
  if m := BARE.match(text):
    for home in ("paramreg_jax", "paramreg_jax.errors"):
      if m.group(1) in importlib.import_module(home).__all__:
        return public_name(f"{home}.{m.group(1)}")
  return None


class LinkNames(SphinxTransform):
  """Inline code naming a public object becomes a reference to its documentation."""

  default_priority = 200

  def apply(self, **kwargs) -> None:
    used = self.env.__dict__.setdefault("paramreg_used_in", {})
    for node in list(self.document.findall(nodes.literal)):
      if isinstance(
        node.parent, (nodes.reference, addnodes.pending_xref, nodes.literal_block)
      ):
        continue
      target = _target(self.env, node.astext().strip())
      if target is None:
        continue
      if target.startswith("paramreg_jax"):
        owner = target if _page_of(target) else target.rsplit(".", 1)[0]
        used.setdefault(owner, set()).add(self.env.docname)
      xref = addnodes.pending_xref(
        "",
        refdomain="py",
        reftype="obj",
        reftarget=target,
        refexplicit=True,
        refwarn=False,
      )
      xref["py:module"] = xref["py:class"] = None
      node.replace_self(xref)
      xref += node


def _page_of(name: str) -> bool:
  """Whether ``name`` is a documented object (it has a page), not a member of one."""
  home, _, leaf = name.rpartition(".")
  return home in HOMES and "." not in leaf


def _resolve_private(app, env, node, contnode):
  """A reference into ``paramreg_jax._src`` (a type hint, a base class) links the public name."""
  target = node.get("reftarget", "")
  if not target.startswith("paramreg_jax._src."):
    return None
  name = public_name(target)
  if name is None:
    return None
  node["reftarget"] = name
  domain = env.domains["py"]
  return domain.resolve_xref(
    env, node["refdoc"], app.builder, "obj", name, node, contnode
  )


def _public_bases(app, name, obj, options, bases: list) -> None:
  """Show only public base classes: a private base shows as its nearest public ancestor
  (``BoxSource`` as ``CheckpointSource``), or not at all."""
  out: list = []
  for b in bases:
    if not _public_class(b):
      b = next((c for c in getattr(b, "__mro__", ()) if _public_class(c)), object)
      if b is object:
        continue
    if b not in out:
      out.append(b)
  bases[:] = out


def _public_class(c: type) -> bool:
  module = getattr(c, "__module__", "")
  return not module.startswith("paramreg_jax._src") or bool(
    public_name(f"{module}.{c.__qualname__}")
  )


def _used_in(app, doctree, docname: str) -> None:
  """Appends "Used in" (the guides that mention the object) to an API page."""
  if not docname.startswith("_autosummary/"):
    return
  name = docname.split("/", 1)[1]
  guides = sorted(
    d
    for d in app.env.__dict__.get("paramreg_used_in", {}).get(name, ())
    if not d.startswith(("_autosummary/", "api", "changelog"))
  )
  sections = list(doctree.findall(nodes.section))
  if not guides or not sections:
    return
  items = nodes.bullet_list()
  for doc in guides:
    uri = app.builder.get_relative_uri(docname, doc)
    title = app.env.titles[doc].astext()
    items += nodes.list_item(
      "", nodes.paragraph("", "", nodes.reference(title, title, refuri=uri))
    )
  sections[0] += [nodes.rubric("", "Used in"), items]


def _public_text(app, doctree, docname: str) -> None:
  """Type hints of attributes name private classes by their full path: show the public name."""

  def public(m: re.Match) -> str:
    name = public_name(m.group(0))
    return name.rsplit(".", 1)[1] if name else m.group(1)

  for node in list(doctree.findall(nodes.Text)):
    if PRIVATE.search(node) and not isinstance(node.parent, nodes.literal_block):
      node.parent.replace(node, nodes.Text(PRIVATE.sub(public, node)))
  for node in doctree.findall(nodes.reference):
    if PRIVATE.search(node.get("reftitle", "")):
      node["reftitle"] = PRIVATE.sub(public, node["reftitle"])


def _purge(app, env, docname: str) -> None:
  for docs in env.__dict__.get("paramreg_used_in", {}).values():
    docs.discard(docname)


def _merge(app, env, docnames, other) -> None:
  mine = env.__dict__.setdefault("paramreg_used_in", {})
  for name, docs in other.__dict__.get("paramreg_used_in", {}).items():
    mine.setdefault(name, set()).update(docs & set(docnames))


def setup(app):
  app.add_transform(LinkNames)
  app.connect("missing-reference", _resolve_private, priority=400)
  app.connect("autodoc-process-bases", _public_bases)
  app.connect("doctree-resolved", _used_in)
  app.connect("doctree-resolved", _public_text)
  app.connect("env-purge-doc", _purge)
  app.connect("env-merge-info", _merge)
  return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
