"""Reports broken to fit 88 columns: ``text_width.expression(code=True)`` keeps the code the
same code (compared by Python's own parser), and a line is wider only where nothing is left
to break at."""

import ast

import pytest

from paramreg_jax._src import text_width

CALLS = [
  "R.stack([R.source('model.layers.0.mlp.up_proj.weight'), R.source('x')], axis=0)",
  "prj.Indices(0, [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 1, 3, 5, 7])",
  "R.source('qkv', prj.Indices(0, [r + c for r in range(0, 96, 24) for c in range(8)]))",
  "f([item_number_one for item_number_one in collection_of_items_with_a_long_name])",
  "R.cast(R.transpose(R.source(f'blk.{i}.attn_q.weight, (a)'), (1, 0)), 'bfloat16')",
]


@pytest.mark.parametrize("width", [20, 40, 88])
@pytest.mark.parametrize("call", CALLS)
def test_code_broken_to_fit_is_the_same_code(call, width):
  lines = text_width.expression(call, 2, width=width, code=True)
  assert ast.dump(ast.parse("\n".join(lines).strip())) == ast.dump(ast.parse(call))
  for line in lines:  # a wider line is one argument with no bracket left to break at
    assert len(line) <= width or text_width._first_bracket(line) is None, line
  if len(call) + 2 > width:
    assert len(lines) > 1
