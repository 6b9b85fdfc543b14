"""The gateway's errors: :class:`GatewayError`, the root every area's errors derive from, and those with a status.

Services raise these; ``http/errors.py`` maps each class to a status once (a
route's error without one is a 500 that says its message).
"""


class GatewayError(Exception):
    """Something the gateway refuses to do."""

    def __init__(self, message: str | None = None) -> None:
        # An empty message is kept: a Run's error is the agent's text, whatever it is.
        super().__init__((self.__doc__ or self.__class__.__name__) if message is None else message)

    @property
    def message(self) -> str:
        return str(self.args[0])


class InvalidInput(GatewayError):
    """The request is not valid."""


class AuthenticationFailed(GatewayError):
    """authentication failed"""

    # One undifferentiated failure (spec: Authentication): every cause, from
    # every scheme, is this class with this message.


class NotFound(GatewayError):
    """No such record."""


class PayloadTooLarge(GatewayError):
    """The request body is larger than this server accepts."""


class Busy(GatewayError):
    """Not recorded: a concurrent write won the race; sending the request again is correct."""


class UnsupportedMediaType(GatewayError):
    """The request body must be JSON (Content-Type: application/json)."""
