"""The chat page in a real browser, what needs no live stream: login errors, scrolling back, a revoked Token, the setting."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from tests import served
from tests.web.conftest import Deployment, Watched, init, log_in, messages, send

pytestmark = pytest.mark.e2e


def test_a_wrong_password_is_refused_with_a_clear_error(deployment: Deployment, watched: Watched) -> None:
    page = watched.page
    page.goto(deployment.url + "/")
    log_in(page, deployment.credentials["user"], "not the password")
    expect(page.locator("#login-error")).to_have_text("Wrong User id or password.")
    log_in(page, "not-a-uuid", "whatever")
    expect(page.locator("#login-error")).to_contain_text("Check what you typed")
    expect(page.locator("#chat")).to_be_hidden()
    assert page.evaluate("sessionStorage.length") == 0
    watched.assert_stayed_home(deployment.url)


def test_scrolling_back_loads_older_messages_and_shows_text_as_text(deployment: Deployment, watched: Watched) -> None:
    user = deployment.credentials["user"]
    with httpx.Client(base_url=deployment.gateway.agent_url, timeout=120) as agent:
        for number in range(1, 111):
            text = f"message {number}"
            if number == 109:
                text = "x" * 400  # no break opportunity
            if number == 110:
                text = '<img src="https://example.invalid/x.png" onerror="window.owned = true">'
            assert agent.post("/messages", json={"userId": user, "text": text}).status_code == 201
    page = watched.page
    page.goto(deployment.url + "/")
    log_in(page, user, deployment.credentials["password"])

    # The newest page (50), then older pages with before=: scrolling to the top loads one, and
    # so does the button (dispatched, not clicked: a click scrolls the button into view,
    # which is itself the scroll to the top, and the page it loads may hide the button).
    expect(messages(page)).to_have_count(50)
    expect(messages(page).first).to_have_text(re.compile(r"message 61$"))
    expect(messages(page, "outbound").last).to_contain_text('<img src="https://example.invalid/x.png"')
    page.locator("#log").evaluate("log => { log.scrollTop = 0; }")
    expect(messages(page)).to_have_count(100)
    expect(messages(page).first).to_have_text(re.compile(r"message 11$"))
    expect(page.locator("#older")).to_be_enabled()
    page.locator("#older").dispatch_event("click")
    expect(messages(page)).to_have_count(110)
    expect(messages(page).first).to_have_text(re.compile(r"message 1$"))
    expect(page.locator("#older")).to_be_hidden()
    assert page.evaluate("window.owned") is None
    # Readable on a phone: long text wraps, nothing scrolls sideways.
    for element in ("document.documentElement", "document.getElementById('log')"):
        assert page.evaluate(f"{element}.scrollWidth <= {element}.clientWidth"), element
    assert page.locator("#messages img").count() == 0

    # A Token revoked elsewhere ends the session with a clear error at the next request.
    token = page.evaluate("sessionStorage.getItem('agent-gateway.token')")
    revoked = httpx.delete(deployment.url + "/auth/tokens", headers={"Authorization": f"Bearer {token}"}, timeout=120)
    assert revoked.status_code == 204
    send(page, "still there?")
    expect(page.locator("#login-error")).to_contain_text("Your session has ended")
    assert page.evaluate("sessionStorage.length") == 0
    watched.assert_stayed_home(deployment.url)


def test_switched_off_the_page_is_the_specs_404(tmp_path: Path, database_url: str, watched: Watched) -> None:
    directory = tmp_path / "own-client"
    env = init(directory, database_url, AGENT_GATEWAY_PUBLIC_CHAT_PAGE="false")
    gateway = served.ServedGateway.spawn_on_free_ports(directory, env)
    try:
        response = watched.page.goto(gateway.public_url + "/")
        assert response is not None and response.status == 404
        assert response.headers["content-type"] == "application/json"
        assert response.json()["statusCode"] == 404
        assert watched.page.goto(gateway.public_url + "/web/chat.js").status == 404
    finally:
        gateway.stop()
