"""The three ways a harness learns it must not score."""

from __future__ import annotations

from .result import FreezeResult, Survivor


class QuiesceError(Exception):
    """Base of every error the kit raises: catch it to mean "do not score"."""


class Unreachable(QuiesceError):
    """The init could not be reached or found, so no result was read.

    Never means "quiescent": the sandbox may still be running.
    """


class FreezeFailed(QuiesceError):
    """The init answered, and its answer is `failed`: processes of the sandbox may be alive."""

    def __init__(self, result: FreezeResult) -> None:
        self.result = result
        self.survivors: list[Survivor] = list(result.survivors)
        super().__init__(
            f"freeze {result.freeze_id or '?'} failed: {result.reason or 'no reason given'}"
            f" ({len(self.survivors)} survivor(s))"
        )


class AttestationInvalid(QuiesceError):
    """The attestation failed one check; `check` names which and `reason` says why."""

    def __init__(self, check: str, reason: str) -> None:
        self.check = check
        self.reason = reason
        super().__init__(f"attestation refused ({check}): {reason}")


class MarkerInvalid(QuiesceError):
    """The marker failed one check; `check` names which and `reason` says why."""

    def __init__(self, check: str, reason: str) -> None:
        self.check = check
        self.reason = reason
        super().__init__(f"marker refused ({check}): {reason}")


class SidecarRefused(QuiesceError):
    """`quiesce sidecar` refused to start; `line` is what it said (one line naming the fix)
    and `returncode` its exit code (2 for its refusals)."""

    def __init__(self, line: str, returncode: int) -> None:
        self.line = line
        self.returncode = returncode
        super().__init__(f"quiesce sidecar refused to start (exit {returncode}): {line}")


class InstallFailed(QuiesceError):
    """quiesce could not be put into the sandbox, or not run from where it was put; the
    message names the path and the fix."""
