"""``sources/storage/stores.py`` on its own: descriptors held by reads, paths that leave a folder in any
spelling, arguments checked before any request."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

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
