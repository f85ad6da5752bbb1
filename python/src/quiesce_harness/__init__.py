"""quiesce_harness: freeze an agent's sandbox through quiesce and score only behind its proof.

from quiesce_harness import Container, freeze, run_verifier

box = Container.docker("task-1")
result = freeze(box)                       # raises FreezeFailed / Unreachable
run_verifier(box, ["./run-tests.sh"], nonce=result.nonce)
"""

from .container import Container, ExecResult
from .errors import FreezeFailed, MarkerInvalid, QuiesceError, Unreachable
from .freeze import FreezeResult, Survivor, freeze
from .marker import key_id, verify_marker
from .verifier import GATE_EXIT_CODES, run_verifier

__all__ = [
    "GATE_EXIT_CODES",
    "Container",
    "ExecResult",
    "FreezeFailed",
    "FreezeResult",
    "MarkerInvalid",
    "QuiesceError",
    "Survivor",
    "Unreachable",
    "freeze",
    "key_id",
    "run_verifier",
    "verify_marker",
]
__version__ = "0.1.0"
