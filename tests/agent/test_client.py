"""The kit's Agent server clients, sync and async, against a real ``serve`` on both backends."""

from __future__ import annotations

import base64
import json
import uuid

import pytest

from agent_gateway.agent import AgentError, AsyncClient, Client

from tests import served

pytestmark = pytest.mark.processes

def protected_header(jws: str) -> dict:
    segment = jws.split(".")[0]
    return json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))


SPEC = {"kind": "cron", "expr": "0 9 * * *", "tz": "Europe/Paris"}


def test_the_sync_client_calls_every_operation(shared_gateway: served.ServedGateway) -> None:
    user = shared_gateway.cli_json("users", "add")
    with Client(shared_gateway.agent_url) as client:
        sent = client.send_message(user["id"], "hello ü")
        assert (sent["userId"], sent["direction"], sent["seq"], sent["text"]) == (user["id"], "outbound", 1, "hello ü")
        client.send_message(user["id"], "second")
        assert [m["text"] for m in client.read_messages(user["id"], after=0)] == ["hello ü", "second"]
        assert [m["seq"] for m in client.read_messages(user["id"], before=2)] == [1]
        assert [m["seq"] for m in client.read_messages(user["id"], limit=1)] == [2]

        decision = client.publish("we ship on Friday")
        assert decision["statement"] == "we ship on Friday" and decision["seq"] >= 1
        jws = client.sign("a statement", "custom+jws")
        assert protected_header(jws)["typ"] == "custom+jws"
        assert protected_header(client.sign("plain"))["typ"] == "service-statement+jws"

        schedule = client.set_schedule("daily.digest", SPEC, data={"team": "ops"})
        assert (schedule["name"], schedule["data"], schedule["until"]) == ("daily.digest", {"team": "ops"}, None)
        replaced = client.set_schedule("daily.digest", {"kind": "cron", "expr": "0 10 * * *"})
        assert (replaced["spec"]["tz"], replaced["data"]) == ("UTC", None)
        assert client.cancel_schedule("daily.digest") is None

        assert client.signals(kind="nothing.like.this") == []
        assert isinstance(client.runs(limit=5), list)
        assert client.runs(signal_id=str(uuid.uuid4())) == []
        assert client.user(user["id"])["id"] == user["id"]


def test_a_refusal_raises_agent_error_with_the_spec_body(shared_gateway: served.ServedGateway) -> None:
    with Client(shared_gateway.agent_url) as client:
        with pytest.raises(AgentError) as missing:
            client.send_message(str(uuid.uuid4()), "to nobody")
        assert missing.value.status_code == 404
        assert missing.value.body == {"statusCode": 404, "error": "Not Found", "message": missing.value.message}

        with pytest.raises(AgentError) as bad:
            client.read_messages("not-a-uuid")
        assert (bad.value.status_code, bad.value.error) == (400, "Bad Request")

        with pytest.raises(AgentError) as absent:
            client.cancel_schedule("never.set")
        assert absent.value.status_code == 404

        with pytest.raises(AgentError) as past:
            client.set_schedule("once", {"kind": "once", "at": "2000-01-01T00:00:00Z"})
        assert past.value.status_code == 400

        with pytest.raises(AgentError) as unknown:
            client.run(str(uuid.uuid4()))
        assert unknown.value.status_code == 404


def test_an_unreachable_server_raises_agent_error_too() -> None:
    url = f"http://127.0.0.1:{served.free_port()}"
    with Client(url) as client, pytest.raises(AgentError) as failed:
        client.publish("x")
    assert failed.value.status_code is None
    assert str(failed.value).startswith(f"Unreachable: the Agent server at {url} did not answer")


def test_the_url_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_SERVER_URL", "http://127.0.0.1:1/")
    assert Client().url == "http://127.0.0.1:1"
    monkeypatch.delenv("AGENT_SERVER_URL")
    with pytest.raises(AgentError, match=r"set \$AGENT_SERVER_URL"):
        Client()


async def test_the_async_client_calls_the_same_operations(shared_gateway: served.ServedGateway) -> None:
    user = shared_gateway.cli_json("users", "add")
    async with AsyncClient(shared_gateway.agent_url) as client:
        sent = await client.send_message(user["id"], "hi")
        assert sent["seq"] == 1
        assert [m["text"] for m in await client.read_messages(user["id"], after=0)] == ["hi"]
        assert (await client.publish("async decision"))["statement"] == "async decision"
        assert protected_header(await client.sign("s"))["typ"] == "service-statement+jws"
        assert (await client.set_schedule("a.b", SPEC))["name"] == "a.b"
        await client.cancel_schedule("a.b")
        assert await client.signals(kind="nothing.like.this") == []
        assert await client.runs(signal_id=str(uuid.uuid4())) == []
        assert (await client.user(user["id"]))["id"] == user["id"]
        with pytest.raises(AgentError) as missing:
            await client.cancel_schedule("a.b")
        assert missing.value.status_code == 404
