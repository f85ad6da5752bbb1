"""The quiescence marker checked in the harness, independently of the binary.

The marker is a compact JWS signed with Ed25519 (docs/marker.md). Everything here is read from
the sandbox's side of the wall, so it is parsed strictly: exactly three base64url parts without
padding, JSON objects without duplicate keys, `alg` pinned to EdDSA before the key is touched.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import reprlib
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .errors import MarkerInvalid
from .extras import need

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from .container import Container

# The default of `quiesce verify --max-age`, and its allowance for a clock ahead of ours.
DEFAULT_MAX_AGE_S = 600.0
FUTURE_SKEW_S = 60.0
# A marker carries at most 1 MiB of evidence; anything far larger is not one.
MAX_MARKER_BYTES = 4 * 1024 * 1024
IDENTITY_FIELDS = ("boot_id", "pid_ns", "hostname", "init_start")
# What to do about a marker signed where a setuid binary could make a sandbox process root, as
# `quiesce verify` says it (exit 18, check "setuid").
PRIVILEGE_ESCALATION_FIX = (
    "run the container with --security-opt no-new-privileges (Kubernetes: "
    "allowPrivilegeEscalation: false) and give the agent no sudo, or accept it with "
    "accept_privilege_escalation=True"
)
# What to do about a marker of a sandbox defined by lineage alone (`quiesce verify` exit 18,
# check "sandbox"): its agent may have been root.
ROOT_AGENT_FIX = (
    "a root agent can act through another root process of the container, which no freeze can "
    "tell apart (docs/threat-model.md, Root agents): accept it with accept_root_agent=True, or "
    "run the agent as a user (--sandbox-user)"
)

_B64URL = re.compile(r"[A-Za-z0-9_-]*")
# The init writes iat as a 64-bit count of seconds; a larger one is no time (and no float).
MAX_IAT = 2**63
# Values a refusal quotes come from the sandbox: shown short and shallow, so a deep or huge one
# costs neither recursion nor memory.
_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 80


def shown(value: object) -> str:
    """`value` as a refusal quotes it: repr, cut to a bounded length and depth."""
    return _SHOWN.repr(value)


def same_text(a: str, b: str) -> bool:
    """A constant-time equality of two strings, any code points (compare_digest takes ASCII)."""
    return hmac.compare_digest(
        a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass")
    )


def _b64url(part: str, what: str) -> bytes:
    if not _B64URL.fullmatch(part) or len(part) % 4 == 1:
        raise MarkerInvalid("format", f"the {what} is not unpadded base64url")
    raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    # Leftover bits in the last character would give two spellings of one token.
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != part:
        raise MarkerInvalid("format", f"the {what} is not canonical base64url")
    return raw


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {shown(k)}")
        out[k] = v
    return out


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as e:
        # RecursionError: JSON nested deeper than Python's stack, which no marker is.
        raise MarkerInvalid("format", f"the {what} is not a JSON object: {e}") from None
    if not isinstance(value, dict):
        raise MarkerInvalid("format", f"the {what} is not a JSON object")
    return value


def load_public_key(public_key_pem: str | bytes) -> Ed25519PublicKey:
    """An Ed25519 SPKI PEM public key (`signing.pub`); anything else raises MarkerInvalid."""
    data = public_key_pem.encode() if isinstance(public_key_pem, str) else public_key_pem
    need("cryptography", "crypto", "a marker's signature check")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        raise MarkerInvalid("key", f"the public key is not a PEM public key: {e}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise MarkerInvalid("key", f"the public key is {type(key).__name__}, not Ed25519")
    return key


def key_id(key: Ed25519PublicKey) -> str:
    """The RFC 7638 JWK thumbprint the init puts in the header's `kid`."""
    from cryptography.hazmat.primitives import serialization

    x = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    x64 = base64.urlsafe_b64encode(x).rstrip(b"=").decode("ascii")
    jwk = '{"crv":"Ed25519","kty":"OKP","x":"' + x64 + '"}'
    return base64.urlsafe_b64encode(hashlib.sha256(jwk.encode()).digest()).rstrip(b"=").decode()


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def verify_marker(
    jws: str | bytes,
    public_key_pem: str | bytes,
    nonce: str | None = None,
    max_age_s: float | None = None,
    container: Container | Mapping[str, object] | None = None,
    *,
    accept_privilege_escalation: bool = False,
    accept_root_agent: bool = False,
    now: float | None = None,
) -> dict[str, Any]:
    """Check a marker and return its claims; raise MarkerInvalid naming the failed check.

    Checks, in this order: the form; `alg` is exactly EdDSA; `kid` names this key; the
    signature; `iss`, `result` and `survivors`; `nonce` (when given: a marker of another freeze
    is a replay); `sandbox` is "uid" (absent: an earlier version's, "uid"), or "lineage" only
    with `accept_root_agent` (its agent may have been root; `quiesce verify
    --accept-root-agent`), which then covers `setuid` too; `setuid` is false (a marker that says
    true, or does not say, was signed where a setuid binary could make a sandbox process root,
    which no freeze can tell apart from root: refused unless `accept_privilege_escalation`, as
    `quiesce verify` refuses it unless --accept-privilege-escalation); `iat` at most `max_age_s`
    old (default 600 s, as `quiesce verify`) and at most 60 s ahead; the container identity
    (when given: a Container, whose identity is read from the engine, or a mapping with any of
    boot_id, pid_ns, hostname, init_start).
    """
    text = jws.decode("ascii", "replace") if isinstance(jws, bytes) else jws
    text = text.strip()
    if len(text) > MAX_MARKER_BYTES:
        raise MarkerInvalid("format", f"{len(text)} bytes, more than any marker")
    parts = text.split(".")
    if len(parts) != 3:
        raise MarkerInvalid("format", f"{len(parts)} parts, a compact JWS has 3")
    # Every part's form before any is used: the signing input is the first two parts as ASCII.
    header_raw = _b64url(parts[0], "header")
    payload_raw = _b64url(parts[1], "payload")
    signature = _b64url(parts[2], "signature")
    header = _json_object(header_raw, "header")
    alg = header.get("alg")
    if alg != "EdDSA":
        raise MarkerInvalid("alg", f"alg is {shown(alg)}; only 'EdDSA' is accepted")
    if "crit" in header:
        raise MarkerInvalid("alg", "the header has 'crit' extensions, which no marker uses")
    key = load_public_key(public_key_pem)
    kid = header.get("kid")
    if kid is not None and not (isinstance(kid, str) and same_text(kid, key_id(key))):
        raise MarkerInvalid("key", "signed by another key: the marker's kid is not this key's")
    if len(signature) != 64:
        raise MarkerInvalid("format", f"the signature is {len(signature)} bytes, Ed25519's is 64")
    from cryptography.exceptions import InvalidSignature

    try:
        key.verify(signature, f"{parts[0]}.{parts[1]}".encode("ascii"))
    except InvalidSignature:
        raise MarkerInvalid("signature", "the signature does not verify with this key") from None
    claims = _json_object(payload_raw, "payload")

    if claims.get("iss") != "quiesce":
        raise MarkerInvalid("claims", f"iss is {shown(claims.get('iss'))}, not 'quiesce'")
    if claims.get("result") != "quiescent":
        raise MarkerInvalid("claims", f"result is {shown(claims.get('result'))}, not 'quiescent'")
    if claims.get("survivors") != 0 or not _is_int(claims.get("survivors")):
        raise MarkerInvalid("claims", f"survivors is {shown(claims.get('survivors'))}, not 0")
    if nonce is not None:
        got = claims.get("nonce")
        if not isinstance(got, str) or not same_text(got, nonce):
            raise MarkerInvalid(
                "nonce",
                f"the marker carries nonce {shown(got)}, not the one asked for: "
                "it answers another freeze (a replay)",
            )
    sandbox = claims.get("sandbox", "uid")
    if sandbox not in ("uid", "lineage"):
        raise MarkerInvalid("claims", f"sandbox is {shown(sandbox)}, neither 'uid' nor 'lineage'")
    if sandbox == "lineage" and not accept_root_agent:
        raise MarkerInvalid("sandbox", f"the marker says sandbox=lineage: {ROOT_AGENT_FIX}")
    setuid = claims.get("setuid")
    if setuid is not None and not isinstance(setuid, bool):
        raise MarkerInvalid("claims", f"setuid is {shown(setuid)}, not a boolean")
    # A root agent needs no setuid binary: accepting one covers it.
    if setuid is not False and not accept_privilege_escalation and sandbox != "lineage":
        said = (
            "says a setuid binary could make a sandbox process root (setuid=true)"
            if setuid
            else "does not say whether a setuid binary could make a sandbox process root "
            "(no setuid claim)"
        )
        raise MarkerInvalid("setuid", f"the marker {said}: {PRIVILEGE_ESCALATION_FIX}")
    iat = claims.get("iat")
    if not isinstance(iat, int) or isinstance(iat, bool) or not -MAX_IAT < iat < MAX_IAT:
        raise MarkerInvalid("claims", f"iat is {shown(iat)}, not a 64-bit integer")
    t = time.time() if now is None else now
    limit = DEFAULT_MAX_AGE_S if max_age_s is None else max_age_s
    if t - iat > limit:
        raise MarkerInvalid("expired", f"signed {t - iat:.0f} s ago, more than {limit:g} s")
    if iat - t > FUTURE_SKEW_S:
        raise MarkerInvalid("future", f"signed {iat - t:.0f} s in the future")
    if container is not None:
        _check_identity(claims, container)
    return claims


def _check_identity(claims: Mapping[str, Any], container: Container | Mapping[str, object]) -> None:
    want = container if isinstance(container, Mapping) else container.identity()
    unknown = set(want) - set(IDENTITY_FIELDS)
    if unknown:
        raise ValueError(f"container identity has unknown fields {sorted(unknown)}")
    if not want:
        raise ValueError("container identity is empty: give any of " + ", ".join(IDENTITY_FIELDS))
    got = claims.get("container")
    if not isinstance(got, dict):
        raise MarkerInvalid("claims", "the marker names no container")
    for field in IDENTITY_FIELDS:
        if field in want and got.get(field) != want[field]:
            raise MarkerInvalid(
                "container",
                f"signed in another container: {field} is {shown(got.get(field))}, "
                f"this container's is {want[field]!r}",
            )
