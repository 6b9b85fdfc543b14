"""Signal Handlers: what turns a Signal into Prompts (spec: Signal, Run).

A Handler has ``handle(signal) -> list[Prompt]`` and, optionally,
``post(signal, failed)``, which the Signal Worker calls once after the Signal's
Runs with whether any of them failed. Either may be a coroutine function.
There is one Handler per Signal kind, registered in Python
(``gateway.handlers.register(kind, handler)``) or declared in ``gateway.toml``::

    [handlers."message.received"]
    template = "A message from user {{ userId }}:\\n\\n{{ text }}"
    session = "user_{{ userId }}"      # omit for a fresh Session per Run

Templates are Jinja2, sandboxed, with strict undefined variables. Their
variables are the payload's members (when the payload is an object), plus
``payload`` (the whole payload) and ``signal`` (``id``, ``kind``,
``emittedAt``) unless a payload member has that name.
"""

from __future__ import annotations

import dataclasses
import pkgutil
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import jinja2
from jinja2.sandbox import SandboxedEnvironment

from agent_gateway import errors
from agent_gateway.config import SettingsError
from agent_gateway.store.queries.signals import Signal

_ENVIRONMENT = SandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
_TABLE_KEYS = frozenset({"template", "session"})


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One Run to record: its text, and the Session it continues (None: a fresh ``run_<run id>``)."""

    text: str
    session: str | None = None


@runtime_checkable
class Handler(Protocol):
    def handle(self, signal: Signal) -> list[Prompt] | Awaitable[list[Prompt]]: ...


class TemplateFailed(errors.GatewayError):
    """A Handler template did not render."""


class Handlers:
    """The registry: one Handler per Signal kind."""

    def __init__(self) -> None:
        self._by_kind: dict[str, Handler] = {}

    def register(self, kind: str, handler: Handler) -> None:
        """Make ``handler`` the Handler of ``kind``; a kind that already has one is refused (ValueError)."""
        if not isinstance(handler, Handler):
            raise TypeError("a Signal Handler needs a handle(signal) method")
        if kind in self._by_kind:
            raise ValueError(f"Signal kind {kind!r} already has a Handler")
        self._by_kind[kind] = handler

    def get(self, kind: str) -> Handler | None:
        return self._by_kind.get(kind)

    def kinds(self) -> list[str]:
        return sorted(self._by_kind)


class TemplateHandler:
    """The declarative Handler of a ``[handlers."<kind>"]`` table: one Prompt per Signal."""

    # handle() is plain, pure and quick: the Signal Worker renders the Prompt inside the
    # transaction that claims the Signal, and records and starts its Run there too.
    inline = True

    def __init__(self, kind: str, template: str, session: str | None = None) -> None:
        self.kind = kind
        # The texts as written: the Run ledger records them (ledger.instructions).
        self.template_text, self.session_text = template, session
        self.template = _ENVIRONMENT.from_string(template)
        self.session = None if session is None else _ENVIRONMENT.from_string(session)

    def handle(self, signal: Signal) -> list[Prompt]:
        context: dict[str, Any] = {
            "payload": signal.payload,
            "signal": {"id": signal.id, "kind": signal.kind, "emittedAt": signal.emitted_at},
        }
        if isinstance(signal.payload, Mapping):
            context.update(signal.payload)
        try:
            text = self.template.render(context)
            session = None if self.session is None else self.session.render(context)
        except Exception as exc:  # undefined variable, sandbox refusal, a type error in an expression
            raise TemplateFailed(f'the template of [handlers."{self.kind}"] did not render: {exc}') from None
        if session is not None and not session.strip():
            raise TemplateFailed(f'the session template of [handlers."{self.kind}"] rendered empty')
        return [Prompt(text, session)]


def from_settings(tables: Mapping[str, Mapping[str, Any]]) -> Handlers:
    """A registry holding one :class:`TemplateHandler` per ``[handlers."<kind>"]`` table.

    Raises :class:`SettingsError` naming the table for an unknown key, a
    missing or non-string template, or a template that does not compile.
    """
    handlers = Handlers()
    for kind, table in tables.items():
        where = f'handlers."{kind}"'
        unknown = sorted(set(table) - _TABLE_KEYS)
        if unknown:
            raise SettingsError(f"{where}: unknown key {unknown[0]!r} (a Handler table has template and session)")
        template, session = table.get("template"), table.get("session")
        if not isinstance(template, str):
            raise SettingsError(f"{where}.template: required, a Jinja2 template string")
        if session is not None and not isinstance(session, str):
            raise SettingsError(f"{where}.session: must be a Jinja2 template string")
        try:
            handlers.register(kind, TemplateHandler(kind, template, session))
        except jinja2.TemplateSyntaxError as exc:
            raise SettingsError(f"{where}: template syntax error on line {exc.lineno}: {exc.message}") from None
    return handlers


def import_setup(name: str) -> Callable[[Any], None]:
    """The ``[signals] setup`` callable (``"package.module:function"``), which gets the Gateway.

    Raises :class:`SettingsError` when it cannot be imported or is not callable.
    """
    try:
        setup = pkgutil.resolve_name(name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise SettingsError(f"signals.setup: cannot import {name!r}: {exc}") from None
    if not callable(setup):
        raise SettingsError(f"signals.setup: {name!r} is not callable")
    return setup
