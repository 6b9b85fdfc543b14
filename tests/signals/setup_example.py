"""A ``[signals] setup`` callable for the tests: what an operator's Python module looks like."""

from agent_gateway.signals.handlers import Prompt

NOT_CALLABLE = 3


class Greeting:
    def handle(self, signal):  # type: ignore[no-untyped-def]
        return [Prompt(f"greet {signal.payload['name']}", f"greet_{signal.payload['name']}")]


def setup(gateway) -> None:  # type: ignore[no-untyped-def]
    gateway.handlers.register("greeting", Greeting())
