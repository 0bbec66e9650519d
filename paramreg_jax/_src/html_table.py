"""The HTML tables of plans and reports in notebooks and the docs: they fit the page.

A long recipe or key wraps inside its cell; a sharding wraps between words only; a shape or
dtype never breaks; a table still wider than the page scrolls inside it instead of overflowing.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from collections.abc import Sequence

_CELL = "padding:2px 8px;text-align:left;vertical-align:top"
_NOWRAP = _CELL + ";white-space:nowrap"
_WRAP = _CELL + ";overflow-wrap:anywhere;min-width:12ch"
_WORDS = _CELL + ";white-space:normal;overflow-wrap:normal;min-width:20ch"


def code(text: str) -> str:
  """``text`` escaped, as inline code (that wraps where its column does: themes set the
  wrapping of ``code`` elements themselves)."""
  return f'<code style="overflow-wrap:inherit">{html.escape(text)}</code>'


def table(
  headers: Sequence[str],
  rows: Iterable[Sequence[str]],
  *,
  wrap: Sequence[int] = (),
  words: Sequence[int] = (),
) -> str:
  """A scrollable table; cells are HTML (escape them); columns in ``wrap`` may wrap anywhere,
  those in ``words`` between words, the others never break.

  Examples:
    >>> from paramreg_jax._src.html_table import code, table
    >>> print(table(["key", "from"], [[code("n:w"), code("source('w')")]], wrap=[1]))  # doctest: +ELLIPSIS
    <div style="overflow-x:auto;max-width:100%"><table ...><th ...>key</th>...</table></div>
  """
  style = [_WRAP if i in wrap else _WORDS if i in words else _NOWRAP for i in range(len(headers))]
  head = "".join(f'<th style="{s}">{html.escape(h)}</th>' for h, s in zip(headers, style))
  body = "".join(
    "<tr>" + "".join(f'<td style="{s}">{c}</td>' for c, s in zip(r, style)) + "</tr>" for r in rows
  )
  return (
    '<div style="overflow-x:auto;max-width:100%">'
    f'<table style="border-collapse:collapse;width:100%"><thead><tr>{head}</tr></thead>'
    f"<tbody>{body}</tbody></table></div>"
  )
