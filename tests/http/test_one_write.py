"""A connection's writes of one turn of the event loop leave in one ``send`` (http.connections)."""

from __future__ import annotations

import asyncio

from agent_gateway.http.connections import _OneWrite


class Recorder:
    """The transport below: records what reaches it."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str) -> str:
        return f"info {name}"


async def turn() -> None:
    await asyncio.sleep(0)
    await asyncio.sleep(0)


async def test_a_head_and_a_body_written_in_one_turn_go_out_together():
    below = Recorder()
    transport = _OneWrite(below, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    transport.write(b"{}")
    assert below.writes == []  # nothing leaves before the turn ends
    await turn()
    assert below.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    transport.write(b"next")
    await turn()
    assert below.writes[1:] == [b"next"]


async def test_close_sends_what_is_held_first_and_abort_drops_it():
    below = Recorder()
    transport = _OneWrite(below, asyncio.get_running_loop())
    transport.write(b"last words")
    transport.close()
    assert below.writes == [b"last words"] and below.closed
    await turn()
    assert below.writes == [b"last words"]  # the scheduled flush finds nothing more

    below = Recorder()
    transport = _OneWrite(below, asyncio.get_running_loop())
    transport.write(b"never sent")
    transport.abort()
    await turn()
    assert below.writes == [] and below.aborted


async def test_nothing_is_written_to_a_transport_that_is_closing():
    below = Recorder()
    transport = _OneWrite(below, asyncio.get_running_loop())
    transport.write(b"too late")
    below.closed = True  # the peer went away within the turn
    await turn()
    assert below.writes == []


async def test_everything_else_is_the_transports():
    transport = _OneWrite(Recorder(), asyncio.get_running_loop())
    assert transport.get_extra_info("peername") == "info peername"
