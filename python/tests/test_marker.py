"""verify_marker against markers the real init signed: each refusal names its check."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from quiesce_harness import MarkerInvalid, key_id, verify_marker
from quiesce_harness.marker import load_public_key

from conftest import Marker


def b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def unb64(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def parts(m: Marker) -> tuple[dict[str, object], dict[str, object], str]:
    h, p, s = m.jws.split(".")
    return json.loads(unb64(h)), json.loads(unb64(p)), s


def iat(m: Marker) -> int:
    v = parts(m)[1]["iat"]
    assert isinstance(v, int)
    return v


def refused(check: str, jws: str, pem: bytes | str, **kw: object) -> MarkerInvalid:
    with pytest.raises(MarkerInvalid) as e:
        verify_marker(jws, pem, **kw)  # type: ignore[arg-type]
    assert e.value.check == check, e.value
    assert e.value.reason
    return e.value


def test_a_real_marker_passes_every_check(marker: Marker) -> None:
    claims = verify_marker(
        marker.jws, marker.public_pem, nonce=marker.nonce, container=marker.identity
    )
    assert claims["nonce"] == marker.nonce
    assert claims["result"] == "quiescent"
    assert claims["sandbox_uids"] == [4242]
    assert [p["comm"] for p in claims["processes"]] == ["sleep"]
    # The init ran with no_new_privs (no-new-privileges): no setuid binary made anyone root.
    assert claims["setuid"] is False


def test_the_key_as_str_or_bytes_and_the_kid(marker: Marker) -> None:
    verify_marker(marker.jws, marker.public_pem.decode(), nonce=marker.nonce)
    verify_marker(marker.jws.encode(), marker.public_pem, nonce=marker.nonce)
    assert parts(marker)[0]["kid"] == key_id(load_public_key(marker.public_pem))


def test_pyjwt_reads_the_same_claims(marker: Marker) -> None:
    pub = serialization.load_pem_public_key(marker.public_pem)
    claims = jwt.decode(marker.jws, pub, algorithms=["EdDSA"])  # type: ignore[arg-type]
    assert claims == verify_marker(marker.jws, marker.public_pem)


def test_tampered_payload_is_refused(marker: Marker) -> None:
    h, p, s = marker.jws.split(".")
    claims = json.loads(unb64(p))
    claims["processes"] = []
    e = refused("signature", f"{h}.{b64(json.dumps(claims).encode())}.{s}", marker.public_pem)
    assert "does not verify" in e.reason


def test_tampered_signature_is_refused(marker: Marker) -> None:
    h, p, s = marker.jws.split(".")
    sig = bytearray(unb64(s))
    sig[0] ^= 1
    refused("signature", f"{h}.{p}.{b64(bytes(sig))}", marker.public_pem)


def test_replayed_nonce_is_refused(marker: Marker, other_marker: Marker) -> None:
    # The marker of an earlier freeze (nonce A) offered for this freeze (nonce B).
    e = refused("nonce", marker.jws, marker.public_pem, nonce=other_marker.nonce)
    assert "replay" in e.reason and marker.nonce in e.reason


def test_expired_and_future_markers_are_refused(marker: Marker) -> None:
    t = iat(marker)
    e = refused("expired", marker.jws, marker.public_pem, now=t + 601)
    assert "600" in e.reason
    refused("expired", marker.jws, marker.public_pem, max_age_s=5, now=t + 6)
    verify_marker(marker.jws, marker.public_pem, max_age_s=5, now=t + 4)
    refused("future", marker.jws, marker.public_pem, now=t - 61)


def test_foreign_container_is_refused(marker: Marker, other_marker: Marker) -> None:
    e = refused("container", marker.jws, marker.public_pem, container=other_marker.identity)
    # Same boot and host, another init (the kernel may hand out the namespace inode again
    # once the first is gone): its start time tells them apart.
    assert "init_start" in e.reason or "pid_ns" in e.reason
    pid_ns = marker.identity["pid_ns"]
    assert isinstance(pid_ns, int)
    refused("container", marker.jws, marker.public_pem, container={"pid_ns": pid_ns + 1})
    refused("container", marker.jws, marker.public_pem, container={"boot_id": "0" * 36})


def test_wrong_alg_is_refused(marker: Marker) -> None:
    h, p, _ = marker.jws.split(".")
    header = json.loads(unb64(h))
    for alg in ("none", "HS256", "RS256", "ES256", "ed25519", "EDDSA", None):
        forged = dict(header, alg=alg)
        hb = b64(json.dumps(forged).encode())
        # HS256 keyed with the public key's PEM: the classic algorithm confusion.
        sig = hmac.new(marker.public_pem, f"{hb}.{p}".encode(), hashlib.sha256).digest()
        e = refused("alg", f"{hb}.{p}.{b64(sig)}", marker.public_pem)
        assert "EdDSA" in e.reason
    refused("alg", f"{b64(json.dumps(dict(header, alg='none')).encode())}.{p}.", marker.public_pem)


def test_another_key_is_refused(marker: Marker, other_marker: Marker) -> None:
    e = refused("key", marker.jws, other_marker.public_pem)
    assert "another key" in e.reason
    # Without a kid, the signature itself fails.
    h, p, s = marker.jws.split(".")
    header = json.loads(unb64(h))
    del header["kid"]
    stripped = f"{b64(json.dumps(header).encode())}.{p}.{s}"
    refused("signature", stripped, marker.public_pem)
    pem = (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    refused("key", marker.jws, pem)


def test_a_marker_signed_by_another_key_for_our_claims_is_refused(marker: Marker) -> None:
    # Someone with their own key re-signs the real header and claims: the signature fails.
    key = Ed25519PrivateKey.generate()
    h, p, _ = marker.jws.split(".")
    sig = key.sign(f"{h}.{p}".encode())
    refused("signature", f"{h}.{p}.{b64(sig)}", marker.public_pem)


def test_malformed_markers_are_refused(marker: Marker) -> None:
    h, p, s = marker.jws.split(".")
    refused("format", f"{h}.{p}", marker.public_pem)
    refused("format", f"{h}.{p}.{s}.x", marker.public_pem)
    refused("format", f"{h}=.{p}.{s}", marker.public_pem)
    refused("format", f"{h}.{p}.{s[:-2]}", marker.public_pem)
    dup = b64(b'{"alg":"EdDSA","alg":"none"}')
    e = refused("format", f"{dup}.{p}.{s}", marker.public_pem)
    assert "duplicate" in e.reason
    refused("key", marker.jws, b"not a key")


class Signer:
    """Claims the init never signs, signed here with a key of our own."""

    def __init__(self) -> None:
        self.key = Ed25519PrivateKey.generate()
        self.pem = self.key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.header = b64(json.dumps({"alg": "EdDSA", "typ": "JWT"}).encode())

    def sign(self, claims: dict[str, object]) -> str:
        h, p = self.header, b64(json.dumps(claims).encode())
        return f"{h}.{p}.{b64(self.key.sign(f'{h}.{p}'.encode()))}"


GOOD = {
    "iss": "quiesce",
    "result": "quiescent",
    "survivors": 0,
    "iat": 100,
    "nonce": "n",
    "setuid": False,
}


def test_a_claim_that_is_not_quiescent_is_refused_even_when_signed() -> None:
    # The claim checks refuse what the signature alone would let through.
    k = Signer()
    verify_marker(k.sign(GOOD), k.pem, nonce="n", now=100)
    for bad in (
        {"iss": "other"},
        {"result": "failed"},
        {"survivors": 1},
        {"survivors": False},
        {"iat": "100"},
        {"iat": True},
    ):
        refused("claims", k.sign({**GOOD, **bad}), k.pem, now=100)
    refused("nonce", k.sign({**GOOD, "nonce": None}), k.pem, nonce="n", now=100)


def test_a_marker_of_a_lineage_sandbox_is_refused_unless_a_root_agent_is_accepted() -> None:
    k = Signer()
    lineage = {**GOOD, "sandbox": "lineage", "agent_root": True, "setuid": True}
    e = refused("sandbox", k.sign(lineage), k.pem, nonce="n", now=100)
    assert "sandbox=lineage" in e.reason and "accept_root_agent=True" in e.reason
    # Accepting privilege escalation is not accepting a root agent.
    refused("sandbox", k.sign(lineage), k.pem, nonce="n", now=100, accept_privilege_escalation=True)
    got = verify_marker(k.sign(lineage), k.pem, nonce="n", now=100, accept_root_agent=True)
    assert got["sandbox"] == "lineage"
    # A marker of users is checked as before; an unknown mode is malformed, accepted or not.
    assert verify_marker(k.sign({**GOOD, "sandbox": "uid"}), k.pem, now=100)["setuid"] is False
    refused("setuid", k.sign({**GOOD, "sandbox": "uid", "setuid": True}), k.pem, now=100)
    for bad in ("LINEAGE", None, 1, ["lineage"]):
        refused("claims", k.sign({**GOOD, "sandbox": bad}), k.pem, now=100, accept_root_agent=True)


def test_a_marker_that_says_setuid_is_refused_unless_accepted(setuid_marker: Marker) -> None:
    # The real init, run without no_new_privs (Docker's default): a setuid binary could have
    # made a sandbox process root, which no freeze tells apart from root.
    m = setuid_marker
    e = refused("setuid", m.jws, m.public_pem, nonce=m.nonce, container=m.identity)
    assert "(setuid=true)" in e.reason
    assert "--security-opt no-new-privileges" in e.reason
    assert "allowPrivilegeEscalation: false" in e.reason
    assert "accept_privilege_escalation=True" in e.reason and "\n" not in str(e)
    claims = verify_marker(
        m.jws, m.public_pem, nonce=m.nonce, container=m.identity, accept_privilege_escalation=True
    )
    assert claims["setuid"] is True and [p["comm"] for p in claims["processes"]] == ["sleep"]
    # A marker of another freeze is still a replay, whatever is accepted.
    refused("nonce", m.jws, m.public_pem, nonce="other", accept_privilege_escalation=True)


def test_a_marker_that_does_not_say_setuid_is_refused_unless_accepted() -> None:
    # An earlier version's marker carries no setuid claim: it does not say, so it is refused.
    k = Signer()
    old = {c: v for c, v in GOOD.items() if c != "setuid"}
    for claims in (old, {**GOOD, "setuid": None}):
        e = refused("setuid", k.sign(claims), k.pem, nonce="n", now=100)
        assert "does not say" in e.reason and "no-new-privileges" in e.reason
        got = verify_marker(
            k.sign(claims), k.pem, nonce="n", now=100, accept_privilege_escalation=True
        )
        assert got.get("setuid") is None
    e = refused("setuid", k.sign({**GOOD, "setuid": True}), k.pem, now=100)
    assert "(setuid=true)" in e.reason
    assert verify_marker(k.sign(GOOD), k.pem, nonce="n", now=100)["setuid"] is False
    # Only a JSON boolean is a claim: anything else is malformed, accepted or not.
    bad: object
    for bad in ("false", 0, 1, [], {}):
        for accept in (False, True):
            refused(
                "claims",
                k.sign({**GOOD, "setuid": bad}),
                k.pem,
                now=100,
                accept_privilege_escalation=accept,
            )
