"""The listening sockets ``serve`` binds before forking its HTTP processes."""

from __future__ import annotations

import socket

from agent_gateway import serving
from agent_gateway.config import Address


def test_accepted_connections_do_not_wait_for_delayed_acks() -> None:
    # Without TCP_NODELAY every response written in two parts waited ~40 ms (Nagle + delayed ACK).
    listener = serving.listen(Address("127.0.0.1", 0), "public_listen")
    try:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        with client, accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        listener.close()
