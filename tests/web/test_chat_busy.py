"""The chat page when the gateway answers 503 ("not recorded, retry"): retried, then said, then sent again.

SQLite only: a write lock held by this test makes every write of the gateway
wait out its busy timeout and answer 503, which is the real answer with
nothing stubbed. On PostgreSQL only stopping the server would do it, which
would cut every other test's connections (see ``restarts_postgresql``).
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from tests.web.conftest import Deployment, Watched, deployed, log_in, messages, send

pytestmark = pytest.mark.e2e


@pytest.fixture
def database_url(sqlite_template: Path, tmp_path: Path) -> str:
    path = tmp_path / "gateway.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def deployment(tmp_path: Path, database_url: str) -> Iterator[Deployment]:
    # Each write gives up on the lock after 2 s instead of 30: three attempts are what is tested.
    with deployed(tmp_path / "demo", database_url, AGENT_GATEWAY_DATABASE_BUSY_TIMEOUT_MS="2000") as deployment:
        yield deployment


def test_a_message_the_gateway_could_not_record_is_kept_to_send_again(
    deployment: Deployment, watched: Watched, database_url: str
) -> None:
    page = watched.page
    page.goto(deployment.url + "/")
    log_in(page, deployment.credentials["user"], deployment.credentials["password"])
    expect(page.locator("#chat")).to_be_visible()

    lock = sqlite3.connect(database_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")  # the write lock: every write of the gateway waits, then 503
        send(page, "are you there?")
        expect(page.locator("#chat-error")).to_have_text(
            "The gateway is busy: your Message was not recorded. Press Send to try again."
        )
        expect(page.locator("#send-text")).to_have_value("are you there?")
        expect(messages(page)).to_have_count(0)
    finally:
        lock.close()

    page.click("#send")
    expect(messages(page, "inbound")).to_have_count(1)
    expect(page.locator("#chat-error")).to_be_hidden()
    expect(page.locator("#send-text")).to_have_value("")
    token = page.evaluate("sessionStorage.getItem('agent-gateway.token')")
    log = httpx.get(deployment.url + "/messages?after=0", headers={"Authorization": f"Bearer {token}"}, timeout=120)
    inbound = [m["text"] for m in log.json()["messages"] if m["direction"] == "inbound"]
    assert inbound == ["are you there?"]  # the refused attempts stored nothing
    watched.assert_stayed_home(deployment.url)
