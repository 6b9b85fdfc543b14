"""One shape for every error either server answers: ``{statusCode, error, message}``."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import iter_route_contexts
from pydantic import BaseModel
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import Match

from agent_gateway import errors
from agent_gateway.store.unavailable import UNAVAILABLE, database_unavailable

logger = logging.getLogger(__name__)

STATUS: dict[type[errors.GatewayError], int] = {
    errors.InvalidInput: 400,
    errors.AuthenticationFailed: 401,
    errors.NotFound: 404,
    errors.PayloadTooLarge: 413,
    errors.UnsupportedMediaType: 415,
    errors.Busy: 503,
}


class ErrorBody(BaseModel):
    statusCode: int
    error: str
    message: str


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    body = {"statusCode": status, "error": HTTPStatus(status).phrase, "message": message}
    return Response(orjson.dumps(body), status, headers=headers, media_type="application/json")


def status_of(exc: errors.GatewayError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def response_for(exc: Exception) -> Response:
    """The answer to an exception a route raised: what the handlers :func:`install` adds answer."""
    if isinstance(exc, errors.GatewayError):
        status = status_of(exc)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return error_response(status, exc.message, headers)
    if database_unavailable(exc):
        logger.warning("database unavailable: %s", type(exc).__name__, extra={"action": "database_unavailable"})
        return error_response(503, "the database is unavailable; nothing was recorded, retry")
    logger.error("internal error", exc_info=exc, extra={"action": "internal_error"})
    return error_response(500, "internal error")


async def _gateway_error(request: Request, exc: Exception) -> Response:
    return response_for(exc)


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    messages = {
        404: "no such route",
        405: f"method {request.method} is not allowed on this route",
    }
    message = messages.get(exc.status_code) or str(exc.detail)
    headers = exc.headers
    if exc.status_code == 405:
        headers = {**(headers or {}), "Allow": _allowed_methods(request)}
    return error_response(exc.status_code, message, headers)


def _allowed_methods(request: Request) -> str:
    # Starlette's Allow names only the first route that matched the path; GET
    # and POST on one path are two routes, and Allow must list them all (RFC 9110).
    methods: set[str] = set()
    for route in iter_route_contexts(request.app.routes):
        if route.methods and route.matches(request.scope)[0] is not Match.NONE:
            methods |= route.methods
    return ", ".join(sorted(methods))


def describe_validation(errors_: list[Any]) -> str:
    """One line for the first validation failure: ``body.text: String should have ...``."""
    if not errors_:
        return "invalid request"
    first = errors_[0]
    location = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or "body"
    if first.get("loc", ())[:1] == ("body",) and location != "body":
        location = "body." + location
    return f"{location}: {first.get('msg', 'invalid')}"


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return error_response(400, describe_validation(list(exc.errors())))




async def _database_error(request: Request, exc: Exception) -> Response:
    if not database_unavailable(exc):
        raise exc  # a bug: the 500 handler logs it
    return response_for(exc)


async def _unexpected(request: Request, exc: Exception) -> Response:
    # Starlette's ServerErrorMiddleware logs the traceback; the client learns nothing more.
    return error_response(500, "internal error")


def install(app: FastAPI) -> None:
    app.add_exception_handler(errors.GatewayError, _gateway_error)
    app.add_exception_handler(HTTPException, _http_exception)
    app.add_exception_handler(RequestValidationError, _validation_error)
    for unavailable in (sa_exc.DBAPIError, *UNAVAILABLE):
        app.add_exception_handler(unavailable, _database_error)
    app.add_exception_handler(Exception, _unexpected)
