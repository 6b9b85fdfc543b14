"""Reading a Message stream the way a client does: events and comments off a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

import httpx
import orjson

# A ceiling for a broken build, never an expectation.
CEILING_S = 300


@dataclasses.dataclass
class Event:
    id: str | None = None
    event: str | None = None
    data: str = ""
    comments: tuple[str, ...] = ()

    @property
    def message(self) -> dict:
        return orjson.loads(self.data)


class EventReader:
    """The events (and comment lines) of one open ``text/event-stream`` response."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._lines = response.aiter_lines()

    async def next(self) -> Event | None:
        """The next event or comment block; None when the server ended the stream."""
        event = Event()
        fields = 0
        comments: list[str] = []
        async with asyncio.timeout(CEILING_S):
            async for line in self._lines:
                if line == "":
                    if fields or comments:
                        event.comments = tuple(comments)
                        return event
                    continue
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "":
                    comments.append(value)
                elif name == "data":
                    event.data = value if not fields or event.data == "" else event.data + "\n" + value
                    fields += 1
                elif name in ("id", "event"):
                    setattr(event, name, value)
                    fields += 1
            return None

    async def messages(self, count: int) -> list[dict]:
        """The next ``count`` Messages, skipping comments."""
        found: list[dict] = []
        while len(found) < count:
            event = await self.next()
            assert event is not None, f"the stream ended after {found}"
            if event.event == "message":
                assert event.id == str(event.message["seq"])
                found.append(event.message)
        return found


@contextlib.asynccontextmanager
async def open_stream(
    client: httpx.AsyncClient, url: str, *, params: dict | None = None, headers: dict | None = None
) -> AsyncIterator[EventReader]:
    async with client.stream("GET", url, params=params, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        reader = EventReader(response)
        # The server sends a comment at once: once it is read, the stream is subscribed.
        first = await reader.next()
        assert first is not None and first.comments == ("keep-alive",)
        yield reader
