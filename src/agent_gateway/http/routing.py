"""The route class every router of both servers uses.

``StrictRoute`` applies, before any handler runs, the spec's cross-cutting
rules: a query parameter the route does not declare is 400 (routes that
declare none refuse every one), a parameter given twice is 400, and a body is
JSON only (415 otherwise), parsed strictly (malformed JSON, invalid UTF-8, NaN
or a lone surrogate is 400). Handlers then see validated values only.
"""

from __future__ import annotations

import email.message
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.dependencies.utils import get_flat_params
from fastapi.params import Query
from fastapi.routing import APIRoute
from starlette.responses import Response

from agent_gateway import errors, jsontext
from agent_gateway.http.errors import ErrorBody

INT32_MAX = 2**31 - 1
_CANONICAL_INT = re.compile(r"0|[1-9][0-9]{0,9}")


def json_response(content: Any, status_code: int = 200) -> Response:
    return Response(jsontext.dumps(content), status_code, media_type="application/json")


def no_content() -> Response:
    return Response(status_code=204)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI declarations of the error answers a route can give."""
    return {status: {"model": ErrorBody} for status in statuses}


def parse_int(name: str, value: str | None, minimum: int, maximum: int) -> int | None:
    """A query or path integer in canonical decimal (no sign, spaces or leading zeros)."""
    if value is None:
        return None
    if not _CANONICAL_INT.fullmatch(value) or not minimum <= int(value) <= maximum:
        raise errors.InvalidInput(f"{name} must be an integer from {minimum} to {maximum}")
    return int(value)


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    if content_type == "application/json":
        return True  # what nearly every client sends; the full parse below costs ~15 us a request
    header = email.message.Message()
    header["content-type"] = content_type
    subtype = header.get_content_subtype()
    if header.get_content_maintype() != "application" or not (subtype == "json" or subtype.endswith("+json")):
        return False
    # JSON is UTF-8 (RFC 8259 §8.1); a body declared in another charset would be misread.
    charset = header.get_param("charset")
    return charset is None or (isinstance(charset, str) and charset.lower() in ("utf-8", "utf8"))


async def _parse_body(request: Request) -> None:
    body = await request.body()
    if not body:
        return  # the model's validation answers "Field required"
    if not _is_json(request.headers.get("content-type")):
        raise errors.UnsupportedMediaType()
    try:
        # jsontext (orjson) refuses invalid UTF-8, lone surrogates, NaN and Infinity, which
        # the standard library would let through to the database.
        request._json = jsontext.loads(body)
    except ValueError as exc:
        raise errors.InvalidInput(f"malformed JSON body: {exc}") from None


class StrictRoute(APIRoute):
    """An APIRoute that refuses undeclared query parameters and non-JSON bodies."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        declared = {400: {"model": ErrorBody, "description": "Invalid input"}}
        kwargs["responses"] = {**declared, **(kwargs.get("responses") or {})}
        super().__init__(path, endpoint, **kwargs)
        if self.body_field is not None:
            self.responses.setdefault(413, {"model": ErrorBody, "description": "Body too large"})
            self.responses.setdefault(415, {"model": ErrorBody, "description": "Body is not JSON"})

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        allowed = frozenset(
            field.alias for field in get_flat_params(self.dependant) if isinstance(field.field_info, Query)
        )
        has_body = self.body_field is not None

        async def strict_handler(request: Request) -> Response:
            if request.scope.get("query_string"):
                check_query(request, allowed)
            if has_body:
                await _parse_body(request)
            return await handler(request)

        return strict_handler


def check_query(request: Request, allowed: frozenset[str]) -> None:
    seen: set[str] = set()
    for name, _ in request.query_params.multi_items():
        if name not in allowed:
            if not allowed:
                raise errors.InvalidInput(f"this route takes no query parameters (got {name!r})")
            raise errors.InvalidInput(f"unknown query parameter {name!r}")
        if name in seen:
            raise errors.InvalidInput(f"query parameter {name!r} given more than once")
        seen.add(name)
