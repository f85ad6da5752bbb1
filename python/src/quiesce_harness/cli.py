"""`python -m quiesce_harness freeze|verify` for harnesses driven from a shell.

Exit codes: 0 quiescent / marker valid; 1 freeze failed / marker refused; 3 unreachable;
2 usage errors. `freeze` prints the result as one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .container import Container
from .errors import FreezeFailed, MarkerInvalid, Unreachable
from .extras import MissingExtra
from .freeze import freeze
from .marker import verify_marker
from .result import FreezeResult


def _add_target(p: argparse.ArgumentParser, required: bool) -> None:
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--docker", metavar="NAME", help="a Docker container, by name or id")
    g.add_argument("--podman", metavar="NAME", help="a Podman container")
    g.add_argument("--compose", metavar="SERVICE", help="a Compose service")
    g.add_argument("--kubectl", metavar="POD", help="a Kubernetes pod")
    p.add_argument("--project", help="Compose project (with --compose)")
    p.add_argument("-f", "--file", action="append", default=[], help="Compose file (repeatable)")
    p.add_argument("-n", "--namespace", help="Kubernetes namespace (with --kubectl)")
    p.add_argument("-c", "--container", help="container in the pod (with --kubectl)")
    p.add_argument("--binary", default="quiesce", help="quiesce's path in the container")
    p.add_argument("--state-dir", default="/run/quiesce", help="the init's state directory")


def _target(a: argparse.Namespace) -> Container | None:
    common = {"binary": a.binary, "state_dir": a.state_dir}
    if a.docker:
        return Container.docker(a.docker, **common)
    if a.podman:
        return Container.podman(a.podman, **common)
    if a.compose:
        return Container.compose(a.compose, project=a.project, files=a.file, **common)
    if a.kubectl:
        return Container.kubectl(a.kubectl, namespace=a.namespace, container=a.container, **common)
    return None


def _as_json(r: FreezeResult) -> str:
    d = dataclasses.asdict(r)
    d.pop("status", None)
    return json.dumps(d, sort_keys=True)


def _freeze(a: argparse.Namespace) -> int:
    c = _target(a)
    assert c is not None  # noqa: S101 -- argparse requires a target
    try:
        r = freeze(c, nonce=a.nonce, timeout=a.timeout)
    except FreezeFailed as e:
        print(_as_json(e.result))
        print(f"quiesce_harness: {e}", file=sys.stderr)
        return 1
    except Unreachable as e:
        print(f"quiesce_harness: unreachable: {e}", file=sys.stderr)
        return 3
    print(_as_json(r))
    return 0


class _Usage(Exception):
    """A command line that names neither a file nor a container to read it from."""


def _kept_or_read(c: Container | None, path: str | None, name: str, option: str) -> bytes:
    """The file the harness kept (`path`), else the copy `name` in the container's state dir."""
    if path:
        return Path(path).read_bytes()
    if c is None:
        raise _Usage(f"give {option} FILE or a container")
    return c.read_file(f"{c.state_dir}/{name}")


def _verify(a: argparse.Namespace) -> int:
    c = _target(a)
    try:
        jws = _kept_or_read(c, a.marker, "quiescence.jws", "--marker")
        # Root in the container could replace its copy of the key: prefer one kept outside.
        pem = _kept_or_read(c, a.public_key, "signing.pub", "--public-key")
        claims = verify_marker(
            jws,
            pem,
            nonce=a.nonce,
            max_age_s=a.max_age,
            container=c if (c is not None and not a.no_container_check) else None,
            accept_privilege_escalation=a.accept_privilege_escalation,
        )
    except _Usage as e:
        print(f"quiesce_harness: {e}", file=sys.stderr)
        return 2
    except MarkerInvalid as e:
        print(json.dumps({"valid": False, "check": e.check, "reason": e.reason}))
        print(f"quiesce_harness: {e}", file=sys.stderr)
        return 1
    except (Unreachable, OSError) as e:
        print(f"quiesce_harness: unreachable: {e}", file=sys.stderr)
        return 3
    print(json.dumps({"valid": True, "jti": claims.get("jti"), "nonce": claims.get("nonce")}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m quiesce_harness")
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("freeze", help="freeze the sandbox; exit 0 only when quiescent")
    _add_target(f, required=True)
    f.add_argument("--nonce", help="nonce the marker must carry (default: a random one)")
    f.add_argument("--timeout", type=float, default=30.0, help="seconds in all (default 30)")
    f.set_defaults(func=_freeze)
    v = sub.add_parser("verify", help="check a marker in the harness, without the binary")
    _add_target(v, required=False)
    v.add_argument("--marker", help="the marker file (default: read from the container)")
    v.add_argument("--public-key", help="SPKI PEM key (default: the container's signing.pub)")
    v.add_argument("--nonce", help="the nonce the marker must carry")
    v.add_argument("--max-age", type=float, help="oldest acceptable marker, seconds (default 600)")
    v.add_argument(
        "--no-container-check", action="store_true", help="do not match the container's identity"
    )
    v.add_argument(
        "--accept-privilege-escalation",
        action="store_true",
        help="accept a marker signed where a setuid binary could make a sandbox process root "
        "(setuid true or absent: the container ran without no-new-privileges)",
    )
    v.set_defaults(func=_verify)
    a = p.parse_args(argv)
    try:
        rc: int = a.func(a)
    except MissingExtra as e:
        # One line naming the extra to install, not an ImportError's traceback.
        print(f"quiesce_harness: {e}", file=sys.stderr)
        return 2
    return rc
