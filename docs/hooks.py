"""MkDocs hooks: the reference pages' generated parts, made at build time from the code itself.

A reference page holds a marker comment, ``<!-- generated: NAME -->``, which ``on_page_markdown``
replaces with Markdown made from the running code, so the page cannot drift from it:

- ``settings``: every setting, from ``agent_gateway.config._KEYS`` (its ``default=`` and ``doc=``);
- ``cli``: every command of ``agent-gateway``, walked recursively from the Typer app itself;
- ``openapi public`` / ``openapi agent``: each server's ``/openapi.json``, from the two FastAPI
  apps built in process (as the tests build them), rendered as Markdown that search indexes.

An unknown marker fails the build. Nothing here reaches the network.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import typer

from agent_gateway import config
from agent_gateway.cli.main import app as cli_app
from agent_gateway.gateway import Gateway
from agent_gateway.signatures import keys

MARKER = re.compile(r"<!-- generated: ([a-z ]+) -->")
# FastAPI lists a 422 on every route; the servers never send one (a refusal is a 400).
UNSENT_STATUSES = {"422"}
UNSENT_SCHEMAS = {"HTTPValidationError", "ValidationError"}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    depth = page.file.src_uri.count("/")

    def generate(match: re.Match[str]) -> str:
        name = match[1].strip()
        if name == "settings":
            return settings_table(depth)
        if name == "cli":
            return "\n".join(cli_sections())
        if name.startswith("openapi "):
            return "\n".join(openapi_sections(openapi(name.removeprefix("openapi "))))
        raise ValueError(f"{page.file.src_uri}: unknown generated part {name!r}")

    return MARKER.sub(generate, markdown)


def cell(text: str) -> str:
    """Text that fits in one Markdown table cell: a pipe is escaped, except in a code span,
    where Python-Markdown's tables keep it (and would show the backslash)."""
    parts = re.split(r"(`+[^`]*`+)", " ".join(text.split()))
    return "".join(part if part.startswith("`") else part.replace("|", "\\|") for part in parts)


# -- settings ----------------------------------------------------------------------------------


def site_links(text: str, depth: int) -> str:
    """The settings' texts link to pages from the site's root (``/operate/logs.md``); make those
    links relative to the page that shows them, which is how MkDocs checks and rewrites links."""
    return re.sub(r"\]\(/", "](" + "../" * depth, text)


def settings_table(depth: int) -> str:
    rows = ["| key | environment variable | default | meaning |", "|---|---|---|---|"]
    for key in config._KEYS:
        rows.append(
            f"| `{key.dotted}` | `{key.env}` | {cell(key.default)} | {cell(site_links(key.doc, depth))} |"
        )
    return "\n".join(rows)


# -- the command line --------------------------------------------------------------------------


def cli_sections() -> Iterator[str]:
    root = typer.main.get_command(cli_app)
    yield from command_sections(root, root.context_class(root, info_name="agent-gateway"))


def command_sections(command: Any, ctx: Any) -> Iterator[str]:
    if getattr(command, "hidden", False):
        return
    if ctx.parent is not None:  # the root's own help opens the page
        yield f"## `{ctx.command_path}`\n"
        if command.help:
            yield cli_help(command.help) + "\n"
    yield f"```\n{ctx.command_path} {' '.join(command.collect_usage_pieces(ctx))}\n```\n"
    records = [param.get_help_record(ctx) for param in command.params if not getattr(param, "hidden", False)]
    records = [record for record in records if record is not None]
    if records:
        yield "| argument or option | meaning |\n|---|---|"
        yield from (f"| {cell(f'`{names}`')} | {cell(meaning)} |" for names, meaning in records)
        yield ""
    subcommands = getattr(command, "list_commands", None)
    if subcommands is None:
        return
    names = subcommands(ctx)
    children = [(name, command.get_command(ctx, name)) for name in names]
    if ctx.parent is not None:
        yield "Commands: " + ", ".join(f"`{name}`" for name, _ in children) + ".\n"
    for name, child in children:
        yield from command_sections(child, child.context_class(child, info_name=name, parent=ctx))


def cli_help(text: str) -> str:
    """A docstring's paragraphs, without Click's ``\\b`` no-rewrap markers."""
    return "\n".join(line for line in text.splitlines() if line.strip() != "\b").strip()


# -- the HTTP APIs -----------------------------------------------------------------------------


@cache
def openapi(server: str) -> dict[str, Any]:
    """The server's ``/openapi.json``, from its FastAPI app built in process on throwaway settings
    (a fresh key, an SQLite URL that is never opened)."""
    if server not in ("public", "agent"):
        raise ValueError(f"no server {server!r}: public or agent")
    with tempfile.TemporaryDirectory() as folder:
        key_file = Path(folder) / "signing-key.pem"
        keys.write_private(key_file, keys.generate_pem("ed25519"))
        settings = config.Settings(
            token_ttl_ms=3_600_000, database_url=f"sqlite:///{folder}/unused.db", signing_key_file=key_file
        )
        gateway = Gateway(settings)
        try:
            return (gateway.public_app if server == "public" else gateway.agent_app).openapi()
        finally:
            asyncio.run(gateway.store.close())


METHODS = ("get", "put", "post", "delete", "patch")


def openapi_sections(spec: dict[str, Any]) -> Iterator[str]:
    schemas = spec.get("components", {}).get("schemas", {})
    info = spec["info"]
    yield f"{info.get('description', '')}\n"
    yield "| route | what it does |\n|---|---|"
    for path, method, operation in operations(spec):
        yield f"| [`{method.upper()} {path}`](#{anchor(method, path)}) | {cell(operation.get('summary', ''))} |"
    yield ""
    for path, method, operation in operations(spec):
        yield f"## `{method.upper()} {path}` {{#{anchor(method, path)}}}\n"
        if operation.get("summary"):
            yield operation["summary"] + ".\n"
        if operation.get("description"):
            yield operation["description"] + "\n"
        parameters = operation.get("parameters", [])
        if parameters:
            yield "| parameter | in | required | meaning |\n|---|---|---|---|"
            for parameter in parameters:
                yield (
                    f"| `{parameter['name']}` | {parameter['in']} | {'yes' if parameter.get('required') else 'no'} "
                    f"| {cell(parameter.get('description', ''))} |"
                )
            yield ""
        body = operation.get("requestBody")
        if body:
            for media, content in body.get("content", {}).items():
                yield f"Request body (`{media}`): {type_name(content.get('schema', {}), schemas)}.\n"
        yield "| status | meaning | body |\n|---|---|---|"
        for status, response in operation.get("responses", {}).items():
            if status in UNSENT_STATUSES:
                continue
            content = response.get("content", {})
            shapes = ", ".join(
                f"`{media}` {type_name(item.get('schema', {}), schemas)}" for media, item in content.items()
            )
            yield f"| {status} | {cell(response.get('description', ''))} | {cell(shapes) or '—'} |"
        yield ""
    yield "## Schemas\n"
    for name, schema in sorted(schemas.items()):
        if name in UNSENT_SCHEMAS:
            continue
        yield f"### {name} {{#schema-{name.lower()}}}\n"
        if schema.get("description"):
            yield cell(schema["description"]) + "\n"
        properties = schema.get("properties", {})
        if properties:
            required = set(schema.get("required", []))
            yield "| field | type | required | meaning |\n|---|---|---|---|"
            for field, spec_ in properties.items():
                yield (
                    f"| `{field}` | {cell(type_name(spec_, schemas))} | {'yes' if field in required else 'no'} "
                    f"| {cell(spec_.get('description', ''))} |"
                )
            yield ""
        else:
            yield f"Type: {type_name(schema, schemas)}.\n"


def operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in spec["paths"].items():
        for method in METHODS:
            if method in item:
                yield path, method, item[method]


def anchor(method: str, path: str) -> str:
    return method + "-" + (re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-") or "root")


def type_name(schema: dict[str, Any], schemas: dict[str, Any]) -> str:
    """A JSON Schema as a short readable type: ``string``, ``array of Decision``, a link to a schema."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#schema-{name.lower()})"
    for union in ("anyOf", "oneOf"):
        if union in schema:
            return " or ".join(type_name(part, schemas) for part in schema[union])
    kind = schema.get("type")
    if kind == "array":
        return "array of " + type_name(schema.get("items", {}), schemas)
    if "enum" in schema:
        return " or ".join(f"`{json.dumps(value)}`" for value in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if kind is None:
        return "any JSON"
    return str(kind)

