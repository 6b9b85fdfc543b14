# The Public routes use the same stand-in authentication scheme as /verify.
from tests.signatures.conftest import bearer  # noqa: F401
