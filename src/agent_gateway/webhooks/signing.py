"""Standard Webhooks signatures: the headers that let a receiver verify a delivery.

The scheme (https://www.standardwebhooks.com): ``webhook-signature`` is
``v1,`` and the base64 HMAC-SHA256, keyed with the secret's bytes, of
``<webhook-id>.<webhook-timestamp>.<body>``; the timestamp is the attempt's, in
whole seconds since the epoch, so a receiver can refuse a replayed attempt,
while the id is the delivery's, the same on every attempt, so it can refuse a
repeated one. The signing is the ``standardwebhooks`` package's own (no
dependencies): the very code receivers verify with.
"""

from __future__ import annotations

from datetime import UTC, datetime

from standardwebhooks.webhooks import Webhook

USER_AGENT = "agent-gateway-webhooks"


def headers(secret: str, message_id: str, at: datetime, body: bytes) -> dict[str, str]:
    """The headers of one attempt to deliver ``body`` as message ``message_id`` at ``at``."""
    at = datetime.fromtimestamp(int(at.timestamp()), UTC)
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": message_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign(message_id, at, body.decode()),
    }
