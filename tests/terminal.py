"""Drive a command through a pseudo-terminal, as a person at a keyboard would."""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Sequence

from tests.served import stop_process

CEILING_S = 300.0


class Terminal:
    """A subprocess whose stdin, stdout and stderr are one pseudo-terminal."""

    def __init__(self, args: Sequence[str], env: dict[str, str]) -> None:
        self._master, slave = os.openpty()
        try:
            self.process = subprocess.Popen(
                args, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
            )
        finally:
            os.close(slave)
        self.output = ""
        self._seen = 0

    def expect(self, text: str, ceiling_s: float = CEILING_S) -> str:
        """Wait until TEXT appears after what was last expected; return everything up to it."""
        deadline = time.monotonic() + ceiling_s
        while (found := self.output.find(text, self._seen)) < 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._read(remaining):
                raise AssertionError(f"{text!r} did not appear; the terminal shows {self.output!r}")
        before, self._seen = self.output[self._seen : found], found + len(text)
        return before

    def send(self, line: str) -> None:
        os.write(self._master, line.encode() + b"\r")

    def wait(self, ceiling_s: float = CEILING_S) -> int:
        """The exit status, reading what is left so the program never blocks on a full terminal."""
        deadline = time.monotonic() + ceiling_s
        while self._read(max(0.0, deadline - time.monotonic())):
            pass
        return self.process.wait(timeout=max(1.0, deadline - time.monotonic()))

    def close(self) -> None:
        stop_process(self.process)
        os.close(self._master)

    def _read(self, timeout_s: float) -> bool:
        """Read what is there within TIMEOUT_S; False once the program has closed the terminal."""
        ready, _, _ = select.select([self._master], [], [], timeout_s)
        if not ready:
            return False
        try:
            chunk = os.read(self._master, 65536)
        except OSError:  # EIO: every process holding the terminal has left
            return False
        self.output += chunk.decode("utf-8", "replace")
        return bool(chunk)
