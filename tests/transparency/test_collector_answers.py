"""The witness collector against witnesses whose answers go wrong, small servers here on loopback: a cosignature
lost on its way (in front of a real witness, aics-witness: asked again from the size it then holds, it cosigns it),
and hostile witnesses beside an honest one: a 409 with a size of thousands of digits, an answer that drips a byte at
a time, an endless answer. Each is that witness's failure (one log line, no traceback, the collector never
restarted), and none holds back the honest witness."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from agent_gateway import config
from agent_gateway.gateway import Gateway
from agent_gateway.store import supervisor
from agent_gateway.transparency import collector, note, service, witness
from tests import servers
from tests.transparency.test_collector import (
    client,
    cosigned_by,
    trusted_by,
    wait_for,
    witnessed_at,
    witnessed_size,
)
from tests.transparency.test_routes import publish
from tests.transparency.test_witness import cosign, vkey

pytestmark = pytest.mark.processes

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def serving(answer: Answer) -> AsyncIterator[str]:
    """A witness on a free loopback port: each add-checkpoint request's body is handed to ``answer``, which writes
    what it likes (or nothing: the connection then closes unanswered); its URL. Every connection is closed, and
    every answer still being written is stopped, when the block ends."""
    answering: set[asyncio.Task[None]] = set()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        answering.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)\r\ncontent-length: *([0-9]+)", head)
            await answer(await reader.readexactly(int(length.group(1)) if length else 0), writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the collector gave up on the answer (its deadline, its cap) and closed the connection
        except asyncio.CancelledError:
            pass  # the block ended (asyncio's server logs a cancelled connection's task as an error)
        finally:
            writer.close()
            answering.discard(task)

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for task in list(answering):
            task.cancel()
        await asyncio.gather(*answering, return_exceptions=True)
        await server.wait_closed()


async def respond(writer: asyncio.StreamWriter, status: int, content_type: str, body: bytes) -> None:
    head = f"HTTP/1.1 {status} Answer\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
    writer.write(head.encode() + b"Connection: close\r\n\r\n" + body)
    await writer.drain()


def checkpoint_of(body: bytes) -> bytes:
    """The checkpoint note text in an add-checkpoint body (after the old size, the proof and an empty line)."""
    signed = body.split(b"\n\n", 1)[1]
    return signed[: signed.index(b"\n\n") + 1]


@contextlib.asynccontextmanager
async def started(settings: config.Settings) -> AsyncIterator[Gateway]:
    gateway = Gateway(settings)
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()


# --- A cosignature lost on its way, from a real witness ---------------------------------------


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Witness]:
    try:
        with servers.witness(tmp_path_factory.mktemp("real"), "real.test/w") as server:
            yield server
    except servers.CannotInstall as exc:
        if os.environ.get("AGENT_GATEWAY_TEST_REQUIRE_WITNESS"):
            pytest.fail(f"the witness is required: {exc}")
        pytest.skip(str(exc))


async def test_a_witness_whose_cosignature_was_lost_is_asked_again_from_the_size_it_holds_and_cosigns_it(
    settings: config.Settings, real: servers.Witness, caplog: pytest.LogCaptureFixture,
) -> None:
    settings = trusted_by(settings, f"agent-gateway.test/{uuid.uuid4().hex[:12]}", [real])
    lost: set[bytes] = set()

    async def lossy(body: bytes, writer: asyncio.StreamWriter) -> None:
        # The witness cosigns and keeps the checkpoint; its first cosignature of each log never reaches the
        # gateway (the connection closes unanswered), as when the answer is read too late or the gateway stops
        # before storing it. The next request, from 0, is answered 409 with the very size being submitted.
        async with httpx.AsyncClient(timeout=60) as http:
            answered = await http.post(f"{real.url}/add-checkpoint", content=body)
        log_origin = checkpoint_of(body).split(b"\n", 1)[0]
        if answered.status_code == 200 and log_origin not in lost:
            lost.add(log_origin)
            return
        content_type = answered.headers.get("content-type", "text/plain")
        await respond(writer, answered.status_code, content_type, answered.content)

    caplog.set_level(logging.INFO, "agent_gateway.transparency.collector")
    async with serving(lossy) as url, started(
        dataclasses.replace(settings, witnesses=(config.Witness(url, real.vkey),))
    ) as gateway:
        async with client(gateway) as agent:
            await publish(agent, 1)  # one Decision: the log idles at size 1, no later publish wakes the collector
        await witnessed_at(gateway, 1, "the Decision log witnessed at 1")

        async def ledger_witnessed() -> bool:  # its instructions entry, idle at 1 as well
            return await witnessed_size(gateway, "/ledger") == 1

        await wait_for(ledger_witnessed, "the ledger witnessed at 1")
        assert await cosigned_by(gateway, real) == [1]
    assert len(lost) == 2  # both logs' first cosignatures were lost
    resyncs = [r for r in caplog.records if r.__dict__.get("action") == "witness_resync"]
    assert {r.__dict__["log"] for r in resyncs} == {"decisions", "ledger"}
    assert all("holds tree size 1" in r.getMessage() for r in resyncs)


# --- Hostile witnesses beside an honest one ---------------------------------------------------------


HONEST_KEY, HOSTILE_KEY = ed25519.Ed25519PrivateKey.generate(), ed25519.Ed25519PrivateKey.generate()
HONEST, HOSTILE = "honest.test/w", "hostile.test/w"


def public(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


async def honest(body: bytes, writer: asyncio.StreamWriter) -> None:
    """A witness that cosigns whatever it is sent (enough here: the collector submits from what it cosigned)."""
    line = cosign(checkpoint_of(body), timestamp=int(time.time()), name=HONEST, key=HONEST_KEY)
    await respond(writer, 200, "text/plain; charset=utf-8", line)


@contextlib.asynccontextmanager
async def beside_an_honest_witness(settings: config.Settings, hostile: Answer) -> AsyncIterator[Gateway]:
    """A gateway whose witnesses are an honest one and ``hostile`` (a quorum of one), stopped when the block ends."""
    async with serving(honest) as honest_url, serving(hostile) as hostile_url:
        listed = (
            config.Witness(honest_url, vkey(HONEST, public(HONEST_KEY))),
            config.Witness(hostile_url, vkey(HOSTILE, public(HOSTILE_KEY))),
        )
        async with started(dataclasses.replace(settings, witnesses=listed, witness_quorum=1)) as gateway:
            yield gateway


async def hostile_failing(caplog: pytest.LogCaptureFixture, reason: str) -> None:
    """Wait (a ceiling of minutes) for the line that says the hostile witness fails the Decision log for ``reason``."""

    async def said() -> bool:
        return any(
            r.__dict__.get("action") == "witness_failing" and r.__dict__.get("witness") == HOSTILE
            and r.__dict__.get("log") == "decisions" and reason in r.getMessage()
            for r in caplog.records
        )

    await wait_for(said, f"the hostile witness failing: {reason}")


@pytest.fixture
def restarts() -> Callable[[], float]:
    """How many times the Decision log's collector has been restarted since the test began."""
    counter = supervisor.restarts.labels("witness collector")
    before = counter._value.get()  # type: ignore[attr-defined]
    return lambda: counter._value.get() - before  # type: ignore[attr-defined]


async def test_a_409_size_of_thousands_of_digits_is_that_witness_failing_and_the_collector_goes_on(
    settings: config.Settings, caplog: pytest.LogCaptureFixture, restarts: Callable[[], float],
) -> None:
    async def huge(body: bytes, writer: asyncio.StreamWriter) -> None:
        # More digits than int() converts (4,300): a ValueError escaped the collector, restarted again and again.
        await respond(writer, 409, witness.SIZE_MEDIA_TYPE, b"1" * 5000 + b"\n")

    caplog.set_level(logging.INFO)
    async with beside_an_honest_witness(settings, huge) as gateway:
        async with client(gateway) as agent:
            await publish(agent, 1)
            await witnessed_at(gateway, 1, "witnessed by the honest witness")
            await hostile_failing(caplog, "409 with an unreadable size")
            await publish(agent, 1)
            await witnessed_at(gateway, 2, "witnessed again: the collector goes on")
    assert restarts() == 0
    assert all(r.exc_info is None for r in caplog.records)


@pytest.mark.parametrize(
    ("body", "size"), [(b"0\n", 0), (b"%d\n" % (2**64 - 1), 2**64 - 1)],
)
def test_a_409_size_below_2_to_the_64_reads(body: bytes, size: int) -> None:
    assert witness.parse_size(body) == size


@pytest.mark.parametrize("body", [b"%d\n" % 2**64, b"1" * 21 + b"\n", b"1" * 5000 + b"\n"])
def test_a_409_size_of_2_to_the_64_or_more_is_unreadable(body: bytes) -> None:
    with pytest.raises(note.NoteError):
        witness.parse_size(body)
    key = witness.WitnessKey(HOSTILE, public(HOSTILE_KEY))
    assert isinstance(witness.read_answer(key, b"", 409, witness.SIZE_MEDIA_TYPE, body), witness.Failed)


def dripping(asked: list[bytes]) -> Answer:
    """A witness that answers a byte every half second, never done: each read is quick, the answer never whole.
    ``asked`` gets the origin of each request."""

    async def drip(body: bytes, writer: asyncio.StreamWriter) -> None:
        asked.append(checkpoint_of(body).split(b"\n", 1)[0])
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1000000\r\n\r\n")
        while True:
            await writer.drain()
            await asyncio.sleep(0.5)
            writer.write(b"x")

    return drip


async def test_a_witness_that_answers_slowly_holds_back_no_other_witness(
    settings: config.Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No deadline within the test's ceilings: only the drip's request's own task waits for it.
    monkeypatch.setattr(collector, "REQUEST_TIMEOUT_S", 3600.0)
    asked: list[bytes] = []
    async with beside_an_honest_witness(settings, dripping(asked)) as gateway:
        async with client(gateway) as agent:
            for size in (1, 2, 3):
                await publish(agent, 1)
                await witnessed_at(gateway, size, f"the honest witness cosigns {size}, the slow one still answering")
        decisions = service.signer(settings, gateway.identity).origin.encode()
    # One request to it in flight for each log (the ledger's too, if sent by now), never a second beside it.
    assert decisions in asked
    assert len(asked) == len(set(asked))


async def test_a_witness_that_answers_slowly_fails_at_the_request_deadline(
    settings: config.Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    restarts: Callable[[], float],
) -> None:
    # httpx's timeout bounds each read (a byte comes every half second): the deadline is the whole request's.
    monkeypatch.setattr(collector, "REQUEST_TIMEOUT_S", 2.0)
    caplog.set_level(logging.INFO)
    async with beside_an_honest_witness(settings, dripping([])) as gateway:
        async with client(gateway) as agent:
            await publish(agent, 1)
            await witnessed_at(gateway, 1, "witnessed by the honest witness")
        await hostile_failing(caplog, "no whole answer within 2 s")
    assert restarts() == 0
    assert all(r.exc_info is None for r in caplog.records)


async def test_an_endless_answer_is_read_up_to_its_cap_and_is_that_witness_failing(
    settings: config.Settings, caplog: pytest.LogCaptureFixture, restarts: Callable[[], float],
) -> None:
    async def endless(body: bytes, writer: asyncio.StreamWriter) -> None:
        # No length: the answer ends when the connection does. 32 MiB at most, so that a collector without a cap
        # (which read it all, then refused it as not signature lines) does not fill this machine's memory.
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
        for _ in range(512):
            writer.write(b"x" * 65535 + b"\n")
            await writer.drain()

    caplog.set_level(logging.INFO)
    async with beside_an_honest_witness(settings, endless) as gateway:
        async with client(gateway) as agent:
            await publish(agent, 1)
            await witnessed_at(gateway, 1, "witnessed by the honest witness")
        await hostile_failing(caplog, f"its answer is larger than {collector.MAX_ANSWER_BYTES} bytes")
    assert restarts() == 0
    assert all(r.exc_info is None for r in caplog.records)
