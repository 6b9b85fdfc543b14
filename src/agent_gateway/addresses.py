"""Which network addresses are public: the rule that the webhooks' sender and the sandbox's egress
proxy both apply to every address a name resolves to, before they connect to it."""

from __future__ import annotations

import ipaddress

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


# IPv6 prefixes whose addresses carry an IPv4 address that a translator or relay on the way reaches
# instead: NAT64's well-known prefix (RFC 6052) and the deprecated IPv4-compatible form (the IPv4
# address in the last 32 bits; 6to4's, RFC 3056, in bits 16-48, ``sixtofour``). Each is judged as
# the IPv4 address it carries: where NAT64 is deployed, 64:ff9b::a00:1 is 10.0.0.1.
_CARRY_LAST_32_BITS = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("::/96"))
# NAT64's local-use prefix (RFC 8215): its translation is the local network's own choice.
_LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")


def is_public(address: str | Address) -> bool:
    """Whether ``address`` is a public unicast address. An IPv6 address that carries an IPv4
    address (IPv4-mapped, NAT64, 6to4, IPv4-compatible) is judged as the IPv4 address it carries
    (``::ffff:127.0.0.1`` and ``64:ff9b::7f00:1`` are loopback); one of NAT64's local-use prefix is
    not public. A textual one may name its zone (``fe80::1%eth0``), as ``getaddrinfo`` writes
    link-local addresses."""
    if isinstance(address, str):
        address = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address):
        if address in _LOCAL_NAT64:
            return False
        carried = address.ipv4_mapped or address.sixtofour
        if carried is None and any(address in prefix for prefix in _CARRY_LAST_32_BITS):
            carried = ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
        if carried is not None:
            address = carried
    return address.is_global and not address.is_multicast
