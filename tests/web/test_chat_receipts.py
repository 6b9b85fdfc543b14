"""The chat page's receipt mark on a User's own Messages (issue 41), in Chromium, against a served demo
deployment (the echo agent, the default template).

Pressed, the mark fetches ``GET /messages/{seq}/receipt`` and checks it in the browser
(``web/static/verify.js``: the Run ledger's checkpoint with WebCrypto Ed25519, each entry's inclusion
and the payload and Prompt digests with SHA-256, the Prompt rendered from the published template and
the text the page shows), then shows the instructions in force. A text shown with one character
changed, a proof hash or a template changed on the way must not verify.
"""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import Route, expect

from tests.web.conftest import Deployment, Watched, log_in, messages, send

pytestmark = pytest.mark.e2e


def test_each_of_your_messages_is_marked_by_its_receipt_checked_in_the_browser(deployment: Deployment, watched: Watched) -> None:
    page = watched.page
    page.goto(deployment.url + "/")
    log_in(page, deployment.credentials["user"], deployment.credentials["password"])
    for number, text in enumerate(["Book the room for Thursday", "and order lunch", "then call Ana", "and Ben"], start=1):
        send(page, text)
        # The echo agent's answer: the Run started, so its receipt holds it.
        expect(messages(page, "outbound")).to_have_count(number)

    def mark(seq: int):  # noqa: ANN202
        return page.locator(f'#messages li[data-seq="{seq}"] .mark')

    def press(seq: int) -> None:
        mark(seq).click()

    press(1)
    expect(mark(1)).to_have_attribute("data-state", "verified")
    expect(mark(1)).to_have_text("✓ reached the agent as written")
    shown = page.locator('#messages li[data-seq="1"] details.instructions')
    expect(shown).to_have_attribute("open", "")
    expect(shown.locator("summary")).to_have_text("Instructions #1 in force")
    expect(shown.locator("pre")).to_contain_text("A message from user {{ userId }}:")
    press(1)  # pressed again, the mark folds the instructions
    expect(shown).not_to_have_attribute("open", "")

    def changed_text(route: Route) -> None:
        # The page is shown Message 3 with one character changed: its receipt is not of that text.
        response = route.fetch()
        body = response.json()
        for message in body["messages"]:
            if message["seq"] == 3:
                message["text"] = message["text"].replace("lunch", "lunck")
        route.fulfill(response=response, body=json.dumps(body))

    def bent_proof(route: Route) -> None:
        response = route.fetch()
        body = response.json()
        hashes = body["runs"][0]["hashes"]
        hashes[0] = ("B" if hashes[0][0] == "A" else "A") + hashes[0][1:]
        route.fulfill(response=response, body=json.dumps(body))

    def other_template(route: Route) -> None:
        # The instructions entry says another template than the published one it was proved as.
        response = route.fetch()
        body = response.json()
        body["instructions"][0]["leaf"] = body["instructions"][0]["leaf"].replace("A message from", "A note from")
        route.fulfill(response=response, body=json.dumps(body))

    page.route(re.compile(r".*/messages\?limit=\d+$"), changed_text)
    page.route(re.compile(r".*/messages/5/receipt$"), bent_proof)
    page.route(re.compile(r".*/messages/7/receipt$"), other_template)
    page.reload()
    expect(messages(page, "inbound")).to_have_count(4)
    expect(messages(page, "inbound").nth(1)).to_contain_text("and order lunck")
    refused = {
        3: "the agent was not given this text for this Message",
        5: "entry 4 is not in the Run ledger's checkpoint",  # Message 5's Run is entry 4
        7: "entry 1 is not in the Run ledger's checkpoint",  # the instructions
    }
    for seq in refused:
        press(seq)
    for seq, why in refused.items():
        expect(mark(seq)).to_have_attribute("data-state", "failed")
        expect(mark(seq)).to_have_attribute("title", why)
    # The agent's Messages carry no mark; an honest one of the same page still verifies.
    expect(page.locator("#messages li.outbound .mark")).to_have_count(0)
    press(1)
    expect(mark(1)).to_have_attribute("data-state", "verified")

    # Restarted with another template, one the page does not render (a filter): instructions
    # entry 6 (after the four Runs' entries) is in force for the next Message; the text is still
    # checked, the Prompt left to the command, and the first Message still shows entry 1.
    deployment.stop()
    template = "{{ text | trim }} (from {{ userId }})"
    deployment.env["AGENT_GATEWAY_HANDLERS"] = json.dumps({"message.received": {"template": template, "session": "user_{{ userId }}"}})
    deployment.start()
    page.reload()
    send(page, "and Carla")
    expect(messages(page, "outbound")).to_have_count(5)
    press(9)
    expect(mark(9)).to_have_attribute("data-state", "unknown")
    expect(mark(9)).to_have_text("✓ text as written, Prompt not checked here")
    later = page.locator('#messages li[data-seq="9"] details.instructions')
    expect(later.locator("summary")).to_have_text("Instructions #6 in force")
    expect(later.locator("pre")).to_contain_text(template)
    press(1)
    expect(shown.locator("summary")).to_have_text("Instructions #1 in force")
    watched.assert_stayed_home(deployment.url)
