"""``agent-gateway chat URL``: a User talks to the agent from a terminal (issue 13).

A client of the Public server only (it reads no settings): it logs in with
the User's password, shows the recent conversation, then follows the User's
Message stream while a line editor (prompt_toolkit) sends what is typed.
Lines arriving from the stream are printed above the editor line. On a
network error it reconnects with ``Last-Event-ID``, so nothing is missed or
shown twice. ``/quit``, Ctrl-C or Ctrl-D leave and revoke the Token it created.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Annotated, Any

import httpx
import orjson
import typer

from agent_gateway.cli.common import fail

# prompt_toolkit is imported where the chat uses it: every other command would pay
# for loading it (this module is imported to register the command).
if TYPE_CHECKING:
    from prompt_toolkit.key_binding import KeyBindings

RECENT = 20
RECONNECT_DELAYS_S = (0.5, 1.0, 2.0, 5.0)
QUIT = "/quit"
# No read timeout: a stream is quiet between Messages (its keep-alives arrive every 15 s).
TIMEOUT = httpx.Timeout(30.0, read=None)


class SessionEnded(Exception):
    """The Token no longer works (revoked or expired): the chat cannot go on."""


def show(message: dict[str, Any]) -> None:
    who = "you" if message["direction"] == "inbound" else "agent"
    print(f"[{message['seq']}] {who}: {message['text']}", flush=True)


def error_text(response: httpx.Response) -> str:
    try:
        return str(response.json()["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}"


class Chat:
    """One logged-in conversation: the client with the User's Token, and where the stream is."""

    def __init__(self, client: httpx.AsyncClient, token: str) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {token}"}
        self.last_seq = 0

    async def recent(self) -> None:
        response = await self.client.get("/messages", params={"limit": str(RECENT)}, headers=self.headers)
        if response.status_code != 200:
            raise fail(f"reading the conversation failed: {error_text(response)}")
        for message in response.json()["messages"]:
            show(message)
            self.last_seq = message["seq"]

    async def follow(self) -> None:
        """Print the stream's Messages as they arrive, reconnecting after network errors, until the Token ends."""
        failures = 0
        while True:
            try:
                await self._follow_once()
                failures = 0  # the server ended the stream (a restart, say): resume at once
            except SessionEnded:
                raise
            except (httpx.TransportError, httpx.HTTPStatusError) as exc:
                delay = RECONNECT_DELAYS_S[min(failures, len(RECONNECT_DELAYS_S) - 1)]
                failures += 1
                print(f"(connection lost: {type(exc).__name__}; reconnecting)", flush=True)
                await asyncio.sleep(delay)

    async def _follow_once(self) -> None:
        headers = {**self.headers, "Last-Event-ID": str(self.last_seq), "Accept": "text/event-stream"}
        async with self.client.stream("GET", "/messages/stream", headers=headers) as response:
            if response.status_code == 401:
                raise SessionEnded()
            response.raise_for_status()
            data: list[str] = []
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
                elif line == "" and data:
                    message = orjson.loads("\n".join(data))
                    data.clear()
                    if message["seq"] > self.last_seq:
                        show(message)
                        self.last_seq = message["seq"]

    async def send(self, text: str) -> None:
        try:
            response = await self.client.post("/messages", json={"text": text}, headers=self.headers)
        except httpx.TransportError as exc:
            print(f"(not sent: {type(exc).__name__}; try again)", flush=True)
            return
        if response.status_code == 401:
            raise SessionEnded()
        if response.status_code != 201:
            print(f"(not sent: {error_text(response)})", flush=True)

    async def log_out(self) -> None:
        try:
            await self.client.delete("/auth/tokens/current", headers=self.headers)
        except httpx.TransportError:
            print("(could not reach the gateway to revoke the Token; it expires on its own)", flush=True)
            return
        print("(logged out)", flush=True)


def leaving_keys() -> KeyBindings:
    """Ctrl-C, and Ctrl-D on an empty line, answer /quit: the chat leaves through one door
    (an exception out of the editor's task would escape the event loop before the logout)."""
    from prompt_toolkit.application import get_app
    from prompt_toolkit.filters import Condition
    from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent

    keys = KeyBindings()

    @keys.add("c-c")
    def _interrupt(event: KeyPressEvent) -> None:
        event.app.exit(result=QUIT)

    @keys.add("c-d", filter=Condition(lambda: not get_app().current_buffer.text))
    def _end(event: KeyPressEvent) -> None:
        event.app.exit(result=QUIT)

    return keys


async def converse(chat: Chat) -> None:
    """The editor loop beside the stream, until /quit, Ctrl-C, Ctrl-D or the end of the Token."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.patch_stdout import patch_stdout

    session: PromptSession[str] = PromptSession(key_bindings=leaving_keys())
    follower = asyncio.create_task(chat.follow())
    try:
        with patch_stdout():
            while True:
                editor = asyncio.create_task(session.prompt_async("> "))
                done, _ = await asyncio.wait({editor, follower}, return_when=asyncio.FIRST_COMPLETED)
                if follower in done:
                    editor.cancel()
                    await asyncio.gather(editor, return_exceptions=True)
                    follower.result()  # raises SessionEnded
                line = editor.result().strip()
                if line == QUIT:
                    return
                if line:
                    await chat.send(line)
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)


async def run(url: str, user: str, password: str) -> None:
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=TIMEOUT) as client:
        try:
            login = await client.post("/auth/tokens", json={"user": user, "password": password})
        except httpx.TransportError as exc:
            raise fail(f"cannot reach {url}: {type(exc).__name__}") from None
        if login.status_code != 201:
            raise fail(f"logging in failed: {error_text(login)}")
        chat = Chat(client, login.json()["token"])
        try:
            await chat.recent()
            print(f"(logged in as {user}; type a message and Enter; {QUIT} or Ctrl-C leaves)", flush=True)
            await converse(chat)
        except SessionEnded:
            print("(your Token no longer works; log in again)", flush=True)
            return
        finally:
            # Also when Ctrl-C arrives outside the editor (asyncio.run then cancels this task once).
            await chat.log_out()


def ask(prompt: str, *, is_password: bool = False) -> str:
    """One line typed at the terminal."""
    from prompt_toolkit import PromptSession

    return PromptSession().prompt(prompt, is_password=is_password)


def read_password(from_stdin: bool) -> str:
    if from_stdin:
        return sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    if not sys.stdin.isatty():
        raise fail("stdin is not a terminal: pass --password-stdin to read the password from it")
    return ask("Password: ", is_password=True)


def chat(
    url: Annotated[str, typer.Argument(help="the Public server, e.g. http://127.0.0.1:8700")],
    user: Annotated[str | None, typer.Option("--user", help="your User id (asked when not given)")] = None,
    password_stdin: Annotated[
        bool, typer.Option("--password-stdin", help="read the password from the first line of stdin")
    ] = False,
) -> None:
    """Talk to the agent as a User: the conversation, live answers, a line editor to send."""
    if user is None:
        if not sys.stdin.isatty():
            raise fail("pass --user ID when stdin is not a terminal")
        user = ask("User id: ").strip()
    password = read_password(password_stdin)
    try:
        asyncio.run(run(url, user, password))
    except KeyboardInterrupt:
        pass
