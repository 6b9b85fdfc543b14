"""The one error a runtime raises: its own module, so that the runtimes and ``runtime.py``,
which builds them, import it without importing each other."""


class RunFailed(Exception):
    """The Run failed; the message is the Run's ``error``."""

    @property
    def message(self) -> str:
        return str(self.args[0])
