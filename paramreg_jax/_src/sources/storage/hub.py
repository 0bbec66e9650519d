"""``hf://`` URLs: a Hugging Face Hub repository at one commit, read over HTTP.

``hf://org/model[@revision][/path]`` is resolved once, when the source is opened: the revision
(a branch, a tag or a commit; ``main`` by default) becomes the commit it points to, and every
file (the weights, the index, ``config.json``, the tokenizer) is then read from that commit's
``resolve`` URL by the same range reader as any HTTP URL. A push to the branch while a restore
runs changes nothing it reads, and ``config.json`` is the one committed with the weights.

The Hub's address is ``HF_ENDPOINT`` (``https://huggingface.co`` by default) and the token is
the one ``huggingface_hub`` finds (``HF_TOKEN``, or ``hf auth login``), or
``storage_options={"token": ...}``. Every request, the revision lookup included, goes through
the range reader's one credential policy (``http_ranges.follow``: the token only to the
Hub's own origin, never over a downgrade to plain http) and one deadline. The repository id,
the revision and the path are checked by the Hub's rules before anything is asked: no dot
segments, encoded or not, ever reach a URL built here.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import urllib.parse
from typing import Any

from paramreg_jax._src import errors
from paramreg_jax._src.sources.storage import answers
from paramreg_jax._src.sources.storage import http_ranges
from paramreg_jax._src.sources.storage.answers import Refused
from paramreg_jax._src.sources.storage.answers import TooLarge
from paramreg_jax._src.sources.storage.answers import Transient

DEFAULT_ENDPOINT = "https://huggingface.co"
_TYPES = {"datasets": "datasets", "spaces": "spaces"}
# the Hub's rule for an owner or a repository name: letters, digits, '-', '_' and '.', not
# starting or ending with '-' or '.', no '--' or '..', at most 96 characters
_NAME = re.compile(r"^(?!.*(--|\.\.))[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_REVISION_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{|//|^/|/$|\.lock$|^\.|/\.")
_ANSWER_CAP = 1 << 20  # a revision's JSON is a few KB


def suggest_for_missing(path: Any, call: str = "prj.SafetensorsSource") -> str:
  """What to say of a local path that does not exist: ``"; a Hugging Face Hub id? ..."``
  (``call('hf://owner/name')`` reads it from the Hub) when it is ``owner/name`` by the Hub's
  own rule for each, else ``""``."""
  parts = str(path).split("/")
  if len(parts) == 2 and all(_NAME.match(p) for p in parts) and not os.path.exists(path):
    return f"; a Hugging Face Hub id? {call}('hf://{path}') reads it from the Hub"
  return ""


def split(url: str) -> tuple[str, str, str, str]:
  """``(repo_type, repo_id, revision, path)`` of ``hf://[datasets/]org/name[@rev][/path]``.

  Examples:
    >>> from paramreg_jax._src.sources.storage.hub import split
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
  for part, what in ((parts[0], "owner"), (name, "repository name")):
    if not _NAME.match(part):
      raise errors.StoreError(
        f"{url}: {part!r} is not a Hub {what} (letters, digits, '-', '_' and '.', not "
        "starting or ending with '-' or '.', no '--' or '..'); nothing was requested"
      )
  if _REVISION_FORBIDDEN.search(revision) or revision.endswith("."):
    raise errors.StoreError(
      f"{url}: {revision!r} is not a revision the Hub can name (a branch, tag or commit: no "
      "'..', no segment starting with '.', no spaces or ~^:?*[\\); nothing was requested"
    )
  path = "/".join(parts[2:])
  if _dot_segments(path):
    raise errors.StoreError(
      f"{url}: the path {path!r} has '.' or '..' segments (percent-encoded or not), which "
      "would leave the repository; nothing was requested"
    )
  return kind, f"{parts[0]}/{name}", revision, path


def _dot_segments(path: str) -> bool:
  """Whether ``path``, decoded up to four times, has an empty, ``.`` or ``..`` segment."""
  text = path
  for _ in range(5):
    if path and any(seg in ("", ".", "..") or "\\" in seg for seg in text.split("/")):
      return True
    text = urllib.parse.unquote(text)
  return False


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
  if not isinstance(commit, str) or not _COMMIT.match(commit):
    raise errors.SourceIOError(
      f"{url}: the Hub's answer for {api} names no commit (a 40-hex sha): {commit!r:.60}"
    )
  prefix = "" if kind == "models" else f"{kind}/"
  root = f"{endpoint}/{prefix}{repo}/resolve/{commit}"
  return f"{root}/{path}".rstrip("/"), {**rest, "headers": headers}, commit


class _Status(Exception):
  """A refusal the Hub answered, with its status and ``X-Error-Code``."""

  def __init__(self, status: int, code: str):
    super().__init__(f"HTTP {status}")
    self.status, self.code = status, code


def _get_json(
  url: str, api: str, headers: dict[str, str], timeout: float, retries: int
) -> dict[str, Any]:
  """The Hub's JSON answer; 5xx, 429, time-outs and dropped connections are retried with
  backoff."""
  for attempt in answers.attempts(retries):
    try:
      return _ask(url, api, headers, timeout)
    except (Transient, OSError, http.client.HTTPException) as e:  # a garbled answer too
      if attempt == retries:
        kind = "timed out" if isinstance(e, TimeoutError) else f"failed ({e})"
        raise errors.SourceIOError(
          f"{url}: asking the Hub for the commit ({api}) {kind} after {attempt + 1} "
          f"attempt(s) (timeout {timeout:g} s)"
        ) from None
  raise errors.SourceIOError(f"{url}: no attempt was made")


def _ask(url: str, api: str, headers: dict[str, str], timeout: float) -> dict[str, Any]:
  """One request; a permanent refusal is a library error, a transient one is raised as is."""

  def judge(status: int, reason: str, answer: Any) -> bool:
    if status == 429 or status >= 500:
      raise Transient(f"HTTP {status} {reason}")
    if status != 200:
      raise _Status(status, answer.get("X-Error-Code", "") or "")
    return True

  try:
    body = http_ranges.get(
      api, headers, judge, timeout=timeout, deadline_seconds=timeout, cap=_ANSWER_CAP
    )
  except _Status as e:
    raise _refusal(url, api, e.status, e.code) from None
  except Refused as e:
    raise errors.SourceIOError(f"{url}: asking the Hub for the commit: {e}") from None
  except TooLarge:
    raise errors.SourceIOError(
      f"{url}: the Hub's answer for {api} is larger than {_ANSWER_CAP} bytes; refused while "
      "it streamed"
    ) from None
  try:
    info = json.loads(body)
  except ValueError as e:
    raise errors.SourceIOError(f"{url}: the Hub's answer is not JSON ({e})") from None
  if not isinstance(info, dict):
    raise errors.SourceIOError(f"{url}: the Hub's answer for {api} is not a JSON object")
  return info


def _refusal(url: str, api: str, status: int, code: str) -> errors.ParamRegError:
  if status == 404 and code == "RevisionNotFound":
    return errors.MissingShardError(
      f"{url}: the repository has no revision {split(url)[2]!r} (a branch, tag or commit)"
    )
  if status in (401, 404) and code in ("RepoNotFound", ""):
    return errors.MissingShardError(
      f"{url}: no such repository, or it is private and the token cannot see it "
      "(HF_TOKEN, or `hf auth login`)"
    )
  if status in (401, 403):
    return errors.SourceIOError(
      f"{url}: the Hub denied access (HTTP {status}{', ' + code if code else ''}): a gated "
      "or private repository needs a token with access (HF_TOKEN, or `hf auth login`), and "
      "a gated one its conditions accepted on its page"
    )
  return errors.SourceIOError(f"{url}: {api} answered HTTP {status}")
