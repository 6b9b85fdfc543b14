"""The auditable log, on both servers (the Public server's behind the bearer, as the Decision reads):
GET /checkpoint, GET /checkpoint/witnessed, GET /checkpoint/consistency, GET /decisions/{seq}/proof."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Query, Request
from pydantic import BaseModel, Field
from starlette.responses import Response
from starlette.types import Scope

from agent_gateway import errors, jsontext, merkle
from agent_gateway.auth import schemes
from agent_gateway.http import params
from agent_gateway.http.app import router as new_router
from agent_gateway.http.fastpath import Answer
from agent_gateway.http.routing import INT32_MAX, error_responses, json_response, parse_int
from agent_gateway.store.engine import Store
from agent_gateway.transparency import proof, service

CHECKPOINT_MEDIA_TYPE = "text/plain; charset=utf-8"


class InclusionOut(BaseModel):
    index: int = Field(description="the Decision's leaf: its position in the log by seq, from 0")
    treeSize: int
    hashes: list[str] = Field(description="the RFC 9162 inclusion proof, base64")


class WitnessesOut(BaseModel):
    quorum: int = Field(description="cosignatures a checkpoint needs to be witnessed (0: no witnesses)")
    witnesses: list[str] = Field(description="each witness's cosignature/v1 verifier key (C2SP signed-note vkey)")


class ConsistencyOut(BaseModel):
    from_: int = Field(alias="from")
    to: int
    hashes: list[str] = Field(description="the RFC 9162 consistency proof, base64; empty when from = to")


FormatQuery = Annotated[
    str | None,
    Query(
        alias="format",
        description="`tlog-proof`: the offline proof in the witnessed checkpoint (c2sp.org/tlog-proof@v1), "
        "its extra the base64 of the Decision's JWS; 404 until a witnessed checkpoint holds the Decision",
    ),
]
SizeQuery = Annotated[str | None, Query(description="tree size (default: the current tree)")]
FromQuery = Annotated[str | None, Query(alias="from", description="the older tree size, at least 1")]
ToQuery = Annotated[str | None, Query(description="the newer tree size (default: the current tree)")]
Authenticated = Annotated[schemes.Authenticated, Depends(schemes.authenticated)]

agent = new_router()
public = new_router()

_CHECKPOINT = {
    200: {
        "content": {"text/plain": {"schema": {"type": "string"}}},
        "description": "A C2SP tlog-checkpoint signed as a C2SP signed note by the gateway's key",
    }
}
_CHECKPOINT_SUMMARY = "The signed checkpoint of the Decision log's Merkle tree"
# The witnessed checkpoint's answers, the Run ledger's too (ledger.routes).
WITNESSED = {
    200: {
        "content": {"text/plain": {"schema": {"type": "string"}}},
        "description": "The checkpoint as one C2SP signed note: the gateway's signature line and one "
        "C2SP tlog-cosignature line per witness that cosigned it",
    },
    **error_responses(404),
}
_WITNESSED_SUMMARY = "The newest checkpoint cosigned by a quorum of the witnesses"
_WITNESSES = {200: {"model": WitnessesOut}}
_WITNESSES_SUMMARY = "The witnesses whose cosignatures make a checkpoint witnessed, and their quorum"
_PROOF = {200: {"model": InclusionOut}, **error_responses(404)}
_PROOF_SUMMARY = "The inclusion proof of a Decision in the tree of a size"
_CONSISTENCY = {200: {"model": ConsistencyOut}}
_CONSISTENCY_SUMMARY = "The consistency proof between two sizes of the tree"


async def _checkpoint(request: Request) -> Response:
    return Response(await request.app.state.checkpoints.latest(), media_type=CHECKPOINT_MEDIA_TYPE)


async def _witnessed(request: Request) -> Response:
    _, signed = await request.app.state.witnessed.latest()
    return Response(signed, media_type=CHECKPOINT_MEDIA_TYPE)


def _witnesses(request: Request) -> Response:
    quorum, vkeys = request.app.state.witnessed.keys()
    return json_response({"quorum": quorum if vkeys else 0, "witnesses": vkeys})


def _proof_args(seq: str, size: str | None) -> tuple[int, int | None]:
    return params.seq_path(seq), parse_int("size", size, 1, INT32_MAX)


async def _proof_answer(request: Request, seq: str, size: str | None, format_: str | None) -> Any:
    if format_ is None:
        return json_response(await _proof(request.app.state.store, *_proof_args(seq, size)))
    if format_ != "tlog-proof":
        raise errors.InvalidInput("format must be tlog-proof")
    if size is not None:
        raise errors.InvalidInput("size cannot be given with format=tlog-proof: the proof is in the witnessed checkpoint")
    body = await service.tlog_proof(request.app.state.store, request.app.state.witnessed, params.seq_path(seq))
    return Response(body, media_type=proof.MEDIA_TYPE)


async def _proof(store: Store, seq: int, size: int | None) -> dict[str, Any]:
    proof = await service.inclusion(store, seq, size)
    return {"index": proof.index, "treeSize": proof.tree_size, "hashes": merkle.b64(proof.hashes)}


def consistency_args(from_: str | None, to: str | None) -> tuple[int | None, int | None]:
    return parse_int("from", from_, 1, INT32_MAX), parse_int("to", to, 1, INT32_MAX)


async def _consistency(store: Store, old: int | None, new: int | None) -> dict[str, Any]:
    new, hashes = await service.consistency(store, old, new)
    return {"from": old, "to": new, "hashes": merkle.b64(hashes)}


@agent.get("/checkpoint", response_class=Response, responses=_CHECKPOINT, summary=_CHECKPOINT_SUMMARY)
async def checkpoint_agent(request: Request) -> Any:
    return await _checkpoint(request)


@agent.get("/checkpoint/witnessed", response_class=Response, responses=WITNESSED, summary=_WITNESSED_SUMMARY)
async def witnessed_agent(request: Request) -> Any:
    return await _witnessed(request)


@agent.get("/checkpoint/witnesses", responses=_WITNESSES, summary=_WITNESSES_SUMMARY)
async def witnesses_agent(request: Request) -> Any:
    return _witnesses(request)


@agent.get("/checkpoint/consistency", responses=_CONSISTENCY, summary=_CONSISTENCY_SUMMARY)
async def consistency_agent(request: Request, from_: FromQuery = None, to: ToQuery = None) -> Any:
    return json_response(await _consistency(request.app.state.store, *consistency_args(from_, to)))


@agent.get("/decisions/{seq}/proof", responses=_PROOF, summary=_PROOF_SUMMARY)
async def proof_agent(request: Request, seq: str, size: SizeQuery = None, format_: FormatQuery = None) -> Any:
    return await _proof_answer(request, seq, size, format_)


@public.get(
    "/checkpoint", response_class=Response, responses={**_CHECKPOINT, **error_responses(401)}, summary=_CHECKPOINT_SUMMARY
)
async def checkpoint_public(request: Request, _: Authenticated) -> Any:
    return await _checkpoint(request)


@public.get(
    "/checkpoint/witnessed", response_class=Response, responses={**WITNESSED, **error_responses(401)},
    summary=_WITNESSED_SUMMARY,
)
async def witnessed_public(request: Request, _: Authenticated) -> Any:
    return await _witnessed(request)


@public.get("/checkpoint/witnesses", responses={**_WITNESSES, **error_responses(401)}, summary=_WITNESSES_SUMMARY)
async def witnesses_public(request: Request, _: Authenticated) -> Any:
    return _witnesses(request)


@public.get("/checkpoint/consistency", responses={**_CONSISTENCY, **error_responses(401)}, summary=_CONSISTENCY_SUMMARY)
async def consistency_public(request: Request, _: Authenticated, from_: FromQuery = None, to: ToQuery = None) -> Any:
    return json_response(await _consistency(request.app.state.store, *consistency_args(from_, to)))


@public.get("/decisions/{seq}/proof", responses={**_PROOF, **error_responses(401)}, summary=_PROOF_SUMMARY)
async def proof_public(
    request: Request, _: Authenticated, seq: str, size: SizeQuery = None, format_: FormatQuery = None
) -> Any:
    return await _proof_answer(request, seq, size, format_)


# --- The fast path (http.fastpath): the proofs an auditor asks for in bulk -----------
# On the Public server the caller is authenticated once the parameters are plainly valid
# and before anything is read, which is where the route's dependency refuses too.


async def _fast_proof(scope: Scope, query: dict[str, str], *, public: bool) -> Answer | None:
    if not query.keys() <= {"size"}:
        return None
    try:
        seq, size = _proof_args(scope["path_params"]["seq"], query.get("size"))
    except errors.InvalidInput:
        return None
    if public:
        await schemes.authenticated(Request(scope))
    return 200, jsontext.dumps(await _proof(scope["app"].state.store, seq, size))


async def _fast_consistency(scope: Scope, query: dict[str, str], *, public: bool) -> Answer | None:
    if not query.keys() <= {"from", "to"}:
        return None
    try:
        old, new = consistency_args(query.get("from"), query.get("to"))
    except errors.InvalidInput:
        return None
    if public:
        await schemes.authenticated(Request(scope))
    return 200, jsontext.dumps(await _consistency(scope["app"].state.store, old, new))


@agent.fast(proof_agent)
async def fast_proof_agent(scope: Scope, query: dict[str, str]) -> Answer | None:
    """``proof_agent`` on the fast path."""
    return await _fast_proof(scope, query, public=False)


@public.fast(proof_public)
async def fast_proof_public(scope: Scope, query: dict[str, str]) -> Answer | None:
    """``proof_public`` on the fast path."""
    return await _fast_proof(scope, query, public=True)


@agent.fast(consistency_agent)
async def fast_consistency_agent(scope: Scope, query: dict[str, str]) -> Answer | None:
    """``consistency_agent`` on the fast path."""
    return await _fast_consistency(scope, query, public=False)


@public.fast(consistency_public)
async def fast_consistency_public(scope: Scope, query: dict[str, str]) -> Answer | None:
    """``consistency_public`` on the fast path."""
    return await _fast_consistency(scope, query, public=True)
