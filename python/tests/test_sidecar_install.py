"""The install's place step on this machine's kernel: an upload the sandbox user owns and holds
open for writing cannot reach the binary root then runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from quiesce_harness import sidecar

import support

# Opens the upload for writing as the sandbox user, says so, then writes through that
# descriptor when told: what an agent does between the copy and the run.
_HOLDER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
print("open", flush=True)
sys.stdin.readline()
os.pwrite(fd, b"#!/bin/sh\\necho agent\\n", 0)
print("wrote", flush=True)
"""


def test_a_held_upload_does_not_reach_the_installed_binary() -> None:
    """The sandbox user owns the upload (podman cp into a container run as it) and holds it open
    for writing across the place step, then writes: the installed binary is unchanged."""
    b = support.need_binary()
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        support.skip_log("sidecar install", "needs root and setpriv(1) to hold an upload as 4242")
        pytest.skip("needs root and setpriv(1)")
    # Where the sandbox user can reach the upload by path, as in the sandbox's install dir.
    d = Path(tempfile.mkdtemp(prefix="quiesce-install-"))
    d.chmod(0o755)
    try:
        _place_beside_a_holder(b, d)
    finally:
        shutil.rmtree(d)


def _place_beside_a_holder(b: Path, d: Path) -> None:
    upload = d / ".quiesce.new"
    shutil.copyfile(b, upload)
    os.chown(upload, 4242, 4242)
    held = upload.stat().st_ino
    upload.chmod(0o755)
    holder = subprocess.Popen(
        ["setpriv", "--reuid", "4242", "--regid", "4242", "--clear-groups", "--",
         "/usr/bin/python3", "-c", _HOLDER, str(upload)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "open"
        path = str(d / "quiesce")
        r = subprocess.run(
            ["sh", "-c", sidecar._SCRIPT, "quiesce-install", path, "place"],
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert "ran 0" in r.stdout.decode()
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "wrote"
    finally:
        holder.kill()
        holder.wait(timeout=10)
    installed = d / "quiesce"
    assert installed.stat().st_ino != held
    assert installed.read_bytes() == b.read_bytes()
    st = installed.stat()
    assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o755)
    assert not upload.exists()
    assert sorted(p.name for p in d.iterdir()) == ["quiesce"]
