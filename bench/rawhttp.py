"""A minimal kept-alive HTTP/1.1 client over asyncio streams, for benchmarks that drive many requests.

httpx costs several milliseconds of CPU per request; on a two-core machine a
benchmark's client using it takes the CPU the gateway it measures needs. This
one sends a request and reads one ``Content-Length`` response on one
connection, nothing else: no redirects, no chunked bodies, no TLS, no pooling
(one :class:`Connection` per concurrent caller).
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlencode, urlsplit

import orjson


class Connection:
    """One kept-alive connection to ``base_url`` (``http://host:port``), one request at a time."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None) -> None:
        address = urlsplit(base_url)
        assert address.scheme == "http" and address.hostname and address.port, base_url
        self.host, self.port = address.hostname, address.port
        fixed = {"Host": f"{self.host}:{self.port}", **(headers or {})}
        self._headers = "".join(f"{name}: {value}\r\n" for name, value in fixed.items())
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._reader = self._writer = None

    async def get(self, path: str, params: dict[str, str] | None = None) -> tuple[int, Any]:
        """``GET path?params``: the status and the decoded JSON body."""
        return await self.request("GET", f"{path}?{urlencode(params)}" if params else path)

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        """``POST path`` with a JSON body: the status and the decoded JSON body."""
        return await self.request("POST", path, orjson.dumps(body))

    async def request(self, method: str, target: str, body: bytes | None = None) -> tuple[int, Any]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        head = f"{method} {target} HTTP/1.1\r\n{self._headers}"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self._writer.write(head.encode() + b"\r\n" + (body or b""))
        status_line, *lines = (await self._reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        length, closing = 0, False
        for line in lines:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and value.strip().lower() == "close":
                closing = True
            elif name == "transfer-encoding":
                raise ValueError(f"{method} {target}: a {value.strip()} response, which this client does not read")
        content = await self._reader.readexactly(length) if length else b""
        if closing:
            await self.close()
        return int(status_line.split(" ", 2)[1]), orjson.loads(content) if content else None
