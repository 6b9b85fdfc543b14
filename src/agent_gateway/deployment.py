"""``agent-gateway init``: a new deployment folder that serves as written."""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

from agent_gateway.auth import service as auth_service
from agent_gateway.config import ScryptCost
from agent_gateway.signatures import keys
from agent_gateway.store.engine import Store
from agent_gateway.store.users import User
from agent_gateway.users import service as users_service

CONFIG_NAME = "gateway.toml"
KEY_NAME = "signing-key.pem"

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

[ops]
# Health (/healthz), readiness (/readyz) and Prometheus metrics (/metrics); "" turns it off.
listen = "127.0.0.1:8702"

[retention]
# Remove Signals that ended more than this long ago, with their Runs, once an hour.
# signals_max_age = "30d"
"""

# The agent: the demo echo agent answers each Message, until you point it at your own.
RUNTIME_TEMPLATE = """
[runtime]
# The agent program: argv, no shell. It calls the Agent server at $AGENT_SERVER_URL.
command = [@PYTHON@, "-m", "agent_gateway.runtimes.echo"]
# "persistent": started once and handed one Run at a time as JSON lines on stdin/stdout
# (see the README). "per-run": started for each Run, with the Prompt on stdin and
# {session}, {run_id} and {signal_id} in an argument replaced per Run.
mode = "persistent"
# Its working directory (the Workspace), created when missing.
workdir = "workspace"
# Confinement: "auto" runs the agent in a bubblewrap sandbox (its Workspace and the Agent
# server, nothing else) when bwrap works, and warns otherwise; "bubblewrap" requires it.
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


def write(directory: Path) -> list[Path]:
    """Create ``directory`` with a config and a fresh Ed25519 key; refuse to overwrite either."""
    directory.mkdir(parents=True, exist_ok=True)
    config, key = directory / CONFIG_NAME, directory / KEY_NAME
    for path in (config, key):
        if path.exists():
            raise FileExistsError(0, "exists", str(path))
    keys.write_private(key, keys.generate_pem("ed25519"))
    with open(config, "x", encoding="utf-8") as file:
        file.write(CONFIG_TEMPLATE + RUNTIME_TEMPLATE.replace("@PYTHON@", json.dumps(sys.executable)))
    return [config, key]


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
