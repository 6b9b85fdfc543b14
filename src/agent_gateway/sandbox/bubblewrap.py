"""Confining the agent program with bubblewrap (``bwrap``): what it sees, and how it starts.

The agent program runs in its own user, PID, network, IPC and UTS
namespaces, with no capabilities and ``no_new_privs`` (bubblewrap sets it).
Its file system is built from nothing: the system's read-only directories
(``/usr``, ``/bin``, ``/lib*``, and ``/etc`` as any user sees it: every file
or folder there that others may not read is covered over, found afresh for
each program, since the agent runs as the gateway's user and, for a gateway
run as root, would otherwise read root's private files), the gateway's
Python environment read-only (``inside.py`` runs on it, and so does a Python
agent), the agent program's own files read-only (never one reached through
a folder the agent can write: its venv's ``pyvenv.cfg`` there would choose
what the gateway binds), the operator's
``runtime.sandbox_ro``/``runtime.sandbox_rw`` paths, the Workspace read-write
at its own path (the working directory), a private ``/tmp``, its own
``/proc`` and a minimal ``/dev``. The gateway's secrets (the signing key,
the config file, the SQLite database and the folders holding them) are never
bound: a path that would contain one is left out, or refused when the
operator names it, and one that lies inside a bound system or Python
directory is covered over.

Its network namespace has a loopback and nothing else. ``inside.py`` forwards
``127.0.0.1:<Agent server port>`` there to a Unix socket of the gateway
(``relay.py``), and, when ``runtime.allow_hosts`` lists hosts, a proxy port to
the egress proxy (``proxy.py``). The environment is a minimal one (``PATH``,
the locale, ``TZ``, ``HOME`` set to the Workspace) with ``AGENT_SERVER_URL``,
the Run's variables, the proxy variables and the names in
``runtime.env_pass``: the gateway's own environment may hold a database
password or cloud credentials.

bubblewrap runs in the agent's process group with SIGTERM and SIGINT blocked,
so the gateway's SIGTERM to the group reaches the agent program (which
``inside.py`` unblocks) and its grace period, while bubblewrap's processes
stay until the program exits; ``--die-with-parent`` and the PID namespace
end everything inside when the program or the gateway ends. bubblewrap asks
to die with its parent only after it has cloned the sandbox's first process,
so a gateway killed in that window would leave a sandbox running beside the
next leader's Runs: each sandbox also holds the read end of a pipe whose
write end only the gateway process holds (the *lifeline*), and ``inside.py``
ends everything inside when it reads the end of it. No
``--new-session``: it would take the agent out of the process group that the
gateway stops, and the program has no terminal to misuse (stdin, stdout and
stderr are pipes and the group has no controlling terminal).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import agent_gateway
from agent_gateway.config import Address
from agent_gateway.errors import GatewayError
from agent_gateway.sandbox import cgroups
from agent_gateway.sandbox.proxy import EgressProxy
from agent_gateway.sandbox.relay import Relay

# Where the gateway's Unix sockets appear inside the sandbox.
INSIDE_DIR = "/run/agent-gateway"
# The Agent server's port on the sandbox's loopback is the configured one, unless that is below
# 1024, which a program without capabilities cannot listen on: then this one.
UNPRIVILEGED_PORTS = 1024
INSIDE_AGENT_PORT = 8701
# The egress proxy's port on the sandbox's loopback (the next one when the Agent server has it).
PROXY_PORT = 3128
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
ETC = "/etc"
# What of /etc is covered over whatever its mode (besides all that others may not read).
ETC_SECRETS = (
    "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/sudoers.d",
    "/etc/ssh", "/etc/ssl/private", "/etc/security/opasswd",
)
# A venv's base interpreter (``home`` in its pyvenv.cfg) is never bound from these: the kernel's views.
NOT_PYTHON = ("/proc", "/sys", "/dev")
# What the agent keeps of the gateway's environment, besides LC_* and runtime.env_pass.
KEPT_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH")
# Removing the agent's cgroup waits for its last processes to exit: up to 100 x 0.05 s.
GROUP_REMOVAL_TRIES = 100
GROUP_REMOVAL_PAUSE_S = 0.05
# Links followed in one path before giving up, as the kernel's limit.
MAX_LINKS = 40
# How long the start-up check may take: a guard, not a measure (bubblewrap starts in milliseconds).
CHECK_TIMEOUT_S = 60
_INSIDE_PY = Path(__file__).with_name("inside.py")

logger = logging.getLogger(__name__)


class SandboxError(GatewayError):
    """The agent program cannot be confined."""


class Sandbox:
    """bubblewrap confinement for one runtime's agent program; ``wrap`` turns its argv into a confined one.

    ``protected`` are the gateway's secrets (files and folders) that the
    agent must never see. ``prepare`` starts the gateway's ends (the relay to
    the Agent server, the egress proxy) before a program starts; ``close``
    stops them.
    """

    def __init__(
        self,
        bwrap: str,
        *,
        agent_server: Address,
        protected: Iterable[Path],
        read_only: Sequence[Path] = (),
        read_write: Sequence[Path] = (),
        allow_hosts: Sequence[Address] = (),
        env_pass: Sequence[str] = (),
        max_processes: int,
        memory_limit_mb: int,
    ) -> None:
        self.bwrap = bwrap
        self.agent_server = agent_server
        self.protected = [_real(path) for path in protected]
        for setting, paths in (("runtime.sandbox_ro", read_only), ("runtime.sandbox_rw", read_write)):
            for path in paths:
                self._refuse_exposing(setting, path)
        self.read_only = [_real(path) for path in read_only]
        self.read_write = [_real(path) for path in read_write]
        self.allow_hosts = tuple(allow_hosts)
        self.env_pass = tuple(env_pass)
        self.max_processes = max_processes
        self.memory_limit_mb = memory_limit_mb
        self.agent_port = agent_server.port if agent_server.port >= UNPRIVILEGED_PORTS else INSIDE_AGENT_PORT
        self.proxy_port = PROXY_PORT if self.agent_port != PROXY_PORT else PROXY_PORT + 1
        self._directory: str | None = None
        self._group: cgroups.Group | None = None
        self._ends: list[Relay | EgressProxy] = []
        self._lifeline: tuple[int, int] | None = None
        self._lock = asyncio.Lock()

    # --- the gateway's ends ------------------------------------------------------

    def directory(self) -> str:
        """The folder of the gateway's Unix sockets (private to the gateway's user), made once."""
        if self._directory is None:
            self._directory = tempfile.mkdtemp(prefix="agent-gateway-sandbox-")
        return self._directory

    async def prepare(self) -> None:
        """Start the relay to the Agent server (and the egress proxy) and open the lifeline, unless done."""
        async with self._lock:
            if self._ends:
                return
            # Not inheritable (PEP 446): no other program the gateway starts holds the write end.
            self._lifeline = os.pipe()
            directory = self.directory()
            self.group()
            server = self.agent_server.connectable
            ends: list[Relay | EgressProxy] = [Relay(os.path.join(directory, "agent.sock"), server.host, server.port)]
            if self.allow_hosts:
                ends.append(EgressProxy(os.path.join(directory, "proxy.sock"), self.allow_hosts))
            for end in ends:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(end.path)
                await end.start()
            self._ends = ends

    async def close(self) -> None:
        """Stop the gateway's ends; closing the lifeline ends whatever still runs confined."""
        ends, self._ends = self._ends, []
        for end in ends:
            await end.close()
        lifeline, self._lifeline = self._lifeline, None
        for fd in lifeline or ():
            os.close(fd)
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None
        if self._group is not None:
            # The program's last processes may still be exiting; an empty group is removable.
            for _ in range(GROUP_REMOVAL_TRIES):
                if self._group.remove():
                    break
                await asyncio.sleep(GROUP_REMOVAL_PAUSE_S)
            self._group = None

    def discard_group(self) -> None:
        """Remove the agent's cgroup before any program has run in it (the start-up check's)."""
        if self._group is not None:
            self._group.remove()
            self._group = None

    def group(self) -> cgroups.Group:
        """The agent's cgroup (``cgroups.py``), made once; it may hold no limit at all."""
        if self._group is None:
            name = f"agent-gateway-{os.getpid()}-{id(self):x}"
            self._group = cgroups.create(name, self.max_processes, self.memory_limit_mb * 1024 * 1024)
        return self._group

    def inherited(self) -> tuple[int, ...]:
        """The file descriptors the confined program's bubblewrap inherits: the lifeline's read end."""
        return (self._lifeline[0],) if self._lifeline is not None else ()

    def enter(self) -> None:
        """What bubblewrap's process runs between fork and exec: join the agent's cgroup, and block
        SIGTERM and SIGINT (``inside.py`` unblocks them for the program; see the module's docstring)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        if self._group is not None:
            self._group.join()

    # --- the confined command ----------------------------------------------------

    def agent_server_url(self) -> str:
        """``$AGENT_SERVER_URL`` inside: the Agent server's port (``agent_port``) on the sandbox's own loopback."""
        return f"http://127.0.0.1:{self.agent_port}"

    def environment(self, env: Mapping[str, str], workdir: Path | None) -> dict[str, str]:
        """What the confined program gets of ``env`` (the runtime's): see the module's docstring."""
        kept = {
            name: value for name, value in env.items()
            if name in KEPT_ENV or name.startswith(("LC_", "AGENT_GATEWAY_"))
        }
        kept.update({name: os.environ[name] for name in self.env_pass if name in os.environ})
        kept["HOME"] = str(_real(workdir)) if workdir is not None else "/tmp"
        kept["AGENT_SERVER_URL"] = self.agent_server_url()
        if self.allow_hosts:
            proxy = f"http://127.0.0.1:{self.proxy_port}"
            for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
                kept[name] = proxy
            # The Agent server is on the loopback, never through the proxy.
            kept["NO_PROXY"] = kept["no_proxy"] = "127.0.0.1,localhost"
        return kept

    def wrap(self, argv: Sequence[str], env: Mapping[str, str], workdir: Path | None) -> list[str]:
        """The bwrap command that runs ``argv`` confined (``env`` is the program's, for finding it on PATH)."""
        directory = self.directory()
        forward = {str(self.agent_port): f"{INSIDE_DIR}/agent.sock"}
        if self.allow_hosts:
            forward[str(self.proxy_port)] = f"{INSIDE_DIR}/proxy.sock"
        setup = {
            "forward": forward,
            "nproc": self.max_processes,
            "data": self.memory_limit_mb * 1024 * 1024,
            "lifeline": self._lifeline[0] if self._lifeline is not None else None,
        }
        args = [
            self.bwrap,
            "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--cap-drop", "ALL",
        ]
        bound: list[Path] = []
        for path in SYSTEM_PATHS:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
                bound.append(Path(path))
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for path in self._program_paths(argv, env, workdir):
            if not any(path.is_relative_to(outer) for outer in bound):
                args += ["--ro-bind", str(path), str(path)]
                bound.append(path)
        # What others may not read of /etc, found afresh each time (milliseconds: a few thousand entries).
        hidden = unreadable(Path(ETC)) if Path(ETC) in bound else []
        covered: list[Path] = []
        for secret in dict.fromkeys([*hidden, *map(Path, ETC_SECRETS), *self.protected]):
            if any(secret.is_relative_to(folder) for folder in covered):
                continue  # inside a folder already covered over
            if os.path.lexists(secret) and any(secret.is_relative_to(outer) for outer in bound):
                # Covered over: an empty folder, or an empty file (bind the Workspace after, if inside).
                if secret.is_dir():
                    args += ["--tmpfs", str(secret)]
                    covered.append(secret)
                else:
                    args += ["--ro-bind", "/dev/null", str(secret)]
        for path in self.read_only:
            args += ["--ro-bind", str(path), str(path)]
        for path in self.read_write:
            args += ["--bind", str(path), str(path)]
        if workdir is not None:
            args += ["--bind", str(_real(workdir)), str(_real(workdir)), "--chdir", str(_real(workdir))]
        else:
            args += ["--chdir", "/tmp"]
        # The root bubblewrap builds is a tmpfs, with the folders leading to each bind: read-only, so
        # that only the Workspace, runtime.sandbox_rw and the private /tmp take writes.
        args += ["--ro-bind", directory, INSIDE_DIR, "--remount-ro", "/"]
        return [*args, "--", sys.executable, "-I", "-S", str(_INSIDE_PY), json.dumps(setup), *argv]

    def _program_paths(self, argv: Sequence[str], env: Mapping[str, str], workdir: Path | None) -> list[Path]:
        """What the program needs read-only: the gateway's Python, the program, its venv, its script.

        A path that would contain one of the gateway's secrets is left out, and so is every path of
        the program's reached through a folder the agent can write (the Workspace, ``sandbox_rw``):
        it sees those anyway, and there a link it made would choose what is bound, as would the
        ``home`` of a venv's pyvenv.cfg, which is then not read at all.
        """
        candidates = [Path(sys.base_prefix), Path(sys.prefix), Path(agent_gateway.__file__).parents[1]]
        candidates += [Path(entry) for entry in sys.path if entry and os.path.isdir(entry)]
        writable = [*self.read_write, *([_real(workdir)] if workdir is not None else [])]
        program = shutil.which(argv[0], path=env.get("PATH")) if "/" not in argv[0] else argv[0]
        if program is not None:
            program_path = Path(workdir or ".", program) if not os.path.isabs(program) else Path(program)
            candidates.append(program_path)
            venv = program_path.parent.parent
            config = venv / "pyvenv.cfg"
            if not passes_through(config, writable) and config.is_file():
                candidates.append(venv)
                candidates += _venv_home(config)
        candidates += [Path(arg) for arg in argv[1:] if os.path.isabs(arg) and os.path.isfile(arg)]
        paths: list[Path] = []
        for candidate in candidates:
            if not os.path.exists(candidate) or passes_through(candidate, writable):
                continue
            path = Path(os.path.abspath(candidate))
            if self._exposes(path) or path in paths:
                continue
            paths.append(path)
        # Outer folders first, so that a path inside one already bound is skipped.
        return sorted(paths, key=lambda path: len(path.parts))

    def _exposes(self, path: Path) -> Path | None:
        """The secret that binding ``path`` would show, if any."""
        real = _real(path)
        for secret in self.protected:
            if secret.is_relative_to(real) or secret.is_relative_to(path):
                return secret
        return None

    def _refuse_exposing(self, setting: str, path: Path) -> None:
        if not os.path.exists(path):
            raise SandboxError(f"{setting}: {path} does not exist")
        secret = self._exposes(path)
        if secret is not None:
            raise SandboxError(f"{setting}: {path} would show the agent the gateway's {secret}")

    # --- the start-up check --------------------------------------------------------

    def check(self, workdir: Path | None) -> None:
        """Start a confined ``true`` as a Run's program would start; raise :class:`SandboxError` saying why not."""
        if workdir is not None:
            secret = self._exposes(workdir)
            if secret is not None:
                raise SandboxError(f"runtime.workdir {workdir} would show the agent the gateway's {secret}")
            with contextlib.suppress(OSError):
                workdir.mkdir(parents=True, exist_ok=True)
        env = self.environment(os.environ, workdir)
        try:
            result = subprocess.run(
                self.wrap(["true"], env, workdir), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, timeout=CHECK_TIMEOUT_S, check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxError(f"bwrap could not be run: {exc}") from None
        if result.returncode != 0:
            reason = result.stderr.decode(errors="replace").strip().splitlines() or [f"exit status {result.returncode}"]
            raise SandboxError(reason[-1])


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _venv_home(config: Path) -> list[Path]:
    """The base interpreter's installation of a virtual environment (``home`` in its pyvenv.cfg,
    the folder of its ``python``), unless that is the root or one of the kernel's views."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for line in config.read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                installation = Path(value.strip()).parent
                if not installation.is_absolute() or any(
                    place == Path("/") or any(place.is_relative_to(view) for view in NOT_PYTHON)
                    for place in (installation, _real(installation))
                ):
                    return []
                return [installation]
    return []


def passes_through(path: Path, folders: Sequence[Path]) -> bool:
    """Whether resolving ``path`` (links followed one by one, as the kernel does) reaches one of
    ``folders`` (real paths) on the way: below one, any link may be the agent's. The links followed
    before are outside them, where the agent cannot change them."""
    parts = list(Path(os.getcwd(), path).parts[1:])
    here, links = Path("/"), 0
    while True:
        if any(here.is_relative_to(folder) for folder in folders):
            return True
        if not parts:
            return False
        part = parts.pop(0)
        step = here.parent if part == ".." else here / part
        if os.path.islink(step) and links < MAX_LINKS:
            links += 1
            target = os.readlink(step)
            here = Path("/") if os.path.isabs(target) else here
            parts = [*Path(target).parts[1 if os.path.isabs(target) else 0 :], *parts]
        else:
            here = step


def unreadable(root: Path) -> list[Path]:
    """Every file and folder below ``root`` that others may not read (a folder: list and enter), the
    folders' contents not listed; links are not followed (what they point at is judged where it is)."""
    found: list[Path] = []
    folders = [root]
    while folders:
        with contextlib.suppress(OSError), os.scandir(folders.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    mode = entry.stat(follow_symlinks=False).st_mode
                    if stat.S_ISLNK(mode):
                        continue
                    if stat.S_ISDIR(mode):
                        if mode & (stat.S_IROTH | stat.S_IXOTH) != stat.S_IROTH | stat.S_IXOTH:
                            found.append(Path(entry.path))
                        else:
                            folders.append(Path(entry.path))
                    elif not mode & stat.S_IROTH:
                        found.append(Path(entry.path))
    return sorted(found)
