"""``hf://`` URLs: a Hugging Face Hub repository at one commit, read over HTTP.

``hf://org/model[@revision][/path]`` is resolved once, when the source is opened: the revision
(a branch, a tag or a commit; ``main`` by default) becomes the commit it points to, and every
file (the weights, the index, ``config.json``, the tokenizer) is then read from that commit's
``resolve`` URL by the same range reader as any HTTP URL. A push to the branch while a restore
runs changes nothing it reads, and ``config.json`` is the one committed with the weights.

The Hub's address is ``HF_ENDPOINT`` (``https://huggingface.co`` by default) and the token is
the one ``huggingface_hub`` finds (``HF_TOKEN``, or ``hf auth login``), or
``storage_options={"token": ...}``.
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from typing import Any

from paramreg_jax._src import errors

DEFAULT_ENDPOINT = "https://huggingface.co"
_TYPES = {"datasets": "datasets", "spaces": "spaces"}


def split(url: str) -> tuple[str, str, str, str]:
  """``(repo_type, repo_id, revision, path)`` of ``hf://[datasets/]org/name[@rev][/path]``.

  Examples:
    >>> from paramreg_jax._src.sources.hub import split
    >>> split("hf://org/model@v1.0/weights/model.safetensors")
    ('models', 'org/model', 'v1.0', 'weights/model.safetensors')
    >>> split("hf://datasets/org/data")
    ('datasets', 'org/data', 'main', '')
  """
  rest = url.split("://", 1)[1].strip("/")
  parts = rest.split("/")
  kind = "models"
  if parts and parts[0] in _TYPES:
    kind, parts = _TYPES[parts[0]], parts[1:]
  if len(parts) < 2 or not parts[0] or not parts[1]:
    raise errors.StoreError(
      f"{url}: an hf:// URL names a repository as hf://org/name[@revision][/path], "
      "e.g. hf://sentence-transformers/all-MiniLM-L6-v2"
    )
  name, _, revision = parts[1].partition("@")
  revision = urllib.parse.unquote(revision) or "main"
  return kind, f"{parts[0]}/{name}", revision, "/".join(parts[2:])


def _settings(options: dict[str, Any] | None) -> tuple[str, str | None, dict[str, Any]]:
  """``(endpoint, token, the other storage options)``."""
  rest = dict(options or {})
  token = rest.pop("token", None)
  endpoint = rest.pop("endpoint", None) or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
  if token is None:
    token = os.environ.get("HF_TOKEN")
  if token is None:
    try:
      from huggingface_hub import get_token

      token = get_token()
    except ImportError:
      token = None
  return endpoint.rstrip("/"), token, rest


def pin(
  url: str, options: dict[str, Any] | None, timeout: float, retries: int = 3
) -> tuple[str, dict, str]:
  """``(https URL of url's path at its commit, storage options for it, the commit)``.

  Raises:
    MissingShardError: the repository or the revision does not exist (or is not visible to
      the token).
    SourceIOError: the Hub denied the request (a gated or private repository and no token), or
      could not be reached.
  """
  kind, repo, revision, path = split(url)
  endpoint, token, rest = _settings(options)
  headers = dict(rest.pop("headers", {}) or {})
  if token:
    headers["Authorization"] = f"Bearer {token}"
  api = f"{endpoint}/api/{kind}/{repo}/revision/{urllib.parse.quote(revision, safe='')}"
  info = _get_json(url, api, headers, timeout, retries)
  commit = info.get("sha")
  if not isinstance(commit, str) or not commit:
    raise errors.SourceIOError(f"{url}: the Hub's answer for {api} names no commit (sha)")
  prefix = "" if kind == "models" else f"{kind}/"
  root = f"{endpoint}/{prefix}{repo}/resolve/{commit}"
  return f"{root}/{path}".rstrip("/"), {**rest, "headers": headers}, commit


def _get_json(
  url: str, api: str, headers: dict[str, str], timeout: float, retries: int
) -> dict[str, Any]:
  """The Hub's JSON answer; 5xx, 429 and dropped connections are retried with backoff."""
  import urllib.error

  delay = 0.05
  for attempt in range(retries + 1):
    try:
      return _ask(url, api, headers, timeout)
    except urllib.error.HTTPError as e:
      if not (e.code == 429 or e.code >= 500) or attempt == retries:
        raise errors.SourceIOError(
          f"{url}: {api} answered HTTP {e.code} after {attempt + 1} attempt(s)"
        ) from None
    except urllib.error.URLError as e:
      if attempt == retries:
        raise errors.SourceIOError(
          f"{url}: could not ask the Hub for the commit after {attempt + 1} attempt(s) ({e.reason})"
        ) from None
    time.sleep(delay)
    delay = min(2 * delay, 2.0)
  raise errors.SourceIOError(f"{url}: no attempt was made")


def _ask(url: str, api: str, headers: dict[str, str], timeout: float) -> dict[str, Any]:
  """One request; a permanent refusal is a library error, a transient one is raised as is."""
  import urllib.error
  import urllib.request

  request = urllib.request.Request(api, headers=headers)
  try:
    with urllib.request.urlopen(request, timeout=timeout) as r:
      return json.loads(r.read(1 << 20))
  except urllib.error.HTTPError as e:
    if e.code == 429 or e.code >= 500:
      raise
    code = e.headers.get("X-Error-Code", "")
    if e.code == 404 and code == "RevisionNotFound":
      raise errors.MissingShardError(
        f"{url}: the repository has no revision {split(url)[2]!r} (a branch, tag or commit)"
      ) from None
    if e.code in (401, 404) and code in ("RepoNotFound", ""):
      raise errors.MissingShardError(
        f"{url}: no such repository, or it is private and the token cannot see it "
        "(HF_TOKEN, or `hf auth login`)"
      ) from None
    if e.code in (401, 403):
      raise errors.SourceIOError(
        f"{url}: the Hub denied access (HTTP {e.code}{', ' + code if code else ''}): a gated "
        "or private repository needs a token with access (HF_TOKEN, or `hf auth login`), and "
        "a gated one its conditions accepted on its page"
      ) from None
    raise errors.SourceIOError(f"{url}: {api} answered HTTP {e.code}") from None
  except ValueError as e:
    raise errors.SourceIOError(f"{url}: the Hub's answer is not JSON ({e})") from None
