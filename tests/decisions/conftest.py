# The Public reads of the log use the same stand-in authentication scheme as /verify.
from tests.signatures.conftest import bearer  # noqa: F401
