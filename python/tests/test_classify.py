"""The engines' answers to an exec, read apart from what the command printed (parsing only)."""

from __future__ import annotations

from quiesce_harness.container import _classify

RUNC = b"OCI runtime exec failed: exec failed: unable to start container process: read init-p: "
MISSING = (
    b'OCI runtime exec failed: exec failed: unable to start container process: exec: "/x": '
    b"stat /x: no such file or directory: unknown"
)


def test_an_exec_the_runtime_could_not_start() -> None:
    r = _classify(126, b"", RUNC + b"connection reset by peer")
    assert not r.started
    assert not _classify(125, b"", b"crun: fork: Resource temporarily unavailable").started


def test_a_missing_executable_is_127_and_started() -> None:
    r = _classify(126, b"", MISSING)
    assert (r.started, r.returncode) == (True, 127)


def test_what_the_sandbox_wrote_is_never_read_as_the_engines_answer() -> None:
    # A failed freeze names its survivors, whose comm the sandbox chose.
    out = b'{"state": "failed", "survivors": [{"comm": "OCI runtime exec failed"}]}'
    for rc in (0, 1, 2):
        assert _classify(rc, out, b"resource temporarily unavailable").started
