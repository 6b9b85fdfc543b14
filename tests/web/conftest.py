"""Fixtures of the browser tests: Debian's chromium, headless, driven by Playwright, against a real ``serve``.

The deployment is what ``agent-gateway init --demo-user`` makes (the echo
agent answers every Message). Playwright's own browser download cannot work
here (no internet): the tests launch ``/usr/bin/chromium`` through
``executable_path``. Without it they are skipped with the reason, unless
``AGENT_GATEWAY_TEST_REQUIRE_CHROMIUM=1`` (set by ``.ci/run``, which installs
it), where they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from tests import served

CHROMIUM = os.environ.get("AGENT_GATEWAY_TEST_CHROMIUM", "/usr/bin/chromium")
REQUIRE_CHROMIUM = os.environ.get("AGENT_GATEWAY_TEST_REQUIRE_CHROMIUM") == "1"
# Ceilings for a broken build, not expectations: chromium on a loaded two-core machine is slow.
CEILING_MS = 300_000
expect.set_options(timeout=CEILING_MS)


class Deployment:
    """A demo deployment served by a real ``serve``, which a test may restart."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.directory = directory
        self.credentials = json.loads((directory / "demo-user.json").read_text())
        # Ports of its own, picked again should another test take one meanwhile; kept for restarts.
        self.gateway = served.ServedGateway.spawn_on_free_ports(directory, env)
        self.env = self.gateway.env

    @property
    def url(self) -> str:
        return self.gateway.public_url

    def stop(self) -> None:
        assert self.gateway.stop() == 0, self.gateway.output()

    def start(self) -> None:
        self.gateway = served.ServedGateway.spawn(self.directory, self.env)  # the same ports and database


def init(directory: Path, database_url: str, **settings: str) -> dict[str, str]:
    env = {
        "AGENT_GATEWAY_DATABASE_URL": database_url,
        "AGENT_GATEWAY_PUBLIC_LISTEN": f"127.0.0.1:{served.free_port()}",
        "AGENT_GATEWAY_AGENT_LISTEN": f"127.0.0.1:{served.free_port()}",
        "AGENT_GATEWAY_AUTH_SCRYPT_LOGN": "10",
        **settings,
    }
    result = served.run_cli("init", str(directory), "--demo-user", config=directory / "gateway.toml", env=env)
    assert result.returncode == 0, result.stderr
    return env


@contextlib.contextmanager
def deployed(directory: Path, database_url: str, **settings: str) -> Iterator[Deployment]:
    """A demo deployment in ``directory`` with ``settings`` (environment variables), served until the block ends."""
    deployment = Deployment(directory, init(directory, database_url, **settings))
    try:
        yield deployment
    finally:
        deployment.gateway.stop()


@pytest.fixture
def deployment(tmp_path: Path, database_url: str) -> Iterator[Deployment]:
    with deployed(tmp_path / "demo", database_url) as deployment:
        yield deployment


@pytest.fixture
def browser() -> Iterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        reason = f"no Chromium at {CHROMIUM}: install Debian's package (apt-get install chromium)"
        if REQUIRE_CHROMIUM:
            pytest.fail(reason)
        pytest.skip(reason)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, timeout=CEILING_MS)
        try:
            yield browser
        finally:
            browser.close()


class Watched:
    """A phone-sized page whose requests and console are recorded."""

    def __init__(self, browser: Browser) -> None:
        self.context = browser.new_context(viewport={"width": 390, "height": 760}, is_mobile=True)
        self.page: Page = self.context.new_page()
        self.page.set_default_timeout(CEILING_MS)
        self.requests: list[str] = []
        self.console: list[str] = []
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.on("console", lambda message: self.console.append(f"{message.type}: {message.text}"))

    def assert_stayed_home(self, origin: str) -> None:
        """Nothing left the origin, and the policy refused nothing the page itself does."""
        assert self.requests and all(url.startswith(origin + "/") for url in self.requests), self.requests
        assert not [line for line in self.console if "Content Security Policy" in line], self.console


@pytest.fixture
def watched(browser: Browser) -> Iterator[Watched]:
    watched = Watched(browser)
    try:
        yield watched
    finally:
        watched.context.close()


def log_in(page: Page, user: str, password: str) -> None:
    page.fill("#login-user", user)
    page.fill("#login-password", password)
    page.click("#login-submit")


def messages(page: Page, direction: str | None = None) -> Locator:
    return page.locator("#messages li" + (f".{direction}" if direction else ""))


def send(page: Page, text: str) -> None:
    page.fill("#send-text", text)
    page.press("#send-text", "Enter")
