"""A ``signals.setup`` for the stream tests: an authentication scheme of the operator's.

It accepts ``Bearer test-<user id>`` (tests.messages.records.UserIdScheme) until a
file ``revoked-<user id>`` appears in ``$STREAM_TEST_REVOKED_DIR``: a credential the
gateway knows nothing about, which a stream must ask the scheme about again.
"""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import Request

from agent_gateway.auth import schemes
from agent_gateway.gateway import Gateway
from tests.messages.records import UserIdScheme


class RevocableScheme(UserIdScheme):
    async def authenticate(self, request: Request) -> schemes.Authenticated | None:
        result = await super().authenticate(request)
        if result is not None and (Path(os.environ["STREAM_TEST_REVOKED_DIR"]) / f"revoked-{result.user.id}").exists():
            return None
        return result


def setup(gateway: Gateway) -> None:
    gateway.auth_schemes.append(RevocableScheme())
