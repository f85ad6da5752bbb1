"""The attestation of the frozen trees checked in the harness, independently of the binary.

The init writes an in-toto Statement v1 in a DSSE envelope, signed with the marker's key
(docs/attestation.md). Like the marker it is read from the sandbox's side of the wall, so it is
parsed strictly: the envelope's signature over DSSE's PAE first, the statement only then, and the
statement must belong to the marker (its `jti`) the harness checked.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import urllib.parse
from collections.abc import Callable
from typing import Any

from .errors import AttestationInvalid
from .marker import _no_duplicates, key_id, load_public_key, same_text, shown

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://quiesce.dev/attestation/frozen-tree/v1"
# The init's own read bound for an envelope.
MAX_ENVELOPE_BYTES = 1 << 30


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding, exactly as the protocol defines it."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def subject_path(name: str) -> bytes:
    """A subject's `name` back to the path's bytes (percent-decoding, `quiesce-percent-v1`)."""
    return urllib.parse.unquote_to_bytes(name)


def _b64(s: object, what: str) -> bytes:
    if not isinstance(s, str):
        raise AttestationInvalid("format", f"{what} is not a string")
    try:
        return base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        raise AttestationInvalid("format", f"{what} is not base64") from None


def _json_object(raw: bytes, check: str, subject: str, what: str) -> dict[str, Any]:
    """`raw` as a JSON object, or the refusal under `check` ("<subject>not JSON", "not <what>").

    UTF-8 only, and a key given twice is refused: the init reads both so (serde), and a reader
    that took the last of two values would check another envelope than `quiesce verify` does.
    """
    try:
        got = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as e:
        # RecursionError: JSON nested deeper than Python's stack, which no attestation is.
        raise AttestationInvalid(check, f"{subject}not JSON: {e}") from None
    if not isinstance(got, dict):
        raise AttestationInvalid(check, f"{subject}not {what} (a JSON object)")
    return got


def verify_attestation(
    envelope: str | bytes,
    public_key_pem: str | bytes,
    jti: str,
    *,
    read_file: Callable[[bytes], bytes] | None = None,
) -> dict[str, Any]:
    """Check an attestation and return its statement; raise AttestationInvalid naming the check.

    Checks, in this order: the envelope's form and payloadType; a signature whose keyid is this
    key's kid and that verifies over PAE; the statement's `_type` and `predicateType`; its
    `predicate.freeze.jti` is `jti` (the marker's, from verify_marker: required, since an
    envelope of another freeze signed with the same key is a replay); with `read_file` (path
    bytes -> content), every subject's sha256 again (`subject` must be a list). Files added
    since, links and special files are not compared here: `quiesce verify` walks the trees
    again.
    """
    # surrogatepass: a lone surrogate (a file read with surrogateescape) fails as JSON, below.
    raw = envelope.encode("utf-8", "surrogatepass") if isinstance(envelope, str) else envelope
    if len(raw) > MAX_ENVELOPE_BYTES:
        raise AttestationInvalid("format", f"{len(raw)} bytes, more than any attestation")
    env = _json_object(raw, "format", "", "a DSSE envelope")
    if env.get("payloadType") != PAYLOAD_TYPE:
        raise AttestationInvalid(
            "format", f"payloadType is {shown(env.get('payloadType'))}, not {PAYLOAD_TYPE}"
        )
    body = _b64(env.get("payload"), "payload")
    key = load_public_key(public_key_pem)
    kid = key_id(key)
    sigs = env.get("signatures")
    mine = [
        s
        for s in (sigs if isinstance(sigs, list) else [])
        if isinstance(s, dict) and isinstance(s.get("keyid"), str) and same_text(s["keyid"], kid)
    ]
    if not mine:
        raise AttestationInvalid("key", "no signature by this key: no keyid is its kid")
    sig = _b64(mine[0].get("sig"), "sig")
    # A key was loaded (load_public_key named the extra were cryptography missing).
    from cryptography.exceptions import InvalidSignature

    try:
        key.verify(sig, pae(PAYLOAD_TYPE, body))
    except InvalidSignature:
        raise AttestationInvalid(
            "signature", "the signature does not verify with this key"
        ) from None
    st = _json_object(body, "statement", "the payload is ", "a statement")
    if st.get("_type") != STATEMENT_TYPE or st.get("predicateType") != PREDICATE_TYPE:
        raise AttestationInvalid(
            "statement",
            f"a {shown(st.get('_type'))} of {shown(st.get('predicateType'))}, not quiesce's",
        )
    pred = st.get("predicate")
    freeze = pred.get("freeze") if isinstance(pred, dict) else None
    got = freeze.get("jti") if isinstance(freeze, dict) else None
    if not (isinstance(got, str) and same_text(got, jti)):
        raise AttestationInvalid(
            "jti", f"of freeze {shown(got)}, not the marker's {jti!r}: freeze again"
        )
    if read_file is not None:
        subjects = st.get("subject")
        if not isinstance(subjects, list):
            # Read as "no subjects", it would pass a check of nothing as a check of the tree.
            raise AttestationInvalid("statement", f"subject is {shown(subjects)}, not a list")
        for s in subjects:
            name = s.get("name") if isinstance(s, dict) else None
            digest = s.get("digest") if isinstance(s, dict) else None
            want = digest.get("sha256") if isinstance(digest, dict) else None
            if not isinstance(name, str) or not isinstance(want, str):
                raise AttestationInvalid(
                    "statement", f"a subject without name or sha256: {shown(s)}"
                )
            try:
                path = subject_path(name)
            except UnicodeEncodeError:
                # A lone surrogate: no percent-encoding the init writes has one.
                raise AttestationInvalid("statement", f"a subject named {shown(name)}") from None
            if hashlib.sha256(read_file(path)).hexdigest() != want:
                raise AttestationInvalid("changed", f"{shown(name)} is not the file attested")
    return st
