"""The suite's own scheduling: a module that shares a server runs in one worker."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ONE_WORKER_MODULES, OneWorkerPerSharedServer

ROOT = Path(__file__).resolve().parent.parent


def test_every_listed_module_exists() -> None:
    assert [module for module in sorted(ONE_WORKER_MODULES) if not (ROOT / module).is_file()] == []


def test_a_listed_module_is_one_scope_and_any_other_test_is_its_own() -> None:
    split = OneWorkerPerSharedServer._split_scope
    assert split(None, "tests/channels/test_matrix.py::test_a[sqlite]") == "tests/channels/test_matrix.py"  # type: ignore[arg-type]
    assert split(None, "tests/channels/test_matrix.py::test_b") == "tests/channels/test_matrix.py"  # type: ignore[arg-type]
    assert split(None, "tests/test_clock.py::test_c[x]") == "tests/test_clock.py::test_c[x]"  # type: ignore[arg-type]
