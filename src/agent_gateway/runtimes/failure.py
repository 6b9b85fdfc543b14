"""The one error a runtime raises: its own module, so that the runtimes and ``runtime.py``,
which builds them, import it without importing each other."""

from agent_gateway import errors


class RunFailed(errors.GatewayError):
    """The Run failed; the message is the Run's ``error``.

    ``logged`` is what the operator's log says of it: the message's first line,
    unless the message holds the agent's own text (its ``failed`` answer, its
    stderr), which may quote a User's Message and so is never logged: then the
    gateway's own words for it.
    """

    def __init__(self, message: str, *, logged: str | None = None) -> None:
        super().__init__(message)
        self.logged = message.split("\n", 1)[0] if logged is None else logged
