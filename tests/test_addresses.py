"""The one rule of which addresses are public (addresses.py), that webhooks and the sandbox share."""

from __future__ import annotations

import ipaddress

import pytest

from agent_gateway.addresses import is_public

NOT_PUBLIC = [
    "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0",
    "::1", "fe80::1", "fe80::1%eth0", "fc00::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "224.0.0.1", "ff02::1",
    # IPv6 carrying a private IPv4 address: NAT64 (RFC 6052), 6to4 (RFC 3056), IPv4-compatible;
    # and NAT64's local-use prefix (RFC 8215), whatever it carries.
    "64:ff9b::7f00:1", "64:ff9b::a00:1", "64:ff9b::a9fe:a9fe", "2002:7f00:1::", "2002:c0a8:101::1", "::a00:1",
    "::7f00:1", "64:ff9b:1::5db8:d822", "::",
]
PUBLIC = [
    "93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "::ffff:93.184.216.34",
    # The same forms carrying a public IPv4 address.
    "64:ff9b::5db8:d822", "2002:5db8:d822::1", "::5db8:d822",
]


@pytest.mark.parametrize("address", NOT_PUBLIC)
def test_non_public_addresses_are_not_public(address: str) -> None:
    assert not is_public(address)
    if "%" not in address:
        assert not is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_public(address: str) -> None:
    assert is_public(address) and is_public(ipaddress.ip_address(address))
