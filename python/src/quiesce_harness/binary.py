"""The static quiesce binaries that the `quiesce` wheel carries, one per Linux architecture.

Both are in every wheel, whatever the host: a harness on an x86_64 laptop puts the aarch64 one
into an arm64 sandbox. A source checkout (the dev install python/test makes) has none.
"""

from __future__ import annotations

import platform
from pathlib import Path

# Where scripts/release_tools.py's `wheel` step puts them, named by Rust target.
BIN_DIR = Path(__file__).resolve().parent / "bin"

# Linux's (uname -m) and Docker's/Debian's names of the two architectures; macOS says arm64.
_TARGETS = {
    "x86_64": "x86_64-unknown-linux-musl",
    "amd64": "x86_64-unknown-linux-musl",
    "aarch64": "aarch64-unknown-linux-musl",
    "arm64": "aarch64-unknown-linux-musl",
}


def binary_path(arch: str | None = None) -> Path:
    """The static quiesce binary for `arch` ("x86_64"/"amd64" or "aarch64"/"arm64", any case;
    None: this host's machine), to copy into a Linux sandbox or run on a Linux host.

    Raises ValueError for another architecture, FileNotFoundError when this install carries no
    binaries (a source checkout rather than the wheel).
    """
    machine = platform.machine() if arch is None else arch
    target = _TARGETS.get(machine.lower())
    if target is None:
        whose = "this host's machine" if arch is None else "architecture"
        raise ValueError(
            f"no quiesce binary for {whose} {machine!r}: there are x86_64 (amd64) and "
            "aarch64 (arm64); pass one of them"
        )
    path = BIN_DIR / f"quiesce-{target}"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: this install of quiesce_harness carries no quiesce binaries (a source "
            "checkout has none): install the wheel that scripts/release writes into dist/ "
            "(pip install dist/quiesce-VERSION-py3-none-any.whl)"
        )
    return path
