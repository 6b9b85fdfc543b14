"""``agent-gateway keys``: signing keys."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer

from agent_gateway.cli.common import ConfigOption, fail, load_settings, print_json
from agent_gateway.signatures import keys
from agent_gateway.signatures.identity import SigningIdentity, SigningKeyError
from agent_gateway.transparency import service as transparency

app = typer.Typer(help="Signing keys.", no_args_is_help=True)

# Typer offers choices through an Enum; this one is built from the key types keys.py generates.
KeyType = enum.Enum("KeyType", [(name, name) for name in keys.KEY_TYPES], type=str)  # type: ignore[misc]


@app.command()
def generate(
    out: Annotated[Path, typer.Argument(help="file to write; never overwritten")],
    key_type: Annotated[KeyType, typer.Option("--type", help="key type")] = KeyType["ed25519"],  # type: ignore[valid-type]
) -> None:
    """Write a new private key as PKCS#8 PEM, readable by its owner only (mode 0600)."""
    try:
        keys.write_private(out, keys.generate_pem(key_type.value))
    except FileExistsError:
        raise fail(f"{out} exists; keys generate never overwrites") from None
    except OSError as exc:
        raise fail(f"cannot write {out}: {exc.strerror}") from None
    typer.echo(f"wrote {out}")


@app.command()
def show(config_path: ConfigOption = None) -> None:
    """Print the deployment's public key: {origin, vkey, ledger: {origin, vkey}, jwks}. ``vkey`` is the
    C2SP signed-note verifier key of the Decision log's checkpoints, ``ledger`` the Run ledger's
    origin and vkey: for verifiers and witnesses to configure (a witness needs both logs)."""
    settings = load_settings(config_path)
    try:
        identity = SigningIdentity.from_settings(settings)
    except SigningKeyError as exc:
        raise fail(str(exc)) from None
    signer, ledger = transparency.signer(settings, identity), transparency.ledger_signer(settings, identity)
    print_json({
        "origin": signer.origin, "vkey": signer.key.vkey(),
        "ledger": {"origin": ledger.origin, "vkey": ledger.key.vkey()}, "jwks": identity.jwks(),
    })
