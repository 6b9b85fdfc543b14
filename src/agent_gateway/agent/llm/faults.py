"""A failed Run's ``error``: one line saying what went wrong, never a secret.

The provider's error body is left out on purpose: it may quote the request, or
part of the API key ("Incorrect API key provided: sk-…"). The line names the
category, the HTTP status and what to do; any secret value that still slips in
is masked.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic_ai import exceptions

# Longest error line: the Run's error is for an operator's eyes, not a dump.
MAX_CHARS = 500
MASK = "[secret]"


class RunError(Exception):
    """A Run failed for a reason already described in one line."""


def describe(exc: BaseException, *, model: str, secrets: Iterable[str] = ()) -> str:
    """The one line a Run fails with for ``exc``, raised while ``model`` answered it."""
    return _masked(" ".join(_reason(exc, model).split()), secrets)[:MAX_CHARS]


def _reason(exc: BaseException, model: str) -> str:
    status = getattr(exc, "status_code", None)
    http = f" (HTTP {status})" if status is not None else ""
    match exc:
        case exceptions.UsageLimitExceeded():
            return f"stopped at a limit of the agent: {_first_sentence(exc.message)}"
        case exceptions.ModelAuthenticationError():
            return f"model {model}: the provider refused the API key{http}; check the key the agent is given"
        case exceptions.ModelRateLimitError():
            return f"model {model}: the provider is rate limiting{http}, still after retries; a later Run may pass"
        case exceptions.ModelQuotaExceededError():
            return f"model {model}: the provider says the account's quota or credit is used up{http}"
        case exceptions.ModelTimeoutError() | exceptions.ModelRequestTimeout():
            return f"model {model}: the provider did not answer in time, after retries"
        case exceptions.ModelConnectionError():
            return f"model {model}: the provider could not be reached ({type(exc.__cause__).__name__})"
        case exceptions.ModelUnavailableError() | exceptions.ModelServerError():
            return f"model {model}: the provider failed{http}, still after retries; a later Run may pass"
        case exceptions.ModelNotFoundError():
            return f"model {model}: the provider does not know this model{http}"
        case exceptions.ModelAPIError():
            return f"model {model}: the provider refused the request{http}: {type(exc).__name__}"
        case exceptions.UnexpectedModelBehavior():
            return f"model {model}: unexpected answer: {_first_sentence(exc.message)}"
        case RunError():
            return str(exc)
        case BaseExceptionGroup():
            return _reason(exc.exceptions[0], model)
    return f"{type(exc).__name__}: {exc}"


def _first_sentence(text: str) -> str:
    """The message without pydantic-ai's advice to its programmer ("Consider raising the limit, ...")."""
    return text.split(". ")[0].rstrip(".")


def _masked(line: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            line = line.replace(secret, MASK)
    return line
