"""Real servers for the tests, installed from PyPI into cached virtual environments of their own.

The pattern (the Matrix homeserver, the transparency witness and the Nostr relay here): :class:`Package` names a server and its pinned requirements;
:func:`install` puts them into ``~/.cache/agent-gateway-tests/<name>-<version>/``
once per machine (never into the project's ``.venv``, whose dependencies they
would fight), under a file lock, since pytest-xdist workers race for it, and
atomically (a half-made environment is never used); :func:`start` runs the
server on a free loopback port, waits for it to answer (a ceiling of minutes,
never a fixed sleep), and :meth:`Running.stop` ends it (a fixture's finalizer
calls it, so no process outlives the tests).

``scripts/test`` installs them before the run (``python -m tests.servers
install``), so install time is not test time. A fixture that cannot install
its server skips with the reason, unless its ``AGENT_GATEWAY_TEST_REQUIRE_*``
variable is set (by ``.ci/run``): then it fails.

Synapse (:func:`synapse`) runs on SQLite, registers users by shared secret
(:meth:`Homeserver.register`), federates with nobody, and has its rate limits
raised out of the tests' way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import hmac
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

T = TypeVar("T")

CACHE = Path(os.environ.get("AGENT_GATEWAY_TEST_CACHE") or Path.home() / ".cache" / "agent-gateway-tests")
INSTALL_TIMEOUT_S = 900.0
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 30.0


class CannotInstall(Exception):
    """The server's environment could not be made (no network to PyPI, say); the message says why."""


@dataclasses.dataclass(frozen=True)
class Package:
    """A server installed from PyPI: its environment's name and its pinned requirements."""

    name: str
    version: str
    requirements: tuple[str, ...]
    # The oldest Python it runs on; None: any the project runs on.
    python_at_least: tuple[int, int] | None = None

    @property
    def folder(self) -> Path:
        return CACHE / f"{self.name}-{self.version}"

    @property
    def python(self) -> Path:
        return self.folder / "bin" / "python"


SYNAPSE = Package("matrix-synapse", "1.163.2", ("matrix-synapse==1.163.2",))
# The witness and the offline verifier beside it (one environment): both need Python 3.12 or newer.
WITNESS = Package("aics-witness", "0.1.0", ("aics-witness==0.1.0", "aics-tlog==0.2.1"), python_at_least=(3, 12))
# A Nostr relay in pure Python (Dave St.Germain's nostr-relay), run by uvicorn.
RELAY = Package("nostr-relay", "1.14", ("nostr-relay==1.14",))
PACKAGES = {"synapse": SYNAPSE, "witness": WITNESS, "relay": RELAY}


@contextlib.contextmanager
def required(start: Callable[[Path], contextlib.AbstractContextManager[T]], folder: Path, what: str) -> Iterator[T]:
    """The server ``start(folder)`` runs, for a fixture: when it cannot be installed the test is
    skipped with the reason, or fails where ``AGENT_GATEWAY_TEST_REQUIRE_<what>=1`` (``.ci/run``)."""
    try:
        context = start(folder)
        server = context.__enter__()
    except CannotInstall as exc:
        variable = f"AGENT_GATEWAY_TEST_REQUIRE_{what}"
        if os.environ.get(variable) == "1":
            pytest.fail(f"{variable}=1 and {exc}")
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        context.__exit__(None, None, None)


def install(package: Package) -> Path:
    """The environment of ``package``, made first if missing; its Python. Raises :class:`CannotInstall`."""
    marker = package.folder / ".installed"
    if marker.exists():
        return package.python
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{package.folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker installing: wait for it, then use its work
        if marker.exists():
            return package.python
        building = package.folder.with_name(package.folder.name + ".building")
        shutil.rmtree(building, ignore_errors=True)
        shutil.rmtree(package.folder, ignore_errors=True)
        try:
            subprocess.run(
                [_base_python(package), "-m", "venv", str(building)], check=True, capture_output=True,
                timeout=INSTALL_TIMEOUT_S,
            )
            subprocess.run(
                [str(building / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 *package.requirements],
                check=True, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
            )
        except subprocess.CalledProcessError as exc:
            shutil.rmtree(building, ignore_errors=True)
            said = (exc.stderr or "").strip().splitlines()
            raise CannotInstall(f"cannot install {' '.join(package.requirements)}: {said[-1] if said else exc}") from None
        except subprocess.TimeoutExpired:
            shutil.rmtree(building, ignore_errors=True)
            raise CannotInstall(f"installing {' '.join(package.requirements)} took over {INSTALL_TIMEOUT_S:g}s") from None
        # A venv's scripts name its folder: it is made where it will stay, under a temporary name,
        # and only its interpreter (moved with it) is used, never its console scripts.
        building.rename(package.folder)
        marker.touch()
    return package.python


def _base_python(package: Package) -> str:
    """The interpreter a new environment is made from: the one under the project's .venv, when it is
    new enough for ``package``; else, in this order, a ``python3.N`` on the PATH (not a pyenv shim), then one under pyenv
    (``~/.pyenv/versions/*/bin``), the newest first. Raises :class:`CannotInstall` when none is."""
    own = getattr(sys, "_base_executable", None) or sys.executable
    if package.python_at_least is None or sys.version_info[:2] >= package.python_at_least:
        return own
    wanted = package.python_at_least
    minors = range(wanted[1] + 10, wanted[1] - 1, -1)
    for minor in minors:
        found = shutil.which(f"python{wanted[0]}.{minor}")
        # pyenv's shims answer for versions that are not selected with an error: skip them.
        if found and "/shims/" not in found:
            return found
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    for minor in minors:
        for candidate in sorted(pyenv.glob(f"{wanted[0]}.{minor}.*/bin/python{wanted[0]}.{minor}"), reverse=True):
            return str(candidate)
    raise CannotInstall(f"{package.name} needs Python {wanted[0]}.{wanted[1]} or newer: none on the PATH nor under {pyenv}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until(check: Callable[[], bool], *, timeout_s: float, what: str, log: Path | None = None) -> None:
    """Wait for ``check`` (polled) up to ``timeout_s``; raise saying ``what`` did not happen."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    tail = "" if log is None or not log.exists() else "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    raise TimeoutError(f"{what} within {timeout_s:g}s{tail}")


@dataclasses.dataclass
class Running:
    """A started server's process; :meth:`stop` ends it (and its children) and waits."""

    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(STOP_TIMEOUT_S)

    def alive(self) -> bool:
        return self.process.poll() is None


def start(argv: list[str], *, folder: Path, answers: Callable[[], bool], what: str) -> Running:
    """Start ``argv`` in ``folder`` (its output in ``folder/server.log``), in a process group of its
    own, and wait until ``answers``; stopped again if it never does."""
    log = folder / "server.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, cwd=folder, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    running = Running(process, log)

    def ready() -> bool:
        if not running.alive():
            raise RuntimeError(f"{what} exited with status {process.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        return answers()

    try:
        wait_until(ready, timeout_s=START_TIMEOUT_S, what=f"{what} did not answer", log=log)
    except BaseException:
        running.stop()
        raise
    return running


# --- Synapse -----------------------------------------------------------------------------------

SERVER_NAME = "localhost"


@dataclasses.dataclass
class Homeserver:
    """A running Synapse: its client-server API's URL, and registration by shared secret."""

    url: str
    server_name: str
    shared_secret: str
    running: Running
    folder: Path

    def register(self, localpart: str | None = None) -> tuple[str, str]:
        """Register a fresh user (a new random localpart unless given); its user ID and access token.

        Through the admin API's shared-secret registration: a nonce, then an HMAC-SHA1 of it with
        the user's name, password and admin flag."""
        localpart = localpart or f"u{secrets.token_hex(6)}"
        password = secrets.token_urlsafe(16)
        endpoint = f"{self.url}/_synapse/admin/v1/register"
        with httpx.Client(timeout=60) as client:
            nonce = client.get(endpoint).raise_for_status().json()["nonce"]
            mac = hmac.new(self.shared_secret.encode(), digestmod=hashlib.sha1)
            mac.update(b"\x00".join([nonce.encode(), localpart.encode(), password.encode(), b"notadmin"]))
            answer = client.post(endpoint, json={
                "nonce": nonce, "username": localpart, "password": password, "admin": False, "mac": mac.hexdigest(),
            })
            answer.raise_for_status()
            body = answer.json()
        return body["user_id"], body["access_token"]

    def stop(self) -> None:
        self.running.stop()

    def restart(self) -> None:
        """Start it again on the same port and database (after :meth:`stop`)."""
        self.running = _start_synapse(self.folder, self.url)


def _synapse_config(folder: Path, port: int, shared_secret: str) -> str:
    """The overrides of the generated configuration: one client listener on loopback, SQLite,
    shared-secret registration, no federation, no rate limit in the tests' way; and the work
    docs/operate/channels.md tells an operator to turn off (presence, room statistics, the
    federation sender of a homeserver that federates with nobody), as there."""
    unlimited = "{per_second: 10000, burst_count: 10000}"
    return f"""
listeners:
  - port: {port}
    bind_addresses: ['127.0.0.1']
    type: http
    tls: false
    x_forwarded: false
    resources:
      - names: [client]
        compress: false
database:
  name: sqlite3
  args:
    database: {folder / 'homeserver.db'}
registration_shared_secret: "{shared_secret}"
enable_registration: false
report_stats: false
trusted_key_servers: []
federation_domain_whitelist: []
suppress_key_server_warning: true
presence:
  enabled: false
stats:
  enabled: false
federation_sender_instances: []
rc_message: {unlimited}
rc_registration: {unlimited}
rc_registration_token_validity: {unlimited}
rc_login:
  address: {unlimited}
  account: {unlimited}
  failed_attempts: {unlimited}
rc_admin_redaction: {unlimited}
rc_joins:
  local: {unlimited}
  remote: {unlimited}
rc_joins_per_room: {unlimited}
rc_invites:
  per_room: {unlimited}
  per_user: {unlimited}
  per_issuer: {unlimited}
rc_3pid_validation: {unlimited}
rc_room_creation: {unlimited}
"""


def _start_synapse(folder: Path, url: str) -> Running:
    python = SYNAPSE.python

    def answers() -> bool:
        try:
            return httpx.get(f"{url}/_matrix/client/versions", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    return start(
        [str(python), "-m", "synapse.app.homeserver", "-c", str(folder / "homeserver.yaml"),
         "-c", str(folder / "overrides.yaml")],
        folder=folder, answers=answers, what="Synapse",
    )


@contextlib.contextmanager
def synapse(folder: Path, extra_config: str = "") -> Iterator[Homeserver]:
    """A Synapse of its own in ``folder`` on a free loopback port, stopped when the block ends;
    ``extra_config`` (YAML) overrides the tests' configuration (bench.channels compares them).
    Raises :class:`CannotInstall` when it cannot be installed."""
    python = install(SYNAPSE)
    port = free_port()
    shared_secret = secrets.token_hex(16)
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(python), "-m", "synapse.app.homeserver", "--server-name", SERVER_NAME, "--config-path",
         str(folder / "homeserver.yaml"), "--data-directory", str(folder), "--generate-config", "--report-stats=no"],
        check=True, capture_output=True, cwd=folder, timeout=START_TIMEOUT_S,
    )
    (folder / "overrides.yaml").write_text(_synapse_config(folder, port, shared_secret) + extra_config)
    url = f"http://127.0.0.1:{port}"
    server = Homeserver(url, SERVER_NAME, shared_secret, _start_synapse(folder, url), folder)
    try:
        yield server
    finally:
        server.stop()


# --- The witness (aics-witness: c2sp.org/tlog-witness) ----------------------------------------


@dataclasses.dataclass
class Witness:
    """A running aics-witness: its submission prefix, its cosignature vkey, and its folder."""

    url: str
    vkey: str
    folder: Path
    running: Running
    port: int
    log_level: str = "INFO"

    def trust(self, origin: str, log_vkey: str) -> None:
        """Have the witness take checkpoints of ``origin`` signed by ``log_vkey``: added to its
        configuration, which it reads again on SIGHUP; waits until it knows the origin."""
        _witness_command(self.folder, "add-log", "--origin", origin, "--vkey", log_vkey)
        os.kill(self.running.process.pid, signal.SIGHUP)
        # A checkpoint of that origin signed by no key it trusts: 404 while the origin is unknown, then 403.
        unsigned = f"old 0\n\n{origin}\n0\n{'A' * 43}=\n\n\u2014 {origin} {'A' * 90}==\n".encode()

        def knows() -> bool:
            return httpx.post(f"{self.url}/add-checkpoint", content=unsigned, timeout=5).status_code != 404

        wait_until(knows, timeout_s=START_TIMEOUT_S, what=f"the witness did not take the log {origin}", log=self.running.log)

    def stop(self) -> None:
        self.running.stop()

    def start(self) -> None:
        """Start it again after :meth:`stop`, on the same port, with the state it had."""
        self.running = _serve_witness(self.folder, self.port, self.log_level)


def _witness_command(folder: Path, *argv: str) -> str:
    python = install(WITNESS)
    done = subprocess.run(
        [str(python), "-m", "aics_witness", *argv, "--config", str(folder / "witness.json")],
        check=True, capture_output=True, text=True, cwd=folder, timeout=START_TIMEOUT_S,
    )
    return done.stdout


def _serve_witness(folder: Path, port: int, log_level: str) -> Running:
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            # Any answer will do: the witness is up once its socket speaks HTTP.
            httpx.post(f"{url}/add-checkpoint", content=b"", timeout=2)
            return True
        except httpx.HTTPError:
            return False

    return start(
        [str(WITNESS.python), "-m", "aics_witness", "serve", "--config", str(folder / "witness.json"), "--log-level", log_level],
        folder=folder, answers=answers, what="aics-witness",
    )


@contextlib.contextmanager
def witness(folder: Path, name: str, log_level: str = "INFO") -> Iterator[Witness]:
    """An aics-witness named ``name`` in ``folder`` on a free loopback port, stopped when the block ends
    (``log_level`` DEBUG logs each request). Raises :class:`CannotInstall` when it cannot be installed."""
    install(WITNESS)
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    said = _witness_command(folder, "init", "--name", name, "--listen", f"127.0.0.1:{port}")
    vkey = said.strip().splitlines()[-1]
    server = Witness(f"http://127.0.0.1:{port}", vkey, folder, _serve_witness(folder, port, log_level), port, log_level)
    try:
        yield server
    finally:
        server.stop()


# --- The Nostr relay (nostr-relay) --------------------------------------------------------------


@dataclasses.dataclass
class Relay:
    """A running nostr-relay: its websocket URL; :meth:`stop` and :meth:`start` keep its port and events."""

    url: str
    folder: Path
    running: Running

    def stop(self) -> None:
        self.running.stop()

    def start(self) -> None:
        self.running = _serve_relay(self.folder, self.url)


def _relay_config(folder: Path, port: int) -> str:
    """SQLite storage in ``folder``; events up to a year old are taken (gift wraps are dated up to
    two days back), signatures checked, no authentication, no rate limit; uvicorn (the gunicorn
    table's keys are its options) closes open websockets within a second of SIGTERM."""
    return f"""
DEBUG: false
relay_name: agent-gateway tests
storage:
  sqlalchemy.url: sqlite+aiosqlite:///{folder / 'relay.sqlite3'}
  num_concurrent_reqs: 10
  num_concurrent_adds: 2
  validators:
    - nostr_relay.validators.is_not_too_large
    - nostr_relay.validators.is_signed
    - nostr_relay.validators.is_recent
oldest_event: 31536000
gunicorn:
  bind: 127.0.0.1:{port}
  workers: 1
  loglevel: warning
  reload: false
  timeout_graceful_shutdown: 1
verification:
  nip05_verification: disabled
authentication:
  enabled: false
message_timeout: 1800
subscription_limit: 64
max_limit: 6000
"""


def _serve_relay(folder: Path, url: str) -> Running:
    http = url.replace("ws://", "http://", 1)

    def answers() -> bool:
        try:  # NIP-11: the relay's information document
            return httpx.get(http, headers={"Accept": "application/nostr+json"}, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    return start(
        [str(RELAY.python), "-c", "from nostr_relay.cli import main; main()", "-c", str(folder / "relay.yaml"),
         "serve", "--use-uvicorn"],
        folder=folder, answers=answers, what="nostr-relay",
    )


@contextlib.contextmanager
def relay(folder: Path) -> Iterator[Relay]:
    """A nostr-relay of its own in ``folder`` on a free loopback port, stopped when the block ends.
    Raises :class:`CannotInstall` when it cannot be installed."""
    install(RELAY)
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (folder / "relay.yaml").write_text(_relay_config(folder, port))
    server = Relay(f"ws://127.0.0.1:{port}", folder, _serve_relay(folder, f"ws://127.0.0.1:{port}"))
    try:
        yield server
    finally:
        server.stop()


def main(argv: list[str]) -> int:
    """``python -m tests.servers install [NAME ...]``: make the servers' environments now."""
    if not argv or argv[0] != "install":
        print("usage: python -m tests.servers install [" + "|".join(PACKAGES) + " ...]", file=sys.stderr)
        return 2
    for name in argv[1:] or list(PACKAGES):
        try:
            print(f"{name}: {install(PACKAGES[name])}")
        except CannotInstall as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
