"""freeze(): ask the init for a freeze and return only a result it read back.

The normal path is one exec of `quiesce freeze --wait --json --nonce N`, whose client waits for
the result of its own request. Where no exec can start (the sandbox holds the pids limit), the
init is signalled through the engine, which needs no process in the container; once that
freeze has freed the pids and an exec starts again, the nonce-bound freeze runs as usual, so
every result carries the caller's nonce and comes from the init's own answer.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any

from .container import Container, ExecResult
from .errors import FreezeFailed, Unreachable

# How often the engine's signal is sent again while no exec can start: a bare signal makes one
# freeze each, so a freeze that could not finish the bomb gets another.
_RESIGNAL_S = 2.0
_POLL_S = 0.05


@dataclass(frozen=True)
class Survivor:
    pid: int
    uid: int | None
    state: str | None
    comm: str | None


@dataclass(frozen=True)
class FreezeResult:
    """A freeze's final status as the init wrote it (`status.json`'s format, docs/marker.md)."""

    state: str
    freeze_id: str | None
    killed: int
    survivors: list[Survivor]
    reason: str | None
    phases_ms: dict[str, int]
    marker: str | None
    nonce: str | None = None
    # True when the engine's signal had to reach the init first (no exec could start).
    via_signal: bool = False
    # The status of the signal's freeze, read once an exec started again (via_signal only).
    signal_status: dict[str, Any] | None = None
    elapsed_s: float = 0.0
    status: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def quiescent(self) -> bool:
        return self.state == "quiescent"


def _survivors(status: dict[str, Any]) -> list[Survivor]:
    out = []
    for s in status.get("survivors") or []:
        if isinstance(s, dict):
            out.append(
                Survivor(
                    pid=int(s.get("pid", 0)),
                    uid=s.get("uid"),
                    state=s.get("state"),
                    comm=s.get("comm"),
                )
            )
    return out


def _json(r: ExecResult) -> dict[str, Any] | None:
    try:
        v = json.loads(r.stdout.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return v if isinstance(v, dict) else None


def _jti(jws: str) -> str | None:
    """The freeze id a marker names, read without checking it (verify_marker checks)."""
    try:
        payload = jws.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return None
    jti = claims.get("jti") if isinstance(claims, dict) else None
    return jti if isinstance(jti, str) else None


def _remaining(deadline: float) -> float:
    return deadline - time.monotonic()


_SEP = b"\n--quiesce-harness-marker--\n"
# One exec for the freeze and its marker where the image has a shell: each exec costs the engine
# about 0.1 s. The shell forks once for quiesce and once for cat; where it cannot (a pids limit)
# quiesce never ran, no status comes back, and freeze() takes the path without a shell.
_WITH_MARKER = '"$0" "$@"; rc=$?; [ $rc = 0 ] && printf %s $SEP && cat $MARKER; exit $rc'


def _freeze_argv(c: Container, nonce: str, deadline: float) -> tuple[list[str], int]:
    wait_s = max(1, int(_remaining(deadline)))
    argv = c.quiesce("freeze", "--wait", "--json", "--nonce", nonce, "--timeout", str(wait_s))
    return argv, wait_s


def _run_freeze(c: Container, nonce: str, deadline: float) -> ExecResult:
    argv, wait_s = _freeze_argv(c, nonce, deadline)
    return c.exec(argv, timeout=wait_s + 10)


def _run_freeze_with_marker(
    c: Container, nonce: str, deadline: float
) -> tuple[ExecResult, bytes | None] | None:
    """The freeze and the marker in one exec through sh; None when sh did not run it (no sh).

    A shell that started but could not fork quiesce says the pids limit is held: that comes
    back as an exec that did not start, so that freeze() goes to the engine's signal at once
    rather than wait on more execs in a container the bomb keeps busy.
    """
    argv, wait_s = _freeze_argv(c, nonce, deadline)
    marker = f"{c.state_dir}/quiescence.jws"
    sep = _SEP.decode()
    script = _WITH_MARKER.replace("$SEP", _shq(sep)).replace("$MARKER", _shq(marker))
    r = c.exec(["sh", "-c", script, *argv], timeout=wait_s + 10)
    if not r.started:
        return r, None
    head, found, tail = r.stdout.partition(_SEP)
    r = ExecResult(r.returncode, head, r.stderr, started=True)
    if _json(r) is None:
        if r.returncode == 2 and _CANNOT_FORK.search(r.stderr.decode("utf-8", "replace")):
            return ExecResult(126, b"", r.stderr, started=False), None
        return None
    return r, (tail if found else None)


# dash, bash and busybox sh, when fork() fails.
_CANNOT_FORK = re.compile(r"cannot fork|can't fork|fork: retry|fork: resource", re.IGNORECASE)


def _shq(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def _await_signal_freeze(c: Container, deadline: float) -> dict[str, Any] | None:
    """Signal the init, then wait until an exec starts and status.json is final."""
    c.signal()
    last_signal = time.monotonic()
    status_path = f"{c.state_dir}/status.json"
    while _remaining(deadline) > 0:
        r = c.exec(["cat", status_path], timeout=max(1.0, _remaining(deadline)))
        if r.started:
            st = _json(r) if r.returncode == 0 else None
            if st is not None and st.get("state") in ("quiescent", "failed"):
                return st
            if r.returncode != 0 and b"no such file" not in r.stderr.lower():
                # cat ran but could not read: an image without cat still lets freeze run.
                return None
        elif time.monotonic() - last_signal > _RESIGNAL_S:
            c.signal()
            last_signal = time.monotonic()
        time.sleep(_POLL_S)
    raise Unreachable(
        f"{c.name}: signalled the init ({c.freeze_signal}) but no exec could start before the "
        "timeout: the sandbox may still hold the pids limit; score nothing"
    )


def freeze(container: Container, nonce: str | None = None, timeout: float = 30.0) -> FreezeResult:
    """Freeze the sandbox; return the init's `quiescent` result, or raise.

    Raises FreezeFailed (with the survivors) when the init answers `failed`, and Unreachable
    when the init cannot be reached or found; a result is returned only when it was read.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout
    nonce = nonce if nonce is not None else secrets.token_hex(16)
    via_signal = False
    signal_status = None
    marker_bytes: bytes | None = None
    both = _run_freeze_with_marker(container, nonce, deadline) if container.use_shell else None
    if both is not None:
        r, marker_bytes = both
    else:
        r = _run_freeze(container, nonce, deadline)
    if not r.started:
        via_signal = True
        signal_status = _await_signal_freeze(container, deadline)
        both = _run_freeze_with_marker(container, nonce, deadline) if container.use_shell else None
        if both is not None and both[0].started:
            r, marker_bytes = both
        else:
            r = _run_freeze(container, nonce, deadline)
        if not r.started:
            raise Unreachable(f"{container.name}: no exec can start ({r.text})")
    if r.returncode == 127:
        raise Unreachable(
            f"{container.name}: quiesce not found at {container.binary!r} in the container "
            f"({r.text}); pass binary= (e.g. /sbin/docker-init when the engine injects it)"
        )
    status = _json(r)
    if status is None or r.returncode not in (0, 1):
        raise Unreachable(f"{container.name}: quiesce freeze exited {r.returncode}: {r.text}")
    if status.get("nonce") != nonce:
        raise Unreachable(
            f"{container.name}: the freeze answered with nonce {status.get('nonce')!r}, "
            "not this request's"
        )
    base = FreezeResult(
        state="quiescent" if r.returncode == 0 and status.get("state") == "quiescent" else "failed",
        freeze_id=status.get("id"),
        killed=int(status.get("killed") or 0) + int((signal_status or {}).get("killed") or 0),
        survivors=_survivors(status),
        reason=status.get("reason"),
        phases_ms={k: int(v) for k, v in (status.get("phases_ms") or {}).items()},
        marker=None,
        nonce=nonce,
        via_signal=via_signal,
        signal_status=signal_status,
        status=status,
    )
    if not base.quiescent:
        raise FreezeFailed(replace(base, elapsed_s=time.monotonic() - t0))
    marker: str | None = None
    if marker_bytes is None:
        m = container.exec(["cat", f"{container.state_dir}/quiescence.jws"], timeout=30)
        if m.started and m.returncode == 0:
            marker_bytes = m.stdout
    if marker_bytes is not None:
        text = marker_bytes.decode("ascii", "replace").strip()
        # A later freeze replaces the marker: only this freeze's is this result's.
        marker = text if _jti(text) == status.get("id") else None
    return replace(base, marker=marker, elapsed_s=time.monotonic() - t0)
