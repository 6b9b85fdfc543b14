"""The chat page's Nostr login (NIP-07, issue 37) in Chromium, with a stand-in extension.

No browser extension can be installed in the tests: the test injects ``window.nostr``
before the page's own script runs. Its ``getPublicKey`` and ``signEvent`` call into this
process, where nostr-sdk signs what the page asks, as an extension does (NIP-07:
``signEvent`` takes ``{kind, created_at, tags, content}`` and returns the signed event).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import nostr_sdk
import pytest
from playwright.sync_api import Browser, Page, Request, expect

from tests.web.conftest import Deployment, Watched, deployed, messages, send

pytestmark = pytest.mark.e2e


class StandInExtension:
    """``window.nostr`` for one page, holding ``keys``; records what it was asked to sign."""

    def __init__(self, page: Page, keys: nostr_sdk.Keys) -> None:
        self.keys = keys
        self.signed: list[dict] = []
        page.expose_function("standInSign", self._sign)
        pubkey = json.dumps(keys.public_key().to_hex())
        page.add_init_script(
            "window.nostr = {"
            f" getPublicKey: async () => {pubkey},"
            " signEvent: async (template) => JSON.parse(await window.standInSign(JSON.stringify(template))),"
            " };"
        )

    def _sign(self, template: str) -> str:
        asked = json.loads(template)
        self.signed.append(asked)
        tags = [nostr_sdk.Tag.parse(tag) for tag in asked["tags"]]
        builder = nostr_sdk.EventBuilder(nostr_sdk.Kind(asked["kind"]), asked["content"]).tags(tags)
        builder = builder.custom_created_at(nostr_sdk.Timestamp.from_secs(asked["created_at"]))
        return builder.finalize(self.keys).as_json()


@pytest.fixture
def nostr_deployment(tmp_path: Path, database_url: str) -> Iterator[Deployment]:
    with deployed(tmp_path / "demo", database_url, AGENT_GATEWAY_AUTH_SCHEMES='["password", "nostr"]') as deployment:
        yield deployment


def test_a_linked_key_logs_in_chats_live_and_logs_out_without_a_token(
    nostr_deployment: Deployment, watched: Watched, browser: Browser
) -> None:
    deployment = nostr_deployment
    keys = nostr_sdk.Keys.generate()
    linked = deployment.gateway.cli("users", "link", deployment.credentials["user"], f"nostr:{keys.public_key().to_bech32()}")
    assert linked.returncode == 0, linked.stderr
    page = watched.page
    extension = StandInExtension(page, keys)
    authorizations: list[str] = []

    def record(request: Request) -> None:
        if request.url.startswith(deployment.url + "/") and "/web/" not in request.url and request.url != deployment.url + "/":
            authorizations.append(request.headers.get("authorization", ""))

    page.on("request", record)
    page.goto(deployment.url + "/")
    page.click("#login-nostr")
    expect(page.locator("#chat-user")).to_have_text("User " + deployment.credentials["user"])
    expect(page.locator("#live-status")).to_have_text("Live")
    send(page, "hello over nostr")
    expect(messages(page, "outbound")).to_have_count(1)  # the echo agent's answer, read off the stream
    assert "hello over nostr" in messages(page, "outbound").first.inner_text()

    # Every request was signed for itself (its URL, method, and the body's digest); no Token exists.
    assert authorizations and all(value.startswith("Nostr ") for value in authorizations), authorizations
    assert len(set(authorizations)) == len(authorizations)
    posted = next(event for event in extension.signed if ["method", "POST"] in event["tags"])
    assert ["u", deployment.url + "/messages"] in posted["tags"]
    assert any(tag[0] == "payload" for tag in posted["tags"])
    assert page.evaluate("sessionStorage.getItem('agent-gateway.token')") is None

    # A reload keeps the session (the key, asked again of the extension), and logging out forgets it.
    page.reload()
    expect(messages(page)).to_have_count(2)
    expect(page.locator("#live-status")).to_have_text("Live")
    page.click("#logout")
    expect(page.locator("#login-notice")).to_have_text("You are logged out.")
    assert page.evaluate("sessionStorage.length") == 0
    watched.assert_stayed_home(deployment.url)

    # Without an extension the page offers only the password form.
    plain = browser.new_page()
    try:
        plain.goto(deployment.url + "/")
        expect(plain.locator("#login-form")).to_be_visible()
        expect(plain.locator("#login-nostr")).to_be_hidden()
    finally:
        plain.close()


def test_an_unlinked_key_is_told_to_ask_the_operator_and_an_unlinked_session_ends(
    nostr_deployment: Deployment, watched: Watched
) -> None:
    deployment = nostr_deployment
    keys = nostr_sdk.Keys.generate()
    page = watched.page
    StandInExtension(page, keys)
    page.goto(deployment.url + "/")
    page.click("#login-nostr")
    expect(page.locator("#login-error")).to_contain_text(f"This Nostr key ({keys.public_key().to_hex()}) is not linked")
    expect(page.locator("#chat")).to_be_hidden()

    identity = f"nostr:{keys.public_key().to_hex()}"
    assert deployment.gateway.cli("users", "link", deployment.credentials["user"], identity).returncode == 0
    page.click("#login-nostr")
    expect(page.locator("#live-status")).to_have_text("Live")
    # Unlinked by the operator: the open stream ends at its next check, and so does the session.
    assert deployment.gateway.cli("users", "unlink", deployment.credentials["user"], identity).returncode == 0
    send(page, "still there?")
    expect(page.locator("#login-error")).to_contain_text("your Nostr key is no longer linked")
    assert page.evaluate("sessionStorage.length") == 0
