"""Fixtures: the real binary as PID 1 of a PID namespace, and a real Docker engine."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import docker
import pytest

import support


@dataclass(frozen=True)
class Marker:
    jws: str
    public_pem: bytes
    nonce: str
    identity: dict[str, object]


def _make_marker(nonce: str, *, setuid: bool = False) -> Marker:
    """A freeze by the real init as PID 1 of a new PID namespace, one sandbox process killed.

    Without `setuid` the marker says `setuid: false`, with it `setuid: true` (support.run_init).
    """
    b = support.need_init("markers")
    with support.scratch("qhk-marker-") as d:
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
        support.run_init(b, s, script, setuid=setuid)
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
    yield from support.docker_client("docker")
