"""``agent-gateway init``: a new deployment folder that serves as written."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import secrets
import sys
from pathlib import Path

from agent_gateway.agent.llm import providers
from agent_gateway.auth import service as auth_service
from agent_gateway import config as config_parsers
from agent_gateway.config import ScryptCost
from agent_gateway.signatures import keys
from agent_gateway.store.engine import Store
from agent_gateway.store.queries.users import User
from agent_gateway.users import service as users_service

CONFIG_NAME = "gateway.toml"
KEY_NAME = "signing-key.pem"
MATRIX_TOKEN_NAME = "matrix-token"
NOSTR_KEY_NAME = "nostr-key"
WORKSPACE_NAME = "workspace"
INSTRUCTIONS_NAME = "instructions.md"

CONFIG_TEMPLATE = """\
# agent-gateway settings. Every key can be overridden by an environment variable:
# its dotted path in upper case joined by "_" after AGENT_GATEWAY_, for example
# AGENT_GATEWAY_DATABASE_URL or AGENT_GATEWAY_AUTH_SCRYPT_LOGN.
# Relative paths are relative to this file's folder.

[database]
# SQLite file (embedded, one process) or "postgresql://user@host:5432/db".
url = "sqlite:///gateway.db"

[public]
# The Public server, for Users' clients. "0.0.0.0:8700" serves the network.
listen = "127.0.0.1:8700"

[agent]
# The Agent server has NO authentication: keep it on loopback or a private network.
listen = "127.0.0.1:8701"

[ops]
# Health (/healthz), readiness (/readyz) and Prometheus metrics (/metrics); "" turns it off.
# A second gateway on this host needs three other ports: public, agent and this one.
listen = "127.0.0.1:8702"

[signing]
# The agent's signing identity: a PKCS#8 PEM private key (Ed25519, P-256, P-384, P-521).
key_file = "signing-key.pem"
# algorithm = "RS256"    # only for keys whose algorithm cannot be derived (RSA, ...)

[auth]
# Lifetime of every Token in milliseconds (required; here 30 days).
token_ttl_ms = 2592000000
# scrypt cost of new password digests; 2^15 x 8 x 1 is a 32 MiB derivation.
scrypt = { logN = 15, blockSize = 8, parallelism = 1 }

[scheduler]
# The timer re-checks due Schedules at least this often.
max_sleep_ms = 60000
# Whether the Agent server serves the /schedules routes.
agent_routes = true

[http]
# Largest request body either server accepts, in bytes.
max_body_bytes = 1048576

[log]
level = "INFO"
# "text", or "json": one JSON object per line, with an access log line per request.
format = "text"
# access = true          # the access log in text too (on by default in json)

[retention]
# Remove Signals that ended more than this long ago, with their Runs, once an hour.
# signals_max_age = "30d"
# Remove webhook deliveries delivered or dead more than this long ago, once an hour.
# deliveries_max_age = "7d"
"""

# The agent: the demo echo agent answers each Message, until you point it at your own.
RUNTIME_TEMPLATE = """
[runtime]
# The agent program: argv, no shell. It calls the Agent server at $AGENT_SERVER_URL.
command = [@PYTHON@, "-m", "agent_gateway.runtimes.echo"]
# "persistent": started once and handed one Run at a time as JSON lines on stdin/stdout
# (docs/agents/runtimes.md). "per-run": started for each Run, with the Prompt on stdin and
# {session}, {run_id} and {signal_id} in an argument replaced per Run.
mode = "persistent"
# Its working directory (the Workspace), created when missing.
workdir = "workspace"
# Confinement: "auto" runs the agent in a bubblewrap sandbox (its Workspace and the Agent
# server, nothing else) when bwrap works; where it cannot, only this echo demo runs (with a
# warning) and any other agent is refused: install bubblewrap, or set "none" to run it
# unconfined on purpose. "bubblewrap" requires it. `agent-gateway doctor` says which applies.
# sandbox = "auto"
# For an agent that calls an LLM API: the hosts it may reach (through the gateway's proxy)
# and the variables of the gateway's environment it gets (an API key, say).
# allow_hosts = ["api.openai.com:443"]
# env_pass = ["OPENAI_API_KEY"]

# One table per Signal kind: a Jinja2 template over the Signal's payload makes the
# Prompt; "session" names the Session it continues (omit it for a fresh one per Run).
[handlers."message.received"]
template = "A message from user {{ userId }}:\\n\\n{{ text }}"
session = "user_{{ userId }}"
"""


# The reference LLM agent (init --agent llm): its runtime, and Handlers for Messages and Schedule fires.
# A fire whose data names a userId continues that User's Session (the agent set it for them).
LLM_RUNTIME_TEMPLATE = """
[runtime]
# The reference LLM agent (pip install -e '.[llm]' in a clone); its options are listed by
# python -m agent_gateway.agent.llm --help. It calls the Agent server's MCP tools at $AGENT_SERVER_URL/mcp.
command = {command}
mode = "persistent"
# Its Workspace: instructions.md (read at each Run: edit it to tell the agent who it is) and
# sessions/ (each Session's memory).
workdir = "workspace"
{confinement}
[handlers."message.received"]
template = "A message from user {{{{ userId }}}}:\\n\\n{{{{ text }}}}"
session = "user_{{{{ userId }}}}"

[handlers."service_schedule_fired"]
template = "The Schedule {{{{ scheduleName }}}} fired (arranged for {{{{ scheduledFor }}}}). Its data: {{{{ data | tojson }}}}"
session = "{{{{ 'user_' ~ data.userId if data is mapping and data.userId is defined else 'schedule_' ~ scheduleName }}}}"
"""

INSTRUCTIONS = """\
You are the shared agent of this gateway: one assistant serving several people (Users).
Edit this file to say who you are and what you may decide; it is read at every Run.

How you work:
- Each request starts with "A message from user <id>:". Answer that User by calling
  send_message with userId set to that id. Your final text reply is not shown to anyone:
  only send_message reaches a User. Never tell one User what another User wrote.
- publish_decision publishes a Decision: numbered, signed and public for good. Publish one
  only when asked to decide something and you are sure; tell the User its number.
- sign_statement signs a Statement without publishing or storing it.
- To remind a User later, call put_schedule with a unique name, spec
  {"kind": "once", "at": "<ISO 8601 instant>"} and data {"userId": "<their id>", "note": "..."}.
  When it fires you are told so with its data: then send the User their reminder.
- If a tool answers an error, read it, fix the call and try again, or tell the User.
"""


def write(
    directory: Path, agent: LLMAgent | None = None, matrix: MatrixAccount | None = None,
    nostr: NostrAccount | None = None,
) -> list[Path]:
    """Create ``directory`` with a config and a fresh Ed25519 key; refuse to overwrite either.

    The config runs the demo echo agent, or the reference LLM agent ``agent`` with an
    instructions file in its Workspace; with ``matrix``, it serves the Matrix channel on that
    account, whose access token goes to a file of its own (mode 0600); with ``nostr``, the Nostr
    channel on those relays, with a fresh secret key in a file of its own (mode 0600)."""
    directory.mkdir(parents=True, exist_ok=True)
    config, key = directory / CONFIG_NAME, directory / KEY_NAME
    instructions = directory / WORKSPACE_NAME / INSTRUCTIONS_NAME
    written = [config, key] if agent is None else [config, key, instructions]
    if matrix is not None:
        written.append(directory / MATRIX_TOKEN_NAME)
    if nostr is not None:
        written.append(directory / NOSTR_KEY_NAME)
    for path in written:
        if path.exists():
            raise FileExistsError(0, "exists", str(path))
    keys.write_private(key, keys.generate_pem("ed25519"))
    runtime = RUNTIME_TEMPLATE.replace("@PYTHON@", json.dumps(sys.executable)) if agent is None else agent.runtime()
    if matrix is not None:
        keys.write_private(directory / MATRIX_TOKEN_NAME, matrix.token.encode() + b"\n")
        runtime += matrix.table()
    if nostr is not None:
        keys.write_private(directory / NOSTR_KEY_NAME, nostr.secret_key.encode() + b"\n")
        runtime += nostr.table()
    with open(config, "x", encoding="utf-8") as file:
        file.write(CONFIG_TEMPLATE + runtime)
    if agent is not None:
        instructions.parent.mkdir(exist_ok=True)
        instructions.write_text(INSTRUCTIONS, encoding="utf-8")
    return written


@dataclasses.dataclass(frozen=True)
class MatrixAccount:
    """``init --matrix-homeserver --matrix-user``: the agent's Matrix account and its access token."""

    homeserver: str
    user_id: str
    token: str = dataclasses.field(repr=False)

    def __post_init__(self) -> None:
        for option, parse, value in (
            ("--matrix-homeserver", config_parsers.homeserver_url, self.homeserver),
            ("--matrix-user", config_parsers.matrix_user_id, self.user_id),
        ):
            try:
                parse(value)
            except ValueError as exc:
                raise ValueError(f"{option} {exc}") from None
        if not self.token or any(c.isspace() for c in self.token):
            raise ValueError("the Matrix access token must be one word (no spaces), and not empty")

    def table(self) -> str:
        return (
            "\n[channels.matrix]\n"
            "# People talk to the agent from Matrix (see the docs' Chat channels page).\n"
            f"homeserver = {json.dumps(config_parsers.homeserver_url(self.homeserver))}\n"
            f"user_id = {json.dumps(self.user_id)}\n"
            f'access_token_file = "{MATRIX_TOKEN_NAME}"\n'
            '# pairing (a stranger gets a code for you to approve), allowlist or open.\n'
            'policy = "pairing"\n'
        )


@dataclasses.dataclass(frozen=True)
class NostrAccount:
    """``init --nostr-relay``: the relays of the Nostr channel and the agent's new key (nostr-sdk's)."""

    relays: tuple[str, ...]
    secret_key: str = dataclasses.field(repr=False)
    npub: str

    @classmethod
    def new(cls, relays: tuple[str, ...]) -> NostrAccount:
        """A fresh key for ``relays``; raises ValueError naming a bad relay URL."""
        try:
            config_parsers.nostr_relays(list(relays))
        except ValueError as exc:
            raise ValueError(f"--nostr-relay: {exc}") from None
        if importlib.util.find_spec("nostr_sdk") is None:
            raise ValueError("--nostr-relay needs the nostr extra: pip install 'agent-gateway[nostr]'")
        from agent_gateway.channels import nostr  # nostr-sdk is an optional extra

        secret, npub = nostr.new_key()
        return cls(relays, secret, npub)

    def table(self) -> str:
        return (
            "\n[channels.nostr]\n"
            "# People talk to the agent in Nostr direct messages (see the docs' Chat channels page).\n"
            f"relays = {json.dumps(list(self.relays))}\n"
            f'key_file = "{NOSTR_KEY_NAME}"  # the agent\'s secret key: keep it to yourself\n'
            '# pairing (a stranger gets a code for you to approve), allowlist or open.\n'
            'policy = "pairing"\n'
        )


@dataclasses.dataclass(frozen=True)
class LLMAgent:
    """``init --agent llm``: the reference LLM agent on ``model``, and what it must reach and be given."""

    model: str
    base_url: str | None = None
    api_key_env: str | None = None

    def __post_init__(self) -> None:
        providers.parse_model(self.model, self.base_url)  # ValueError: the CLI's one line
        if self.base_url is not None:
            providers.endpoints("openai", self.base_url)
        if self.api_key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env):
            raise ValueError(f"--api-key-env must be an environment variable's name (got {self.api_key_env!r})")

    @property
    def provider(self) -> str:
        return providers.parse_model(self.model, self.base_url)[0]

    @property
    def key_env(self) -> str | None:
        return providers.key_env(self.provider, self.api_key_env)

    def command(self) -> list[str]:
        argv = [sys.executable, "-m", "agent_gateway.agent.llm", "--model", self.model]
        if self.base_url is not None:
            argv += ["--base-url", self.base_url]
        if self.key_env is not None:
            argv += ["--api-key-env", self.key_env]
        return argv + ["--instructions", INSTRUCTIONS_NAME]

    def passed_env(self) -> list[str]:
        """The variables the agent is given: its API key's (the value never leaves the environment)."""
        names = [self.key_env] if self.key_env is not None else []
        return names + ([providers.FUNCTION_MODELS_ENV] if self.provider == providers.FUNCTION else [])

    def runtime(self) -> str:
        return LLM_RUNTIME_TEMPLATE.format(
            command=json.dumps(self.command()),
            confinement=confinement(providers.endpoints(self.provider, self.base_url), self.passed_env()),
        )


def confinement(allow_hosts: list[str], env_pass: list[str]) -> str:
    """The runtime settings that let the confined agent reach the model and have its key."""
    return (
        "# Confinement: the hosts the agent may reach (the model's), the variables it is given (the\n"
        "# API key's: its value stays in the environment of serve, never in this file).\n"
        f"allow_hosts = {json.dumps(allow_hosts)}\n"
        f"env_pass = {json.dumps(env_pass)}\n"
    )


DEMO_USER_NAME = "demo-user.json"


async def admit_demo_user(store: Store, cost: ScryptCost) -> tuple[User, str]:
    """Admit a User with a fresh random password, for trying a new deployment out."""
    password = secrets.token_urlsafe(12)
    async with store.transaction() as conn:
        user = await users_service.admit(conn)
        await auth_service.set_password(conn, user.id, password, cost=cost)
    return user, password


def write_demo_user(directory: Path, user: User, password: str) -> Path:
    """Keep the demo User's credentials beside the config, readable by the owner only."""
    path = directory / DEMO_USER_NAME
    keys.write_private(path, json.dumps({"user": user.id, "password": password}, indent=2).encode() + b"\n")
    return path
