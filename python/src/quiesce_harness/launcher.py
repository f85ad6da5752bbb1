"""The `quiesce` command the wheel puts on PATH: the packaged static binary for this machine.

It execs the binary in its own place (same pid, same arguments, same environment), so a
`quiesce` started as a container's PID 1 or as a freeze client is the binary itself and not a
Python process standing in front of it.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Sequence

from .binary import binary_path


def _refuse(msg: str) -> int:
    print(f"quiesce: {msg}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Exec the binary with `argv` (default sys.argv; argv[0] names the command). Returns only
    when it cannot: 2 on a host it has no binary for, 126 when the exec fails."""
    args = list(sys.argv if argv is None else argv)
    system, machine = platform.system(), platform.machine()
    fix = (
        "to put quiesce into a Linux sandbox from here, copy "
        'quiesce_harness.binary_path("x86_64") or binary_path("aarch64") into it'
    )
    if system != "Linux":
        return _refuse(
            f"this is {system} on {machine or 'an unknown machine'}, and the quiesce binary "
            f"runs on Linux only (x86_64, aarch64): {fix}"
        )
    try:
        path = binary_path()
    except ValueError:
        return _refuse(
            f"this Linux machine is {machine!r}, and the wheel has quiesce binaries for x86_64 "
            f"and aarch64 only: {fix}"
        )
    except FileNotFoundError as e:
        return _refuse(str(e))
    try:
        # The packaged binary by its absolute path, never a shell or a PATH lookup.
        os.execv(path, [args[0] if args else "quiesce", *args[1:]])  # noqa: S606
    except OSError as e:
        print(
            f"quiesce: cannot run {path}: {e.strerror}: reinstall the quiesce wheel "
            "(pip install --force-reinstall quiesce-VERSION-py3-none-any.whl)",
            file=sys.stderr,
        )
        return 126
