"""``agent-gateway sign`` (operator-side, with the deployment's key) and ``verify`` (offline, anyone)."""

from __future__ import annotations

from typing import Annotated

import typer

from agent_gateway import errors
from agent_gateway.cli.common import ConfigOption, fail, load_settings, parse_json, print_json
from agent_gateway.signatures import service, verifier
from agent_gateway.signatures.identity import AlgorithmMismatch, SigningIdentity


def sign(
    claims: Annotated[str, typer.Argument(help='a JSON object with a "statement" member, or "-" to read it from stdin')],
    typ: Annotated[str, typer.Option(help="the protected header's typ, 1..128 characters")] = service.STATEMENT_TYP,
    config_path: ConfigOption = None,
) -> None:
    """Sign claims with the deployment's key and print {"jws": ...}; no database, nothing stored.

    The payload is the claims' JSON with members in the order written.
    """
    value = parse_json(claims, "claims")
    settings = load_settings(config_path)
    try:
        token = service.sign_claims(SigningIdentity.from_settings(settings), value, typ)
    except (errors.GatewayError, AlgorithmMismatch) as exc:
        raise fail(str(exc)) from None
    print_json({"jws": token})


def verify(
    jws: Annotated[str, typer.Argument(help='the compact JWS, or "-" to read it from stdin')],
    jwks: Annotated[str, typer.Option("--jwks", help="the JWK Set: a file or an http(s) URL such as .../jwks.json")],
) -> None:
    """Check an artifact against a JWK Set, offline; print {verified, header, payload}. Exit 1 when not verified."""
    if jws == "-":
        jws = typer.get_text_stream("stdin").read().strip()
    try:
        keys = verifier.load_jwk_set(jwks)
    except verifier.JwkSetError as exc:
        raise fail(str(exc)) from None
    verified = verifier.verify(jws, keys)
    if verified is None:
        print_json({"verified": False})
        raise typer.Exit(1)
    print_json({"verified": True, "header": verified.header, "payload": verified.payload})
