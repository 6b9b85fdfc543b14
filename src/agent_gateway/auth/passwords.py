"""Password digests: scrypt, recording the cost each was written under (spec: Authentication 7).

A digest is one line of text in the PHC string style::

    $scrypt$ln=15,r=8,p=1$<salt>$<hash>

(salt and hash in unpadded base64). Verification reads the cost from the
digest, never from the settings, so raising the configured cost leaves every
old password working; nothing rehashes at login.

A derivation takes 65–200 ms of one core at the default cost, depending on
the core, so it runs in a thread pool (the derivation releases the GIL): logins never stall the
event loop, and as many derive at once as there are cores. It is
``cryptography``'s scrypt, whose OpenSSL derives the default cost in about
five sixths of the time of the system OpenSSL's under ``hashlib.scrypt``
(64 against 77 ms on an AMD EPYC core, the same bytes).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ctypes
import dataclasses
import hmac
import logging
import os
import re
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor

from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from agent_gateway import errors
from agent_gateway.config import ScryptCost, SettingsError

logger = logging.getLogger(__name__)

SALT_BYTES = 16
HASH_BYTES = 32
# Derivation threads run at a lower priority than the event loop, so a burst of
# logins takes the cores the loop does not need instead of queueing other requests.
DERIVATION_NICENESS = 10

# glibc's mallopt parameters (malloc.h), and the largest derivation whose memory is kept.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MAX_KEPT_DERIVATION_BYTES = 256 * 2**20

_DIGEST = re.compile(r"\$scrypt\$ln=([0-9]{1,2}),r=([0-9]{1,9}),p=([0-9]{1,9})\$([A-Za-z0-9+/]+)\$([A-Za-z0-9+/]+)")
# What a login for an unknown id, or for a User without a password, compares against.
_NO_DIGEST_SALT = bytes(SALT_BYTES)


@dataclasses.dataclass(frozen=True)
class Digest:
    """A parsed password digest."""

    cost: ScryptCost
    salt: bytes
    hash: bytes

    def __str__(self) -> str:
        return (
            f"$scrypt$ln={self.cost.log_n},r={self.cost.block_size},p={self.cost.parallelism}"
            f"${_b64(self.salt)}${_b64(self.hash)}"
        )

    @classmethod
    def parse(cls, text: str) -> Digest:
        """Read a stored digest; raise ValueError when it is not one this module wrote."""
        match = _DIGEST.fullmatch(text)
        if not match:
            raise ValueError("not a scrypt password digest")
        log_n, block_size, parallelism = (int(group) for group in match.group(1, 2, 3))
        try:
            salt, hash_ = (base64.b64decode(_pad(part), validate=True) for part in match.group(4, 5))
            cost = ScryptCost(log_n, block_size, parallelism)
        except (binascii.Error, SettingsError):
            raise ValueError("not a scrypt password digest") from None
        if len(hash_) != HASH_BYTES:
            raise ValueError("not a scrypt password digest")
        return cls(cost, salt, hash_)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode().rstrip("=")


def _pad(text: str) -> str:
    return text + "=" * (-len(text) % 4)


def _encode(password: str) -> bytes:
    try:
        return password.encode("utf-8")
    except UnicodeEncodeError:
        # Only a lone surrogate gets here; HTTP bodies cannot carry one (the JSON parser refuses it).
        raise errors.InvalidInput("the password is not valid Unicode text") from None


def _derive(password: bytes, salt: bytes, cost: ScryptCost) -> bytes:
    kdf = Scrypt(salt=salt, length=HASH_BYTES, n=2**cost.log_n, r=cost.block_size, p=cost.parallelism)
    return kdf.derive(password)


def _lower_priority() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), DERIVATION_NICENESS)
    except (AttributeError, OSError):  # not Linux: threads share the process's priority
        pass


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _new_pool() -> ThreadPoolExecutor:
    # Each derivation holds its memory (32 MiB at the default cost) while it runs:
    # one thread per core keeps every core busy and bounds that memory.
    return ThreadPoolExecutor(max_workers=_cores(), thread_name_prefix="scrypt", initializer=_lower_priority)


_pool = _new_pool()


def _new_pool_after_fork() -> None:
    # A forked HTTP process (``http.workers``) inherits no threads, only the parent's pool object.
    global _pool
    _pool = _new_pool()


os.register_at_fork(after_in_child=_new_pool_after_fork)


_kept_bytes = 0


def _keep_derivation_memory(cost: ScryptCost) -> None:
    """Let each derivation thread keep its scrypt buffer from one derivation to the next.

    OpenSSL allocates the buffer (32 MiB at the default cost) for every derivation.
    glibc serves an allocation that large with a fresh mmap, so every derivation
    page-faulted 8,193 zeroed pages in and unmapped them again: about 19 ms of
    system time on top of 80 ms of scrypt itself. Raising glibc's mmap and trim
    thresholds above the buffer's size makes it come from the thread's arena and
    stay there (the pool's threads then hold one buffer each: 64 MiB on 2 cores).
    Elsewhere than glibc this does nothing. Called on the loop's thread only.
    """
    global _kept_bytes
    if cost.memory_bytes <= _kept_bytes or cost.memory_bytes > MAX_KEPT_DERIVATION_BYTES:
        return
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:  # not glibc (macOS)
        return
    threshold = cost.memory_bytes + 2**20
    if mallopt(_M_MMAP_THRESHOLD, threshold) and mallopt(_M_TRIM_THRESHOLD, 2 * threshold):
        _kept_bytes = cost.memory_bytes


async def _derive_off_loop(password: bytes, salt: bytes, cost: ScryptCost) -> bytes:
    _keep_derivation_memory(cost)
    return await asyncio.get_running_loop().run_in_executor(_pool, _derive, password, salt, cost)


async def derive(password: str, cost: ScryptCost) -> str:
    """The digest text of ``password`` under ``cost`` with a fresh salt (off the event loop).

    Raises ``errors.InvalidInput`` for a password that is not valid Unicode
    text (the cost was checked when it was made: see ``config.ScryptCost``).
    """
    salt = secrets.token_bytes(SALT_BYTES)
    return str(Digest(cost, salt, await _derive_off_loop(_encode(password), salt, cost)))


async def verify(password: str, digest: str | None, fallback: ScryptCost) -> bool:
    """Whether ``password`` matches ``digest``, compared in constant time, at the digest's own cost.

    With no digest (an unknown id, a User without a password) the same
    derivation is spent at the ``fallback`` cost, the configured one, so that
    the answer's timing does not tell who exists or who has a password.
    """
    parsed = None
    if digest is not None:
        try:
            parsed = Digest.parse(digest)
        except ValueError:
            logger.error("a stored password digest is unreadable; the login is refused")
    if parsed is None:
        await _derive_off_loop(_encode(password), _NO_DIGEST_SALT, fallback)
        return False
    derived = await _derive_off_loop(_encode(password), parsed.salt, parsed.cost)
    return hmac.compare_digest(derived, parsed.hash)
