"""``sources/storage/stores.py`` on its own: descriptors held by reads, paths that leave a folder in any
spelling, arguments checked before any request."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import paramreg_jax as prj
from paramreg_jax._src.sources.storage import remote
from paramreg_jax._src.sources.storage import stores


def test_a_read_holds_the_descriptor_that_close_releases_after_it(tmp_path):
  path = tmp_path / "f"
  path.write_bytes(bytes(range(256)) * 16)
  f = stores.LocalFile(path)
  fd = f._acquire()  # a read in flight
  f.close()
  with pytest.raises(prj.errors.StoreError, match="the source was closed"):
    f.pread(4, 0)  # new reads are refused
  assert os.pread(fd, 4, 0) == bytes(range(4))  # the one in flight still reads its file
  f._release()
  assert f.fd == -1
  with pytest.raises(OSError):
    os.fstat(fd)  # closed once the read was done


def test_concurrent_reads_and_close_never_mix_files(tmp_path):
  path = tmp_path / "f"
  path.write_bytes(np.arange(1024, dtype=np.int32).tobytes())
  for _ in range(200):
    f = stores.LocalFile(path)
    out = np.empty(1024, np.int32)
    errors = []

    def read(f=f, out=out, errors=errors):
      try:
        f.pread_into(out, 0, "it")
      except prj.errors.StoreError as e:
        errors.append(e)

    t = threading.Thread(target=read)
    t.start()
    f.close()
    t.join()
    assert errors or np.array_equal(out, np.arange(1024, dtype=np.int32))


@pytest.mark.parametrize(
  "name, outside",
  [
    ("model-00001.safetensors", False),
    ("sub/model.safetensors", False),
    ("../x.safetensors", True),
    ("%2e%2e/x.safetensors", True),
    ("%252e%252e/x.safetensors", True),
    ("..%2fx.safetensors", True),
    ("/etc/passwd", True),
    ("%2fetc%2fpasswd", True),
    ("https://elsewhere/x", True),
  ],
)
def test_a_remote_folder_refuses_paths_that_leave_it_in_any_spelling(name, outside):
  folder = remote.RemoteFolder.__new__(remote.RemoteFolder)
  assert folder.escapes(name) is outside


def test_urls_and_their_arguments():
  assert stores.is_url("https://h/x") and not stores.is_url("file:///x") and not stores.is_url("x")
  url = "https://127.0.0.1:9/m.safetensors"
  assert remote.check_remote_args(url, None, 0, 1.0, 1.0) is None
  for bad in ((url, None, -1, 1.0, 1.0), (url, None, 1, 0, 1.0), (url, 5, 1, 1.0, 1.0)):
    with pytest.raises(prj.errors.StoreError):
      remote.check_remote_args(*bad)
  with pytest.raises(prj.errors.StoreError, match="ftp:// is not a protocol read here"):
    remote.check_remote_args("ftp://h/x", None, 1, 1.0, 1.0)


@pytest.mark.parametrize("size", [1, 4096, (4 << 20) - 1, 4 << 20, (9 << 20) + 13, 40 << 20])
def test_a_large_read_in_parts_is_the_file_byte_for_byte(tmp_path, size):
  """Reads of 4 MiB and more go in parallel parts; every byte lands where one read puts it."""
  data = np.random.default_rng(size).integers(0, 256, size + 100, dtype=np.uint8)
  (tmp_path / "f").write_bytes(data.tobytes())
  f = stores.LocalFile(tmp_path / "f")
  out = np.full(size, 7, np.uint8)
  f.pread_into(out, 100, "x")
  np.testing.assert_array_equal(out, data[100:])
  f.close()


def test_a_file_cut_short_under_a_read_in_parts_names_the_bytes(tmp_path):
  (tmp_path / "f").write_bytes(bytes(10 << 20))
  f = stores.LocalFile(tmp_path / "f")
  os.truncate(tmp_path / "f", 7 << 20)
  with pytest.raises(prj.errors.SourceIOError) as info:
    f.pread_into(np.empty(10 << 20, np.uint8), 0, "'w'")
  assert str(info.value).endswith(
    f"'w' needs bytes up to {10 << 20}, but the file is now {7 << 20} bytes (truncated after "
    "it was opened?)"
  )
  f.close()


@given(st.integers(1, 1 << 34))
def test_parts_cover_a_read_once_in_order(n):
  parts = stores._parts(n)
  assert parts[0][0] == 0 and parts[-1][1] == n
  assert all(a < b for a, b in parts) and all(b == c for (_, b), (c, _) in zip(parts, parts[1:]))
  assert len(parts) <= stores.PARALLEL_PARTS
  if n >= 2 * stores.PART_BYTES:
    assert len(parts) >= 2 and all(b - a >= stores.PART_BYTES for a, b in parts[:-1])
  else:
    assert parts == [(0, n)]
