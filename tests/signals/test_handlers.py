"""Signal Handlers: the registry, and templates declared in gateway.toml (no database involved)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agent_gateway import config
from agent_gateway.gateway import Gateway
from agent_gateway.signals import handlers
from agent_gateway.signals.handlers import Handlers, Prompt, TemplateFailed, TemplateHandler
from agent_gateway.store.queries.signals import Signal


def a_signal(payload: object, kind: str = "k") -> Signal:
    return Signal("00000000-0000-4000-8000-000000000001", kind, payload, "2026-01-01T00:00:00.000Z", "processing", None)


def test_a_template_renders_the_payloads_members_and_the_signal() -> None:
    handler = TemplateHandler("k", "{{ a }} {{ b.c }} {{ payload.a }} {{ signal.kind }} {{ signal.id }} {{ signal.emittedAt }}")
    [prompt] = handler.handle(a_signal({"a": "A", "b": {"c": 3}}))
    assert prompt == Prompt("A 3 A k 00000000-0000-4000-8000-000000000001 2026-01-01T00:00:00.000Z", None)


def test_a_payload_that_is_not_an_object_is_reachable_as_payload() -> None:
    [prompt] = TemplateHandler("k", "{{ payload | join(',') }}").handle(a_signal([1, 2]))
    assert prompt.text == "1,2"


def test_a_payload_member_wins_over_payload_and_signal() -> None:
    [prompt] = TemplateHandler("k", "{{ payload }}/{{ signal }}").handle(a_signal({"payload": "p", "signal": "s"}))
    assert prompt.text == "p/s"


def test_the_session_template_and_a_fresh_session() -> None:
    assert TemplateHandler("k", "x", "user_{{ id }}").handle(a_signal({"id": 7})) == [Prompt("x", "user_7")]
    assert TemplateHandler("k", "x").handle(a_signal({})) == [Prompt("x", None)]


def test_text_is_not_html_escaped_and_trailing_newlines_are_kept() -> None:
    [prompt] = TemplateHandler("k", "{{ t }}\n").handle(a_signal({"t": "<b>&'\""}))
    assert prompt.text == "<b>&'\"\n"


@pytest.mark.parametrize(
    ("template", "payload", "reason"),
    [
        ("{{ missing }}", {}, "'missing' is undefined"),
        ("{{ a.b }}", {"a": {}}, "'dict object' has no attribute 'b'"),
        ("{{ a + 1 }}", {"a": "x"}, 'can only concatenate str (not "int") to str'),
        ("{{ ''.__class__.__mro__ }}", {}, "access to attribute '__class__' of 'str' object is unsafe."),
        ("{{ 1 / 0 }}", {}, "division by zero"),
    ],
)
def test_a_template_that_does_not_render_names_the_kind(template: str, payload: object, reason: str) -> None:
    with pytest.raises(TemplateFailed) as failed:
        TemplateHandler("message.received", template).handle(a_signal(payload))
    assert str(failed.value) == f'the template of [handlers."message.received"] did not render: {reason}'


def test_a_session_template_that_renders_empty_fails() -> None:
    with pytest.raises(TemplateFailed, match=r'the session template of \[handlers."k"\] rendered empty'):
        TemplateHandler("k", "x", "{{ s }}").handle(a_signal({"s": " "}))


def test_one_handler_per_kind() -> None:
    registry = Handlers()
    handler = TemplateHandler("k", "x")
    registry.register("k", handler)
    assert registry.get("k") is handler
    assert registry.get("other") is None
    with pytest.raises(ValueError, match="Signal kind 'k' already has a Handler"):
        registry.register("k", TemplateHandler("k", "y"))
    with pytest.raises(TypeError, match=r"needs a handle\(signal\) method"):
        registry.register("j", object())  # type: ignore[arg-type]
    assert registry.kinds() == ["k"]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({}, 'handlers."k".template: required, a Jinja2 template string'),
        ({"template": 3}, 'handlers."k".template: required, a Jinja2 template string'),
        ({"template": "x", "session": ["a"]}, 'handlers."k".session: must be a Jinja2 template string'),
        ({"template": "x", "sessions": "a"}, "handlers.\"k\": unknown key 'sessions' (a Handler table has template and session)"),
        ({"template": "{{ unclosed"}, 'handlers."k": template syntax error on line 1: unexpected end of template'),
        ({"template": "x", "session": "{% if %}"}, 'handlers."k": template syntax error on line 1: Expected an expression'),
    ],
)
def test_bad_handler_tables_are_refused_at_start(table: dict, message: str) -> None:
    with pytest.raises(config.SettingsError) as refused:
        handlers.from_settings({"k": table})
    assert str(refused.value).startswith(message)


def test_handlers_from_gateway_toml_and_the_environment(tmp_path: Path) -> None:
    file = tmp_path / "gateway.toml"
    file.write_text(
        '[auth]\ntoken_ttl_ms = 1000\n[handlers."message.received"]\ntemplate = "From {{ userId }}"\nsession = "user_{{ userId }}"\n'
    )
    settings = config.load(file, environ={})
    registry = handlers.from_settings(settings.handlers)
    assert registry.get("message.received").handle(a_signal({"userId": "u"})) == [Prompt("From u", "user_u")]  # type: ignore[union-attr]

    settings = config.load(file, environ={"AGENT_GATEWAY_HANDLERS": '{"tick": {"template": "tock"}}'})
    registry = handlers.from_settings(settings.handlers)
    assert registry.kinds() == ["tick"]


def test_a_gateway_with_a_bad_handler_table_does_not_start(settings: config.Settings) -> None:
    with pytest.raises(config.SettingsError):
        Gateway(dataclasses.replace(settings, handlers={"k": {"template": "{{"}}))


async def test_a_setup_callable_registers_python_handlers(settings: config.Settings, tmp_path: Path) -> None:
    gateway = Gateway(dataclasses.replace(settings, signals_setup="tests.signals.setup_example:setup"))
    await gateway.store.close()
    assert gateway.handlers.get("greeting").handle(a_signal({"name": "ada"})) == [Prompt("greet ada", "greet_ada")]  # type: ignore[union-attr]
    # An HTTP-only process does not import the operator's code.
    api_only = Gateway(dataclasses.replace(settings, signals_setup="no.such.module:setup"), frozenset({"api"}))
    await api_only.store.close()

    file = tmp_path / "gateway.toml"
    file.write_text('[auth]\ntoken_ttl_ms = 1000\n[signals]\nsetup = "tests.signals.setup_example:setup"\n')
    assert config.load(file, environ={}).signals_setup == "tests.signals.setup_example:setup"
    assert config.load(file, environ={"AGENT_GATEWAY_SIGNALS_SETUP": "x:y"}).signals_setup == "x:y"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no.such.module:setup", "signals.setup: cannot import 'no.such.module:setup': No module named 'no'"),
        ("tests.signals.setup_example:missing", "signals.setup: cannot import 'tests.signals.setup_example:missing'"),
        ("tests.signals.setup_example:NOT_CALLABLE", "signals.setup: 'tests.signals.setup_example:NOT_CALLABLE' is not callable"),
    ],
)
def test_a_setup_that_cannot_be_used_stops_the_gateway_at_start(
    settings: config.Settings, name: str, message: str
) -> None:
    with pytest.raises(config.SettingsError) as refused:
        Gateway(dataclasses.replace(settings, signals_setup=name))
    assert str(refused.value).startswith(message)
