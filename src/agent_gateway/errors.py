"""The gateway's errors. Services raise these; ``http/errors.py`` maps each class to a status once."""


class GatewayError(Exception):
    """Something the gateway refuses to do."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.__doc__ or self.__class__.__name__)

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
