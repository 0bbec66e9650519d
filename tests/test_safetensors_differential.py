"""``SafetensorsSource`` against the ``safetensors`` package, over generated and mutated files.

Each file is opened by both. They must agree: both refuse it, or both read the same tensors
with the same bytes. The deliberate differences (``README.md``, Reliability) are stricter on
our side only, never more lenient: a tensor name twice in the header (safetensors keeps the
last), ``__metadata__`` twice, and the packed 4-bit ``F4`` dtype (no numpy/JAX dtype holds two
values per byte). Anything else we raise must be a ``StoreError``, never a crash.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from paramreg_jax import SafetensorsSource
from paramreg_jax.errors import StoreError

DTYPES = {
  "F64": np.float64,
  "F32": np.float32,
  "F16": np.float16,
  "I64": np.int64,
  "U64": np.uint64,
  "I32": np.int32,
  "U32": np.uint32,
  "I16": np.int16,
  "U16": np.uint16,
  "I8": np.int8,
  "U8": np.uint8,
  "BOOL": np.bool_,
  "C64": np.complex64,
}
# mutation -> accepted by safetensors, refused here on purpose
DELIBERATE = {"duplicate name", "duplicate metadata", "F4 dtype"}


def random_tensors(rng):
  out = {}
  for i in range(int(rng.integers(1, 5))):
    dtype = list(DTYPES.values())[int(rng.integers(len(DTYPES)))]
    shape = tuple(int(d) for d in rng.integers(0, 4, size=int(rng.integers(0, 3))))
    raw = rng.integers(0, 256, size=int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    value = raw.astype(np.uint8).view(np.uint8)
    out[f"t{i}.{rng.integers(100)}"] = (
      (value != 0).reshape(shape) if dtype is np.bool_ else value.view(dtype).reshape(shape)
    )
  return out


def split(blob: bytes) -> tuple[dict, bytes]:
  (n,) = struct.unpack("<Q", blob[:8])
  return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def join(header_text: str, data: bytes) -> bytes:
  raw = header_text.encode("utf-8", "surrogatepass")
  return struct.pack("<Q", len(raw)) + raw + data


def first_tensor(header: dict) -> str:
  return next(k for k in header if k != "__metadata__")


def mutate(kind: str, blob: bytes, rng) -> bytes:
  header, data = split(blob)
  key = first_tensor(header)
  if kind == "valid":
    return blob
  if kind == "padded header":
    return join(json.dumps(header) + " " * int(rng.integers(1, 9)), data)
  if kind == "leading space":
    return join(" " + json.dumps(header), data)
  if kind == "duplicate name":
    text = json.dumps(header)
    entry = json.dumps({key: header[key]})[1:-1]
    return join("{" + entry + ", " + text[1:], data)
  if kind == "duplicate metadata":
    return join(
      '{"__metadata__": {"a": "1"}, "__metadata__": {"b": "2"}, ' + json.dumps(header)[1:], data
    )
  if kind == "metadata not strings":
    header["__metadata__"] = [{"a": 1}, ["x"], "text", {"a": None}][int(rng.integers(4))]
    return join(json.dumps(header), data)
  if kind == "NaN":
    return join(json.dumps(header).replace("]", ", NaN]", 1), data)
  if kind == "minus zero":
    text = json.dumps(header)
    return join(text.replace('"shape": [', '"shape": [-0, ', 1), data)
  if kind == "lone surrogate":
    header["w\udc80"] = header.pop(key)
    return join(json.dumps(header), data)
  if kind == "F4 dtype":
    header[key]["dtype"] = "F4"
    return join(json.dumps(header), data)
  if kind == "unknown dtype":
    header[key]["dtype"] = "X9"
    return join(json.dumps(header), data)
  if kind == "offset shift":
    b, e = header[key]["data_offsets"]
    d = int(rng.choice([-1, 1]))
    header[key]["data_offsets"] = [max(0, b + d), max(0, e + d)]
    return join(json.dumps(header), data)
  if kind == "shape change":
    header[key]["shape"] = [*header[key]["shape"], 2]
    return join(json.dumps(header), data)
  if kind == "truncated":
    return blob[: int(rng.integers(0, len(blob)))]
  if kind == "trailing bytes":
    return blob + bytes(int(rng.integers(1, 9)))
  if kind == "length field":
    (n,) = struct.unpack("<Q", blob[:8])
    n = int(rng.choice([n - 1, n + 1, 2**40, 100_000_001]))
    return struct.pack("<Q", max(0, n)) + blob[8:]
  if kind == "flipped header byte":
    (n,) = struct.unpack("<Q", blob[:8])
    at = 8 + int(rng.integers(0, max(1, n)))
    flipped = bytearray(blob)
    flipped[at] ^= 1 << int(rng.integers(8))
    return bytes(flipped)
  raise AssertionError(kind)


KINDS = [
  "valid",
  "padded header",
  "leading space",
  "duplicate name",
  "duplicate metadata",
  "metadata not strings",
  "NaN",
  "minus zero",
  "lone surrogate",
  "F4 dtype",
  "unknown dtype",
  "offset shift",
  "shape change",
  "truncated",
  "trailing bytes",
  "length field",
  "flipped header byte",
]


def reference(path):
  try:
    with safe_open(str(path), framework="np") as f:
      return {k: f.get_tensor(k) for k in f.keys()}
  except Exception:
    return None


def ours(path):
  try:
    with SafetensorsSource(path) as src:
      return {k: src.lease(k).read() for k in src.keys()}
  except StoreError:
    return None


@pytest.mark.parametrize("seed", range(6))
def test_we_agree_with_the_safetensors_package(tmp_path, seed):
  rng = np.random.default_rng(seed)
  counts = {"both read": 0, "both refuse": 0, "deliberate": 0}
  for n in range(60):
    kind = KINDS[n % len(KINDS)] if n < len(KINDS) else KINDS[int(rng.integers(len(KINDS)))]
    tensors = random_tensors(rng)
    base = tmp_path / "base.safetensors"
    save_file(tensors, str(base), metadata={"format": "np"} if rng.random() < 0.5 else None)
    path = tmp_path / f"{n}.safetensors"
    path.write_bytes(mutate(kind, base.read_bytes(), rng))
    ref, got = reference(path), ours(path)
    if kind in DELIBERATE and ref is not None and got is None:
      counts["deliberate"] += 1
      continue
    assert (ref is None) == (got is None), (
      f"{kind} (seed {seed}, file {n}): safetensors "
      f"{'refuses' if ref is None else 'reads'} it, we {'refuse' if got is None else 'read'} it"
    )
    if ref is not None:
      assert set(ref) == set(got), kind
      for k in ref:
        assert got[k].dtype == ref[k].dtype and got[k].shape == ref[k].shape, (kind, k)
        assert got[k].tobytes() == ref[k].tobytes(), (kind, k)
    counts["both read" if ref is not None else "both refuse"] += 1
  # the comparison had both outcomes to compare: files both read (bytes equal) and files both
  # refuse; a reader that refused everything, or read everything, would not get here
  assert counts["both read"] >= 5 and counts["both refuse"] >= 5, counts
