"""Settings: a TOML file, every key overridable by an ``AGENT_GATEWAY_*`` variable.

The file is ``gateway.toml`` (``--config PATH`` or ``AGENT_GATEWAY_CONFIG``);
relative paths inside it are relative to its folder. A key's environment name
is its dotted path in upper case joined by ``_``: ``auth.token_ttl_ms`` is
``AGENT_GATEWAY_AUTH_TOKEN_TTL_MS``, ``auth.scrypt.logN`` is
``AGENT_GATEWAY_AUTH_SCRYPT_LOGN``. A bad setting raises :class:`SettingsError`
whose one line names the setting and the reason.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import importlib.util
import ipaddress
import os
import re
import tomllib
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from agent_gateway import errors
from agent_gateway.addresses import is_public

ENV_PREFIX = "AGENT_GATEWAY_"
CONFIG_ENV = "AGENT_GATEWAY_CONFIG"
# The scheduler's timer cannot sleep past 2^31-1 ms (24.85 days).
TIMER_CEILING_MS = 2**31 - 1
MAX_SCRYPT_LOGN = 20
# Expiry instants must stay within the four-digit years of the stored timestamps.
MAX_TOKEN_TTL_MS = 100 * 365 * 24 * 3600 * 1000
# A derivation's memory, held by each derivation thread (auth.passwords): a bound, not OpenSSL's.
MAX_SCRYPT_MEMORY_BYTES = 2**31 - 1
# "per-run" starts [runtime] command for each Run; "persistent" starts it once and hands it Runs as JSON lines.
RUNTIME_MODES = ("per-run", "persistent")
# "auto" confines the agent program with bubblewrap when it works (else only the echo demo runs,
# unconfined), "bubblewrap" refuses to start without it, "none" runs it unconfined.
SANDBOX_MODES = ("auto", "bubblewrap", "none")
# A stream re-checks its Token at least every 10 s (issue 13).
MAX_STREAM_AUTH_CHECK_MS = 10_000
# A request waits for SQLite's write lock at most five minutes, whatever the setting says.
MAX_BUSY_TIMEOUT_MS = 300_000
# What a [[webhooks]] endpoint can subscribe to; the names are the payloads' "type" too.
WEBHOOK_EVENTS = (
    "run.ended", "signal.failed", "message.outbound", "message.inbound", "decision.published", "schedule.fired",
)
_WEBHOOK_KEYS = frozenset({"url", "events", "secret_file", "secret_env", "allow_private"})
# A Standard Webhooks secret: "whsec_" and the key in base64.
_WEBHOOK_SECRET = re.compile(r"whsec_([A-Za-z0-9+/]+={0,2})")


class SettingsError(errors.GatewayError):
    """A setting is missing or invalid; the message names it."""


@dataclasses.dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def connectable(self) -> Address:
        """Where a client on this host reaches a server bound here: a wildcard bind means loopback."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        return Address(host, self.port)

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


@dataclasses.dataclass(frozen=True)
class ScryptCost:
    """The cost of a password derivation; one that cannot run is refused on construction."""

    log_n: int = 15
    block_size: int = 8
    parallelism: int = 1

    def __post_init__(self) -> None:
        for name, value in (("logN", self.log_n), ("blockSize", self.block_size), ("parallelism", self.parallelism)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SettingsError(f"auth.scrypt.{name}: must be a positive integer (got {value!r})")
        if self.log_n > MAX_SCRYPT_LOGN:
            raise SettingsError(f"auth.scrypt.logN: must be at most {MAX_SCRYPT_LOGN} (got {self.log_n})")
        if self.log_n >= 16 * self.block_size:
            # scrypt's own limit (RFC 7914, 2: N < 2^(128 r / 8)); OpenSSL refuses to derive beyond it.
            raise SettingsError(
                f"auth.scrypt.logN: must be below 16 x blockSize, here {16 * self.block_size} (got {self.log_n})"
            )
        if self.memory_bytes > MAX_SCRYPT_MEMORY_BYTES:
            raise SettingsError(
                f"auth.scrypt: 2^{self.log_n} x {self.block_size} x {self.parallelism} needs "
                f"{self.memory_bytes // 2**20} MiB per derivation; at most 2 GiB is allowed"
            )

    @property
    def memory_bytes(self) -> int:
        """What OpenSSL allocates for one derivation: ``128·r·(N + 2)`` for V plus ``128·r·p`` for B."""
        return 128 * self.block_size * (2**self.log_n + 2 + self.parallelism)


@dataclasses.dataclass(frozen=True)
class WebhookEndpoint:
    """One ``[[webhooks]]`` table: where to POST which events, signed with which secret."""

    url: str
    events: frozenset[str]
    # Read from secret_file or secret_env at load; never printed, logged or sent.
    secret: str = dataclasses.field(repr=False)
    allow_private: bool = False
    # Where the secret was read from (secret_file), so the sandbox never shows it to the agent.
    secret_file: Path | None = None


@dataclasses.dataclass(frozen=True)
class Witness:
    """One ``[[transparency.witnesses]]`` table: where the witness takes checkpoints, and its
    cosignature verifier key (read by ``transparency.witness`` when the gateway starts)."""

    url: str
    vkey: str


@dataclasses.dataclass(frozen=True)
class Settings:
    token_ttl_ms: int
    database_url: str = "sqlite:///gateway.db"
    database_busy_timeout_ms: int = 30_000
    public_listen: Address = Address("127.0.0.1", 8700)
    agent_listen: Address = Address("127.0.0.1", 8701)
    # Names the Agent server is addressed by besides an IP address, localhost and its listen host.
    agent_allowed_hosts: tuple[str, ...] = ()
    signing_key_file: Path | None = None
    signing_key_pem: str | None = None
    signing_algorithm: str | None = None
    scrypt: ScryptCost = ScryptCost()
    scheduler_max_sleep_ms: int = 60_000
    scheduler_agent_routes: bool = True
    max_body_bytes: int = 1024 * 1024
    http_workers: int = 1
    max_header_bytes: int = 64 * 1024
    header_timeout_ms: int = 10_000
    body_timeout_ms: int = 30_000
    idle_timeout_ms: int = 5_000
    public_max_connections: int = 10_000
    agent_max_connections: int = 1_000
    runtime_command: tuple[str, ...] | None = None
    runtime_workdir: Path | None = None
    runtime_mode: str = "per-run"
    # Confinement of the agent program (sandbox/).
    runtime_sandbox: str = "auto"
    runtime_sandbox_ro: tuple[Path, ...] = ()
    runtime_sandbox_rw: tuple[Path, ...] = ()
    runtime_allow_hosts: tuple[Address, ...] = ()
    runtime_env_pass: tuple[str, ...] = ()
    runtime_memory_limit_mb: int = 4096
    runtime_max_processes: int = 1024
    handlers: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    signals_setup: str | None = None
    log_level: str = "INFO"
    # The ops listener, log format and access log, retention.
    ops_listen: Address | None = Address("127.0.0.1", 8702)
    # Names the ops listener is addressed by besides an IP address, localhost and its listen host.
    ops_allowed_hosts: tuple[str, ...] = ()
    log_format: str = "text"
    log_access: bool | None = None  # None: on in the json format, off in text
    retention_signals_max_age: datetime.timedelta | None = None
    retention_deliveries_max_age: datetime.timedelta | None = None
    # The Decision log's checkpoints (transparency/): None derives a name from the signing key.
    transparency_origin: str | None = None
    # Its witnesses (transparency/collector.py) and how many cosignatures make a checkpoint
    # witnessed; None: every witness listed.
    witnesses: tuple[Witness, ...] = ()
    witness_quorum: int | None = None
    # The Users' chat page at the Public server's / (web/); off for deployments with their own client.
    public_chat_page: bool = True
    # Message streams (streams/): keep-alive comments, the Token re-check, a stalled
    # reader's grace, and the SQLite cross-process poll.
    stream_keep_alive_ms: int = 15_000
    stream_auth_check_ms: int = 10_000
    stream_stall_ms: int = 10_000
    stream_poll_ms: int = 50
    # The file the settings were read from (not a setting): its folder is never shown to the agent.
    config_file: Path | None = None
    # Webhooks (webhooks/): the endpoints, and how their deliveries are retried and sent.
    webhooks: tuple[WebhookEndpoint, ...] = ()
    webhook_retry_for: datetime.timedelta = datetime.timedelta(days=1)
    webhook_first_retry_ms: int = 5_000
    webhook_timeout_ms: int = 10_000
    # Chat channels (channels/): Matrix ([channels.matrix]); its access token is read from its
    # file by the channel when it starts, and is never held here.
    matrix_homeserver: str | None = None
    matrix_user_id: str | None = None
    matrix_access_token_file: Path | None = None
    matrix_policy: str = "pairing"
    # Nostr ([channels.nostr]): its secret key is read from its file by the channel when it starts.
    nostr_relays: tuple[str, ...] = ()
    nostr_key_file: Path | None = None
    nostr_policy: str = "pairing"
    # Authentication schemes of the Public server, in registration order (auth/schemes.py).
    auth_schemes: tuple[str, ...] = ("password",)
    # The Public server's URL as its clients send it (behind a proxy): the NIP-98 scheme's signed URL.
    public_base_url: str | None = None

    @property
    def channels(self) -> frozenset[str]:
        """The chat channels this deployment serves."""
        served = {"matrix": self.matrix_homeserver is not None, "nostr": bool(self.nostr_relays)}
        return frozenset(name for name, on in served.items() if on)

    @property
    def access_log(self) -> bool:
        return self.log_format == "json" if self.log_access is None else self.log_access


# --- value parsers: each takes a TOML value or an environment string -------------


def _int(value: Any, *, minimum: int = 1, maximum: int | None = None) -> int:
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):
        value = int(value.strip())
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError("must be an integer")
    if value < minimum:
        raise ValueError(f"must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise ValueError(f"must be at most {maximum}")
    return value


def _positive_int(value: Any) -> int:
    return _int(value)


def _str(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("must be a non-empty string")
    return value


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
        return True
    if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
        return False
    raise ValueError("must be true or false")


def _address(value: Any) -> Address:
    match = isinstance(value, str) and re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\[\]]+):(\d+)", value)
    if not match:
        raise ValueError('must be "host:port" (or "[ipv6]:port")')
    host = match.group(1) or match.group(3)
    port = int(match.group(2) or match.group(4))
    if port > 65535:
        raise ValueError("port must be 0..65535")
    return Address(host, port)


def _host_name(value: Any) -> str:
    """A host name or IP address, without a port (``agent.allowed_hosts``, ``ops.allowed_hosts``)."""
    host = _str(value).strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"must be a host name or address without a port (got {value!r})") from None
    elif not re.fullmatch(r"[a-z0-9_.-]+", host):
        raise ValueError(f"must be a host name or address without a port (got {value!r})")
    return host


def _database_url(value: Any) -> str:
    url = _str(value)
    if not re.match(r"(sqlite|postgresql|postgres)(\+\w+)?://", url):
        raise ValueError('must start with "sqlite://" or "postgresql://"')
    return url


def _json_or(kind: type) -> Callable[[Any], Any]:
    def parse(value: Any) -> Any:
        if isinstance(value, str) and kind is not str:
            try:
                value = orjson.loads(value)
            except orjson.JSONDecodeError:
                raise ValueError("must be JSON") from None
        if not isinstance(value, kind):
            raise ValueError(f"must be a {'list' if kind is list else 'table'}")
        return value

    return parse


def _command(value: Any) -> tuple[str, ...]:
    items = _json_or(list)(value)
    if not items or not all(isinstance(item, str) and item for item in items):
        raise ValueError("must be a non-empty list of strings (argv, no shell)")
    return tuple(items)


def _runtime_mode(value: Any) -> str:
    mode = _str(value)
    if mode not in RUNTIME_MODES:
        raise ValueError('must be "per-run" or "persistent"')
    return mode


def _sandbox(value: Any) -> str:
    mode = _str(value)
    if mode not in SANDBOX_MODES:
        raise ValueError('must be "auto", "bubblewrap" or "none"')
    return mode


def _list(item: Callable[[Any], Any]) -> Callable[[Any], tuple[Any, ...]]:
    """A list (TOML, or JSON in the environment) of values each parsed by ``item``."""

    def parse(value: Any) -> tuple[Any, ...]:
        try:
            items = _json_or(list)(value)
        except ValueError:
            raise ValueError("must be a list (in an environment variable, a JSON list)") from None
        try:
            return tuple(item(entry) for entry in items)
        except ValueError as exc:
            raise ValueError(f"each entry {exc}") from None

    return parse


def _host_port(value: Any) -> Address:
    address = _address(value)
    if address.port == 0:
        raise ValueError('must be "host:port" with a port 1..65535')
    return address


def _env_name(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        raise ValueError("must be an environment variable name (letters, digits, _)")
    return value


def _handlers(value: Any) -> dict[str, dict[str, Any]]:
    table = _json_or(dict)(value)
    for kind, handler in table.items():
        if not isinstance(handler, dict):
            raise ValueError(f"[handlers.{kind!r}] must be a table")
    return table


def _log_level(value: Any) -> str:
    level = _str(value).upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError("must be DEBUG, INFO, WARNING or ERROR")
    return level


def _optional_address(value: Any) -> Address | None:
    """An address, or nothing for an empty string (the listener is off)."""
    return None if value == "" else _address(value)


def _log_format(value: Any) -> str:
    if value not in ("text", "json"):
        raise ValueError('must be "text" or "json"')
    return value


_AGE = re.compile(r"([0-9]{1,9})([smhdw])")
_AGE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_age(value: Any) -> datetime.timedelta:
    """An age such as ``30d``, ``12h``, ``90m``, ``45s``, ``2w`` or ``0s``; raises ValueError."""
    match = _AGE.fullmatch(value.strip()) if isinstance(value, str) else None
    if not match:
        raise ValueError('must be a whole number and a unit s, m, h, d or w, such as "30d" or "12h"')
    return datetime.timedelta(**{_AGE_UNITS[match.group(2)]: int(match.group(1))})


def _origin(value: Any) -> str:
    origin = _str(value)
    if re.search(r"[\s+]", origin) or any(ord(c) < 0x20 for c in origin):
        raise ValueError("must be a signed-note key name: no spaces, no '+', no control characters")
    return origin


@dataclasses.dataclass(frozen=True)
class _WebhookTable:
    """A ``[[webhooks]]`` table as written; :func:`_webhook_endpoint` reads its secret."""

    where: str
    url: str
    events: frozenset[str]
    secret_file: str | None
    secret_env: str | None
    allow_private: bool


def _tables(value: Any, name: str, known: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """An array of tables (TOML, or JSON in the environment) named ``name``, each with only ``known``
    keys: ``(where, table)`` for each, ``where`` naming it in messages (``webhooks[0]``)."""
    found = []
    for index, table in enumerate(_json_or(list)(value)):
        where = f"{name}[{index}]"
        if not isinstance(table, dict):
            raise ValueError(f"{where} must be a table")
        for key in table:
            if key not in known:
                raise ValueError(f"{where}.{key}: unknown key (known: {', '.join(sorted(known))})")
        found.append((where, table))
    return found


def _webhooks(value: Any) -> tuple[_WebhookTable, ...]:
    parsed: list[_WebhookTable] = []
    for where, table in _tables(value, "webhooks", _WEBHOOK_KEYS):
        parsed.append(_webhook_table(where, table))
        if any(other.url == parsed[-1].url for other in parsed[:-1]):
            raise ValueError(f"{where}.url: {parsed[-1].url} is already an endpoint; give each URL one table")
    return tuple(parsed)


def _webhook_table(where: str, table: dict[str, Any]) -> _WebhookTable:
    url = table.get("url")
    host = _http_host(url)
    if host is None:
        raise ValueError(f"{where}.url: must be an http:// or https:// URL with a valid host and no credentials (got {url!r})")
    allow_private = table.get("allow_private", False)
    if not isinstance(allow_private, bool):
        raise ValueError(f"{where}.allow_private: must be true or false")
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    # The sender's rule at each attempt (addresses.is_public), applied to a literal at once.
    if literal is not None and not is_public(literal) and not allow_private:
        raise ValueError(f"{where}.url: {host} is not a public address; set allow_private = true to send there")
    events = table.get("events")
    if not isinstance(events, list) or not events or not all(isinstance(event, str) for event in events):
        raise ValueError(f"{where}.events: must be a non-empty list of event names ({', '.join(WEBHOOK_EVENTS)})")
    for event in events:
        if event not in WEBHOOK_EVENTS:
            raise ValueError(f"{where}.events: unknown event {event!r} (known: {', '.join(WEBHOOK_EVENTS)})")
    secret_file, secret_env = table.get("secret_file"), table.get("secret_env")
    if (secret_file is None) == (secret_env is None):
        raise ValueError(f"{where}: give secret_file or secret_env (one of them; never the secret itself)")
    for key, name in (("secret_file", secret_file), ("secret_env", secret_env)):
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"{where}.{key}: must be a non-empty string")
    return _WebhookTable(where, url, frozenset(events), secret_file, secret_env, allow_private)


def _http_host(url: Any) -> str | None:
    """The host of a URL the gateway POSTs to (a webhook, a witness), or None when it cannot send there."""
    if not isinstance(url, str) or any(c.isspace() for c in url):
        return None
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # a port that is not a number raises here
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username is not None:
        return None
    # The URL must also be one httpx, which sends to it, can use: it refuses some that the standard
    # library splits (a host that is no valid IDNA name, ü-.example.com), and would refuse them at
    # every attempt. Imported here: reading a configuration without URLs needs none of httpx.
    import httpx

    try:
        if not httpx.URL(url).host:
            return None
    except httpx.InvalidURL:
        return None
    return parts.hostname


def _webhook_endpoint(table: _WebhookTable, base: Path, environ: Mapping[str, str]) -> WebhookEndpoint:
    """The endpoint of ``table``, its secret read from its file (relative to ``base``) or variable."""
    if table.secret_file is not None:
        source = f"{table.where}.secret_file"
        try:
            secret = (base / table.secret_file).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            raise SettingsError(f"{source}: no such file: {base / table.secret_file}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"{source}: cannot read {base / table.secret_file}: {type(exc).__name__}") from None
    else:
        source = f"{table.where}.secret_env"
        secret = environ.get(table.secret_env or "", "").strip()
        if not secret:
            raise SettingsError(f"{source}: the environment variable {table.secret_env} is not set or empty")
    match = _WEBHOOK_SECRET.fullmatch(secret)
    if not match or not _base64(match.group(1)):
        # Never echo the value: it is (or was meant to be) the secret.
        raise SettingsError(f'{source}: the secret must be "whsec_" followed by base64 (a Standard Webhooks secret)')
    secret_path = None if table.secret_file is None else base / table.secret_file
    return WebhookEndpoint(table.url, table.events, secret, table.allow_private, secret_path)


def _base64(text: str) -> bytes:
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except ValueError:
        return b""


def _witnesses(value: Any) -> tuple[Witness, ...]:
    parsed: list[Witness] = []
    for where, table in _tables(value, "transparency.witnesses", ("url", "vkey")):
        url, vkey = table.get("url"), table.get("vkey")
        if _http_host(url) is None:
            raise ValueError(f"{where}.url: must be an http:// or https:// URL with a host and no credentials (got {url!r})")
        if not isinstance(vkey, str) or not vkey:
            raise ValueError(f"{where}.vkey: must be the witness's verifier key (name+key ID+base64 key)")
        # The same witness twice would count twice toward the quorum.
        for other in parsed:
            if vkey == other.vkey or url.rstrip("/") == other.url.rstrip("/"):
                raise ValueError(f"{where}: the same witness as an earlier table (its url or vkey); list each witness once")
        parsed.append(Witness(url.rstrip("/"), vkey))
    return tuple(parsed)


CHANNEL_POLICIES = ("pairing", "allowlist", "open")
# A Matrix user ID: @localpart:server, the server a host name or an IP literal with an optional port.
MATRIX_USER_ID = re.compile(r"@[\x21-\x39\x3b-\x7e]+:(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")


def _channel_policy(value: Any) -> str:
    if value not in CHANNEL_POLICIES:
        raise ValueError('must be "pairing", "allowlist" or "open"')
    return value


def homeserver_url(value: Any) -> str:
    """A Matrix homeserver's client-server API base URL (no trailing slash); raises ValueError."""
    url = _str(value)
    if _http_host(url) is None:
        raise ValueError("must be the http:// or https:// base URL of the homeserver's client-server API, without credentials")
    return url.rstrip("/")


def matrix_user_id(value: Any) -> str:
    """A Matrix user ID; raises ValueError."""
    if not isinstance(value, str) or not MATRIX_USER_ID.fullmatch(value):
        raise ValueError('must be a Matrix user ID, such as "@agent:example.org"')
    return value


def _relay_url(value: Any) -> str:
    """A Nostr relay's websocket URL: wss://, or ws:// to a loopback host (nothing else can read it)."""
    if not isinstance(value, str) or any(c.isspace() for c in value):
        raise ValueError(f"{value!r} is not a relay URL")
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # a port that is not a number raises here
    except ValueError:
        raise ValueError(f"{value!r} is not a relay URL") from None
    if parts.scheme not in ("ws", "wss") or not parts.hostname or parts.username is not None:
        raise ValueError(f"{value!r} must be a wss:// URL (ws:// for a relay on this host), without credentials")
    if parts.scheme == "ws" and not _loopback_host(parts.hostname):
        raise ValueError(f"{value!r}: ws:// (unencrypted) is allowed only for a loopback host; use wss://")
    return value


def _loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def nostr_relays(value: Any) -> tuple[str, ...]:
    """A non-empty list of distinct relay URLs; raises ValueError."""
    urls = _list(_relay_url)(value)
    if not urls:
        raise ValueError("must list at least one relay")
    if len({url.rstrip("/") for url in urls}) < len(urls):
        raise ValueError("lists a relay twice")
    return urls


AUTH_SCHEMES = ("password", "nostr")


def _auth_scheme(value: Any) -> str:
    if value not in AUTH_SCHEMES:
        raise ValueError(f"must be one of {', '.join(map(repr, AUTH_SCHEMES))}")
    return value


def _base_url(value: Any) -> str:
    parts = urllib.parse.urlsplit(_str(value))
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError("must be an http(s) URL with a host and no query, such as https://gateway.example.org")
    return parts.geturl().rstrip("/")


def _min_age(value: Any) -> datetime.timedelta:
    age = parse_age(value)
    if age < datetime.timedelta(minutes=1):
        raise ValueError("must be at least 1m")
    return age


@dataclasses.dataclass(frozen=True)
class _Key:
    path: tuple[str, ...]
    field: str
    parse: Callable[[Any], Any]
    is_path: bool = False
    # What the settings reference (docs/) prints for this key: the default as Markdown, and
    # one sentence of meaning. Required, so a new key cannot go undocumented.
    default: str = dataclasses.field(kw_only=True)
    doc: str = dataclasses.field(kw_only=True)

    @property
    def dotted(self) -> str:
        return ".".join(self.path)

    @property
    def env(self) -> str:
        return ENV_PREFIX + "_".join(self.path).upper()


def _allowed_hosts(section: str, server: str, page: str, note: str = "") -> _Key:
    """``<section>.allowed_hosts`` of a server without authentication (``http.connections.Hosts``)."""
    return _Key(
        (section, "allowed_hosts"), f"{section}_allowed_hosts", _list(_host_name),
        default="`[]`",
        doc=f"names {server} may be addressed by in `Host`, besides an IP address, `localhost` and "
            f"`{section}.listen`'s host{note}, and the hosts of web pages (`Origin`) it answers besides a loopback "
            f"address, `localhost` and that host: any other is refused, against DNS rebinding (see {page})",
    )


_KEYS = (
    _Key(("database", "url"), "database_url", _database_url,
         default='`sqlite:///gateway.db`',
         doc='`sqlite:///relative/or/absolute.db` (embedded, WAL) or `postgresql://user[:password]@host:5432/db`'),
    _Key(("database", "busy_timeout_ms"), "database_busy_timeout_ms", lambda v: _int(v, minimum=0, maximum=MAX_BUSY_TIMEOUT_MS),
         default="`30000`",
         doc="SQLite only: how long a write waits for another process's write lock (a CLI command's, a backup's) "
             "before its request answers 503 (retry)"),
    _Key(("public", "listen"), "public_listen", _address,
         default='`127.0.0.1:8700`',
         doc='Public server address, `host:port` (`[::1]:8700` for IPv6)'),
    _Key(("agent", "listen"), "agent_listen", _address,
         default='`127.0.0.1:8701`',
         doc='Agent server address; a non-loopback address logs a warning (no authentication!)'),
    _allowed_hosts("agent", "the Agent server", "[Agent server](/agents/agent-server.md#host-and-origin)"),
    _Key(("signing", "key_file"), "signing_key_file", _str, is_path=True,
         default='—',
         doc="PKCS#8 PEM private key: the agent's signing identity"),
    _Key(("signing", "key"), "signing_key_pem", _str,
         default='—',
         doc='the PEM itself, for container deployments (instead of `key_file`)'),
    _Key(("signing", "algorithm"), "signing_algorithm", _str,
         default='derived',
         doc='JOSE algorithm; only for keys whose algorithm cannot be derived (RSA, ...)'),
    _Key(("auth", "token_ttl_ms"), "token_ttl_ms", lambda v: _int(v, maximum=MAX_TOKEN_TTL_MS),
         default='**required**',
         doc='lifetime of every Token, in milliseconds (positive)'),
    _Key(("auth", "schemes"), "auth_schemes", _list(_auth_scheme),
         default='`["password"]`',
         doc='authentication schemes of the Public server, asked in this order: `"password"` (bearer Tokens) '
             'and `"nostr"` (NIP-98, needs `pip install \'agent-gateway[nostr]\'`)'),
    _Key(("auth", "scrypt", "logN"), "scrypt.log_n", lambda v: _int(v, maximum=MAX_SCRYPT_LOGN),
         default='`15`',
         doc="log2 of scrypt's CPU/memory cost for new password digests (1..20)"),
    _Key(("auth", "scrypt", "blockSize"), "scrypt.block_size", _positive_int,
         default='`8`',
         doc='scrypt `r`'),
    _Key(("auth", "scrypt", "parallelism"), "scrypt.parallelism", _positive_int,
         default='`1`',
         doc='scrypt `p`'),
    _Key(("scheduler", "max_sleep_ms"), "scheduler_max_sleep_ms", lambda v: _int(v, maximum=TIMER_CEILING_MS - 1),
         default='`60000`',
         doc='the Scheduler re-checks due Schedules at least this often (below 2^31-1)'),
    _Key(("scheduler", "agent_routes"), "scheduler_agent_routes", _bool,
         default='`true`',
         doc='whether the Agent server serves `/schedules` at all'),
    _Key(("http", "max_body_bytes"), "max_body_bytes", _positive_int,
         default='`1048576`',
         doc='largest request body either server accepts (413 above)'),
    _Key(("http", "workers"), "http_workers", lambda v: _int(v, maximum=64),
         default='`1`',
         doc='HTTP processes sharing both addresses (1..64); the extra ones are forked by `serve` and serve HTTP only'),
    _Key(("http", "max_header_bytes"), "max_header_bytes", lambda v: _int(v, minimum=1024),
         default='`65536`',
         doc="largest total of a request's headers either server reads (431 above; at least 1024)"),
    _Key(("http", "header_timeout_ms"), "header_timeout_ms", lambda v: _int(v, maximum=TIMER_CEILING_MS),
         default='`10000`',
         doc='a connection whose request headers are not complete this long after it opened or after its previous response is closed'),
    _Key(("http", "body_timeout_ms"), "body_timeout_ms", lambda v: _int(v, maximum=TIMER_CEILING_MS),
         default='`30000`',
         doc="a request whose body is not complete this long after its headers is answered `408` and its connection closed"),
    _Key(("http", "idle_timeout_ms"), "idle_timeout_ms", lambda v: _int(v, maximum=TIMER_CEILING_MS),
         default='`5000`',
         doc='an idle keep-alive connection is closed after this long'),
    _Key(("public", "base_url"), "public_base_url", _base_url,
         default='the request\'s own URL',
         doc='the Public server\'s URL as clients send it, when a proxy stands in front (`https://gateway.example.org`); '
             'the URL a NIP-98 event signs is this plus the path and query as forwarded, percent-encoding included'),
    _Key(("public", "max_connections"), "public_max_connections", _positive_int,
         default='`10000`',
         doc='open connections the Public server holds (per HTTP process); past it, 503 and close. Lowered at start when the descriptor limit cannot hold it (see [Connections](/operate/connections.md))'),
    _Key(("agent", "max_connections"), "agent_max_connections", _positive_int,
         default='`1000`',
         doc='the same for the Agent server'),
    _Key(("runtime", "command"), "runtime_command", _command,
         default='—',
         doc='the agent program (argv, no shell) started for each Run, or once in `"persistent"` mode; in the environment a JSON array'),
    _Key(("runtime", "workdir"), "runtime_workdir", _str, is_path=True,
         default='—',
         doc="the agent's working directory (the Workspace)"),
    _Key(("runtime", "mode"), "runtime_mode", _runtime_mode,
         default='`"per-run"`',
         doc='`"per-run"`: `runtime.command` is started for each Run; `"persistent"`: started once and handed Runs as JSON lines (see [Runtimes](/agents/runtimes.md#the-persistent-runtime-the-contract-for-agent-authors)); `init` writes `"persistent"`'),
    _Key(("runtime", "sandbox"), "runtime_sandbox", _sandbox,
         default='`"auto"`',
         doc='confinement of the agent program (see [Confinement](/agents/confinement.md)): `"auto"` confines it with bubblewrap when `bwrap` works; where it cannot, it refuses to start any agent program but the bundled echo demo (which starts unconfined, with a warning); `"bubblewrap"` refuses to start without confinement, even the echo demo; `"none"` runs it unconfined on purpose. `agent-gateway doctor` says which applies'),
    _Key(("runtime", "sandbox_ro"), "runtime_sandbox_ro", _list(_str), is_path=True,
         default='`[]`',
         doc='more paths the confined agent program sees read-only (each must exist, and none may hold the gateway\'s key, config or database)'),
    _Key(("runtime", "sandbox_rw"), "runtime_sandbox_rw", _list(_str), is_path=True,
         default='`[]`',
         doc='more paths the confined agent program may write (same rules as `sandbox_ro`)'),
    _Key(("runtime", "allow_hosts"), "runtime_allow_hosts", _list(_host_port),
         default='`[]` (no egress)',
         doc='the `"host:port"` addresses the confined agent program may reach, through the egress proxy given to it as `HTTPS_PROXY`/`HTTP_PROXY`; a listed name that resolves to a loopback, link-local or private address is refused unless that address is listed too'),
    _Key(("runtime", "env_pass"), "runtime_env_pass", _list(_env_name),
         default='`[]`',
         doc="names of the gateway's environment variables passed to the confined agent program (an API key, say), besides `PATH`, the locale and `TZ`"),
    _Key(("runtime", "memory_limit_mb"), "runtime_memory_limit_mb", lambda v: _int(v, minimum=16, maximum=2**31),
         default='`4096`',
         doc="the confined agent program's data memory per process, in MiB (`RLIMIT_DATA`); an allocation past it fails"),
    _Key(("runtime", "max_processes"), "runtime_max_processes", lambda v: _int(v, minimum=8, maximum=2**22),
         default='`1024`',
         doc="processes and threads the confined agent program may run at once (`RLIMIT_NPROC`, and a `pids` cgroup where one can be made: as root, only the cgroup holds)"),
    _Key(("handlers",), "handlers", _handlers,
         default='—',
         doc='declarative Signal Handlers, one table per Signal kind with a `template` and an optional `session` (see [Signal Handlers](/agents/handlers.md)); in the environment one JSON object of all of them'),
    _Key(("signals", "setup"), "signals_setup", _str,
         default='—',
         doc='`"module:function"` called with the Gateway in worker processes, to register Python Signal Handlers or replace the runtime'),
    _Key(("log", "level"), "log_level", _log_level,
         default='`INFO`',
         doc='`DEBUG`, `INFO`, `WARNING` or `ERROR`'),
    _Key(("ops", "listen"), "ops_listen", _optional_address,
         default='`127.0.0.1:8702`',
         doc='the ops listener (`/healthz`, `/readyz`, `/metrics`); `""` turns it (and metrics) off; a non-loopback address logs a warning'),
    _allowed_hosts(
        "ops", "the ops listener", "[Health, metrics and alerts](/operate/health-metrics.md#host-and-origin)",
        " (a Prometheus that scrapes it by name needs that name here)",
    ),
    _Key(("log", "format"), "log_format", _log_format,
         default='`text`',
         doc='`text`, or `json`: one JSON object per line (see [Logs](/operate/logs.md))'),
    _Key(("log", "access"), "log_access", _bool,
         default='on in `json`, off in `text`',
         doc='one log line per answered request: server, method, route template, status, duration, bytes'),
    _Key(("retention", "signals_max_age"), "retention_signals_max_age", parse_age,
         default='off',
         doc='an age (`30d`, `12h`, `90m`, `45s`, `2w`): the scheduler role removes ended Signals older than this, with their Runs, once an hour'),
    _Key(("retention", "deliveries_max_age"), "retention_deliveries_max_age", parse_age,
         default='off',
         doc='an age, as above: the scheduler role removes webhook deliveries `delivered` or `dead` longer ago than this, once an hour; pending and retrying ones are never removed (see [Retention](/operate/retention.md))'),
    _Key(("transparency", "origin"), "transparency_origin", _origin,
         default='`agent-gateway/decisions/<16 hex>`',
         doc='the name of the Decision log in its [checkpoints](/users/checkpoints.md#checkpoints); a signed-note key name: no spaces, no `+`. The default is derived from the signing key (the first 8 bytes of SHA-256 of its SubjectPublicKeyInfo), so it is the same in every process and stays as long as the key'),
    _Key(("transparency", "witnesses"), "witnesses", _witnesses,
         default='none',
         doc='the witnesses that cosign the Decision log\'s checkpoints, one `[[transparency.witnesses]]` table each '
             '(the whole list as JSON in the variable): `url`, where the gateway POSTs `{url}/add-checkpoint` '
             '(c2sp.org/tlog-witness), and `vkey`, the witness\'s cosignature verifier key (`name+key ID+base64`, '
             'type 0x04); only an Ed25519 signing key can be witnessed; see [Witnesses](/users/witnesses.md)'),
    _Key(("transparency", "witness_quorum"), "witness_quorum", _positive_int,
         default='every witness',
         doc='how many verified cosignatures make a checkpoint witnessed (`GET /checkpoint/witnessed`); at most the '
             'number of witnesses listed'),
    _Key(("public", "chat_page"), "public_chat_page", _bool,
         default='`true`',
         doc='whether the Public server serves the [chat page](/users/chat-page.md) at `/` and `/web/…`; `false` for deployments that bring their own client (both then answer 404)'),
    _Key(("streams", "keep_alive_ms"), "stream_keep_alive_ms", lambda v: _int(v, maximum=TIMER_CEILING_MS),
         default='`15000`',
         doc='a Message stream sends a `: keep-alive` comment after this long without an event'),
    _Key(("streams", "auth_check_ms"), "stream_auth_check_ms", lambda v: _int(v, maximum=MAX_STREAM_AUTH_CHECK_MS),
         default='`10000`',
         doc='a Public stream re-checks its Token this often (at most 10000) and ends when it is revoked or expired'),
    _Key(("streams", "stall_ms"), "stream_stall_ms", lambda v: _int(v, maximum=TIMER_CEILING_MS),
         default='`10000`',
         doc='a stream whose reader takes nothing for this long (its 64 KiB buffer full) is disconnected'),
    _Key(("streams", "poll_ms"), "stream_poll_ms", lambda v: _int(v, maximum=10_000),
         default='`50`',
         doc='SQLite with `http.workers > 1` only: how often each HTTP process looks for Messages written by the others (1..10000)'),
    _Key(("webhooks",), "webhooks", _webhooks,
         default='none',
         doc='the webhook endpoints, one `[[webhooks]]` table each (the whole list as JSON in the variable): '
             '`url` (http or https), `events` (a list of `run.ended`, `signal.failed`, `message.outbound`, '
             '`message.inbound`, `decision.published`, `schedule.fired`), `secret_file` or `secret_env` (where '
             'the Standard Webhooks secret, `whsec_` and base64, is read; never the secret itself) and '
             '`allow_private` (default `false`: loopback, link-local and private addresses are refused); '
             'see [Webhooks](/operate/webhooks.md)'),
    _Key(("webhook_delivery", "retry_for"), "webhook_retry_for", _min_age,
         default='`1d`',
         doc='an age (at least `1m`): a delivery that has failed is retried, with exponential backoff, until '
             'this long after its event, then marked dead'),
    _Key(("webhook_delivery", "first_retry_ms"), "webhook_first_retry_ms", lambda v: _int(v, maximum=3_600_000),
         default='`5000`',
         doc='the wait after the first failed attempt; each following wait is three times the one before, at most six hours'),
    _Key(("webhook_delivery", "timeout_ms"), "webhook_timeout_ms", lambda v: _int(v, maximum=300_000),
         default='`10000`',
         doc='one delivery attempt (connect, send, the answer) fails after this long'),
    _Key(("channels", "matrix", "homeserver"), "matrix_homeserver", homeserver_url,
         default='—',
         doc="the Matrix homeserver's client-server API base URL (`https://matrix.example.org`); setting it "
             "serves the Matrix channel (see [Chat channels](/operate/channels.md))"),
    _Key(("channels", "matrix", "user_id"), "matrix_user_id", matrix_user_id,
         default='—',
         doc="the agent's Matrix account (`@agent:example.org`), registered beforehand"),
    _Key(("channels", "matrix", "access_token_file"), "matrix_access_token_file", _str, is_path=True,
         default='—',
         doc="the file holding that account's access token (surrounding whitespace stripped); the token is "
             "never logged nor stored in the database"),
    _Key(("channels", "matrix", "policy"), "matrix_policy", _channel_policy,
         default='`"pairing"`',
         doc='what a message from a Matrix user linked to no User does: `"pairing"` (one reply with a code '
             'for the operator to approve), `"allowlist"` (nothing) or `"open"` (a new User is admitted)'),
    _Key(("channels", "nostr", "relays"), "nostr_relays", nostr_relays,
         default='—',
         doc='the relays the agent reads its direct messages on and publishes on (`["wss://relay.example.org"]`; '
             '`ws://` only for a loopback host); setting it serves the Nostr channel (see '
             '[Chat channels](/operate/channels.md)); needs `pip install \'agent-gateway[nostr]\'`'),
    _Key(("channels", "nostr", "key_file"), "nostr_key_file", _str, is_path=True,
         default='—',
         doc="the file holding the agent's Nostr secret key (64 hex characters or `nsec1…`), mode 0600; the key "
             "is never logged nor stored in the database"),
    _Key(("channels", "nostr", "policy"), "nostr_policy", _channel_policy,
         default='`"pairing"`',
         doc='what a direct message from a Nostr key linked to no User does: `"pairing"`, `"allowlist"` or '
             '`"open"`, as for Matrix'),
)


def named(field: str) -> str:
    """How an operator sets the setting held in ``field``: its dotted key and its environment variable."""
    [key] = [key for key in _KEYS if key.field == field]
    return f"{key.dotted} (or {key.env})"


_KNOWN_TABLES = {
    "database", "public", "agent", "signing", "auth", "scheduler", "http", "runtime", "handlers", "signals", "log",
    "ops", "retention", "transparency", "streams", "webhooks", "webhook_delivery", "channels",
}


def _lookup(document: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = document
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _check_unknown(document: Mapping[str, Any]) -> None:
    known = {key.path for key in _KEYS}
    for table, body in document.items():
        if table not in _KNOWN_TABLES:
            raise SettingsError(f"{table}: unknown setting")
        if table == "webhooks":  # an array of tables, checked by its parser
            continue
        if not isinstance(body, Mapping):
            # Ignoring it would quietly serve the defaults the operator meant to change.
            raise SettingsError(f"{table}: must be a table ([{table}])")
        if table == "handlers":
            continue
        for name, value in body.items():
            if (table, name) in known:
                continue
            if not any(path[:2] == (table, name) for path in known):
                raise SettingsError(f"{table}.{name}: unknown setting")
            if not isinstance(value, Mapping):
                raise SettingsError(f"{table}.{name}: must be a table")
            for sub in value:
                if (table, name, sub) not in known:
                    raise SettingsError(f"{table}.{name}.{sub}: unknown setting")


def load(
    path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Read settings from ``path`` (or ``AGENT_GATEWAY_CONFIG``) and the environment."""
    environ = os.environ if environ is None else environ
    path = path or environ.get(CONFIG_ENV)
    document: dict[str, Any] = {}
    base = Path.cwd()
    if path:
        file = Path(path)
        try:
            document = tomllib.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SettingsError(f"config: {file}: no such file") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise SettingsError(f"config: {file}: not valid TOML ({exc})") from None
        base = file.resolve().parent
        _check_unknown(document)

    values: dict[str, Any] = {"config_file": Path(path).resolve()} if path else {}
    scrypt: dict[str, Any] = {}
    for key in _KEYS:
        raw, source = environ.get(key.env), key.env
        if raw is None:
            raw, source = _lookup(document, key.path), key.dotted
        if raw is None:
            continue
        try:
            value = key.parse(raw)
        except ValueError as exc:
            where = key.dotted if source == key.dotted else f"{key.dotted} ({source})"
            if str(exc).startswith(f"{key.dotted}["):  # names the table of a list itself ([[webhooks]], [[transparency.witnesses]])
                raise SettingsError(str(exc) if source == key.dotted else f"{exc} (in {source})") from None
            raise SettingsError(f"{where}: {exc}") from None
        if key.is_path:
            value = tuple(base / item for item in value) if isinstance(value, tuple) else base / value
        if key.field.startswith("scrypt."):
            scrypt[key.field.removeprefix("scrypt.")] = value
        else:
            values[key.field] = value

    if not path and not values:
        raise SettingsError(f"no configuration: pass --config or set {CONFIG_ENV}")
    if "token_ttl_ms" not in values:
        raise SettingsError(
            "auth.token_ttl_ms (AGENT_GATEWAY_AUTH_TOKEN_TTL_MS): required, "
            "the lifetime of every Token in milliseconds (no default)"
        )
    values["database_url"] = _resolve_sqlite(values.get("database_url", Settings.database_url), base)
    if "webhooks" in values:
        values["webhooks"] = tuple(_webhook_endpoint(table, base, environ) for table in values["webhooks"])
    _check_matrix(values)
    _check_nostr(values)
    _check_quorum(values)
    _check_schemes(values)
    return Settings(scrypt=ScryptCost(**scrypt), **values)


def _check_matrix(values: Mapping[str, Any]) -> None:
    """The Matrix channel is served with all three of its keys, or none."""
    needed = {"matrix_homeserver": "homeserver", "matrix_user_id": "user_id", "matrix_access_token_file": "access_token_file"}
    given = [key for key in needed if key in values]
    if given and len(given) < len(needed):
        missing = ", ".join(f"channels.matrix.{name}" for key, name in needed.items() if key not in values)
        raise SettingsError(f"{missing}: required to serve the Matrix channel (with homeserver, user_id and access_token_file)")


def _check_nostr(values: Mapping[str, Any]) -> None:
    """The Nostr channel is served with its relays and key file, and its library (an optional extra)."""
    given = [key for key in ("nostr_relays", "nostr_key_file", "nostr_policy") if key in values]
    if not given:
        return
    for key, name in (("nostr_relays", "relays"), ("nostr_key_file", "key_file")):
        if key not in values:
            raise SettingsError(f"channels.nostr.{name}: required to serve the Nostr channel (with relays and key_file)")
    if importlib.util.find_spec("nostr_sdk") is None:
        raise SettingsError("channels.nostr: the Nostr channel needs the nostr extra: pip install 'agent-gateway[nostr]'")


def _check_quorum(values: Mapping[str, Any]) -> None:
    """A quorum the listed witnesses can meet."""
    quorum, listed = values.get("witness_quorum"), len(values.get("witnesses", ()))
    if quorum is not None and quorum > listed:
        raise SettingsError(
            f"transparency.witness_quorum: {quorum} cosignatures cannot be met by the {listed} "
            "[[transparency.witnesses]] listed"
        )


def _check_schemes(values: Mapping[str, Any]) -> None:
    """Each scheme once; the nostr scheme only with its library (an optional extra)."""
    schemes = values.get("auth_schemes", Settings.auth_schemes)
    if not schemes or len(set(schemes)) < len(schemes):
        raise SettingsError("auth.schemes: name each scheme once, at least one")
    if "nostr" in schemes and importlib.util.find_spec("coincurve") is None:
        raise SettingsError("auth.schemes: \"nostr\" needs the nostr extra: pip install 'agent-gateway[nostr]'")


def _resolve_sqlite(url: str, base: Path) -> str:
    """Make a relative SQLite file path relative to the config file's folder."""
    match = re.fullmatch(r"(sqlite(?:\+\w+)?:///)(.+)", url)
    if not match or match.group(2).startswith("/") or match.group(2) == ":memory:":
        return url
    return match.group(1) + str(base / match.group(2))
