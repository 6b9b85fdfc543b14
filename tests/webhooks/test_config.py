"""``[[webhooks]]`` and ``[webhook_delivery]``: what loads, and every refusal as one line that
names the table and never shows a secret."""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from agent_gateway import config
from agent_gateway.config import SettingsError

pytestmark = pytest.mark.processes

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
BASE = "[auth]\ntoken_ttl_ms = 1000\n"


def load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> config.Settings:
    path = tmp_path / "gateway.toml"
    path.write_text(BASE + text)
    return config.load(path, environ={"HOOK_SECRET": SECRET, **(environ or {})})


def refused(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(SettingsError) as caught:
        load(tmp_path, text, environ)
    message = str(caught.value)
    assert "\n" not in message and SECRET not in message
    return message


def test_endpoints_load_with_their_secrets(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "crm").write_text(SECRET + "\n")
    settings = load(
        tmp_path,
        '[[webhooks]]\nurl = "https://crm.example.com/hooks"\nevents = ["message.inbound", "message.outbound"]\n'
        'secret_file = "secrets/crm"\n'
        '[[webhooks]]\nurl = "http://localhost:9000/x"\nevents = ["run.ended"]\nsecret_env = "HOOK_SECRET"\n'
        "allow_private = true\n"
        '[webhook_delivery]\nretry_for = "12h"\nfirst_retry_ms = 2000\ntimeout_ms = 3000\n',
    )
    crm, local = settings.webhooks
    assert (crm.url, crm.events, crm.secret, crm.allow_private) == (
        "https://crm.example.com/hooks", {"message.inbound", "message.outbound"}, SECRET, False
    )
    assert (local.url, local.events, local.secret, local.allow_private) == (
        "http://localhost:9000/x", {"run.ended"}, SECRET, True
    )
    assert settings.webhook_retry_for == datetime.timedelta(hours=12)
    assert (settings.webhook_first_retry_ms, settings.webhook_timeout_ms) == (2000, 3000)
    assert SECRET not in repr(settings)  # a logged Settings never shows it


def test_defaults(tmp_path: Path) -> None:
    settings = load(tmp_path, "")
    assert settings.webhooks == ()
    assert settings.webhook_retry_for == datetime.timedelta(days=1)
    assert (settings.webhook_first_retry_ms, settings.webhook_timeout_ms) == (5000, 10000)


def test_the_whole_list_from_the_environment(tmp_path: Path) -> None:
    tables = [{"url": "https://example.com/h", "events": ["decision.published"], "secret_env": "HOOK_SECRET"}]
    settings = load(
        tmp_path,
        '[[webhooks]]\nurl = "https://other.example.com/"\nevents = ["run.ended"]\nsecret_env = "HOOK_SECRET"\n',
        {"AGENT_GATEWAY_WEBHOOKS": orjson.dumps(tables).decode()},
    )
    assert [(e.url, e.events) for e in settings.webhooks] == [("https://example.com/h", {"decision.published"})]


TABLE = '[[webhooks]]\nurl = "https://example.com/h"\nevents = ["run.ended"]\nsecret_env = "HOOK_SECRET"\n'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[[webhooks]]\nurl = "ftp://example.com/"\nevents = ["run.ended"]\nsecret_env = "HOOK_SECRET"\n',
         "webhooks[0].url: must be an http:// or https:// URL"),
        ('[[webhooks]]\nurl = "https://user:pw@example.com/"\nevents = ["run.ended"]\nsecret_env = "HOOK_SECRET"\n',
         "webhooks[0].url: must be an http:// or https:// URL"),
        ('[[webhooks]]\nurl = "https://example.com:port/"\nevents = ["run.ended"]\nsecret_env = "HOOK_SECRET"\n',
         "webhooks[0].url: must be an http:// or https:// URL"),
        ('[[webhooks]]\nevents = ["run.ended"]\nsecret_env = "HOOK_SECRET"\n', "webhooks[0].url: must be"),
        ('[[webhooks]]\nurl = "http://127.0.0.1:8000/"\nevents = ["run.ended"]\nsecret_env = "HOOK_SECRET"\n',
         "webhooks[0].url: 127.0.0.1 is not a public address; set allow_private = true"),
        ('[[webhooks]]\nurl = "http://[fd00::1]/"\nevents = ["run.ended"]\nsecret_env = "HOOK_SECRET"\n',
         "webhooks[0].url: fd00::1 is not a public address"),
        ('[[webhooks]]\nurl = "http://[64:ff9b::a9fe:a9fe]/"\nevents = ["run.ended"]\nsecret_env = "HOOK_SECRET"\n',
         "webhooks[0].url: 64:ff9b::a9fe:a9fe is not a public address"),  # NAT64 of 169.254.169.254
        ('[[webhooks]]\nurl = "https://example.com/"\nevents = ["run.finished"]\nsecret_env = "HOOK_SECRET"\n',
         "webhooks[0].events: unknown event 'run.finished' (known: run.ended, "),
        ('[[webhooks]]\nurl = "https://example.com/"\nevents = []\nsecret_env = "HOOK_SECRET"\n',
         "webhooks[0].events: must be a non-empty list"),
        ('[[webhooks]]\nurl = "https://example.com/"\nevents = "run.ended"\nsecret_env = "HOOK_SECRET"\n',
         "webhooks[0].events: must be a non-empty list"),
        ('[[webhooks]]\nurl = "https://example.com/"\nevents = ["run.ended"]\n',
         "webhooks[0]: give secret_file or secret_env"),
        ('[[webhooks]]\nurl = "https://example.com/"\nevents = ["run.ended"]\nsecret_env = "HOOK_SECRET"\n'
         'secret_file = "s"\n', "webhooks[0]: give secret_file or secret_env"),
        ('[[webhooks]]\nurl = "https://example.com/"\nevents = ["run.ended"]\nsecret = "whsec_abc"\n',
         "webhooks[0].secret: unknown key"),
        ('[[webhooks]]\nurl = "https://example.com/"\nevents = ["run.ended"]\nsecret_env = "HOOK_SECRET"\n'
         'allow_private = "yes"\n', "webhooks[0].allow_private: must be true or false"),
        ('[[webhooks]]\nurl = "https://example.com/"\nevents = ["run.ended"]\nsecret_env = "NOT_SET"\n',
         "webhooks[0].secret_env: the environment variable NOT_SET is not set or empty"),
        ('[[webhooks]]\nurl = "https://example.com/"\nevents = ["run.ended"]\nsecret_file = "absent"\n',
         "webhooks[0].secret_file: no such file: "),
        (TABLE + TABLE, "webhooks[1].url: https://example.com/h is already an endpoint"),
        ("[webhooks]\nurl = 1\n", "webhooks: must be a list"),
        ('[webhook_delivery]\nretry_for = "30s"\n', "webhook_delivery.retry_for: must be at least 1m"),
        ('[webhook_delivery]\nretry_for = "a day"\n', "webhook_delivery.retry_for: must be a whole number"),
        ("[webhook_delivery]\ntimeout_ms = 0\n", "webhook_delivery.timeout_ms: must be at least 1"),
        ("[webhook_delivery]\nfirst_retry_ms = 'soon'\n", "webhook_delivery.first_retry_ms: must be an integer"),
        ("[webhook_delivery]\nretries = 3\n", "webhook_delivery.retries: unknown setting"),
    ],
)
def test_refusals_are_one_line_naming_the_table(tmp_path: Path, text: str, expected: str) -> None:
    assert refused(tmp_path, text).startswith(expected)


@pytest.mark.parametrize("secret", ["hunter2", "whsec_", "whsec_not base64!", SECRET.removeprefix("whsec_")])
def test_a_secret_that_is_not_a_standard_webhooks_secret_is_refused_unshown(tmp_path: Path, secret: str) -> None:
    (tmp_path / "secret").write_text(secret)
    message = refused(
        tmp_path, '[[webhooks]]\nurl = "https://example.com/"\nevents = ["run.ended"]\nsecret_file = "secret"\n'
    )
    assert message == 'webhooks[0].secret_file: the secret must be "whsec_" followed by base64 (a Standard Webhooks secret)'
    assert secret not in message or secret == "whsec_"


def test_an_environment_list_names_its_variable(tmp_path: Path) -> None:
    message = refused(tmp_path, "", {"AGENT_GATEWAY_WEBHOOKS": '[{"url": "https://example.com/", "events": ["x"], "secret_env": "HOOK_SECRET"}]'})
    assert message.startswith("webhooks[0].events: unknown event 'x'") and message.endswith("(in AGENT_GATEWAY_WEBHOOKS)")
    assert refused(tmp_path, "", {"AGENT_GATEWAY_WEBHOOKS": "{"}) == "webhooks (AGENT_GATEWAY_WEBHOOKS): must be JSON"


def test_serve_refuses_a_bad_table_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(BASE + '[[webhooks]]\nurl = "https://example.com/"\nevents = ["run.ended"]\nsecret_env = "NOT_SET"\n')
    result = subprocess.run(
        [sys.executable, "-m", "agent_gateway", "serve", "--config", str(path)],
        capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 1
    assert result.stderr == "agent-gateway: error: webhooks[0].secret_env: the environment variable NOT_SET is not set or empty\n"


def test_the_documented_secret_command_makes_a_usable_secret(tmp_path: Path) -> None:
    """The command docs/operate/webhooks.md gives for making a secret."""
    command = """python3 -c 'import base64, os; print("whsec_" + base64.b64encode(os.urandom(24)).decode())'"""
    page = (Path(__file__).resolve().parents[2] / "docs" / "operate" / "webhooks.md").read_text()
    assert command in page
    made = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60, check=True).stdout
    (tmp_path / "secret").write_text(made)
    settings = load(tmp_path, '[[webhooks]]\nurl = "https://example.com/"\nevents = ["run.ended"]\nsecret_file = "secret"\n')
    assert settings.webhooks[0].secret == made.strip()


def test_the_documented_environment_list_loads(tmp_path: Path) -> None:
    """The ``AGENT_GATEWAY_WEBHOOKS=...`` line of docs/operate/webhooks.md, as a shell would pass it."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "operate" / "webhooks.md").read_text()
    [line] = [line for line in page.splitlines() if line.startswith("AGENT_GATEWAY_WEBHOOKS=")]
    value = subprocess.run(
        ["sh", "-c", f'{line}; printf %s "$AGENT_GATEWAY_WEBHOOKS"'], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    settings = load(tmp_path, "", {"AGENT_GATEWAY_WEBHOOKS": value, "ALERTS_WEBHOOK_SECRET": SECRET})
    [alerts] = settings.webhooks
    assert (alerts.url, alerts.events, alerts.secret) == ("https://alerts.example.com/agent-gateway", {"run.ended"}, SECRET)
