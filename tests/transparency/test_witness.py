"""Witness protocol: cosignature/v1 lines and keys (c2sp.org/tlog-cosignature), the add-checkpoint
exchange (c2sp.org/tlog-witness), with the specs' own examples as vectors."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from agent_gateway.transparency import note, witness

# c2sp.org/tlog-cosignature's example checkpoint, its witness line and the message it signs.
SPEC_TEXT = b"example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
SPEC_LINE = (
    "\u2014 witness.example.com/w1 jWbPPwAAAABkGFDLEZMHwSRaJNiIDoe9DYn/zXcrtPHeolMI5OWXEhZCB9dlrDJsX3b2oyin1nPZ"
    "qhf5nNo0xUe+mbIUBkBIfZ+qnA==\n"
).encode()
SPEC_MESSAGE = (
    b"cosignature/v1\ntime 1679315147\nexample.com/behind-the-sofa\n20852163\n"
    b"CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
)
# c2sp.org/tlog-witness's example add-checkpoint body, its proof and its checkpoint note.
SPEC_PROOF = [
    "PlRNCrwHpqhGrupue0L7gxbjbMiKA9temvuZZDDpkaw=",
    "jrJZDmY8Y7SyJE0MWLpLozkIVMSMZcD5kvuKxPC3swk=",
    "5+pKlUdi2LeF/BcMHBn+Ku6yhPGNCswZZD1X/6QgPd8=",
    "/6WVhPs2CwSsb5rYBH5cjHV/wSmA79abXAwhXw3Kj/0=",
]
SPEC_NOTE = SPEC_TEXT + (
    "\n\u2014 example.com/behind-the-sofa Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5/Zhcyv2q1gGzGku9nTo"
    "+zyWE+xeMcTOAYQ8=\n"
).encode()
# RFC 8032 §7.1 TEST 1's secret key, as a witness's key.
SEED = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
PUBLIC = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
NAME = "witness.example/w1"


def private() -> ed25519.Ed25519PrivateKey:
    return ed25519.Ed25519PrivateKey.from_private_bytes(SEED)


def cosign(text: bytes, timestamp: int = 1_700_000_000, name: str = NAME, key: ed25519.Ed25519PrivateKey | None = None) -> bytes:
    """A cosignature/v1 line as a witness writes it, by hand from the spec (not with the module's code)."""
    key = key or private()
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    key_id = hashlib.sha256(name.encode() + b"\n\x04" + public).digest()[:4]
    signature = key.sign(b"cosignature/v1\ntime %d\n" % timestamp + text)
    blob = key_id + timestamp.to_bytes(8, "big") + signature
    return f"\u2014 {name} {base64.b64encode(blob).decode()}\n".encode()


def vkey(name: str = NAME, public: bytes = PUBLIC) -> str:
    key_id = hashlib.sha256(name.encode() + b"\n\x04" + public).digest()[:4]
    encoded = base64.b64encode(b"\x04" + public).decode()
    return f"{name}+{key_id.hex()}+{encoded}"


def test_the_spec_examples_cosignature_line_reads_as_its_key_id_and_time() -> None:
    [cosignature] = witness.signature_lines(SPEC_LINE)
    assert cosignature is not None
    assert (cosignature.name, cosignature.key_id.hex(), cosignature.timestamp) == ("witness.example.com/w1", "8d66cf3f", 1679315147)
    assert witness.cosigned_message(SPEC_TEXT, cosignature.timestamp) == SPEC_MESSAGE
    assert cosignature.line() == SPEC_LINE


def test_a_verifier_key_round_trips_and_its_key_id_is_the_specs() -> None:
    key = witness.WitnessKey.parse(vkey())
    assert key.public == PUBLIC and key.name == NAME
    assert key.key_id == hashlib.sha256(NAME.encode() + b"\n\x04" + PUBLIC).digest()[:4]
    assert key.vkey() == vkey()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "name+hex key ID+base64"),
        ("witness.example/w1", "name+hex key ID+base64"),
        ("has space+00000000+BNdamAGCsQq31Uv+08lkBzoO4XLz2qYjJa8CGmj3B1Ea", "name+hex key ID+base64"),
        (vkey().replace("+BN", "+AN"), "not a cosignature/v1 key"),  # type 0x01: a log's key, not a witness's
        (vkey()[:-4] + "AA==", "not a cosignature/v1 key"),  # 31 bytes
        (vkey().replace(vkey().split("+")[1], "00000000"), "does not match"),
        (vkey().replace(vkey().split("+")[1], vkey().split("+")[1].upper()), "name+hex key ID+base64"),
        (vkey()[:-1] + "!", "name+hex key ID+base64"),
    ],
)
def test_a_malformed_verifier_key_is_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(note.NoteError, match=re.escape(why)):
        witness.WitnessKey.parse(text)


def test_a_cosignature_verifies_under_its_key_and_nothing_else() -> None:
    key = witness.WitnessKey.parse(vkey())
    line = cosign(SPEC_TEXT)
    assert witness.cosignature_of(key, SPEC_TEXT, line) is not None
    # Another checkpoint, another time, another key, another name: no cosignature.
    assert witness.cosignature_of(key, SPEC_TEXT.replace(b"20852163", b"20852164"), line) is None
    [parsed] = witness.signature_lines(line)
    assert parsed is not None
    moved = witness.Cosignature(parsed.name, parsed.key_id, parsed.timestamp + 1, parsed.signature)
    assert not key.verifies(SPEC_TEXT, moved)
    other = ed25519.Ed25519PrivateKey.generate()
    assert witness.cosignature_of(key, SPEC_TEXT, cosign(SPEC_TEXT, key=other)) is None
    renamed = witness.WitnessKey("witness.example/w2", PUBLIC)
    assert witness.cosignature_of(renamed, SPEC_TEXT, line) is None


@pytest.mark.parametrize("index", range(4, 76))
def test_one_byte_changed_in_a_cosignature_fails_it(index: int) -> None:
    key = witness.WitnessKey.parse(vkey())
    [parsed] = witness.signature_lines(cosign(SPEC_TEXT))
    assert parsed is not None
    blob = bytearray(parsed.key_id + parsed.timestamp.to_bytes(8, "big") + parsed.signature)
    blob[index] ^= 1
    line = f"\u2014 {NAME} {base64.b64encode(bytes(blob)).decode()}\n".encode()
    assert witness.cosignature_of(key, SPEC_TEXT, line) is None


def test_of_several_lines_only_the_one_under_the_configured_key_is_kept() -> None:
    key = witness.WitnessKey.parse(vkey())
    other_algorithm = f"\u2014 {NAME} {base64.b64encode(bytes(200)).decode()}\n".encode()
    other_witness = cosign(SPEC_TEXT, name="witness.example/w2", key=ed25519.Ed25519PrivateKey.generate())
    lines = other_algorithm + other_witness + cosign(SPEC_TEXT, timestamp=42)
    found = witness.cosignature_of(key, SPEC_TEXT, lines)
    assert found is not None and found.timestamp == 42


@pytest.mark.parametrize(
    "lines",
    [b"", b"\xff\n", b"no signature\n", "\u2014 w1 AAAA".encode(), "\u2014 w 1 AAAA\n".encode(), "\u2014 w1 AAAAA\n".encode()],
)
def test_text_that_is_not_signature_lines_is_refused(lines: bytes) -> None:
    with pytest.raises(note.NoteError):
        witness.signature_lines(lines)


def test_a_timestamp_past_2_to_the_63_is_no_cosignature() -> None:
    blob = b"\0" * 4 + (2**63).to_bytes(8, "big") + b"\0" * 64
    assert witness.signature_lines(f"\u2014 w {base64.b64encode(blob).decode()}\n".encode()) == [None]


def test_the_add_checkpoint_body_is_the_specs_example() -> None:
    body = witness.add_checkpoint_body(20852014, [base64.b64decode(hash_) for hash_ in SPEC_PROOF], SPEC_NOTE)
    expected = b"old 20852014\n" + b"".join(hash_.encode() + b"\n" for hash_ in SPEC_PROOF) + b"\n" + SPEC_NOTE
    assert body == expected
    assert witness.add_checkpoint_body(0, [], SPEC_NOTE) == b"old 0\n\n" + SPEC_NOTE
    with pytest.raises(ValueError, match="at most 63"):
        witness.add_checkpoint_body(1, [b"\0" * 32] * 64, SPEC_NOTE)


@pytest.mark.parametrize(("body", "size"), [(b"0\n", 0), (b"20852014\n", 20852014)])
def test_a_409_size_reads(body: bytes, size: int) -> None:
    assert witness.parse_size(body) == size


@pytest.mark.parametrize("body", [b"", b"12", b"012\n", b"-1\n", b"1 \n", b"1\n\n"])
def test_a_malformed_409_size_is_refused(body: bytes) -> None:
    with pytest.raises(note.NoteError):
        witness.parse_size(body)


KEY = witness.WitnessKey(NAME, PUBLIC)


def test_a_200_with_a_valid_cosignature_is_cosigned() -> None:
    answer = witness.read_answer(KEY, SPEC_TEXT, 200, "text/plain", cosign(SPEC_TEXT, timestamp=7))
    assert isinstance(answer, witness.Cosigned) and answer.cosignature.timestamp == 7


@pytest.mark.parametrize(
    ("status", "content_type", "body", "expected", "reason"),
    [
        (200, "text/plain", cosign(b"another\n1\n" + b"A" * 43 + b"=\n"), witness.Refused, "verifies under its vkey"),
        (200, "text/plain", b"garbage", witness.Refused, "not signature lines"),
        (403, "text/plain", b"", witness.Refused, "403"),
        (404, "text/plain", b"", witness.Refused, "404"),
        (409, "text/x.tlog.size; charset=utf-8", b"12\n", witness.Conflict, None),
        (409, "text/plain", b"conflict", witness.Conflict, None),
        (409, "text/x.tlog.size", b"twelve\n", witness.Failed, "409"),
        (422, "text/plain", b"", witness.Refused, "422: the consistency proof from the tree size it holds does not verify"),
        (400, "text/plain", b"", witness.Failed, "HTTP 400"),
        (500, "text/plain", b"", witness.Failed, "HTTP 500"),
    ],
)
def test_each_answer_of_a_witness_means_one_thing(status: int, content_type: str, body: bytes, expected: type, reason: str | None) -> None:
    answer = witness.read_answer(KEY, SPEC_TEXT, status, content_type, body)
    assert type(answer) is expected
    if reason is not None:
        assert reason in answer.reason  # type: ignore[union-attr]
    if status == 409 and expected is witness.Conflict:
        assert answer == witness.Conflict(12 if content_type.startswith("text/x.tlog.size") else None)
