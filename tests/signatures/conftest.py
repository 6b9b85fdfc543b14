from __future__ import annotations

import pytest

from agent_gateway.gateway import Gateway
from agent_gateway.users import service as users

from tests.signatures.helpers import BearerTestScheme


@pytest.fixture
async def bearer(gateway: Gateway) -> dict[str, str]:
    """Headers of an admitted User, accepted by a test scheme registered on the gateway."""
    gateway.auth_schemes.append(BearerTestScheme(gateway.store))
    async with gateway.store.transaction() as conn:
        user = await users.admit(conn)
    return {"Authorization": f"Bearer test-{user.id}"}
