"""Reads of an object in a bucket (``s3://``, ``gs://``) that can never mix two versions.

When a source opens an object it records what the store says the object is (its size, and
its ETag on S3 or its generation on GCS); every read then asks for exactly that version, and
checks the answer names it:

- S3: ``GetObject`` with ``If-Match: <ETag>`` (the store refuses with 412 once the object
  changed), and the answer's ``Content-Range`` total and ``ETag`` must be the opened ones;
- GCS: the media download of the opened ``generation`` (gone once the object is replaced),
  and the answer's ``Content-Range`` total and ``x-goog-generation`` (when sent) must match;
- an object deleted after it was opened is a change, not a missing file.

Other fsspec protocols are read by ``cat_file`` with the size checked.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from paramreg_jax._src.sources.storage import answers
from paramreg_jax._src.sources.storage.answers import Changed
from paramreg_jax._src.sources.storage.answers import RangeNotSupported


@dataclasses.dataclass(frozen=True)
class Pinned:
  """What an object was when it was opened."""

  size: int
  etag: str | None = None
  generation: str | None = None


def _protocols(fs: Any) -> set[str]:
  protocol = fs.protocol
  return {protocol} if isinstance(protocol, str) else set(protocol)


def open_object(fs: Any, path: str) -> Pinned:
  """The object's size and version, as the store describes it now."""
  info = fs.info(path)
  if info.get("type") == "directory":
    raise FileNotFoundError(path)
  etag = info.get("ETag") or info.get("etag")
  generation = info.get("generation")
  return Pinned(int(info["size"]), etag, str(generation) if generation else None)


def read(fs: Any, path: str, pinned: Pinned, start: int, end: int) -> bytes:
  """Bytes ``start:end`` of the object as it was opened (``Changed`` if it is not)."""
  protocols = _protocols(fs)
  try:
    if protocols & {"s3", "s3a"} and pinned.etag:
      return _s3(fs, path, pinned, start, end)
    if protocols & {"gs", "gcs"} and pinned.generation:
      return _gcs(fs, path, pinned, start, end)
    return fs.cat_file(path, start=start, end=end)
  except FileNotFoundError:
    raise Changed("it was deleted or replaced") from None


def _s3(fs: Any, path: str, pinned: Pinned, start: int, end: int) -> bytes:
  from fsspec.asyn import sync

  bucket, key, version = fs.split_path(path)

  async def get() -> tuple[dict[str, Any], bytes]:
    extra = {"VersionId": version} if version else {}
    try:
      response = await fs._call_s3(
        "get_object",
        Bucket=bucket,
        Key=key,
        Range=f"bytes={start}-{end - 1}",
        IfMatch=pinned.etag,
        **extra,
      )
    except OSError as e:
      if "PreconditionFailed" in str(e) or "412" in str(e) or "pre-condition" in str(e):
        raise Changed(f"the store says it no longer matches ETag {pinned.etag}") from None
      raise
    try:
      return response, await response["Body"].read()
    finally:
      response["Body"].close()

  response, body = sync(fs.loop, get)
  check_range(response.get("ContentRange", ""), pinned, start, end)
  etag = response.get("ETag")
  if etag and etag != pinned.etag:
    raise Changed(f"its ETag is now {etag}, it was {pinned.etag} when opened")
  return body


def _gcs(fs: Any, path: str, pinned: Pinned, start: int, end: int) -> bytes:
  from fsspec.asyn import sync

  url = fs.url(path, generation=pinned.generation)
  headers, body = sync(fs.loop, fs._call, "GET", url, headers={"Range": f"bytes={start}-{end - 1}"})
  check_range(headers.get("Content-Range", ""), pinned, start, end)
  generation = headers.get("x-goog-generation")
  if generation and generation != pinned.generation:
    raise Changed(f"its generation is now {generation}, it was {pinned.generation}")
  return body


def check_range(content_range: str, pinned: Pinned, start: int, end: int) -> None:
  """An answer names exactly the bytes asked for, of an object of the opened size."""
  named = answers.content_range(content_range)
  if named is None:
    return  # a store that does not say (the body's length is checked by the caller)
  first, last, total = named
  if total != pinned.size:
    raise Changed(f"its size is now {total} bytes, it was {pinned.size} when opened")
  if (first, last) != (start, min(end, total) - 1):
    raise RangeNotSupported(f"asked for bytes {start}-{end - 1}, the store sent {first}-{last}")
