"""A connection flood: idle connections (nothing sent) and slowloris ones (a header line now and then)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from types import TracebackType


class Flood:
    """``idle`` + ``slow`` non-blocking connections to ``host:port``, held until closed."""

    def __init__(self, host: str, port: int, *, idle: int, slow: int, interval_s: float) -> None:
        self.sockets: list[socket.socket] = []
        self._stop = threading.Event()
        self._interval_s = interval_s
        try:
            for _ in range(idle + slow):
                sock = socket.socket()
                sock.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    sock.connect((host, port))
                self.sockets.append(sock)
        except BaseException:
            self.close()
            raise
        self._slow = self.sockets[idle:]
        self._sender = threading.Thread(target=self._send_slowly, daemon=True)
        self._sender.start()

    def _send_slowly(self) -> None:
        for sock in self._slow:
            with contextlib.suppress(OSError):
                sock.send(b"GET / HTTP/1.1\r\nHost: x\r\n")
        while not self._stop.wait(self._interval_s):
            for sock in self._slow:
                with contextlib.suppress(OSError):
                    sock.send(b"X-Slow: y\r\n")

    def wait_closed(self, ceiling_s: float) -> int:
        """Wait until the server has closed every connection; how many it left open at the ceiling.

        An accepted connection is closed by a timeout, one past the cap at once (after a 503,
        which is read and dropped), one still in the backlog when it is accepted.
        """
        deadline = time.monotonic() + ceiling_s
        open_ = list(self.sockets)
        while open_ and time.monotonic() < deadline:
            still = []
            for sock in open_:
                try:
                    if sock.recv(65536) == b"":
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    continue
                still.append(sock)
            open_ = still
            time.sleep(0.1)
        return len(open_)

    def close(self) -> None:
        self._stop.set()
        if hasattr(self, "_sender"):
            self._sender.join()
        for sock in self.sockets:
            sock.close()

    def __enter__(self) -> Flood:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
