"""The chat page in a real browser with the live stream: answers appear without reloading, across a restart."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from tests.web.conftest import Deployment, Watched, log_in, messages, send

pytestmark = pytest.mark.e2e


def test_a_user_chats_live_across_a_restart_and_logs_out(
    deployment: Deployment, watched: Watched, tmp_path: Path
) -> None:
    page = watched.page
    response = page.goto(deployment.url + "/")
    assert response is not None and response.status == 200
    headers = response.headers
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"
    assert headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in headers["content-security-policy"]

    log_in(page, deployment.credentials["user"], deployment.credentials["password"])
    expect(page.locator("#live-status")).to_have_text("Live")
    page.evaluate("window.sameDocument = true")  # gone if anything reloads the page

    send(page, "hello, agent")
    expect(messages(page, "inbound").last).to_contain_text("hello, agent")
    expect(messages(page, "outbound").last).to_contain_text("echo: hello, agent")
    expect(page.locator("#send-text")).to_have_value("")
    screenshot = tmp_path / "chat.png"
    page.screenshot(path=screenshot, full_page=True)
    print(f"screenshot: {screenshot}")

    # The Token is in this tab's sessionStorage only: never a URL, never localStorage.
    token = page.evaluate("sessionStorage.getItem('agent-gateway.token')")
    assert token and page.evaluate("localStorage.length") == 0
    assert not [url for url in watched.requests if token in url]

    deployment.stop()
    expect(page.locator("#live-status")).to_contain_text("Connection lost")
    deployment.start()
    expect(page.locator("#live-status")).to_have_text("Live")
    send(page, "are you back?")
    expect(messages(page, "outbound").last).to_contain_text("echo: are you back?")
    expect(page.locator("#live-status")).to_have_text("Live")
    assert page.evaluate("window.sameDocument") is True
    # Each Message's own text, without its meta line or the inbound ones' receipt mark.
    assert page.locator("#messages li .text").all_inner_texts() == [
        "hello, agent",
        "echo: hello, agent",
        "are you back?",
        "echo: are you back?",
    ]

    page.click("#logout")
    expect(page.locator("#login-notice")).to_have_text("You are logged out.")
    expect(page.locator("#chat")).to_be_hidden()
    assert page.evaluate("sessionStorage.length") == 0
    me = httpx.get(deployment.url + "/users/me", headers={"Authorization": f"Bearer {token}"}, timeout=120)
    assert me.status_code == 401
    watched.assert_stayed_home(deployment.url)




def test_a_token_revoked_elsewhere_ends_the_session_without_a_click(deployment: Deployment, watched: Watched) -> None:
    page = watched.page
    page.goto(deployment.url + "/")
    log_in(page, deployment.credentials["user"], deployment.credentials["password"])
    expect(page.locator("#live-status")).to_have_text("Live")
    # A Message written elsewhere (another device, curl) shows up live too.
    token = page.evaluate("sessionStorage.getItem('agent-gateway.token')")
    auth = {"Authorization": f"Bearer {token}"}
    sent = httpx.post(deployment.url + "/messages", json={"text": "from my phone"}, headers=auth, timeout=120)
    assert sent.status_code == 201
    expect(messages(page, "inbound").last).to_contain_text("from my phone")
    expect(messages(page, "outbound").last).to_contain_text("echo: from my phone")
    # A reload keeps the tab's session (sessionStorage) and the conversation.
    page.reload()
    expect(page.locator("#live-status")).to_have_text("Live")
    expect(messages(page)).to_have_count(2)

    # The stream ends with the Token; the page's reconnect is refused and it asks for a login.
    assert httpx.delete(deployment.url + "/auth/tokens", headers=auth, timeout=120).status_code == 204
    expect(page.locator("#login-error")).to_contain_text("Your session has ended")
    expect(page.locator("#chat")).to_be_hidden()
    assert page.evaluate("sessionStorage.length") == 0
    watched.assert_stayed_home(deployment.url)
