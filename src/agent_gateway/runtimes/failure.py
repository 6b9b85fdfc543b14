"""The one error a runtime raises: its own module, so that the runtimes and ``runtime.py``,
which builds them, import it without importing each other."""

from agent_gateway import errors


class RunFailed(errors.GatewayError):
    """The Run failed; the message is the Run's ``error``."""
