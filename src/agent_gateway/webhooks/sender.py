"""One attempt to POST a delivery, with the limits an outbound request from a server needs.

- A whole attempt (name lookup, connect, send, the answer's headers) is
  bounded by the timeout; at most :data:`MAX_RESPONSE_BYTES` of the answer is
  read, and only its status matters.
- Redirects are never followed: a 3xx is a failed attempt.
- SSRF: the endpoint's name is resolved here and every address it resolves
  to must be public (not loopback, link-local, private, shared, reserved,
  multicast or unspecified, IPv4-mapped ones included) unless the endpoint has
  ``allow_private``. The request then connects to the very address that was
  checked (the Host header and TLS name stay the URL's), so a name that
  resolves differently a moment later (DNS rebinding) cannot redirect it.
- No proxy from the environment, no cookies, TLS certificates verified.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import httpx

from agent_gateway import errors
from agent_gateway.addresses import is_public

MAX_RESPONSE_BYTES = 64 * 1024


class EndpointRefused(errors.GatewayError):
    """The endpoint's address is not one the gateway sends to; the message says why."""


class Sender:
    """POSTs deliveries; one connection pool for the deliverer's life."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s),
            follow_redirects=False,
            trust_env=False,
            limits=httpx.Limits(max_keepalive_connections=16, keepalive_expiry=30.0),
        )

    async def post(self, url: str, body: bytes, headers: dict[str, str], *, allow_private: bool) -> str | None:
        """Send one attempt; None when the endpoint answered 2xx, else why not (one line)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._post(httpx.URL(url), body, headers, allow_private)
        except TimeoutError:
            return f"no answer within {self.timeout_s:g}s"
        except EndpointRefused as exc:
            return str(exc)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        except OSError as exc:
            return f"cannot connect: {exc.strerror or exc}"

    async def _post(self, url: httpx.URL, body: bytes, headers: dict[str, str], allow_private: bool) -> str | None:
        address = await self._resolve(url, allow_private)
        request = self._client.build_request(
            "POST",
            url.copy_with(host=str(address)),
            content=body,
            headers={**headers, "host": url.netloc.decode("ascii")},
            extensions={"sni_hostname": url.host} if url.scheme == "https" else None,
        )
        response = await self._client.send(request, stream=True)
        try:
            read = 0
            async for chunk in response.aiter_raw():
                read += len(chunk)
                if read >= MAX_RESPONSE_BYTES:  # nothing more of it matters; the connection is dropped
                    break
        finally:
            await response.aclose()
        if 200 <= response.status_code < 300:
            return None
        if response.is_redirect:
            return f"HTTP {response.status_code}: redirects are not followed"
        return f"HTTP {response.status_code}"

    async def _resolve(self, url: httpx.URL, allow_private: bool) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        """The address to connect to: the first that ``url``'s host resolves to, all of them checked."""
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            found = await asyncio.get_running_loop().getaddrinfo(url.host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise EndpointRefused(f"cannot resolve {url.host}: {exc.strerror}") from None
        addresses = [ipaddress.ip_address(info[4][0]) for info in found]
        if not addresses:
            raise EndpointRefused(f"cannot resolve {url.host}")
        if not allow_private:
            for address in addresses:
                if not is_public(address):
                    raise EndpointRefused(
                        f"refused: {url.host} resolves to {address}, which is not a public address "
                        "(set allow_private = true for this endpoint to send there)"
                    )
        return addresses[0]

    async def close(self) -> None:
        await self._client.aclose()
