"""The chat page's Decisions and their "verified" mark (issue 38), in Chromium, against real witnesses.

A served demo deployment lists two real witnesses (aics-witness, tests/servers.py) with a quorum of
two. The page checks each Decision's offline proof (``?format=tlog-proof``) in the browser
(``web/static/verify.js``, WebCrypto Ed25519 and SHA-256) against the Public server's JWK Set and
``GET /checkpoint/witnesses``. A proof or a Decision changed on its way to the page must not verify.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from playwright.sync_api import Route, expect

from agent_gateway import config
from tests import servers
from tests.transparency.test_collector import log_vkey, served_publish, served_witnessed_size, wait_until
from tests.transparency.test_collector import witnesses  # noqa: F401 (the module's real witnesses)
from tests.web.conftest import Deployment, Watched, deployed, init, log_in

pytestmark = pytest.mark.e2e


def test_each_decision_is_marked_by_its_proof_checked_in_the_browser(
    tmp_path: Path, database_url: str, witnesses: list[servers.Witness], watched: Watched  # noqa: F811
) -> None:
    directory = tmp_path / "demo"
    env = init(directory, database_url)
    vkey = log_vkey(config.load(directory / "gateway.toml", environ=env))
    origin = vkey.split("+", 1)[0]
    # The module's witness, and one of this test's own, which it stops.
    with servers.witness(tmp_path / "own-witness", "own.test/w") as own:
        listed = [witnesses[0], own]
        for each in listed:
            each.trust(origin, vkey)
        env["AGENT_GATEWAY_TRANSPARENCY_WITNESSES"] = json.dumps([{"url": w.url, "vkey": w.vkey} for w in listed])
        check_marks(Deployment(directory, env), own, watched)


def check_marks(deployment: Deployment, own: servers.Witness, watched: Watched) -> None:
    try:
        served_publish(deployment.gateway, 3)
        wait_until(lambda: served_witnessed_size(deployment.gateway) == 3)
        # One witness goes: a fourth Decision cannot be witnessed (the quorum is both).
        own.running.stop()
        served_publish(deployment.gateway, 1)

        page = watched.page

        def tampered_proof(route: Route) -> None:
            # One character of a proof hash changed on the way: Decision 2 is no longer in the tree.
            response = route.fetch()
            lines = response.text().split("\n")
            lines[3] = ("B" if lines[3][0] == "A" else "A") + lines[3][1:]
            route.fulfill(response=response, body="\n".join(lines))

        def changed_statement(route: Route) -> None:
            # The list says Decision 3 said something else: its signed JWS disagrees.
            response = route.fetch()
            page_of = response.json()
            for decision in page_of["decisions"]:
                if decision["seq"] == 3:
                    decision["statement"] = "something it never said"
            route.fulfill(response=response, body=json.dumps(page_of))

        page.route(re.compile(r".*/decisions/2/proof\?format=tlog-proof$"), tampered_proof)
        page.route(re.compile(r".*/decisions\?limit=\d+$"), changed_statement)
        page.goto(deployment.url + "/")
        log_in(page, deployment.credentials["user"], deployment.credentials["password"])
        page.click("#show-decisions")

        def mark(seq: int):  # noqa: ANN202
            return page.locator(f'#decision-list li[data-seq="{seq}"] .mark')

        expect(mark(1)).to_have_attribute("data-state", "verified")
        expect(mark(1)).to_have_attribute("title", re.compile("2 of 2 witnesses cosigned"))
        expect(mark(2)).to_have_attribute("data-state", "failed")
        expect(mark(2)).to_have_attribute("title", "the Decision is not in the checkpoint's tree")
        expect(mark(3)).to_have_attribute("data-state", "failed")
        expect(mark(3)).to_have_attribute("title", "the proof is of another Decision")
        expect(mark(4)).to_have_attribute("data-state", "pending")
        expect(page.locator("#decision-list li")).to_have_count(4)
        expect(page.locator("#decision-list li").first).to_have_attribute("data-seq", "4")  # newest first
        watched.assert_stayed_home(deployment.url)
    finally:
        deployment.gateway.stop()


def test_without_witnesses_the_decisions_carry_no_mark_and_the_page_says_why(
    tmp_path: Path, database_url: str, watched: Watched
) -> None:
    with deployed(tmp_path / "demo", database_url) as deployment:
        served_publish(deployment.gateway, 1)
        page = watched.page
        page.goto(deployment.url + "/")
        log_in(page, deployment.credentials["user"], deployment.credentials["password"])
        page.click("#show-decisions")
        expect(page.locator("#decisions-note")).to_contain_text("This gateway has no witnesses")
        expect(page.locator("#decision-list li")).to_have_count(1)
        expect(page.locator("#decision-list .mark")).to_have_text("")
        page.click("#show-decisions")
        expect(page.locator("#decisions")).to_be_hidden()
