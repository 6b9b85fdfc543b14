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
- No proxy from the environment, no cookies, TLS certificates verified. A
  connection is kept for reuse in a pool of its endpoint's origin (scheme,
  host name, port) alone: pools key connections by the address connected to,
  so one shared by two names on one address would let the second reuse a
  connection whose certificate was checked for the first, and never check its own.
- Whatever goes wrong with an attempt, even building its request (a URL the
  HTTP client cannot use), is that attempt's failure, said in one line: never
  an exception that would stop the deliverer.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket

import httpx

from agent_gateway import errors
from agent_gateway.addresses import is_public

logger = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 64 * 1024
# Connections kept open per origin: a deliverer sends to one endpoint one attempt at a time.
KEEPALIVE_PER_ORIGIN = 2


class EndpointRefused(errors.GatewayError):
    """The endpoint's address is not one the gateway sends to; the message says why."""


class Sender:
    """POSTs deliveries; a connection pool per endpoint origin for the deliverer's life."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        # One context for every pool (loading the trusted certificates is what a context costs): the
        # CAs httpx trusts by default, never ones the environment names (no proxy from it either).
        self._verify = httpx.create_ssl_context(trust_env=False)
        self._clients: dict[tuple[str, str, int], httpx.AsyncClient] = {}

    def _client(self, url: httpx.URL) -> httpx.AsyncClient:
        """The pool of ``url``'s origin: its connections were verified for this host name only."""
        origin = (url.scheme, url.raw_host.decode("ascii"), url.port or (443 if url.scheme == "https" else 80))
        client = self._clients.get(origin)
        if client is None:
            client = self._clients[origin] = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s),
                follow_redirects=False,
                trust_env=False,
                verify=self._verify,
                limits=httpx.Limits(max_keepalive_connections=KEEPALIVE_PER_ORIGIN, keepalive_expiry=30.0),
            )
        return client

    async def post(self, url: str, body: bytes, headers: dict[str, str], *, allow_private: bool) -> str | None:
        """Send one attempt; None when the endpoint answered 2xx, else why not (one line)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._post(httpx.URL(url), body, headers, allow_private)
        except httpx.InvalidURL as exc:  # not an HTTPError: the URL is refused before any request
            return f"invalid URL: {exc}"
        except TimeoutError:
            return f"no answer within {self.timeout_s:g}s"
        except EndpointRefused as exc:
            return str(exc)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        except OSError as exc:
            return f"cannot connect: {exc.strerror or exc}"
        except Exception as exc:
            # Unforeseen (a bug, a library's surprise): still this attempt's failure, retried as any
            # other, and its traceback logged; never the deliverer's end, which would leave the
            # delivery claimed again and again with no outcome recorded.
            logger.warning("webhook attempt failed unexpectedly", exc_info=exc, extra={"action": "deliver_webhook"})
            return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

    async def _post(self, url: httpx.URL, body: bytes, headers: dict[str, str], allow_private: bool) -> str | None:
        address = await self._resolve(url, allow_private)
        client = self._client(url)
        request = client.build_request(
            "POST",
            url.copy_with(host=str(address)),
            content=body,
            headers={**headers, "host": url.netloc.decode("ascii")},
            # The name as the Host header carries it (IDNA-encoded): the one the certificate must name.
            extensions={"sni_hostname": url.raw_host.decode("ascii")} if url.scheme == "https" else None,
        )
        response = await client.send(request, stream=True)
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
        # The IDNA-encoded name, as in the Host header: url.host is Unicode, which getaddrinfo would
        # encode by the older IDNA rules, another name for some (straße.de).
        host = url.raw_host.decode("ascii")
        try:
            found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
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
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(client.aclose() for client in clients))
