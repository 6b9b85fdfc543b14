"""Password digests (spec: Authentication 7): scrypt, self-describing cost, constant-time check."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from agent_gateway import errors
from agent_gateway.auth import passwords
from agent_gateway.config import ScryptCost, SettingsError

CHEAP = ScryptCost(log_n=4, block_size=8, parallelism=1)


async def test_a_digest_records_its_cost_salt_and_hash():
    text = await passwords.derive("s3cret", ScryptCost(log_n=5, block_size=4, parallelism=2))
    assert text.startswith("$scrypt$ln=5,r=4,p=2$")
    digest = passwords.Digest.parse(text)
    assert digest.cost == ScryptCost(5, 4, 2)
    assert len(digest.salt) == passwords.SALT_BYTES and len(digest.hash) == passwords.HASH_BYTES
    # It is exactly scrypt of the UTF-8 password under the recorded parameters.
    assert digest.hash == hashlib.scrypt(b"s3cret", salt=digest.salt, n=32, r=4, p=2, dklen=32)
    assert str(digest) == text
    assert "s3cret" not in text


async def test_salts_differ():
    assert await passwords.derive("same", CHEAP) != await passwords.derive("same", CHEAP)


async def test_verify_accepts_the_password_only():
    text = await passwords.derive("pässwörd ✓", CHEAP)
    assert await passwords.verify("pässwörd ✓", text, CHEAP)
    for wrong in ("pässwörd", "pässwörd ✓ ", "PÄSSWÖRD ✓", ""):
        assert not await passwords.verify(wrong, text, CHEAP)


async def test_verify_uses_the_digests_cost_not_the_configured_one():
    # Raising the configured cost leaves old digests working, at their own cost.
    old = await passwords.derive("old password", CHEAP)
    raised = ScryptCost(log_n=6, block_size=8, parallelism=2)
    assert await passwords.verify("old password", old, raised)
    assert not await passwords.verify("wrong", old, raised)
    assert (await passwords.derive("new", raised)).startswith("$scrypt$ln=6,r=8,p=2$")


async def test_the_default_cost_is_32_mib_and_runs():
    # 128 x 8 x 2^15 bytes: just over OpenSSL's default 32 MiB limit, so maxmem must be given.
    cost = ScryptCost()
    assert (cost.log_n, cost.block_size, cost.parallelism) == (15, 8, 1)
    assert cost.memory_bytes > 32 * 2**20
    text = await passwords.derive("default", cost)
    assert text.startswith("$scrypt$ln=15,r=8,p=1$")
    assert await passwords.verify("default", text, CHEAP)


async def test_no_digest_spends_one_derivation_at_the_configured_cost(monkeypatch: pytest.MonkeyPatch):
    spent: list[ScryptCost] = []
    derive = passwords._derive

    def counting(password: bytes, salt: bytes, cost: ScryptCost) -> bytes:
        spent.append(cost)
        return derive(password, salt, cost)

    monkeypatch.setattr(passwords, "_derive", counting)
    stored = ScryptCost(log_n=5)
    text = await passwords.derive("pw", stored)
    spent.clear()
    assert not await passwords.verify("pw", None, CHEAP)
    assert not await passwords.verify("wrong", text, CHEAP)
    assert await passwords.verify("pw", text, CHEAP)
    assert spent == [CHEAP, stored, stored]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain",
        "$scrypt$ln=4,r=8,p=1$c2FsdA$",
        "$scrypt$ln=21,r=8,p=1$c2FsdHNhbHRzYWx0c2FsdA$" + "A" * 43,
        "$scrypt$ln=0,r=8,p=1$c2FsdHNhbHRzYWx0c2FsdA$" + "A" * 43,
        "$scrypt$ln=4,r=0,p=1$c2FsdHNhbHRzYWx0c2FsdA$" + "A" * 43,
        "$scrypt$ln=16,r=1,p=1$c2FsdHNhbHRzYWx0c2FsdA$" + "A" * 43,  # beyond what scrypt derives
        "$scrypt$ln=4,r=8,p=1$c2FsdHNhbHRzYWx0c2FsdA$" + "A" * 42,
        "$scrypt$ln=4,r=8,p=1$c2FsdHNhbHRzYWx0c2FsdA$" + "A" * 41,
        "$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA",
    ],
)
async def test_an_unreadable_digest_never_verifies(text: str, monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(ValueError):
        passwords.Digest.parse(text)
    calls = []
    monkeypatch.setattr(passwords, "_derive", lambda *args: calls.append(args) or b"")
    assert not await passwords.verify("anything", text, CHEAP)
    assert len(calls) == 1  # still one derivation


async def test_derivation_runs_off_the_event_loop():
    deriving = asyncio.create_task(passwords.derive("slow", ScryptCost(log_n=15)))
    await asyncio.sleep(0)  # the task has started and handed the derivation to a thread
    assert not deriving.done()
    assert (await deriving).startswith("$scrypt$")


def test_the_pool_has_a_thread_per_core():
    assert passwords._pool._max_workers == passwords._cores() >= 1


async def test_a_lone_surrogate_is_invalid_input():
    with pytest.raises(errors.InvalidInput):
        await passwords.derive("\ud800", CHEAP)
    with pytest.raises(errors.InvalidInput):
        await passwords.verify("\ud800", None, CHEAP)


async def test_nul_and_long_passwords_are_just_characters():
    long = "x" * 100_000
    text = await passwords.derive(long, CHEAP)
    assert await passwords.verify(long, text, CHEAP)
    nul = await passwords.derive("a\u0000b", CHEAP)
    assert await passwords.verify("a\u0000b", nul, CHEAP)
    assert not await passwords.verify("a", nul, CHEAP)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"log_n": 0}, "logN: must be a positive integer"),
        ({"log_n": 21}, "logN: must be at most 20"),
        ({"log_n": -1}, "logN: must be a positive integer"),
        ({"log_n": True}, "logN: must be a positive integer"),
        ({"log_n": 15.0}, "logN: must be a positive integer"),
        ({"block_size": 0}, "blockSize: must be a positive integer"),
        ({"parallelism": 0}, "parallelism: must be a positive integer"),
        ({"parallelism": "1"}, "parallelism: must be a positive integer"),
        ({"log_n": 20, "block_size": 16}, "per derivation"),
        # scrypt itself refuses N >= 2^(16 r): refused here, not at the first login.
        ({"log_n": 16, "block_size": 1}, "logN: must be below 16 x blockSize, here 16 \\(got 16\\)"),
    ],
)
def test_a_cost_that_cannot_run_is_refused_at_the_call(kwargs: dict, message: str):
    with pytest.raises(SettingsError, match=message):
        ScryptCost(**kwargs)


def test_the_largest_costs_are_accepted():
    assert ScryptCost(log_n=20, block_size=8, parallelism=1).memory_bytes == 128 * 8 * (2**20 + 3)
    ScryptCost(log_n=20, block_size=15, parallelism=1)
    ScryptCost(log_n=1, block_size=1, parallelism=1000)


@pytest.mark.skipif(not hasattr(__import__("ctypes").CDLL(None), "mallopt"), reason="glibc only")
async def test_a_derivation_reuses_its_memory_instead_of_faulting_it_in_again():
    import resource

    # The default cost: a buffer just over 32 MiB (8,193 pages), past the largest glibc
    # would ever serve from an arena by itself.
    cost = ScryptCost()
    for _ in range(4):  # every pool thread has derived once
        await asyncio.gather(*(passwords.derive("warm", cost) for _ in range(passwords._cores())))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        await passwords.derive("again", cost)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3
    # A fresh mapping per derivation faults every page of the buffer in; a kept one, next to none.
    assert faults < 1000
