"""The HTML tables notebooks and the docs show: they fit the page and escape what they show."""

import re

import jax
import numpy as np

import paramreg_jax as prj
from paramreg_jax import recipes as R


def _cells(html: str, column: str) -> list[str]:
  """The style of ``column``'s header and of each of its cells."""
  headers = re.findall(r"<th style=\"([^\"]*)\">([^<]*)</th>", html)
  index = [name for _, name in headers].index(column)
  rows = re.findall(r"<tr>(.*?)</tr>", html.split("<tbody>")[1])
  return [headers[index][0]] + [re.findall(r"<td style=\"([^\"]*)\"", r)[index] for r in rows]


def test_the_plan_table_scrolls_wraps_shardings_between_words_and_recipes_anywhere():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", "model"))
  src = prj.MemorySource({"a<b": np.ones((4, 4), np.float32)})
  target = {"w": jax.ShapeDtypeStruct((4, 4), np.float32, sharding=sharding)}
  recipe = R.transpose(R.source("a<b"), (1, 0))
  html = prj.plan_restore(target, src, recipes={"w": recipe})._repr_html_()
  assert html.startswith("<b>RestorePlan</b>") and "overflow-x:auto" in html
  sharding = _cells(html, "sharding")
  assert all("min-width:20ch" in s and "anywhere" not in s for s in sharding)
  assert all("white-space:nowrap" in s for s in _cells(html, "shape") + _cells(html, "dtype"))
  assert all("overflow-wrap:anywhere" in s for s in _cells(html, "from"))
  assert "transpose(source(&#x27;a&lt;b&#x27;), (1, 0))" in html  # escaped, never raw
  assert "a<b" not in html


def test_match_export_and_report_tables_scroll_too():
  src = prj.MemorySource({"fc.weight": np.zeros((3, 2), np.float32)})
  target = {"fc": {"kernel": jax.ShapeDtypeStruct((2, 3), np.float32)}}
  m = prj.match(target, src)
  report = prj.SurgeryReport(kept=("n:a",), added=("n:b",), dropped=(), reinitialized=())
  plan = prj.plan_export(prj.plan_restore(target, src, recipes=m))
  for html in (m._repr_html_(), report._repr_html_(), plan._repr_html_()):
    assert '<div style="overflow-x:auto;max-width:100%"><table' in html
  assert all("overflow-wrap:anywhere" in s for s in _cells(m._repr_html_(), "checkpoint"))
