"""HTTP(S) requests through fsspec's aiohttp client: what ``RemoteFile`` and ``RemoteFolder``
use when the storage options hold more than ``headers`` (``client_kwargs``, an ``auth``...),
which the standard-library reader (``http_ranges.py``) could not honour. Same contract:
``on_head`` judges the response before its body is read.
"""

from __future__ import annotations

from typing import Any

from paramreg_jax._src.sources.storage import http_ranges
from paramreg_jax._src.sources.storage.answers import Refused
from paramreg_jax._src.sources.storage.answers import TooLarge
from paramreg_jax._src.sources.storage.answers import Transient
from paramreg_jax._src.sources.storage.http_ranges import OnHead


def get(
  fs: Any,
  url: str,
  headers: dict[str, str],
  on_head: OnHead,
  *,
  timeout: float,
  deadline_seconds: float,
  method: str = "GET",
  cap: int | None = None,
  ranged: bool = False,
) -> bytes:
  """``method url`` with the filesystem's headers and ``headers``, following redirects under
  the standard-library reader's credential policy (``http_ranges.follow``); the body (none
  for a HEAD, or when ``on_head`` says so), refused (``TooLarge``; ``Refused`` when
  ``ranged``) once it passes ``cap`` bytes while it streams."""
  from fsspec.asyn import sync

  async def fetch() -> bytes:
    import aiohttp

    session = await fs.set_session()
    kw = {k: v for k, v in fs.kwargs.items() if k not in ("headers", "timeout")}
    kw["timeout"] = aiohttp.ClientTimeout(
      total=deadline_seconds, sock_connect=timeout, sock_read=timeout
    )
    target, sent = fs.encode_url(url), {**fs.kwargs.get("headers", {}), **headers}
    call = session.head if method == "HEAD" else session.get
    for _ in range(http_ranges.MAX_REDIRECTS + 1):
      async with call(target, headers=sent, allow_redirects=False, **kw) as r:
        if r.status in http_ranges.REDIRECTS and r.headers.get("Location"):
          target, sent = http_ranges.follow(str(target), r.headers["Location"], sent)
          continue
        if not on_head(r.status, r.reason, r.headers) or method == "HEAD":
          return b""
        if cap is None:
          return await r.read()
        body = bytearray()
        async for chunk in r.content.iter_chunked(1 << 16):
          body += chunk
          if len(body) > cap:
            if ranged:
              raise Refused(f"the server sent more than the {cap} bytes asked for")
            raise TooLarge(f"more than {cap}")
        return bytes(body)
    raise Transient(f"{url}: more than {http_ranges.MAX_REDIRECTS} redirects")

  return sync(fs.loop, fetch)
