"""The plain-text reports fit a screen: lines of at most :data:`WIDTH` columns.

``print(match)``, an export plan, a surgery report: a line that would be wider breaks where a
reader (and Python) expects it, never inside a name. An expression breaks at its brackets, one
argument per line (``expression``); a list of names between its items (``items``). A single
name longer than the width stays whole. The HTML forms of the same reports are
:mod:`html_table`'s.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

WIDTH = 88  # columns: the code column of the docs and a terminal with room for a margin

_OPEN = "([{"


def expression(text: str, indent: int = 0, *, width: int = WIDTH, code: bool = False) -> list[str]:
  """``text`` (a call expression) as lines of at most ``width`` columns, indented by ``indent``:
  the outermost call that is too wide puts each argument on its own line, two columns further
  in, and its closing bracket on a line of its own; arguments that are plain names or numbers
  fill their lines instead. ``code=True`` ends every argument with a comma (a trailing one
  too, as formatters write Python), so the lines stay valid code.

  Examples:
    >>> from paramreg_jax._src.text_width import expression
    >>> print("\\n".join(expression("stack([source('a.0.w'), source('a.1.w')], axis=0)", width=40)))
    stack(
      [source('a.0.w'), source('a.1.w')],
      axis=0
    )
    >>> print("\\n".join(expression("Indices(0, [0, 2, 4, 6, 8, 10, 12, 14])", width=24)))
    Indices(
      0,
      [
        0, 2, 4, 6, 8, 10,
        12, 14
      ]
    )
  """
  pad = " " * indent
  if indent + len(text) <= width:
    return [pad + text]
  span = _first_bracket(text)
  if span is None:
    return [pad + text]  # one name or number: it stays whole
  start, end = span
  args = _split(text[start + 1 : end])
  if not args:
    return [pad + text]
  trailing = code and not _comprehension(args[-1])  # `[x for x in y,]` is no Python
  args = [*args[:-1], args[-1] + ("," if trailing else "")]
  lines = [pad + text[: start + 1]]
  if all(_first_bracket(arg) is None for arg in args):  # names or numbers: filled, not one a line
    lines += items("", args, indent + 2, width=width)
  else:
    for k, arg in enumerate(args):
      comma = "," if k < len(args) - 1 else ""
      lines += expression(arg + comma, indent + 2, width=width, code=code)
  return [*lines, pad + text[end:]]


def items(
  label: str, parts: Sequence[str], indent: int = 0, *, sep: str = ", ", width: int = WIDTH
) -> list[str]:
  """``label`` followed by ``parts`` joined by ``sep``, continued on lines that start under the
  first part (or four columns in, when the label is wide) wherever the next part would pass
  ``width``.

  Examples:
    >>> from paramreg_jax._src.text_width import items
    >>> print("\\n".join(items("kept: ", ["n:a/kernel", "n:a/bias", "n:b/kernel"], width=26)))
    kept: n:a/kernel,
          n:a/bias, n:b/kernel
  """
  pad = " " * indent
  hang = " " * (len(label) if indent + len(label) <= width // 2 else 4)
  mark, gap = sep.rstrip(), sep[len(sep.rstrip()) :]
  lines, line = [], pad + label
  for k, part in enumerate(parts):
    piece = part + (mark if k < len(parts) - 1 else "")
    if k == 0 or len(line) + len(gap) + len(piece) <= width:
      line += (gap if k else "") + piece
    else:
      lines.append(line)
      line = pad + hang + piece
  return [*lines, line]


def prose(text: str, first: str = "", rest: str = "", *, width: int = WIDTH) -> list[str]:
  """``text`` (words) wrapped at spaces, its first line after ``first``, the others after
  ``rest``; a word longer than a line stays whole.

  Examples:
    >>> from paramreg_jax._src.text_width import prose
    >>> print("\\n".join(prose("name + transpose (0.80)", "# ^ ", "#   ", width=18)))
    # ^ name +
    #   transpose
    #   (0.80)
  """
  return textwrap.wrap(
    text,
    width,
    initial_indent=first,
    subsequent_indent=rest,
    break_long_words=False,
    break_on_hyphens=False,
  ) or [first.rstrip()]


def _scan(text: str):
  """``(index, character, depth)`` of each character outside quotes; ``depth`` counts the
  brackets around it (a bracket itself is at the depth of what surrounds it)."""
  depth, quote = 0, ""
  for i, ch in enumerate(text):
    if quote:
      quote = "" if ch == quote and text[i - 1] != "\\" else quote
    elif ch in "'\"":
      quote = ch
    else:
      depth -= ch in ")]}"
      yield i, ch, depth
      depth += ch in _OPEN


def _first_bracket(text: str) -> tuple[int, int] | None:
  """Where the first bracket outside quotes opens, and where it closes."""
  start = -1
  for i, ch, depth in _scan(text):
    if depth == 0 and ch in _OPEN and start < 0:
      start = i
    elif depth == 0 and ch in ")]}" and start >= 0:
      return start, i
  return None


def _comprehension(arg: str) -> bool:
  """Whether ``arg`` is a comprehension: a ``for`` outside its own brackets and quotes."""
  return " for " in "".join(ch for _, ch, depth in _scan(arg) if depth == 0)


def _split(inner: str) -> list[str]:
  """``inner``'s arguments: split at its commas outside brackets and quotes, stripped."""
  cuts = [i for i, ch, depth in _scan(inner) if ch == "," and depth == 0]
  bounds = zip([-1, *cuts], [*cuts, len(inner)])
  return [part for a, b in bounds if (part := inner[a + 1 : b].strip())]
