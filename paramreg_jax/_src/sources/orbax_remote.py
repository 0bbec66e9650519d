"""An orbax checkpoint in a bucket (``gs://``, ``s3://``): the tensorstore kvstore that reaches
it, and its arrays' metadata read without orbax's reader.

orbax 0.12 builds its tensorstore specs for local paths and ``gs://`` only (an ``s3://`` path
becomes a ``file`` path), and its metadata reader opens arrays through those specs. So for a
URL the saved tree comes from ``_METADATA`` (orbax's own JSON, read through ``epath``) and each
array's shape, dtype and chunks from its tensorstore, opened through tensorstore's ``gcs`` or
``s3`` driver. Endpoints come from the environment, as for orbax and the fsspec stores:
``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``) for S3, ``TENSORSTORE_GCS_HTTP_URL`` for GCS.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from paramreg_jax._src import errors

ARRAY_TYPES = ("jax.Array", "np.ndarray", "scalar")


def _normal_url(url: str) -> str:
  url = url.strip().rstrip("/")
  return url if "://" in url else f"http://{url}"


def _check_gcs_endpoint(url: str) -> None:
  """gcsfs (the listing) reads ``STORAGE_EMULATOR_HOST``, tensorstore (the arrays) reads
  ``TENSORSTORE_GCS_HTTP_URL``: refuse a setting that would send them to different servers."""
  emulator = os.environ.get("STORAGE_EMULATOR_HOST")
  tensorstore = os.environ.get("TENSORSTORE_GCS_HTTP_URL")
  if emulator and (not tensorstore or _normal_url(emulator) != _normal_url(tensorstore)):
    raise errors.StoreError(
      f"{url}: STORAGE_EMULATOR_HOST={emulator} sends the listing to another server, but "
      f"tensorstore, which reads the arrays, reads TENSORSTORE_GCS_HTTP_URL (now "
      f"{tensorstore or 'unset: storage.googleapis.com'}). Nothing was read: set "
      f"TENSORSTORE_GCS_HTTP_URL={_normal_url(emulator)} as well"
    )


# where s3fs/gcsfs (the listing) and tensorstore (the arrays) both find credentials
CREDENTIALS = {
  "s3": "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or AWS_PROFILE",
  "gs": "GOOGLE_APPLICATION_CREDENTIALS, or `gcloud auth application-default login`",
}


def _is_denied(e: BaseException) -> bool:
  text = str(e)
  return (
    isinstance(e, PermissionError)
    or getattr(e, "code", None) in (401, 403)
    or text.startswith("Forbidden")
    or "denied" in text.lower()
  )


def check_listing(path: Any) -> None:
  """Lists the bucket directory ``path`` once, so that a denied request is not taken for a
  missing directory (fsspec's ``isdir`` answers False to both)."""
  try:
    next(iter(path.iterdir()), None)
  except FileNotFoundError:
    return  # the caller's "no such directory"
  except Exception as e:  # s3fs/gcsfs raise many types
    detail = str(e).strip().replace("\n", ": ")
    if _is_denied(e):
      hint = CREDENTIALS[str(path).split("://", 1)[0]]
      raise errors.StoreError(
        f"{path}: the store denied listing the checkpoint ({detail}); not retried: check the "
        f"credentials read here ({hint})"
      ) from None
    raise errors.StoreError(
      f"{path}: cannot list the checkpoint ({type(e).__name__}: {detail})"
    ) from e


def kvstore(url: str) -> dict[str, Any]:
  """The tensorstore kvstore spec of the ``gs://`` or ``s3://`` directory ``url``.

  Examples:
    >>> kvstore("gs://bucket/runs/ckpt")
    {'driver': 'gcs', 'bucket': 'bucket', 'path': 'runs/ckpt/'}
  """
  scheme, rest = str(url).split("://", 1)
  bucket, _, prefix = rest.partition("/")
  prefix = prefix.strip("/")
  spec: dict[str, Any] = {"bucket": bucket, "path": f"{prefix}/" if prefix else ""}
  if scheme == "gs":
    _check_gcs_endpoint(str(url))
    return {"driver": "gcs", **spec}
  endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
  if endpoint:
    spec["endpoint"] = _normal_url(endpoint)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
      spec["aws_region"] = region
  if os.environ.get("AWS_ACCESS_KEY_ID"):  # skip the chain's profile-file probes (and logs)
    spec["aws_credentials"] = {"type": "environment"}
  return {"driver": "s3", **spec}


def saved_arrays(data: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
  """``[(jax key path, orbax array name)]`` of the arrays ``_METADATA`` lists."""
  tree = data.get("tree_metadata")
  out = []
  for entry in (tree or {}).values() if isinstance(tree, dict) else ():
    value = entry.get("value_metadata") if isinstance(entry, dict) else None
    keys = entry.get("key_metadata") if isinstance(entry, dict) else None
    if not isinstance(value, dict) or not isinstance(keys, list) or value.get("skip_deserialize"):
      continue
    if str(value.get("value_type")) not in ARRAY_TYPES:
      continue
    path = tuple(
      jax.tree_util.SequenceKey(int(k["key"]))
      if k.get("key_type") == 1
      else jax.tree_util.DictKey(k["key"])
      for k in keys
    )
    out.append((path, ".".join(str(k["key"]) for k in keys)))
  return out


def open_arrays(specs: dict[str, dict[str, Any]], context: Any, where: str) -> dict[str, Any]:
  """The opened tensorstores of ``{array name: spec}``, opened concurrently."""
  import tensorstore as ts

  futures = {n: ts.open(spec, context=context, open=True, read=True) for n, spec in specs.items()}
  stores = {}
  for name, fut in futures.items():
    try:
      stores[name] = fut.result()
    except Exception as e:  # tensorstore raises ValueError/RuntimeError variants
      raise errors.StoreError(
        f"{where}: cannot open its array {name!r}: {e}. Nothing was read: check the endpoint "
        "and credentials tensorstore reads (docs: Restore from the Hub or a bucket)"
      ) from e
  return stores


def versions(url: str) -> dict[str, str]:
  """``{object: version}`` of every object under the bucket directory ``url``: its GCS
  generation, or its S3 ETag (with the size and modification time: an ETag alone repeats when
  the same bytes are written again, which is harmless)."""
  import fsspec

  fs, root = fsspec.core.url_to_fs(str(url))
  found = fs.find(root, detail=True)
  fs.invalidate_cache(root)  # the next listing asks the store, not the cache
  return {
    name[len(root) :]: str(info.get("generation") or (info.get("ETag"), info.get("LastModified")))
    for name, info in found.items()
  }


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
  """The objects written, replaced or deleted between two :func:`versions`."""
  return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def describe(store: Any) -> tuple[tuple[int, ...], np.dtype, tuple[int, ...] | None]:
  """``(shape, dtype, storage chunk shape)`` of an opened tensorstore."""
  chunk = store.chunk_layout.read_chunk.shape
  return tuple(store.shape), np.dtype(store.dtype.numpy_dtype), tuple(chunk) if chunk else None
