"""The kit's own execs never look a name up through the container's PATH.

A task image may put a directory the sandbox user owns first on PATH (ENV
PATH=/app/.venv/bin:$PATH). Here that directory holds the sandbox user's `true`, `sh`,
`quiesce`, `stat`, `cat` (and the rest of the names the kit uses), each of which, when run,
appends a line to a proof file before it does what the real one does: freeze(),
start_sidecar() and run_verifier()'s gate, as root, must leave no proof file, with quiesce as
PID 1 and as a sidecar, through the Docker API (which sets the exec's PATH) and through an exec
function that sets no environment (`docker exec` as a harness without an SDK writes it).
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path

import docker
import docker.errors
import pytest

from quiesce_harness import Container, Unreachable, freeze, run_verifier, start_sidecar

import support
from support import SLIM, Box, box, cli_exec

BASE = "debian:bookworm-slim"
FAKES = "/workspace/bin"
PROOF = "/workspace/ran"
IMAGE_PATH = f"{FAKES}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NAMES = ("true", "sh", "bash", "quiesce", "stat", "cat", "kill", "uname", "id", "readlink")
# Each fake records who ran it, then runs the real one (as a forger would, to go unnoticed).
FAKE = """#!/bin/sh
echo "$(/usr/bin/id -u 2>/dev/null || /bin/id -u) ${0##*/} $*" >> %s
for d in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do
    [ "$d" != "${0%%/*}" ] && [ -x "$d/${0##*/}" ] && exec "$d/${0##*/}" "$@"
done
exit 0
"""


def plant(b: Box, where: str = FAKES, names: Sequence[str] = NAMES) -> None:
    """The sandbox user's fakes, first on the container's PATH (or in `where`)."""
    script = shlex.quote(FAKE % PROOF)
    cmd = f"mkdir -p {where} && cd {where} && " + " && ".join(
        f"printf '%s' {script} > {n} && chmod 755 {n}" for n in names
    )
    rc, out = b.ctr.exec_run(["/bin/sh", "-c", cmd], user=support.AGENT_UID)
    assert rc == 0, out
    # The fakes work: the container's PATH finds them (and the proof file is then removed).
    rc, out = b.ctr.exec_run(["/bin/sh", "-c", f"cat {PROOF} && rm {PROOF}"])
    assert rc == 0 and b"0 cat " in out, out


def no_proof(b: Box) -> None:
    """No fake ran as root (the sandbox user's own runs of them, its workloads', are its own)."""
    rc, out = b.ctr.exec_run(["/bin/sh", "-c", f"/bin/cat {PROOF} 2>/dev/null; echo end"])
    assert rc == 0 and isinstance(out, bytes) and out.endswith(b"end\n"), out
    root = [line for line in out.decode().splitlines() if line.startswith("0 ")]
    assert root == [], f"a fake ran as root: {root}"


def containers(b: Box, client: docker.DockerClient) -> list[Container]:
    return [
        Container.docker(b.name, client=client),
        Container.from_exec(cli_exec("docker", b.name), name=b.name),
    ]


def gate(c: Container, nonce: str | None) -> None:
    done = run_verifier(c, ["/bin/true"], nonce=nonce, timeout=60)
    assert done.returncode == 0, done.stderr


def test_quiesce_as_pid1_runs_nothing_of_the_image_path(client: docker.DockerClient) -> None:
    with box(client, SLIM, environment={"PATH": IMAGE_PATH}) as b:
        plant(b)
        # Dockerfiles hand /usr/local/bin to the non-root user (so that `pip install` works):
        # the kit's fixed PATH leaves it out. (A quiesce there, the first place a relative
        # binary is looked for, is refused: the test below.)
        rc, out = b.ctr.exec_run(["/bin/sh", "-c", f"chown {support.AGENT_UID} /usr/local/bin"])
        assert rc == 0, out
        plant(b, "/usr/local/bin", [n for n in NAMES if n != "quiesce"])
        for c in containers(b, client):
            b.start("setsid-writer")
            r = freeze(c)
            assert r.state == "quiescent" and r.killed >= 1 and r.marker
            # The relative default binary was found through the fixed PATH, not /workspace/bin.
            assert c.binary_path() in ("/sbin/quiesce", "/usr/sbin/quiesce")
            gate(c, r.nonce)
            c.read_file("/proc/1/comm")
            c.signal("CONT")
            no_proof(b)


def test_a_relative_binary_in_a_directory_the_sandbox_user_owns_is_refused(
    client: docker.DockerClient,
) -> None:
    with box(client, SLIM) as b:
        # A directory on the fixed PATH that the sandbox user owns, holding its quiesce.
        rc, out = b.ctr.exec_run(["/bin/sh", "-c", f"chown {support.AGENT_UID} /usr/local/sbin"])
        assert rc == 0, out
        rc, out = b.ctr.exec_run(
            ["/bin/sh", "-c", f"cp /sbin/quiesce /usr/local/sbin/quiesce-x && echo > {PROOF}"],
            user=support.AGENT_UID,
        )
        assert rc == 0, out
        with pytest.raises(Unreachable) as e:
            freeze(Container.docker(b.name, binary="quiesce-x", client=client))
        assert "owner 1000" in str(e.value) and "binary=" in str(e.value)
        with pytest.raises(Unreachable) as e:
            freeze(Container.docker(b.name, binary="no-such-quiesce", client=client))
        assert "'no-such-quiesce' not found" in str(e.value) and "binary=" in str(e.value)


def bare(client: docker.DockerClient) -> contextlib.AbstractContextManager[Box]:
    """debian:bookworm-slim running sleep as PID 1, its PATH the sandbox user's first."""
    try:
        client.images.get(BASE)
    except docker.errors.ImageNotFound:
        subprocess.run(["bash", str(support.REPO / "docker/base-images")], check=True)
    return support.foreign_box(
        client, BASE, ["sleep", "infinity"], kind="path-", environment={"PATH": IMAGE_PATH}
    )


@pytest.mark.parametrize("through", ["docker", "exec"])
def test_the_sidecar_runs_nothing_of_the_image_path(
    client: docker.DockerClient, through: str
) -> None:
    b_bin = support.need_binary()
    with bare(client) as b:
        plant(b)
        c = containers(b, client)[0 if through == "docker" else 1]
        sc = start_sidecar(c, support.AGENT_UID, binary=Path(b_bin))
        rc, out = b.ctr.exec_run(
            ["/bin/sh", "-c", "nohup sleep 1000 >/dev/null 2>&1 &"], user=support.AGENT_UID
        )
        assert rc == 0, out
        r = freeze(sc.container)
        assert r.state == "quiescent" and r.killed >= 1 and r.marker
        gate(sc.container, r.nonce)
        no_proof(b)


def test_the_verifiers_own_command_keeps_the_image_path(client: docker.DockerClient) -> None:
    # The task's command is the task's: a bare name there is looked up through the image's
    # PATH, as documented (run_verifier), which is why the gates of the kit name /bin/true.
    with box(client, SLIM, environment={"PATH": IMAGE_PATH}) as b:
        plant(b)
        c = Container.docker(b.name, client=client)
        r = freeze(c)
        done = run_verifier(c, ["true"], nonce=r.nonce, timeout=60)
        assert done.returncode == 0, done.stderr
        rc, out = b.ctr.exec_run(["/bin/cat", PROOF])
        assert rc == 0 and isinstance(out, bytes) and out.startswith(b"0 true"), out
