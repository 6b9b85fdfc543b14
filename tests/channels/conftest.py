"""The real Matrix homeserver (one Synapse per test session, tests/servers.py), the people's
client (matrix-nio, as the channel), and gateways serving the Matrix channel in process."""

from __future__ import annotations

import asyncio
import signal
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import nio
import pytest

from agent_gateway import config
from agent_gateway.gateway import Gateway
from agent_gateway.runtimes import echo
from agent_gateway.runtimes.failure import RunFailed
from agent_gateway.store.queries.runs import Run
from tests import servers
from tests.served import ServedGateway

# Every wait on the homeserver or the gateway has this ceiling; none is a fixed sleep.
CEILING_S = 180.0
T = TypeVar("T")


@pytest.fixture(scope="session")
def homeserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Homeserver]:
    """One Synapse for the session's Matrix tests (they share one xdist group, so one worker)."""
    with servers.required(servers.synapse, tmp_path_factory.mktemp("synapse"), "HOMESERVER") as server:
        yield server


@pytest.fixture
def running_homeserver(homeserver: servers.Homeserver) -> Iterator[servers.Homeserver]:
    """The session's homeserver, started again after a test that stopped it."""
    yield homeserver
    if not homeserver.running.alive():
        homeserver.restart()


async def until(check: Callable[[], Awaitable[T]], *, what: str = "the condition") -> T:
    """Poll ``check`` until it returns something truthy (a ceiling of minutes)."""
    deadline = time.monotonic() + CEILING_S
    while True:
        found = await check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {CEILING_S:g}s")
        await asyncio.sleep(0.1)


class Person:
    """Someone on the homeserver, with a client of their own (the library the channel uses)."""

    def __init__(self, homeserver: servers.Homeserver, token: tuple[str, str] | None = None) -> None:
        self.user_id, self.token = token or homeserver.register()
        self.client = nio.AsyncClient(homeserver.url, self.user_id)
        self.client.restore_login(self.user_id, "", self.token)

    async def direct_room(self, agent: str) -> str:
        answer = await self.client.room_create(is_direct=True, invite=[agent], preset=nio.RoomPreset.trusted_private_chat)
        assert isinstance(answer, nio.RoomCreateResponse), answer
        return answer.room_id

    async def group_room(self, *invited: str) -> str:
        answer = await self.client.room_create(invite=list(invited), preset=nio.RoomPreset.private_chat)
        assert isinstance(answer, nio.RoomCreateResponse), answer
        return answer.room_id

    async def members(self, room_id: str) -> list[str]:
        answer = await self.client.joined_members(room_id)
        return [] if isinstance(answer, nio.JoinedMembersError) else [member.user_id for member in answer.members]

    async def say(self, room_id: str, text: str, msgtype: str = "m.text", **content: Any) -> None:
        answer = await self.client.room_send(room_id, "m.room.message", {"msgtype": msgtype, "body": text, **content})
        assert isinstance(answer, nio.RoomSendResponse), answer

    async def join(self, room_id: str) -> None:
        answer = await self.client.join(room_id)
        assert isinstance(answer, nio.JoinResponse), answer

    async def invites(self) -> list[str]:
        answer = await self.client.sync(timeout=0, full_state=True)
        assert isinstance(answer, nio.SyncResponse), answer
        return list(answer.rooms.invite)

    async def heard(self, room_id: str, sender: str) -> list[tuple[str, str]]:
        """``(msgtype, body)`` of every message ``sender`` wrote in ``room_id``, oldest first."""
        answer = await self.client.room_messages(room_id, limit=1000)
        assert isinstance(answer, nio.RoomMessagesResponse), answer
        said = [
            (event.source["content"].get("msgtype"), event.source["content"].get("body"))
            for event in answer.chunk
            if isinstance(event, nio.RoomMessage) and event.sender == sender
        ]
        return list(reversed(said))

    async def close(self) -> None:
        await self.client.close()


class EchoRuntime:
    """The echo agent's answers (``runtimes.echo.answer``), posted in process."""

    def __init__(self) -> None:
        self.gateway: Gateway | None = None

    async def run(self, run: Run) -> None:
        found = echo.answer(run.prompt, run.session or "")
        if found is None or self.gateway is None:
            raise RunFailed("no User named")
        await self.gateway.messages.send(*found)


HANDLERS = {
    "message.received": {"template": "A message from user {{ userId }}:\n\n{{ text }}", "session": "user_{{ userId }}"}
}


@dataclasses.dataclass
class Deployment:
    """The agent's account and the gateways serving it (in process, each with the echo agent)."""

    agent: str
    settings: config.Settings
    started: list[Gateway] = dataclasses.field(default_factory=list)

    async def start(self, **changes: Any) -> Gateway:
        gateway = Gateway(dataclasses.replace(self.settings, **changes))
        runtime = EchoRuntime()
        runtime.gateway = gateway
        gateway.runtime = runtime
        await gateway.start()
        self.started.append(gateway)
        return gateway

    async def stop(self, gateway: Gateway) -> None:
        await gateway.stop()
        self.started.remove(gateway)


@pytest.fixture
async def deployment(
    running_homeserver: servers.Homeserver, settings: config.Settings, tmp_path: Path
) -> AsyncIterator[Deployment]:
    agent, token = running_homeserver.register()
    token_file = tmp_path / "matrix-token"
    token_file.write_text(f"  {token}\n")
    served = dataclasses.replace(
        settings, handlers=HANDLERS, matrix_homeserver=running_homeserver.url, matrix_user_id=agent,
        matrix_access_token_file=token_file,
    )
    found = Deployment(agent, served)
    yield found
    for gateway in reversed(found.started):
        await gateway.stop()


@pytest.fixture
async def people(running_homeserver: servers.Homeserver) -> AsyncIterator[Callable[[], Person]]:
    made: list[Person] = []

    def make() -> Person:
        made.append(Person(running_homeserver))
        return made[-1]

    yield make
    for person in made:
        await person.close()


async def store_and_kill(gateway: ServedGateway, user_id: str) -> None:
    """An outbound Message of ``user_id`` stored while the network is down (its delivery pending or
    failed), then ``serve`` killed with SIGKILL before it could send it."""
    async with httpx.AsyncClient(timeout=CEILING_S) as client:
        sent = await client.post(f"{gateway.agent_url}/messages", json={"userId": user_id, "text": "stored, then killed"})
    assert sent.status_code == 201, sent.text
    [delivery] = gateway.cli_json("channels", "deliveries")
    assert delivery["state"] in ("pending", "failed") and delivery["message"] == sent.json()["id"]
    assert gateway.stop(signal.SIGKILL) == -signal.SIGKILL
