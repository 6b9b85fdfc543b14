"""The log handler: the lines of one turn of the event loop leave in one write, in order, and none is lost or doubled."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_gateway.ops import logs


class Writes:
    """A text stream that records each write."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> None:
        self.writes.append(text)

    def flush(self) -> None:
        pass

    @property
    def text(self) -> str:
        return "".join(self.writes)


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger("tests.ops.test_logs")
    logger.propagate, logger.level = False, logging.INFO
    yield logger
    for handler in logger.handlers:
        handler.flush()
    logger.handlers.clear()
    logger.propagate = True


def handled(logger: logging.Logger, stream: object) -> logs.TurnHandler:
    handler = logs.TurnHandler(stream)  # type: ignore[arg-type]
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    return handler


def test_the_lines_of_one_turn_leave_together_at_its_end(logger: logging.Logger) -> None:
    stream = Writes()
    handled(logger, stream)

    async def main() -> None:
        for n in range(3):
            logger.info("line %d", n)
        assert stream.writes == []  # still this turn
        await asyncio.sleep(0)
        assert stream.writes == ["line 0\nline 1\nline 2\n"]
        logger.info("line 3")
        await asyncio.sleep(0)

    asyncio.run(main())
    assert stream.writes == ["line 0\nline 1\nline 2\n", "line 3\n"]


def test_a_line_outside_a_loop_is_written_at_once_after_those_waiting(logger: logging.Logger) -> None:
    stream = Writes()
    handled(logger, stream)

    async def main() -> None:
        logger.info("in the loop")
        await asyncio.to_thread(logger.info, "from a thread")  # before the loop's turn ends

    asyncio.run(main())
    logger.info("after the loop")
    assert stream.text == "in the loop\nfrom a thread\nafter the loop\n"


def test_lines_left_by_a_loop_closed_before_it_wrote_them_are_written_by_the_next(logger: logging.Logger) -> None:
    stream = Writes()
    handled(logger, stream)

    async def interrupted() -> None:
        logger.info("first")
        raise KeyboardInterrupt  # leaves the loop at once: its turn never ends

    loop = asyncio.new_event_loop()
    with pytest.raises(KeyboardInterrupt):
        loop.run_until_complete(interrupted())
    loop.close()
    assert stream.writes == []

    async def main() -> None:
        logger.info("second")
        await asyncio.sleep(0)

    asyncio.run(main())
    assert stream.text == "first\nsecond\n"


def test_lines_waiting_are_written_before_a_fork_and_never_twice(tmp_path: Path) -> None:
    path = tmp_path / "log"
    logger = logging.getLogger("tests.ops.test_logs.fork")
    logger.setLevel(logging.INFO)
    root = logging.getLogger()  # logs.flush writes the root's handlers, as logs.configure sets them
    with path.open("w") as stream:
        handler = logs.TurnHandler(stream)
        root.addHandler(handler)
        try:

            async def main() -> int:
                logger.info("before the fork")
                pid = os.fork()
                if pid == 0:  # the child logs, and writes all it holds (as before its os._exit)
                    try:
                        logger.info("the child")
                        logs.flush()
                    finally:
                        os._exit(0)
                return pid

            pid = asyncio.run(main())
            os.waitpid(pid, 0)
        finally:
            root.removeHandler(handler)
    assert path.read_text().count("before the fork") == 1
    assert "the child" in path.read_text()


def test_text_lines_read_as_the_standard_format_does() -> None:
    standard, ours = logging.Formatter(logs.TEXT_FORMAT), logs.TextFormatter()
    for created in (1_764_000_000.0, 1_764_000_000.999, 1_764_000_001.05, 1_764_000_000.5):
        record = logging.makeLogRecord({"msg": "hello %s", "args": ("there",), "levelname": "INFO", "name": "x"})
        record.created, record.msecs = created, (created - int(created)) * 1000
        assert ours.format(record) == standard.format(record)
