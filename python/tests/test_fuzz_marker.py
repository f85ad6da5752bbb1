"""Fuzzing the kit's readers of bytes a sandbox or a root escapee can shape: verify_marker and
verify_attestation, with hypothesis.

The seeds are real: one freeze by the release binary as PID 1, signing with a key made by
`quiesce keygen`, so a mutated header, claim or statement can be signed again exactly as the init
signs it. Inputs: raw bytes; byte mutations of the real marker and envelope (bit flips,
truncation, insertion, padding, whitespace, base64 alphabets, non-UTF-8); and JSON mutations
signed again (type confusion, huge and non-finite numbers, deep nesting, duplicate keys, wrong
alg, kid, typ and crit). The property: an input verifies only if what it says is what the init
signed (an unsigned mutation: the same token, or the same statement), or, signed again, if every
check the kit promises holds for it; anything else raises the kit's own refusal (MarkerInvalid,
AttestationInvalid); never another exception, never a call of more than a second.

QUIESCE_FUZZ_EXAMPLES sets the examples per test: 200 by default (seconds, as scripts/test runs
it); the long campaign (docs/testing.md) repeats runs of 500 with fresh seeds for 10 minutes.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from quiesce_harness import AttestationInvalid, MarkerInvalid, verify_attestation, verify_marker
from quiesce_harness.attestation import (
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    pae,
    subject_path,
)
from quiesce_harness.marker import FUTURE_SKEW_S, key_id, load_public_key

import support

EXAMPLES = int(os.environ.get("QUIESCE_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    # The bound is bounded() below, a real timer: hypothesis's deadline only sees calls that end.
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CALL_BOUND_S = 1.0


@dataclass(frozen=True)
class Seed:
    jws: str
    envelope: bytes
    key: Ed25519PrivateKey
    pem: bytes
    nonce: str
    claims: dict[str, Any]
    statement: dict[str, Any]
    files: dict[bytes, bytes]


@pytest.fixture(scope="module")
def seed() -> Iterator[Seed]:
    """One freeze by the real init with a key of ours, one tree of two files attested."""
    b = support.need_init("fuzz")
    nonce = "nonce-f-" + os.urandom(8).hex()
    with support.scratch("qhk-fuzz-") as d:
        s, tree, keys = d / "state", d / "tree", d / "keys"
        tree.mkdir()
        (tree / "a").write_bytes(b"alpha\n")
        (tree / "caf\u00e9 100%").write_bytes(b"beta\n")
        subprocess.run([str(b), "keygen", "--out", str(keys)], check=True, timeout=30)
        script = f"""
set -e
while [ ! -s {s}/sandbox.json ]; do sleep 0.01; done
{b} freeze --state-dir {s} --wait --nonce {nonce} >/dev/null
cp {s}/quiescence.jws {s}/quiescence.intoto.jsonl {d}/
"""
        support.run_init(
            b,
            s,
            script,
            init_args=["--signing-key", str(keys / "signing.key"), "--attest", str(tree)],
        )
        key = serialization.load_pem_private_key((keys / "signing.key").read_bytes(), None)
        assert isinstance(key, Ed25519PrivateKey)
        pem = (keys / "signing.pub").read_bytes()
        jws = (d / "quiescence.jws").read_text().strip()
        envelope = (d / "quiescence.intoto.jsonl").read_bytes()
        claims = verify_marker(jws, pem, nonce)
        files = {bytes(p): p.read_bytes() for p in tree.iterdir()}
        statement = verify_attestation(envelope, pem, claims["jti"], read_file=files.__getitem__)
        yield Seed(jws, envelope, key, pem, nonce, claims, statement, files)


class TooSlow(BaseException):
    """A call past CALL_BOUND_S: a BaseException, so no `except Exception` in the kit hides it."""


def _alarm(_sig: int, _frame: FrameType | None) -> None:
    raise TooSlow(f"a call took more than {CALL_BOUND_S} s")


@contextlib.contextmanager
def bounded() -> Iterator[None]:
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, CALL_BOUND_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def marker_outcome(token: str | bytes, sd: Seed) -> dict[str, Any] | None:
    """The claims verify_marker returned, or None for its refusal; anything else fails."""
    with bounded():
        try:
            claims = verify_marker(token, sd.pem, sd.nonce, now=float(sd.claims["iat"]))
        except MarkerInvalid as e:
            event(f"refused ({e.check})")
            return None
    # Counted, so a campaign shows that the checks of a verified input ran at all.
    event("verified")
    return claims


def attestation_outcome(
    env: str | bytes, sd: Seed, read: Callable[[bytes], bytes] | None = None
) -> dict[str, Any] | None:
    """The statement verify_attestation returned, or None for its refusal."""
    with bounded():
        try:
            statement = verify_attestation(env, sd.pem, str(sd.claims["jti"]), read_file=read)
        except AttestationInvalid as e:
            event(f"refused ({e.check})")
            return None
    event("verified")
    return statement


def b64u(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


# Byte-level mutations of a token or an envelope: what a writer of the file can do to it.
WHITESPACE = st.sampled_from([b" ", b"\n", b"\r\n", b"\t", b"\x0b", b"\x0c", b"\x1c", b"\x00"])
ODD_BYTES = st.sampled_from(
    [b"=", b"==", b"+", b"/", b".", b"\xff", b"\xc3\xa9", b"\xed\xa0\x80", b"\\", b'"', b"%"]
)


@st.composite
def mutated(draw: st.DrawFn, original: bytes) -> bytes:
    """`original` after one to four edits: flip, delete, insert, swap alphabet, cut, repeat."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["flip", "delete", "insert", "alphabet", "cut", "repeat"]))
        if op == "flip" and i < len(data):
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "delete":
            del data[i : i + draw(st.integers(1, 8))]
        elif op == "insert":
            data[i:i] = draw(st.one_of(WHITESPACE, ODD_BYTES, st.binary(min_size=1, max_size=4)))
        elif op == "alphabet":
            data = bytearray(bytes(data).replace(b"-", b"+").replace(b"_", b"/"))
        elif op == "cut":
            data = data[:i]
        else:
            data[i:i] = data[i : i + draw(st.integers(1, 40))]
    return bytes(data)


# JSON values of every type, and raw JSON text Python reads but no init writes.
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
RAW_JSON = st.sampled_from(
    [
        "NaN",
        "-Infinity",
        "1e999",
        "-0",
        "0.0",
        "1E0",
        "true",
        '"\\ud800"',
        '"\\u0000"',
        '"quiesce\\u0000"',
        "9" * 5000,
        "1" + "0" * 30,
        "-" + "9" * 40,
        "[" * 100000 + "]" * 100000,
        '{"a":' * 50000 + "1" + "}" * 50000,
        "[" * 900 + "]" * 900,
    ]
)
VALUE_TEXT = st.one_of(JSON_VALUES.map(json.dumps), RAW_JSON)


@st.composite
def json_text(draw: st.DrawFn, obj: dict[str, Any]) -> bytes:
    """`obj` as JSON with one to three fields changed, dropped, added or given twice."""
    items = [(k, json.dumps(v)) for k, v in obj.items()]
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["set", "drop", "add", "twice"]))
        keys = [k for k, _ in items]
        k = draw(st.sampled_from(keys)) if keys and op != "add" else draw(st.text(max_size=8))
        if op == "set":
            items = [(n, draw(VALUE_TEXT) if n == k else t) for n, t in items]
        elif op == "drop":
            items = [(n, t) for n, t in items if n != k]
        else:
            items.append((k, draw(VALUE_TEXT)))
    space = draw(st.sampled_from(["", " ", "\n", "\t"]))
    body = ("," + space).join(f"{json.dumps(k)}:{space}{t}" for k, t in items)
    return ("{" + space + body + space + "}").encode()


HEADERS = st.fixed_dictionaries(
    {},
    optional={
        "alg": st.sampled_from(["EdDSA", "eddsa", "none", "HS256", "ES256", "Ed25519", " EdDSA"])
        | JSON_VALUES,
        "kid": st.sampled_from(["", "k\u00e9", "\ud800"]) | JSON_VALUES,
        "typ": st.sampled_from(["JWT", "JOSE", "jwt"]) | JSON_VALUES,
        "crit": JSON_VALUES,
        "jwk": JSON_VALUES,
    },
)


def sign_marker(sd: Seed, header: bytes, payload: bytes) -> str:
    """A compact JWS over these exact bytes, signed with the init's key as the init signs."""
    h, p = b64u(header), b64u(payload)
    return f"{h}.{p}.{b64u(sd.key.sign(f'{h}.{p}'.encode()))}"


def real_header(sd: Seed) -> dict[str, Any]:
    h: dict[str, Any] = json.loads(base64.urlsafe_b64decode(sd.jws.split(".")[0] + "=="))
    return h


def assert_claims_promised(sd: Seed, header: bytes, claims: dict[str, Any]) -> None:
    """What verify_marker promises of a marker it returns, checked again independently."""
    h = json.loads(header)
    assert h["alg"] == "EdDSA" and "crit" not in h
    assert h.get("kid") in (None, key_id(load_public_key(sd.pem)))
    assert claims["iss"] == "quiesce" and claims["result"] == "quiescent"
    assert type(claims["survivors"]) is int and claims["survivors"] == 0
    assert claims["nonce"] == sd.nonce and claims["setuid"] is False
    assert type(claims["iat"]) is int
    assert -FUTURE_SKEW_S <= sd.claims["iat"] - claims["iat"] <= 600


@FUZZ
@given(raw=st.binary(max_size=4096) | st.text(max_size=2048))
def test_raw_input_is_refused_by_verify_marker(seed: Seed, raw: bytes | str) -> None:
    assert marker_outcome(raw, seed) is None


@FUZZ
@given(data=st.data(), as_text=st.booleans())
def test_a_mutated_marker_verifies_only_as_itself(
    seed: Seed, data: st.DataObject, as_text: bool
) -> None:
    token = data.draw(mutated(seed.jws.encode()))
    # As text, each byte one code point: 0x85 and 0xa0 are then whitespace, as str.strip says.
    given = token.decode("latin-1") if as_text else token
    got = marker_outcome(given, seed)
    if got is not None:
        # Whitespace around the token is the one change that keeps it the same token.
        text = given if isinstance(given, str) else given.decode("ascii", "replace")
        assert text.strip() == seed.jws
        assert got == seed.claims


@FUZZ
@given(data=st.data(), which=st.sampled_from(["header", "claims", "both"]))
def test_a_marker_signed_again_verifies_only_with_every_check_met(
    seed: Seed, data: st.DataObject, which: str
) -> None:
    header = json.dumps(real_header(seed)).encode()
    payload = json.dumps(seed.claims).encode()
    if which != "claims":
        header = data.draw(
            json_text(real_header(seed)) | HEADERS.map(lambda h: json.dumps(h).encode())
        )
    if which != "header":
        payload = data.draw(json_text(seed.claims))
    got = marker_outcome(sign_marker(seed, header, payload), seed)
    if got is not None:
        assert_claims_promised(seed, header, got)


def envelope_of(sd: Seed, body: bytes, sigs: list[Any] | None = None) -> bytes:
    """A DSSE envelope of `body`, signed with the init's key over PAE as the init signs."""
    sig = base64.b64encode(sd.key.sign(pae(PAYLOAD_TYPE, body))).decode()
    kid = key_id(load_public_key(sd.pem))
    env = {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(body).decode(),
        "signatures": [{"keyid": kid, "sig": sig}] if sigs is None else sigs,
    }
    return json.dumps(env).encode() + b"\n"


def read_seed(sd: Seed) -> Callable[[bytes], bytes]:
    """The attested tree as it was: a name outside it reads as empty, never as the host's."""
    return lambda p: sd.files.get(p, b"")


@FUZZ
@given(raw=st.binary(max_size=4096) | st.text(max_size=2048))
def test_raw_input_is_refused_by_verify_attestation(seed: Seed, raw: bytes | str) -> None:
    assert attestation_outcome(raw, seed) is None


@FUZZ
@given(data=st.data(), as_text=st.booleans(), read=st.booleans())
def test_a_mutated_envelope_verifies_only_as_itself(
    seed: Seed, data: st.DataObject, as_text: bool, read: bool
) -> None:
    env = data.draw(mutated(seed.envelope))
    got = attestation_outcome(
        env.decode("utf-8", "surrogateescape") if as_text else env,
        seed,
        read_seed(seed) if read else None,
    )
    if got is not None:
        # JSON whitespace, or base64 that decodes to the same bytes, keeps the statement.
        assert got == seed.statement


@FUZZ
@given(
    data=st.data(),
    keyid=st.sampled_from(["", "k\u00e9", "\ud800", None, 1]) | JSON_VALUES,
    sig=st.sampled_from(["", "=", "AA==", "\u00e9"]) | JSON_VALUES,
)
def test_an_envelope_with_other_signatures_verifies_only_by_this_key(
    seed: Seed, data: st.DataObject, keyid: Any, sig: Any
) -> None:
    # The init's own payload bytes, so that its signature (`good`) is over them.
    body = base64.b64decode(json.loads(seed.envelope)["payload"])
    good = json.loads(seed.envelope)["signatures"][0]
    forged = {"keyid": good["keyid"], "sig": sig}
    entries = [{"keyid": keyid, "sig": sig}, {"keyid": keyid}, forged, good, sig]
    sigs = data.draw(
        st.permutations(entries).flatmap(lambda s: st.integers(0, len(s)).map(lambda n: s[:n]))
    )
    got = attestation_outcome(envelope_of(seed, body, sigs), seed)
    if got is not None:
        assert good in sigs and got == seed.statement


def with_raw(obj: dict[str, Any], path: tuple[str | int, ...], raw: bytes) -> bytes:
    """`obj` as JSON with the value at `path` replaced by the raw JSON text `raw`."""
    copy = json.loads(json.dumps(obj))
    inner = copy
    for step in path[:-1]:
        inner = inner[step]
    mark = "\x00mutated-" + os.urandom(8).hex()
    inner[path[-1]] = mark
    return json.dumps(copy).encode().replace(json.dumps(mark).encode(), raw)


INNER = {
    "statement": (),
    "predicate": ("predicate",),
    "freeze": ("predicate", "freeze"),
    "subject": ("subject", 0),
}


@FUZZ
@given(data=st.data(), where=st.sampled_from(sorted(INNER)))
def test_a_statement_signed_again_verifies_only_with_every_check_met(
    seed: Seed, data: st.DataObject, where: str
) -> None:
    path = INNER[where]
    inner: Any = seed.statement
    for step in path:
        inner = inner[step]
    changed = data.draw(json_text(inner))
    body = with_raw(seed.statement, path, changed) if path else changed
    read = read_seed(seed)
    got = attestation_outcome(envelope_of(seed, body), seed, read)
    if got is not None:
        assert got["_type"] == STATEMENT_TYPE and got["predicateType"] == PREDICATE_TYPE
        assert got["predicate"]["freeze"]["jti"] == seed.claims["jti"]
        for s in got["subject"]:
            want = hashlib.sha256(read(subject_path(s["name"]))).hexdigest()
            assert s["digest"]["sha256"] == want


# What the fuzzing found, and the same faults found next to them while fixing, each kept as a
# case: the input, and the check that must refuse it.
def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


def claims_with(sd: Seed, **changed: Any) -> bytes:
    return json.dumps({**sd.claims, **changed}).encode()


def header_of(sd: Seed, **changed: Any) -> bytes:
    return json.dumps({**real_header(sd), **changed}).encode()


def statement_with(sd: Seed, path: tuple[str | int, ...], value: Any) -> bytes:
    return with_raw(sd.statement, path, json.dumps(value).encode())


MARKER_FINDINGS: dict[str, tuple[str, Callable[[Seed], str | bytes]]] = {
    # The payload part went to the signature check as ASCII before its form was checked.
    "a non-ASCII byte in the payload part": (
        "format",
        lambda sd: sd.jws.replace(".", ".\x80", 1).encode("latin-1"),
    ),
    "a non-ASCII character in the payload part": (
        "format",
        lambda sd: sd.jws.replace(".", ".\u00e9", 1),
    ),
    # json.loads raised RecursionError, which is no ValueError.
    "an unsigned header nested 100000 deep": (
        "format",
        lambda sd: b64u(deep(100000)) + "." + sd.jws.split(".", 1)[1],
    ),
    "a signed payload nested 100000 deep": (
        "format",
        lambda sd: sign_marker(sd, header_of(sd), deep(100000)),
    ),
    # hmac.compare_digest raised TypeError on a str that is not ASCII.
    "an unsigned kid that is not ASCII": (
        "key",
        lambda sd: b64u(header_of(sd, kid="k\u00e9")) + "." + sd.jws.split(".", 1)[1],
    ),
    # str.encode raised UnicodeEncodeError on a lone surrogate.
    "a signed nonce with a lone surrogate": (
        "nonce",
        lambda sd: sign_marker(sd, header_of(sd), claims_with(sd, nonce="\ud800")),
    ),
    # iat - now raised OverflowError: an int past a float's range.
    "a signed iat of 10**400": (
        "claims",
        lambda sd: sign_marker(sd, header_of(sd), claims_with(sd, iat=10**400)),
    ),
    "a signed iat of 2**63": (
        "claims",
        lambda sd: sign_marker(sd, header_of(sd), claims_with(sd, iat=2**63)),
    ),
}

ATTESTATION_FINDINGS: dict[str, tuple[str, Callable[[Seed], str | bytes]]] = {
    # str.encode raised UnicodeEncodeError on an envelope read with surrogateescape.
    "an envelope given as text with a lone surrogate": ("format", lambda sd: "\udcfb"),
    # json.loads raised RecursionError, which is no ValueError.
    "an envelope nested 100000 deep": ("format", lambda sd: deep(100000)),
    "a signed statement nested 100000 deep": (
        "statement",
        lambda sd: envelope_of(sd, deep(100000)),
    ),
    # hmac.compare_digest raised TypeError on a str that is not ASCII.
    "a keyid that is not ASCII": (
        "key",
        lambda sd: envelope_of(
            sd, json.dumps(sd.statement).encode(), [{"keyid": "k\u00e9", "sig": ""}]
        ),
    ),
    "a signed jti that is not ASCII": (
        "jti",
        lambda sd: envelope_of(sd, statement_with(sd, ("predicate", "freeze", "jti"), "j\u00e9")),
    ),
    # A subject that was no list was read as no subjects: a check of nothing passed.
    "a signed subject that is no list": (
        "statement",
        lambda sd: envelope_of(sd, statement_with(sd, ("subject",), 1.5)),
    ),
    # urllib's unquote_to_bytes raised UnicodeEncodeError on a lone surrogate.
    "a signed subject name with a lone surrogate": (
        "statement",
        lambda sd: envelope_of(sd, statement_with(sd, ("subject", 0, "name"), "\ud800")),
    ),
}


@pytest.mark.parametrize("case", sorted(MARKER_FINDINGS))
def test_each_marker_finding_is_refused_by_its_check(seed: Seed, case: str) -> None:
    check, make = MARKER_FINDINGS[case]
    with bounded(), pytest.raises(MarkerInvalid) as e:
        verify_marker(make(seed), seed.pem, seed.nonce, now=float(seed.claims["iat"]))
    assert e.value.check == check


@pytest.mark.parametrize("case", sorted(ATTESTATION_FINDINGS))
def test_each_attestation_finding_is_refused_by_its_check(seed: Seed, case: str) -> None:
    check, make = ATTESTATION_FINDINGS[case]
    with bounded(), pytest.raises(AttestationInvalid) as e:
        verify_attestation(make(seed), seed.pem, str(seed.claims["jti"]), read_file=read_seed(seed))
    assert e.value.check == check


def test_whitespace_around_a_marker_is_the_one_change_that_verifies(seed: Seed) -> None:
    # str.strip's whitespace, as the kit strips it: NEL and NBSP in a str, not as bytes.
    now = float(seed.claims["iat"])
    for token in (f"\x85 {seed.jws}\n\xa0", f"\x1c{seed.jws}\r\n".encode()):
        assert verify_marker(token, seed.pem, seed.nonce, now=now) == seed.claims
    for token in (b"\x85" + seed.jws.encode(), f"{seed.jws}\x00"):
        with pytest.raises(MarkerInvalid) as e:
            verify_marker(token, seed.pem, seed.nonce, now=now)
        assert e.value.check == "format"
