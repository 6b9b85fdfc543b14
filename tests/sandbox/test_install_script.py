"""scripts/install-bubblewrap, which scripts/quickstart runs before serving: on a machine without
bwrap it installs bubblewrap as root with apt-get, and otherwise says in one line how; it never
stops the quickstart. Run against stand-ins for ``id`` and ``apt-get`` on a PATH without bwrap."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install-bubblewrap"
HOW = (
    "bubblewrap is not installed: the echo demo runs unconfined, and any other agent program will be refused "
    "until you install it (Debian/Ubuntu: sudo apt-get install bubblewrap)\n"
)


def stand_in(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def run(tmp_path: Path, uid: int, apt_get: str | None = None, bwrap: bool = False) -> tuple[str, list[str]]:
    """The script's output, and each apt-get call's arguments, on a PATH of stand-ins only."""
    folder = tmp_path / "bin"
    folder.mkdir()
    calls = tmp_path / "apt-get-calls"
    stand_in(folder, "id", f"echo {uid}")
    if apt_get is not None:
        stand_in(folder, "apt-get", f'echo "$*" >> {calls}\n{apt_get}')
    if bwrap:
        stand_in(folder, "bwrap", "exit 0")
    result = subprocess.run(
        ["/bin/bash", str(SCRIPT)], env={"PATH": str(folder)}, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stderr == ""
    return result.stdout, calls.read_text().splitlines() if calls.exists() else []


def test_bwrap_found_says_nothing(tmp_path: Path) -> None:
    assert run(tmp_path, 0, apt_get="exit 0", bwrap=True) == ("", [])


@pytest.mark.parametrize(("uid", "apt_get"), [(1000, "exit 0"), (1000, None), (0, None)], ids=["user", "user-no-apt", "root-no-apt"])
def test_where_it_cannot_install_one_line_says_how(tmp_path: Path, uid: int, apt_get: str | None) -> None:
    assert run(tmp_path, uid, apt_get) == (HOW, [])


def test_root_with_apt_get_installs_it(tmp_path: Path) -> None:
    output, calls = run(tmp_path, 0, apt_get="exit 0")
    assert output == "installing bubblewrap, which confines the agent program (apt-get install bubblewrap)\n"
    assert calls == ["install -y -qq bubblewrap"]


def test_empty_package_lists_are_updated_first(tmp_path: Path) -> None:
    # The first install fails (no package lists yet, as in a fresh container), the one after update works.
    output, calls = run(tmp_path, 0, apt_get=f'[ "$1" = update ] && : > {tmp_path}/updated; [ -e {tmp_path}/updated ]')
    assert calls == ["install -y -qq bubblewrap", "update -qq", "install -y -qq bubblewrap"]
    assert output.count("\n") == 1


def test_a_failed_install_is_one_line_and_the_quickstart_goes_on(tmp_path: Path) -> None:
    output, calls = run(tmp_path, 0, apt_get="exit 100")
    assert output.splitlines()[1] == (
        "could not install bubblewrap: the echo demo runs unconfined, and any other agent program will be "
        "refused until it is installed (apt-get install bubblewrap)"
    )
    assert len(output.splitlines()) == 2
