"""Which network addresses are public: the rule that the webhooks' sender and the sandbox's egress
proxy both apply to every address a name resolves to, before they connect to it."""

from __future__ import annotations

import ipaddress

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def is_public(address: str | Address) -> bool:
    """Whether ``address`` is a public unicast address. An IPv4-mapped IPv6 address is judged as the
    IPv4 address it carries (``::ffff:127.0.0.1`` is loopback); a textual one may name its zone
    (``fe80::1%eth0``), as ``getaddrinfo`` writes link-local addresses."""
    if isinstance(address, str):
        address = ipaddress.ip_address(address.split("%", 1)[0])
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        address = mapped
    return address.is_global and not address.is_multicast
