"""[transparency] witness_quorum and [[transparency.witnesses]]: read, and refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_gateway import config
from agent_gateway.config import SettingsError
from agent_gateway.signatures import keys
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.transparency import service
from tests.transparency.test_witness import PUBLIC, vkey

REQUIRED = "[auth]\ntoken_ttl_ms = 1000\n"
VKEY_1 = vkey("w1.example/w", PUBLIC)
VKEY_2 = vkey("w2.example/w", bytes(range(32)))
TWO = f"""
[[transparency.witnesses]]
url = "http://127.0.0.1:7380/"
vkey = "{VKEY_1}"

[[transparency.witnesses]]
url = "https://w2.example/prefix"
vkey = "{VKEY_2}"
"""


def load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> config.Settings:
    path = tmp_path / "gateway.toml"
    path.write_text(REQUIRED + text, encoding="utf-8")
    return config.load(path, environ=environ or {})


def refused(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(SettingsError) as caught:
        load(tmp_path, text, environ)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_no_witnesses_by_default(tmp_path: Path) -> None:
    settings = load(tmp_path, "")
    assert settings.witnesses == () and settings.witness_quorum is None
    assert service.quorum(settings) == 0


def test_witnesses_and_quorum_are_read(tmp_path: Path) -> None:
    settings = load(tmp_path, "[transparency]\nwitness_quorum = 1\n" + TWO)
    assert settings.witnesses == (
        config.Witness("http://127.0.0.1:7380", VKEY_1), config.Witness("https://w2.example/prefix", VKEY_2),
    )
    assert service.quorum(settings) == 1
    assert service.quorum(load(tmp_path, TWO)) == 2  # the default: every witness


def test_witnesses_from_the_environment(tmp_path: Path) -> None:
    listed = json.dumps([{"url": "http://127.0.0.1:1", "vkey": VKEY_1}])
    settings = load(tmp_path, "", {"AGENT_GATEWAY_TRANSPARENCY_WITNESSES": listed, "AGENT_GATEWAY_TRANSPARENCY_WITNESS_QUORUM": "1"})
    assert settings.witnesses == (config.Witness("http://127.0.0.1:1", VKEY_1),) and settings.witness_quorum == 1


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[transparency]\nwitness_quorum = 3\n" + TWO, "transparency.witness_quorum: 3 cosignatures cannot be met by the 2"),
        ("[transparency]\nwitness_quorum = 1\n", "transparency.witness_quorum: 1 cosignatures cannot be met by the 0"),
        ("[transparency]\nwitness_quorum = 0\n" + TWO, "transparency.witness_quorum:"),
        ("[[transparency.witnesses]]\nvkey = 'x'\n", "transparency.witnesses[0].url: must be an http"),
        ("[[transparency.witnesses]]\nurl = 'ftp://w'\nvkey = 'x'\n", "transparency.witnesses[0].url: must be an http"),
        ("[[transparency.witnesses]]\nurl = 'http://u:p@w'\nvkey = 'x'\n", "transparency.witnesses[0].url: must be an http"),
        ("[[transparency.witnesses]]\nurl = 'http://w'\n", "transparency.witnesses[0].vkey: must be"),
        ("[[transparency.witnesses]]\nurl = 'http://w'\nvkey = 'x'\nkey = 1\n", "transparency.witnesses[0].key: unknown key"),
        ("[transparency]\nwitnesses = ['x']\n", "transparency.witnesses[0] must be a table"),
        (TWO + f"[[transparency.witnesses]]\nurl = 'http://w3'\nvkey = '{VKEY_1}'\n", "transparency.witnesses[2]: the same witness"),
        (TWO + f"[[transparency.witnesses]]\nurl = 'http://127.0.0.1:7380'\nvkey = '{vkey('w3', bytes(32))}'\n", "transparency.witnesses[2]: the same witness"),
        ("[transparency]\nwitness = 1\n", "transparency.witness: unknown setting"),
    ],
)
def test_a_bad_witness_setting_is_refused_in_one_line_naming_it(tmp_path: Path, text: str, named: str) -> None:
    assert refused(tmp_path, text).startswith(named)


def test_a_bad_witness_list_in_the_environment_names_the_variable(tmp_path: Path) -> None:
    message = refused(tmp_path, "", {"AGENT_GATEWAY_TRANSPARENCY_WITNESSES": '[{"url": "x", "vkey": "y"}]'})
    assert message.startswith("transparency.witnesses[0].url:") and "AGENT_GATEWAY_TRANSPARENCY_WITNESSES" in message


ED25519 = SigningIdentity(keys.generate_pem("ed25519"))


def test_the_witnesses_are_read_at_start_with_an_ed25519_key(tmp_path: Path) -> None:
    [first, second] = service.witnesses(load(tmp_path, TWO), ED25519)
    assert (first.url, first.key.vkey(), second.key.name) == ("http://127.0.0.1:7380", VKEY_1, "w2.example/w")
    assert service.witnesses(load(tmp_path, ""), SigningIdentity(keys.generate_pem("p256"))) == []


@pytest.mark.parametrize("kind", ["p256", "p384"])
def test_witnesses_are_refused_at_start_for_a_key_that_is_not_ed25519(tmp_path: Path, kind: str) -> None:
    with pytest.raises(SettingsError, match=r"^transparency.witnesses: only an Ed25519 signing key can be witnessed") as caught:
        service.witnesses(load(tmp_path, TWO), SigningIdentity(keys.generate_pem(kind)))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("w1 space+00000000+AAAA", "name+hex key ID"),
        (VKEY_1.replace("+BN", "+AN"), "not a cosignature/v1 key"),
        (VKEY_1.replace(VKEY_1.split("+")[1], "00000000"), "does not match"),
    ],
)
def test_a_malformed_vkey_is_refused_at_start_in_one_line(tmp_path: Path, bad: str, reason: str) -> None:
    settings = load(tmp_path, TWO.replace(VKEY_2, bad))
    with pytest.raises(SettingsError, match=r"^transparency.witnesses\[1\].vkey: ") as caught:
        service.witnesses(settings, ED25519)
    assert reason in str(caught.value) and "\n" not in str(caught.value)
