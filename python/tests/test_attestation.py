"""verify_attestation against an attestation the real init signed: each refusal names its check."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from google.protobuf import json_format
from in_toto.exceptions import SignatureVerificationError
from in_toto.models.metadata import Envelope, Metadata
from in_toto_attestation.v1 import statement, statement_pb2
from securesystemslib.signer import SSlibKey  # type: ignore[attr-defined]  # exported, not in __all__

from quiesce_harness import AttestationInvalid, verify_attestation, verify_marker
from quiesce_harness.attestation import pae, subject_path
from quiesce_harness.marker import key_id, load_public_key

import support


@dataclass(frozen=True)
class Attested:
    envelope: bytes
    marker: str
    public_pem: bytes
    tree: Path


@pytest.fixture(scope="module")
def attested() -> Iterator[Attested]:
    """A freeze by the real init as PID 1 of a new PID namespace, with a tree attested."""
    b = support.need_init("attestation")
    with support.scratch("qhk-attest-") as d:
        s, tree = d / "state", d / "tree"
        tree.mkdir()
        (tree / "a").write_bytes(b"alpha\n")
        (tree / b"new\nline".decode()).write_bytes(b"nl\n")
        script = f"""
set -e
while [ ! -s {s}/sandbox.json ]; do sleep 0.01; done
{b} freeze --state-dir {s} --wait >/dev/null
cp {s}/quiescence.jws {s}/signing.pub {s}/quiescence.intoto.jsonl {d}/
"""
        support.run_init(b, s, script, init_args=["--attest", str(tree)])
        yield Attested(
            envelope=(d / "quiescence.intoto.jsonl").read_bytes(),
            marker=(d / "quiescence.jws").read_text().strip(),
            public_pem=(d / "signing.pub").read_bytes(),
            tree=tree,
        )


def read(p: bytes) -> bytes:
    return Path(os.fsdecode(p)).read_bytes()


def test_the_real_attestation_verifies_and_names_every_file(attested: Attested) -> None:
    claims = verify_marker(attested.marker, attested.public_pem)
    st = verify_attestation(attested.envelope, attested.public_pem, claims["jti"], read_file=read)
    names = [s["name"] for s in st["subject"]]
    assert names == [f"{attested.tree}/a", f"{attested.tree}/new%0Aline"]
    assert subject_path(names[1]) == f"{attested.tree}/new\nline".encode()


def test_the_in_toto_projects_own_code_accepts_the_real_attestation(attested: Attested) -> None:
    """in-toto's DSSE envelope and securesystemslib's key verify the signature; the Statement v1
    schema of in-toto-attestation (protobuf, unknown fields refused) accepts the statement."""
    env = Metadata.from_dict(json.loads(attested.envelope))
    assert isinstance(env, Envelope)
    pub = load_public_key(attested.public_pem)
    kid = json.loads(attested.envelope)["signatures"][0]["keyid"]
    assert kid == key_id(pub)
    key = SSlibKey.from_crypto(pub, keyid=kid)
    env.verify_signature({**key.to_dict(), "keyid": kid})
    pb = json_format.Parse(env.payload, statement_pb2.Statement())
    statement.Statement.copy_from_pb(pb).validate()
    assert [s.name for s in pb.subject] == [f"{attested.tree}/a", f"{attested.tree}/new%0Aline"]
    assert pb.predicate_type == "https://quiesce.dev/attestation/frozen-tree/v1"
    # The same code refuses an edited statement and another key.
    body = json.loads(env.payload)
    body["subject"][0]["digest"]["sha256"] = "00" * 32
    edited = Metadata.from_dict(
        {
            **json.loads(attested.envelope),
            "payload": base64.b64encode(json.dumps(body).encode()).decode(),
        }
    )
    with pytest.raises(SignatureVerificationError):
        edited.verify_signature({**key.to_dict(), "keyid": kid})
    other = SSlibKey.from_crypto(Ed25519PrivateKey.generate().public_key(), keyid=kid)
    with pytest.raises(SignatureVerificationError):
        env.verify_signature({**other.to_dict(), "keyid": kid})


def refused(check: str, env: bytes, pem: bytes, jti: str = "any", **kw: object) -> None:
    with pytest.raises(AttestationInvalid) as e:
        verify_attestation(env, pem, jti, **kw)  # type: ignore[arg-type]
    assert e.value.check == check, e.value


def test_each_refusal_names_its_check(attested: Attested) -> None:
    pem = attested.public_pem
    env = json.loads(attested.envelope)
    body = json.loads(base64.b64decode(env["payload"]))
    refused("format", b"[]", pem)
    refused("format", json.dumps({**env, "payloadType": "text/plain"}).encode(), pem)
    other = (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    refused("key", attested.envelope, other)
    body["subject"][0]["digest"]["sha256"] = "00" * 32
    edited = {**env, "payload": base64.b64encode(json.dumps(body).encode()).decode()}
    refused("signature", json.dumps(edited).encode(), pem)
    refused("jti", attested.envelope, pem, jti="another-freeze")
    jti = verify_marker(attested.marker, pem)["jti"]
    # A key given twice: `quiesce verify` refuses it, so the kit does too, whichever value the
    # signature covers.
    twice = b'{"payload": "e30=", ' + attested.envelope.lstrip()[1:]
    refused("format", twice, pem, jti=jti)
    (attested.tree / "a").write_bytes(b"beta\n")
    refused("changed", attested.envelope, pem, jti=jti, read_file=read)


def test_pae_is_the_dsse_specs() -> None:
    assert pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
