"""Each endpoint is sent to on its own: one that never answers holds back its own deliveries only.
On both backends."""

from __future__ import annotations

import asyncio

from agent_gateway.store.engine import Store
from agent_gateway.webhooks.deliverer import Deliverer
from tests.webhooks import receiver as receivers
from tests.webhooks.receiver import Receiver
from tests.webhooks.test_deliverer_leases import policy, to, write_pending

# Far longer than the test: the held attempt ends when the test lets it, never by timing out.
NEVER_S = 3600.0


async def test_an_endpoint_that_never_answers_holds_back_no_other(store: Store, receiver: Receiver) -> None:
    with receivers.running() as silent:
        silent.hold.clear()  # it takes every request and never answers (until the test ends)
        sender = Deliverer(store, [to(silent), to(receiver)], policy(timeout_s=NEVER_S))
        await write_pending(store, silent.url, 3)
        sender.start()
        try:
            assert await asyncio.to_thread(silent.holding.wait, receivers.WAIT_S)
            # Written while the silent endpoint's attempt is open: sent at once all the same, in order.
            later = await write_pending(store, receiver.url, 3)
            got = await asyncio.to_thread(receiver.wait_for, 3)
            assert [r.id for r in got] == later
            assert silent.received == []  # still open: nothing waited for it to end
        finally:
            silent.hold.set()
            await sender.stop()
