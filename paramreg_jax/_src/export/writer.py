"""Safetensors files the way Hugging Face writes them, written atomically.

``layout`` splits tensors into size-bounded shards (``model.safetensors``, or
``model-00001-of-00003.safetensors`` and ``model.safetensors.index.json``); ``header`` and
``index`` are their bytes. ``staging.Staging`` publishes the directory atomically.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.sources import safetensors_format as st

DTYPE_NAMES = {dtype: name for name, dtype in st.DTYPES.items()}
INDEX_NAME = st.INDEX_NAME
SINGLE_NAME = "model.safetensors"


def dtype_name(dtype: np.dtype, key: str) -> str:
  name = DTYPE_NAMES.get(np.dtype(dtype))
  if name is None:
    raise errors.ExportError(f"{key}: safetensors has no dtype for {np.dtype(dtype)}", key)
  return name


def layout(
  tensors: Sequence[tuple[str, tuple[int, ...], np.dtype, int]], max_shard_bytes: int
) -> list[tuple[str, list[int]]]:
  """``[(file name, [tensor positions])]``: tensors in order, a new shard when the next one
  would pass ``max_shard_bytes`` (a tensor larger than that gets a shard of its own)."""
  shards: list[list[int]] = [[]]
  size = 0
  for i, (_, _, _, nbytes) in enumerate(tensors):
    if shards[-1] and size + nbytes > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append(i)
    size += nbytes
  if len(shards) == 1:
    return [(SINGLE_NAME, shards[0])]
  n = len(shards)
  return [(f"model-{i + 1:05d}-of-{n:05d}.safetensors", s) for i, s in enumerate(shards)]


def header(
  entries: Sequence[tuple[str, tuple[int, ...], np.dtype, int]], metadata: dict[str, str]
) -> tuple[bytes, list[int]]:
  """The header bytes (padded to 8 with spaces, as the reference writer does) and each
  tensor's start offset in the data section."""
  body: dict[str, Any] = {"__metadata__": metadata}
  offsets = []
  offset = 0
  for key, shape, dtype, nbytes in entries:
    body[key] = {
      "dtype": dtype_name(dtype, key),
      "shape": list(shape),
      "data_offsets": [offset, offset + nbytes],
    }
    offsets.append(offset)
    offset += nbytes
  raw = json.dumps(body, separators=(",", ":")).encode()
  raw += b" " * (-len(raw) % 8)
  return len(raw).to_bytes(8, "little") + raw, offsets


def entries(tensors: Sequence[Any]) -> list[tuple[str, tuple[int, ...], np.dtype, int]]:
  """``(key, shape, dtype, nbytes)`` of each planned tensor (what ``layout`` and ``header``
  take)."""
  return [(t.key, t.shape, t.dtype, t.nbytes) for t in tensors]


def write_index(
  folder: pathlib.Path,
  tensors: Sequence[tuple[str, tuple[int, ...], np.dtype, int]],
  shards: list[tuple[str, list[int]]],
) -> None:
  """``model.safetensors.index.json`` in ``folder``, when the tensors are in several shards."""
  if len(shards) > 1:
    weight_map = {tensors[i][0]: name for name, positions in shards for i in positions}
    total = sum(t[3] for t in tensors)
    (folder / INDEX_NAME).write_bytes(index(weight_map, total))


def index(weight_map: dict[str, str], total_size: int) -> bytes:
  return (
    json.dumps({"metadata": {"total_size": total_size}, "weight_map": weight_map}, indent=2) + "\n"
  ).encode()
