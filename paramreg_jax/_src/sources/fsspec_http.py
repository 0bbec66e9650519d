"""HTTP(S) requests through fsspec's aiohttp client: what ``RemoteFile`` and ``RemoteFolder``
use when the storage options hold more than ``headers`` (``client_kwargs``, an ``auth``...),
which the standard-library reader (``http_ranges.py``) could not honour. Same contract:
``on_head`` judges the response before its body is read.
"""

from __future__ import annotations

from typing import Any

from paramreg_jax._src.sources.http_ranges import OnHead
from paramreg_jax._src.sources.pinning import TooLarge


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
) -> bytes:
  """``method url`` with the filesystem's headers and ``headers``, following redirects; the
  body (none for a HEAD, or when ``on_head`` says so), refused (``TooLarge``) once it passes
  ``cap`` bytes while it streams."""
  from fsspec.asyn import sync

  async def fetch() -> bytes:
    import aiohttp

    session = await fs.set_session()
    kw = {k: v for k, v in fs.kwargs.items() if k not in ("headers", "timeout")}
    kw["timeout"] = aiohttp.ClientTimeout(
      total=deadline_seconds, sock_connect=timeout, sock_read=timeout
    )
    sent = {**fs.kwargs.get("headers", {}), **headers}
    call = session.head if method == "HEAD" else session.get
    # a HEAD follows redirects too (the Hub answers resolve URLs with one to its storage)
    async with call(fs.encode_url(url), headers=sent, allow_redirects=True, **kw) as r:
      if not on_head(r.status, r.reason, r.headers) or method == "HEAD":
        return b""
      if cap is None:
        return await r.read()
      body = bytearray()
      async for chunk in r.content.iter_chunked(1 << 16):
        body += chunk
        if len(body) > cap:
          raise TooLarge(f"more than {cap}")
      return bytes(body)

  return sync(fs.loop, fetch)
