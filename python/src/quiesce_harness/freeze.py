"""freeze(): ask the init for a freeze and return only a result it read back.

The normal path is one exec of `quiesce freeze --wait --json --nonce N`, whose client waits for
the result of its own request and prints it with the freeze's marker (no shell or `cat` needed
in the image). Where no exec can start (the sandbox holds the pids limit), the
init is signalled through the engine, which needs no process in the container; once that
freeze has freed the pids and an exec starts again, the nonce-bound freeze runs as usual, so
every result carries the caller's nonce and comes from the init's own answer.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import replace
from typing import Any

from .container import Container, ExecResult
from .errors import FreezeFailed, Unreachable
from .result import FreezeResult, Survivor

# How often the engine's signal is sent again while no exec can start: a bare signal makes one
# freeze each, so a freeze that could not finish the bomb gets another.
_RESIGNAL_S = 2.0
_POLL_S = 0.05


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


# Exit codes of an exec whose process was SIGKILLed (a shell's 128+9; Python's -9).
_KILLED = (137, -9)
# How often an exec killed before it said anything is asked again.
_KILLED_RETRIES = 2


def _run_freeze(c: Container, nonce: str, deadline: float) -> ExecResult:
    """One `quiesce freeze` exec; asked again (twice at most, within the deadline) when its
    process was killed before it printed anything. Runtimes do that to an exec they could not
    finish joining to a container at its pids limit (runc: "error executing setns process"),
    which a sidecar's container, whose PID 1 the engine's signal cannot reach for it, meets;
    each ask is its own request, and only an answer carrying this nonce is read."""
    found = c.find_binary()
    if isinstance(found, ExecResult):
        return found
    for attempt in range(_KILLED_RETRIES + 1):
        wait_s = max(1, int(_remaining(deadline)))
        argv = c.quiesce("freeze", "--wait", "--json", "--nonce", nonce, "--timeout", str(wait_s))
        r = c.exec(argv, timeout=wait_s + 10)
        killed_silent = r.returncode in _KILLED and not r.stdout.strip()
        if not killed_silent or attempt == _KILLED_RETRIES or _remaining(deadline) < 1.0:
            return r
        time.sleep(_POLL_S)
    return r


def _marker(c: Container, status: dict[str, Any]) -> str | None:
    """This freeze's marker: from the freeze's own JSON, or the file for older binaries.

    `quiesce freeze --json` carries `marker` (null when it could not read it as verify would),
    so one exec does it all and the image needs no shell or cat. Binaries before that key print
    none: then the marker is read with `cat` in a second exec.
    """
    if "marker" in status:
        m = status["marker"]
        text = m.strip() if isinstance(m, str) else None
    else:
        r = c.exec(["cat", f"{c.state_dir}/quiescence.jws"], timeout=30)
        ok = r.started and r.returncode == 0
        text = r.stdout.decode("ascii", "replace").strip() if ok else None
    # A later freeze replaces the marker: only this freeze's is this result's.
    return text if text is not None and _jti(text) == status.get("id") else None


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
    return _freeze(container, nonce, timeout, again=True)


def _freeze(container: Container, nonce: str | None, timeout: float, again: bool) -> FreezeResult:
    """freeze(); `again`: a failed freeze that left nothing alive may be asked once more."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    nonce = nonce if nonce is not None else secrets.token_hex(16)
    via_signal = False
    signal_status = None
    r = _run_freeze(container, nonce, deadline)
    if not r.started:
        via_signal = True
        signal_status = _await_signal_freeze(container, deadline)
        r = _run_freeze(container, nonce, deadline)
        if not r.started:
            raise Unreachable(f"{container.name}: no exec can start ({r.text})")
    if r.returncode == 127:
        raise Unreachable(
            f"{container.name}: quiesce not found at {container.binary!r} in the container "
            f"({r.text}); pass binary= (e.g. /quiesce, the binary bound read-only there beside "
            "the engine's injected init: docs/threat-model.md, The way in)"
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
        failed = replace(base, elapsed_s=time.monotonic() - t0)
        # A freeze that killed everything it found and still could not show a quiet table
        # (a bomb's last processes held the pids limit until the init reaped them) is asked
        # once more: the next one starts from an empty sandbox. Anything left alive is final.
        if again and not base.survivors and _remaining(deadline) > 1.0:
            try:
                second = _freeze(container, nonce, _remaining(deadline), again=False)
            except FreezeFailed:
                raise FreezeFailed(failed) from None
            return replace(
                second, killed=second.killed + failed.killed, elapsed_s=time.monotonic() - t0
            )
        raise FreezeFailed(failed)
    marker = _marker(container, status)
    return replace(base, marker=marker, elapsed_s=time.monotonic() - t0)
