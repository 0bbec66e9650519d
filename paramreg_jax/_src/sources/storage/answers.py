"""What a range request can answer, for every transport (the standard-library reader, fsspec,
bucket reads of a pinned version, the Hub): the outcomes as exceptions, which the remote file
turns into retries (after the backoff of :func:`attempts`) or library errors, and the
``Content-Range`` an answer names its bytes by.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator


def attempts(retries: int) -> Iterator[int]:
  """The attempts ``0 .. retries`` of a request whose transient failures are retried: before
  each retry, a sleep that doubles from 0.05 s up to 2 s (exponential backoff)."""
  delay = 0.05
  for attempt in range(retries + 1):
    if attempt:
      time.sleep(delay)
      delay = min(2 * delay, 2.0)
    yield attempt


class RangeNotSupported(Exception):
  """The server does not answer range requests as asked (a permanent failure)."""


class Changed(Exception):
  """The object at the URL is not the one that was opened."""


class Transient(Exception):
  """A failure worth retrying (a body cut short, HTTP 5xx or 429)."""


class TooLarge(Exception):
  """A document is over its cap."""


class Refused(Exception):
  """A response refused for what it is, not for a passing fault: a redirect from https to
  plain http, a range answered with more bytes than asked for (a permanent failure)."""


_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


def content_range(value: str | None) -> tuple[int, int, int] | None:
  """The first and last byte and the object's size a ``Content-Range`` header names
  (``bytes 0-99/1000``), or None when it names none."""
  m = _CONTENT_RANGE.fullmatch((value or "").strip())
  return None if m is None else (int(m.group(1)), int(m.group(2)), int(m.group(3)))
