"""What a freeze answered: the init's final status, as the kit hands it to a harness.

It imports nothing of the kit: errors.py (FreezeFailed carries a result) and freeze.py (which
makes one) both build on it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
