"""Fixtures: the real binary as PID 1 of a PID namespace, and a real Docker engine."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import pytest

import support


@dataclass(frozen=True)
class Marker:
    jws: str
    public_pem: bytes
    nonce: str
    identity: dict[str, object]


def _need_binary() -> Path:
    b = support.binary()
    if not b.exists():
        pytest.fail(f"no quiesce binary at {b}: run `cargo build --release` (or set QUIESCE_BIN)")
    return b


def _make_marker(nonce: str, *, setuid: bool = False) -> Marker:
    """A freeze by the real init as PID 1 of a new PID namespace, one sandbox process killed.

    The init runs with no_new_privs, as `--security-opt no-new-privileges` starts it, so that
    the marker says `setuid: false`; with `setuid`, without it (Docker's default), so that it
    says `setuid: true`.
    """
    b = _need_binary()
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None:
        support.skip_log("markers", "needs root, unshare(1) and setpriv(1) to run the init")
        pytest.skip("needs root, unshare(1) and setpriv(1)")
    d = Path(tempfile.mkdtemp(prefix="qhk-marker-"))
    s = d / "state"
    script = f"""
set -e
while [ ! -s {s}/sandbox.json ]; do sleep 0.01; done
setpriv --reuid 4242 --regid 4242 --clear-groups sleep 100 &
while ! grep -qs '^Uid:.*4242' /proc/$!/status; do sleep 0.01; done
{b} freeze --state-dir {s} --wait --nonce {nonce} >/dev/null
cat /proc/sys/kernel/random/boot_id /proc/sys/kernel/hostname > {d}/ids
stat -L -c %i /proc/1/ns/pid >> {d}/ids
cut -d')' -f2- /proc/1/stat | awk '{{print $20}}' >> {d}/ids
cp {s}/quiescence.jws {s}/signing.pub {d}/
"""
    try:
        subprocess.run(
            [
                *([] if setuid else support.NO_NEW_PRIVS),
                "unshare",
                "--pid",
                "--fork",
                "--mount-proc",
                str(b),
                "--sandbox-user",
                "4242",
                "--state-dir",
                str(s),
                "--after-freeze",
                "exit",
                "--",
                "sh",
                "-c",
                script,
            ],
            check=True,
            timeout=60,
            capture_output=True,
        )
        boot_id, hostname, pid_ns, start = (d / "ids").read_text().split("\n")[:4]
        return Marker(
            jws=(d / "quiescence.jws").read_text().strip(),
            public_pem=(d / "signing.pub").read_bytes(),
            nonce=nonce,
            identity={
                "boot_id": boot_id,
                "hostname": hostname,
                "pid_ns": int(pid_ns),
                "init_start": int(start),
            },
        )
    except subprocess.CalledProcessError as e:
        pytest.fail(f"the init's freeze failed: {e.stderr.decode(errors='replace')}")
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def marker() -> Marker:
    return _make_marker("nonce-a-" + os.urandom(8).hex())


@pytest.fixture(scope="session")
def setuid_marker() -> Marker:
    """A marker from an init that ran without no_new_privs: it says `setuid: true`."""
    return _make_marker("nonce-s-" + os.urandom(8).hex(), setuid=True)


@pytest.fixture(scope="session")
def other_marker() -> Marker:
    """A marker from another init, in another PID namespace, with its own key and nonce."""
    return _make_marker("nonce-b-" + os.urandom(8).hex())


@pytest.fixture(scope="session")
def client() -> Iterator[docker.DockerClient]:
    """A Docker engine that answers, with the kit's test images built on it."""
    try:
        c = docker.from_env(timeout=300)
        c.ping()
    except docker.errors.DockerException as e:
        support.skip_log("docker", f"no Docker engine answers ({e}); start one with docker/engine")
        pytest.skip("no Docker engine answers")
    _need_binary()
    support.build_images(c)
    yield c
    for ctr in c.containers.list(all=True, filters={"label": support.LABEL}):
        if str(ctr.name).startswith(support.PREFIX):
            ctr.remove(force=True)
    c.close()
