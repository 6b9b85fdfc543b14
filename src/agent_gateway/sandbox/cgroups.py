"""Limits on the confined agent as a whole, through a cgroup of its own where this process may make one.

The rlimits that ``inside.py`` sets hold everywhere but count per process
(``RLIMIT_DATA``) or per user (``RLIMIT_NPROC``), and the kernel exempts uid 0
from ``RLIMIT_NPROC`` altogether: a gateway running as root cannot stop a fork
bomb with rlimits. So the agent's processes also join a cgroup made below
the gateway's own, in each hierarchy (cgroup v2, or a v1 ``pids``/``memory``
hierarchy) where the gateway may create one (as root, or a user given a
delegated subtree), with ``pids.max = runtime.max_processes`` and a memory
limit of ``runtime.memory_limit_mb`` for all its processes together.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

# The memory limit's file in each cgroup version.
_MEMORY_FILE = {"cgroup2": "memory.max", "cgroup": "memory.limit_in_bytes"}


class Group:
    """The agent's cgroup, one directory per hierarchy that has a limit to set."""

    def __init__(self, directories: dict[str, Path]) -> None:
        self.directories = directories  # controller -> directory

    @property
    def controllers(self) -> list[str]:
        return sorted(self.directories)

    def join(self) -> None:
        """Move the calling process into the group (run between fork and exec: no allocation-heavy work)."""
        for directory in self.directories.values():
            fd = os.open(directory / "cgroup.procs", os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    def remove(self) -> bool:
        """Remove the group's directories; False while a process is still in one (it stays)."""
        removed = True
        for directory in self.directories.values():
            try:
                directory.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                removed = False
        return removed


def create(name: str, max_processes: int, memory_bytes: int) -> Group:
    """A group ``name`` below this process's cgroups with the limits set where possible (maybe none)."""
    limits = {"pids": ("pids.max", str(max_processes)), "memory": (None, str(memory_bytes))}
    directories: dict[str, Path] = {}
    for controller, (file, value) in limits.items():
        found = _own_cgroup(controller)
        if found is None:
            continue
        version, parent = found
        directory = parent / name
        try:
            directory.mkdir(exist_ok=True)
            (directory / (file or _MEMORY_FILE[version])).write_text(value)
        except OSError:
            with contextlib.suppress(OSError):
                directory.rmdir()
            continue
        directories[controller] = directory
    return Group(directories)


def _own_cgroup(controller: str) -> tuple[str, Path] | None:
    """This process's cgroup directory in the hierarchy that has ``controller``, and its version."""
    try:
        memberships = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in memberships:
        _, controllers, path = line.split(":", 2)
        version = "cgroup2" if controllers == "" else "cgroup"
        if version == "cgroup" and controller not in controllers.split(","):
            continue
        for mount in mounts:
            fields = mount.split()
            separator = fields.index("-")
            fstype, options = fields[separator + 1], fields[separator + 3].split(",")
            if fstype != version or (version == "cgroup" and controller not in options):
                continue
            root, point = fields[3], fields[4]
            if not (path + "/").startswith(root.rstrip("/") + "/"):
                continue
            directory = Path(point, path[len(root.rstrip("/")):].lstrip("/"))
            if version == "cgroup2" and not _v2_enabled(directory, controller):
                continue
            return version, directory
    return None


def _v2_enabled(directory: Path, controller: str) -> bool:
    """Whether cgroups below ``directory`` get ``controller`` (enabling it when allowed)."""
    control = directory / "cgroup.subtree_control"
    with contextlib.suppress(OSError):
        if controller in control.read_text().split():
            return True
        control.write_text(f"+{controller}")
        return True
    return False
