"""quiesce_harness: freeze an agent's sandbox through quiesce and score only behind its proof.

from quiesce_harness import Container, freeze, run_verifier

box = Container.docker("task-1")
result = freeze(box)                       # raises FreezeFailed / Unreachable
run_verifier(box, ["./run-tests.sh"], nonce=result.nonce)

Where PID 1 is not quiesce, start_sidecar(box, "agent") puts it beside it (see sidecar.py).
"""

from .attestation import verify_attestation
from .binary import binary_path
from .container import Container, ExecResult
from .errors import (
    AttestationInvalid,
    FreezeFailed,
    InstallFailed,
    MarkerInvalid,
    QuiesceError,
    SidecarRefused,
    Unreachable,
)
from .freeze import freeze
from .marker import key_id, verify_marker
from .provider import SandboxExec, SandboxKill, SandboxUpload
from .result import FreezeResult, Survivor
from .sidecar import Sidecar, start_sidecar
from .verifier import GATE_EXIT_CODES, HAND_OVER_EXIT, HandOver, run_verifier

__all__ = [
    "GATE_EXIT_CODES",
    "HAND_OVER_EXIT",
    "AttestationInvalid",
    "Container",
    "ExecResult",
    "FreezeFailed",
    "FreezeResult",
    "HandOver",
    "InstallFailed",
    "MarkerInvalid",
    "QuiesceError",
    "SandboxExec",
    "SandboxKill",
    "SandboxUpload",
    "Sidecar",
    "SidecarRefused",
    "Survivor",
    "Unreachable",
    "binary_path",
    "freeze",
    "key_id",
    "run_verifier",
    "start_sidecar",
    "verify_attestation",
    "verify_marker",
]
__version__ = "0.1.0"
