"""What a chat network's module gives the machinery: how it reads, opens conversations and sends.

A network module (``channels.matrix``) subclasses :class:`Network`; everything
else (identities, policies, pairing, inbound Messages with the read position,
the outbox, retries, leadership) is the machinery's, so the next network is
one module plus its tests.
"""

from __future__ import annotations

import abc

from agent_gateway import errors


class SendFailed(errors.GatewayError):
    """An attempt to send failed; the message says why (never a secret) and it is retried."""


class Network(abc.ABC):
    """One network's client, connected while this process leads its channel."""

    # The channel's name: the <channel> of its identities, its settings table.
    name: str
    # pairing, allowlist or open (channels.inbound).
    policy: str

    def __init__(self) -> None:
        # None until the first read; then whether the last read or send reached the server.
        self.reachable: bool | None = None
        self.problem: str | None = None

    @abc.abstractmethod
    async def read(self) -> None:
        """Connect and take what people write (through ``channels.inbound.record``) until cancelled.

        Outages of the server are waited out here, with :attr:`reachable` false meanwhile."""

    @abc.abstractmethod
    async def open_conversation(self, address: str) -> str:
        """Open a conversation with ``address`` (Matrix: a direct room, the person invited) and
        return its id; raises :class:`SendFailed`."""

    @abc.abstractmethod
    async def send(self, conversation: str, kind: str, text: str, transaction_id: str) -> None:
        """Send ``text`` in ``conversation`` (``kind`` message or notice), at most once per
        ``transaction_id`` on the network's side where it allows; raises :class:`SendFailed`."""

    async def close(self) -> None:
        """Release the connection (the read has been cancelled)."""
