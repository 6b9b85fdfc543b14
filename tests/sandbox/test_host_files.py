"""What of the host the confined agent sees besides its own files: never a folder chosen by a file it
can write (a venv's pyvenv.cfg in its Workspace), never the kernel's views or the root as a venv's
base, of /etc only what any user may read, and none of the secret files the configuration names."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import stat
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_gateway import config
from agent_gateway.config import Address
from agent_gateway.sandbox import bubblewrap, choose
from agent_gateway.sandbox.bubblewrap import Sandbox, SandboxError
from tests.conftest import ETC_MADE_BY_TESTS

pytestmark = pytest.mark.processes

AGENT_SERVER = Address("127.0.0.1", 9999)
# Prints the files it names, or "unseen" for each the sandbox has none of (never given as arguments:
# an argument that is the absolute path of a file is bound for the program).
SHOW = '#!/bin/sh\nfor f in {files}; do cat "$f" 2>/dev/null || echo unseen; echo .; done\n'


@pytest.fixture
def sandboxes(bwrap: str) -> Iterator[Callable[..., Sandbox]]:
    """Makes sandboxes (no protected paths unless given), closed at the end."""
    made: list[Sandbox] = []

    def make(**options: Any) -> Sandbox:
        options.setdefault("protected", [])
        sandbox = Sandbox(bwrap, agent_server=AGENT_SERVER, max_processes=1024, memory_limit_mb=4096, **options)
        made.append(sandbox)
        return sandbox

    yield make
    for sandbox in made:
        asyncio.run(sandbox.close())


def run(sandbox: Sandbox, argv: list[str], workdir: Path) -> subprocess.CompletedProcess[str]:
    """``argv`` confined as a Run's program starts (without the gateway's ends: nothing here calls it)."""
    env = sandbox.environment(os.environ, workdir)
    return subprocess.run(
        sandbox.wrap(argv, env, workdir), env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=300, check=False,
    )


def binds(args: list[str]) -> list[str]:
    """The host paths a bwrap command binds (read-only or not)."""
    return [args[at + 1] for at, arg in enumerate(args) if arg in ("--ro-bind", "--bind")]


def script(path: Path, *shown: Path) -> Path:
    """An agent program at ``path`` that shows the files ``shown`` (:data:`SHOW`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SHOW.format(files=" ".join(f"'{file}'" for file in shown) or "''"))
    path.chmod(0o755)
    return path


def shown(result: subprocess.CompletedProcess[str]) -> list[str]:
    """What a :func:`script` program showed of each file."""
    assert result.returncode == 0, result.stderr
    return result.stdout.split(".\n")[:-1]


@pytest.fixture
def host_only(tmp_path: Path) -> Path:
    """A host folder with a file the agent must never read."""
    folder = tmp_path / "host-only"
    folder.mkdir()
    (folder / "secret.txt").write_text("host only\n")
    return folder


# --- a venv's pyvenv.cfg --------------------------------------------------------------------


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_a_venv_in_the_workspace_chooses_no_bind(
    sandboxes: Callable[..., Sandbox], tmp_path: Path, host_only: Path, relative: bool
) -> None:
    """The agent writes its venv's pyvenv.cfg: `home = <any host folder>/x` showed that folder at its next start."""
    workspace = tmp_path / "workspace"
    agent = script(workspace / ".venv" / "bin" / "agent", host_only / "secret.txt")
    (workspace / ".venv" / "pyvenv.cfg").write_text(f"home = {host_only}/bin\n")
    sandbox = sandboxes()
    program = ".venv/bin/agent" if relative else str(agent)
    assert shown(run(sandbox, [program], workspace)) == ["unseen\n"]
    # Nor the host's /proc over the sandbox's own.
    (workspace / ".venv" / "pyvenv.cfg").write_text("home = /proc/x\n")
    assert "/proc" not in binds(sandbox.wrap([program], {}, workspace))


def test_a_venv_in_a_sandbox_rw_folder_chooses_no_bind(
    sandboxes: Callable[..., Sandbox], tmp_path: Path, host_only: Path
) -> None:
    shared = tmp_path / "shared"
    agent = script(shared / "venv" / "bin" / "agent", host_only / "secret.txt")
    (shared / "venv" / "pyvenv.cfg").write_text(f"home = {host_only}/bin\n")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    assert shown(run(sandboxes(read_write=[shared]), [str(agent)], workspace)) == ["unseen\n"]


def test_a_program_reached_through_a_link_into_the_workspace_chooses_no_bind(
    sandboxes: Callable[..., Sandbox], tmp_path: Path, host_only: Path
) -> None:
    """The operator's link outside leads into the Workspace, where the agent's venv is."""
    workspace = tmp_path / "workspace"
    script(workspace / ".venv" / "bin" / "agent")
    (workspace / ".venv" / "pyvenv.cfg").write_text(f"home = {host_only}/bin\n")
    (tmp_path / "opt").mkdir()
    (tmp_path / "opt" / "agent").symlink_to(workspace)
    program = tmp_path / "opt" / "agent" / ".venv" / "bin" / "agent"
    args = sandboxes().wrap([str(program)], {}, workspace)
    assert not any(path.startswith((str(host_only), str(tmp_path / "opt"))) for path in binds(args))


def test_a_venv_outside_the_agents_folders_is_honoured(
    sandboxes: Callable[..., Sandbox], tmp_path: Path
) -> None:
    """The operator's venv beside the Workspace: its base interpreter's installation is bound."""
    base = tmp_path / "python"
    (base / "bin").mkdir(parents=True)
    agent = script(tmp_path / "venv" / "bin" / "agent")
    (tmp_path / "venv" / "pyvenv.cfg").write_text(f"home = {base}/bin\nversion = 3.12\n")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    args = sandboxes().wrap([str(agent)], {}, workspace)
    assert {str(base), str(tmp_path / "venv")} <= set(binds(args))


@pytest.mark.parametrize("home", ["/proc/self", "/sys/kernel", "/dev/shm", "/x", "relative/bin"])
def test_a_venv_home_is_never_the_root_or_a_kernel_view(
    sandboxes: Callable[..., Sandbox], tmp_path: Path, home: str
) -> None:
    agent = script(tmp_path / "venv" / "bin" / "agent")
    (tmp_path / "venv" / "pyvenv.cfg").write_text(f"home = {home}\n")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    bound = binds(sandboxes().wrap([str(agent)], {}, workspace))
    assert not {"/", "/proc", "/sys", "/dev"} & set(bound)
    assert str(Path(home).parent) not in bound


def test_a_venv_home_holding_a_protected_path_is_not_bound(
    sandboxes: Callable[..., Sandbox], tmp_path: Path
) -> None:
    gateway = tmp_path / "gateway"
    (gateway / "bin").mkdir(parents=True)
    (gateway / "signing-key.pem").write_text("key\n")
    agent = script(tmp_path / "venv" / "bin" / "agent", gateway / "signing-key.pem")
    (tmp_path / "venv" / "pyvenv.cfg").write_text(f"home = {gateway}/bin\n")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    sandbox = sandboxes(protected=[gateway / "signing-key.pem"])
    assert str(gateway) not in binds(sandbox.wrap([str(agent)], {}, workspace))
    assert shown(run(sandbox, [str(agent)], workspace)) == ["unseen\n"]


def test_passes_through(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    (workspace / "sub").mkdir(parents=True)
    (workspace / "out").symlink_to("/usr")
    (tmp_path / "alias").symlink_to(workspace)
    folders = [workspace.resolve()]
    assert bubblewrap.passes_through(workspace / "sub" / "file", folders)
    assert bubblewrap.passes_through(workspace / "out" / "bin", folders)  # leaves it, but through it
    assert bubblewrap.passes_through(tmp_path / "alias" / "x", folders)
    assert bubblewrap.passes_through(tmp_path / "other" / ".." / "workspace", folders)
    assert not bubblewrap.passes_through(tmp_path / "other", folders)
    assert not bubblewrap.passes_through(Path(sys.executable), folders)


# --- /etc as any user sees it ---------------------------------------------------------------


def test_unreadable_lists_what_others_may_not_read_without_following_links(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    (etc / "open").mkdir(parents=True)
    for name, mode in (("readable", 0o644), ("private", 0o600), ("group", 0o640), ("open/private", 0o600)):
        (etc / name).write_text(name)
        (etc / name).chmod(mode)
    for name, mode in (("closed", 0o700), ("listless", 0o711), ("enterless", 0o754)):
        (etc / name).mkdir()
        (etc / name / "inside").write_text("inside")
        (etc / name).chmod(mode)
    (etc / "link").symlink_to(etc / "private")
    assert bubblewrap.unreadable(etc) == sorted(
        etc / name for name in ("private", "group", "open/private", "closed", "listless", "enterless")
    )


@pytest.fixture
def etc_files() -> dict[str, Path]:
    """Uniquely named files and a folder under the real /etc (as root only), removed when the whole
    run ends (``tests/conftest.py``: other workers' sandboxes may be starting with them listed)."""
    if os.geteuid() != 0:
        pytest.skip("writing under /etc needs root (which is also where it matters)")
    name = f"{ETC_MADE_BY_TESTS}{uuid.uuid4().hex}"
    made = {
        "private": Path(f"/etc/{name}.private"),
        "public": Path(f"/etc/{name}.public"),
        "folder": Path(f"/etc/{name}.d"),
    }
    for key, mode in (("private", 0o600), ("public", 0o644)):
        made[key].write_text(f"{key} content\n")
        made[key].chmod(mode)
    made["folder"].mkdir(mode=0o700)
    (made["folder"] / "readable").write_text("inside a private folder\n")
    (made["folder"] / "readable").chmod(0o644)
    return made


def test_the_agent_sees_of_etc_only_what_any_user_may_read(
    sandboxes: Callable[..., Sandbox], tmp_path: Path, etc_files: dict[str, Path]
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    files = [etc_files["private"], etc_files["public"], etc_files["folder"] / "readable", Path("/etc/shadow")]
    show = script(tmp_path / "show", *files)
    assert stat.S_IMODE(etc_files["private"].stat().st_mode) == 0o600 and etc_files["private"].stat().st_uid == 0
    private, public, inside, shadow = shown(run(sandboxes(), [str(show)], workspace))
    assert private in ("", "unseen\n")  # an empty file over it
    assert public == "public content\n"
    assert inside == "unseen\n"  # an empty folder over it
    assert shadow in ("", "unseen\n")


# --- the secret files the configuration names -----------------------------------------------


def test_every_secret_file_the_configuration_names_is_protected(bwrap: str, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    nostr, matrix = keys / "nostr.key", tmp_path / "tokens" / "matrix.token"
    nostr.write_text("nsec1...\n")
    matrix.parent.mkdir()
    matrix.write_text("syt_...\n")
    settings = config.Settings(
        token_ttl_ms=1, runtime_command=(sys.executable, "-c", "pass"), runtime_workdir=tmp_path / "workspace",
        runtime_sandbox="bubblewrap", nostr_key_file=nostr, matrix_access_token_file=matrix,
    )
    assert {nostr, matrix} <= set(choose.protected(settings))
    for changes in ({"runtime_sandbox_ro": (keys,)}, {"runtime_sandbox_rw": (matrix.parent,)}):
        with pytest.raises(SandboxError) as refused:
            choose.choose(dataclasses.replace(settings, **changes), AGENT_SERVER)
        [(setting, (path,))] = changes.items()
        secret = nostr if path == keys else matrix
        assert str(refused.value) == (
            'runtime.sandbox = "bubblewrap": the agent program cannot be confined: '
            f"{setting.replace('_', '.', 1)}: {path} would show the agent the gateway's {secret}"
        )
    with pytest.raises(SandboxError, match="^runtime.sandbox = \"bubblewrap\": .*runtime.workdir .* would show"):
        choose.choose(dataclasses.replace(settings, runtime_workdir=keys), AGENT_SERVER)


def test_a_webhooks_secret_file_is_protected_wherever_it_lies(bwrap: str, tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "hook.secret").write_text("whsec_" + "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFB" + "\n")
    (tmp_path / "gateway.toml").write_text(
        '[auth]\ntoken_ttl_ms = 60000\n\n[[webhooks]]\nurl = "https://hooks.example.org/in"\nevents = ["decision.published"]\n'
        'secret_file = "secrets/hook.secret"\n'
    )
    settings = config.load(tmp_path / "gateway.toml", environ={})
    [endpoint] = settings.webhooks
    assert endpoint.secret_file == secrets / "hook.secret"
    settings = dataclasses.replace(
        settings, runtime_command=(sys.executable, "-c", "pass"), runtime_workdir=tmp_path / "workspace",
        runtime_sandbox="bubblewrap", runtime_sandbox_ro=(secrets,),
    )
    with pytest.raises(SandboxError, match="runtime.sandbox.ro: .* would show the agent the gateway's .*hook.secret"):
        choose.choose(settings, AGENT_SERVER)
