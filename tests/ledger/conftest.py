# The Public routes use the same stand-in authentication scheme as /verify.
from tests.signatures.conftest import bearer  # noqa: F401
from tests.signals.conftest import agent_program, make_gateway  # noqa: F401
