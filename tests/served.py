"""A real gateway process for end-to-end tests: ``agent-gateway init`` then ``serve``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson

from agent_gateway import deployment

SRC = Path(__file__).resolve().parents[1] / "src"
# A ceiling, not an expectation: on a loaded two-core machine a start takes seconds.
START_TIMEOUT_S = 300
LISTENERS = ("AGENT_GATEWAY_PUBLIC_LISTEN", "AGENT_GATEWAY_AGENT_LISTEN", "AGENT_GATEWAY_OPS_LISTEN")
LISTEN_TRIES = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_demo(directory: Path, database_url: str) -> tuple[dict[str, str], subprocess.CompletedProcess[str]]:
    """``agent-gateway init DIRECTORY --demo-user`` as a newcomer runs it, on free ports; the
    variables to ``spawn`` it with, and what init printed."""
    env = {
        "AGENT_GATEWAY_DATABASE_URL": database_url,
        "AGENT_GATEWAY_PUBLIC_LISTEN": f"127.0.0.1:{free_port()}",
        "AGENT_GATEWAY_AGENT_LISTEN": f"127.0.0.1:{free_port()}",
    }
    init = run_cli("init", str(directory), "--demo-user", config=directory / "gateway.toml", env=env)
    assert init.returncode == 0, init.stderr
    return env, init


def cli_env(config: Path, extra: dict[str, str] | None = None, src: Path = SRC) -> dict[str, str]:
    """The environment of the gateway code in ``src`` (this checkout's, or another's for a benchmark)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_GATEWAY_")}
    env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
    env["AGENT_GATEWAY_CONFIG"] = str(config)
    # Never the default ops port: tests (and other checkouts' tests) serve side by side.
    env["AGENT_GATEWAY_OPS_LISTEN"] = f"127.0.0.1:{free_port()}"
    env.update(extra or {})
    return env


def run_cli(
    *args: str, config: Path, input: str | None = None, env: dict[str, str] | None = None, src: Path = SRC
) -> subprocess.CompletedProcess[str]:
    """Run ``agent-gateway ARGS`` as a subprocess of this checkout's code (or that in ``src``)."""
    return subprocess.run(
        [sys.executable, "-m", "agent_gateway", *args],
        env=cli_env(config, env, src),
        input=input,
        capture_output=True,
        text=True,
        timeout=600,
    )


# Typer's runner swaps the process's stdout, stderr and environment for a call: one call at a time.
_HERE = threading.Lock()


def run_cli_here(
    *args: str, config: Path, input: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``agent-gateway ARGS`` as :func:`run_cli` runs it, but in this process (Typer's runner), for
    tables of refusals, repeated runs and a test's setup, where what is tested is the command's
    answer and not its start: an interpreter start costs a second and a half of CPU. The
    environment is what :func:`run_cli` would give, no more: every other ``AGENT_GATEWAY_``
    variable of this process is hidden for the call. From a test whose event loop is running the
    command runs in a thread of its own (it runs its own loop), and the test waits for it as it
    would for a subprocess."""
    with _HERE:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return _invoke(args, config, input, env)
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as thread:
            return thread.submit(_invoke, args, config, input, env).result()


def _invoke(
    args: tuple[str, ...], config: Path, input: str | None, env: dict[str, str] | None
) -> subprocess.CompletedProcess[str]:
    from typer.testing import CliRunner

    from agent_gateway.cli.main import app

    given = {"AGENT_GATEWAY_CONFIG": str(config), **(env or {})}
    hidden: dict[str, str | None] = {name: None for name in os.environ if name.startswith("AGENT_GATEWAY_")}
    # A command configures no logging: in its own process, Python's last-resort handler writes
    # each warning to stderr as one more line. Here pytest's handlers would take them: they are
    # written to the command's stderr as that handler would, so "one line" tests stay as strict.
    logged = io.StringIO()
    last_resort = logging.StreamHandler(logged)
    last_resort.setLevel(logging.WARNING)
    logging.getLogger().addHandler(last_resort)
    try:
        result = CliRunner().invoke(app, list(args), input=input, env={**hidden, **given}, prog_name="agent-gateway")
    finally:
        logging.getLogger().removeHandler(last_resort)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    stderr = result.stderr + logged.getvalue()
    return subprocess.CompletedProcess(["agent-gateway", *args], result.exit_code, result.stdout, stderr)


class ServedGateway:
    def __init__(self, directory: Path, process: subprocess.Popen[bytes], env: dict[str, str], log: Path) -> None:
        self.directory = directory
        self.config = directory / "gateway.toml"
        self.process = process
        self.env = env
        self.log = log
        self.public_url = f"http://{env['AGENT_GATEWAY_PUBLIC_LISTEN']}"
        self.agent_url = f"http://{env['AGENT_GATEWAY_AGENT_LISTEN']}"
        self.database_url = env.get("AGENT_GATEWAY_DATABASE_URL")  # None when only its file names it
        ops = env.get("AGENT_GATEWAY_OPS_LISTEN")
        self.ops_url = f"http://{ops}" if ops else None

    @classmethod
    @contextlib.contextmanager
    def start(
        cls,
        directory: Path,
        database_url: str,
        env: dict[str, str] | None = None,
        *,
        descriptors: int | None = None,
        src: Path = SRC,
    ) -> Iterator[ServedGateway]:
        if src == SRC:
            # What `agent-gateway init DIRECTORY` writes, written in this process: a command run
            # only to write two files cost every served gateway a second of CPU (init's own
            # command is run by the tests of init, of the tour and of the working loop).
            deployment.write(directory)
        else:
            result = run_cli("init", str(directory), config=directory / "gateway.toml", src=src)
            assert result.returncode == 0, result.stderr
        extra = {"AGENT_GATEWAY_DATABASE_URL": database_url, "AGENT_GATEWAY_AUTH_SCRYPT_LOGN": "10", **(env or {})}
        # A listener the test names (off, or on 0.0.0.0) is kept as named.
        named = {name: value for name, value in (env or {}).items() if name in LISTENERS}
        gateway = cls.spawn_on_free_ports(directory, extra, named=named, descriptors=descriptors, src=src)
        try:
            yield gateway
        finally:
            gateway.stop()

    @classmethod
    def spawn_on_free_ports(
        cls, directory: Path, extra: dict[str, str], *args: Any, named: dict[str, str] | None = None, **options: Any
    ) -> ServedGateway:
        """:meth:`spawn` with its three listeners on free loopback ports of their own (``extra``'s
        listen addresses replaced), but those ``named``. A port found free can be taken by another
        test between its pick and serve's bind: serve then says so in one line, and it is started
        again on new ones."""
        for attempt in range(LISTEN_TRIES):
            ports = {name: f"127.0.0.1:{free_port()}" for name in LISTENERS}
            try:
                return cls.spawn(directory, {**extra, **ports, **(named or {})}, *args, **options)
            except RuntimeError as exc:
                if attempt == LISTEN_TRIES - 1 or "Address already in use" not in str(exc):
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def spawn(
        cls,
        directory: Path,
        extra: dict[str, str],
        args: tuple[str, ...] = (),
        *,
        descriptors: int | None = None,
        src: Path = SRC,
    ) -> ServedGateway:
        """``serve ARGS`` (``--role api``, say) with the deployment's config and ``extra`` variables,
        in a process group of its own (stopped whole); ``descriptors`` sets its RLIMIT_NOFILE; the
        code is this checkout's unless ``src`` names another's."""
        log = directory / f"serve-{time.monotonic_ns()}.log"
        env = cli_env(directory / "gateway.toml", extra, src)

        def limit() -> None:
            if descriptors is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors))

        with open(log, "wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "agent_gateway", "serve", *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=limit,
            )
        gateway = cls(directory, process, extra, log)
        try:
            gateway.wait_ready()
        except BaseException:
            gateway.stop()
            raise
        return gateway

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"serve exited with {self.process.returncode}:\n{self.output()}")
            try:
                for url in (self.public_url, self.agent_url):
                    httpx.get(f"{url}/openapi.json", timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.05)
        raise TimeoutError(f"serve did not answer within {START_TIMEOUT_S}s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def cli(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, config=self.config, input=input, env=self.env)

    def cli_here(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """:meth:`cli` in this process (:func:`run_cli_here`)."""
        return run_cli_here(*args, config=self.config, input=input, env=self.env)

    def cli_json(self, *args: str, input: str | None = None) -> Any:
        """The JSON a command prints, run in this process (:func:`run_cli_here`): these calls set a
        test up or read its state, and :meth:`cli` keeps the real starts."""
        result = self.cli_here(*args, input=input)
        assert result.returncode == 0, result.stderr
        return orjson.loads(result.stdout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> int:
        return stop_process(self.process, sig, timeout)


def stop_process(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 120) -> int:
    """Stop a process started with ``start_new_session=True`` with ``sig`` (SIGKILL after
    ``timeout``), then anything left in its group; its exit status."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    # Forked HTTP processes and agent programs die with serve; this is for when they did not.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    return process.returncode
