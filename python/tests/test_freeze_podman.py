"""freeze() and run_verifier() through rootful Podman's client, on a real container."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator

import docker
import pytest

from quiesce_harness import Container, Unreachable, freeze, run_verifier, verify_marker

import support

# Podman's default rlimits need CAP_SYS_RESOURCE, which root may lack here (docker/matrix).
# no-new-privileges, as the docs ask: run_verifier refuses a marker signed without it.
RUN = [
    "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--network", "none",
    "--security-opt", support.SECURITY_OPT,
]  # fmt: skip


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=120, check=check
    )


@pytest.fixture(scope="module")
def image(client: docker.DockerClient) -> str:
    if shutil.which("podman") is None:
        support.skip_log("podman", "podman is not installed (docker/matrix installs it)")
        pytest.skip("no podman")
    if podman("info", check=False).returncode != 0:
        support.skip_log("podman", "podman info fails here")
        pytest.skip("podman info fails")
    want = str(client.images.get(support.SLIM).id).removeprefix("sha256:")
    have = podman("image", "inspect", "--format", "{{.Id}}", support.SLIM, check=False).stdout
    if have.strip() != want:
        save = subprocess.Popen(["docker", "save", support.SLIM], stdout=subprocess.PIPE)
        subprocess.run(["podman", "load", "-q"], stdin=save.stdout, check=True, timeout=300)
        save.wait(timeout=60)
    return f"localhost/{support.SLIM}"


@pytest.fixture
def ctr(image: str) -> Iterator[str]:
    name = f"{support.PREFIX}pm-{uuid.uuid4().hex[:8]}"
    podman("run", "-d", "--name", name, "--pids-limit", str(support.PIDS_LIMIT), *RUN, image)
    try:
        support.until(
            lambda: (
                podman(
                    "exec", name, "test", "-s", "/run/quiesce/sandbox.json", check=False
                ).returncode
                == 0
            ),
            15,
            "the init never wrote sandbox.json",
        )
        yield name
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)


def agents(name: str) -> int:
    """Live agent processes, by `podman top` (user, host pid) and the host's /proc (state)."""
    out = podman("top", name, "user", "hpid", check=False).stdout.splitlines()[1:]
    n = 0
    for line in out:
        user, hpid = line.split()[:2]
        if user not in ("agent", "1000"):
            continue
        try:
            with open(f"/proc/{hpid}/stat") as f:
                alive = f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            alive = False  # exited since podman listed it
        except (OSError, IndexError):
            alive = True  # unreadable is unknown, never gone
        n += alive
    return n


@pytest.mark.parametrize("workload", ["setsid-writer", "fork-bomb"])
def test_podman_freeze(ctr: str, workload: str) -> None:
    podman("exec", "-d", "-u", "agent", ctr, "sh", "-c", support.WORKLOADS[workload])
    support.until(lambda: agents(ctr) >= (100 if workload == "fork-bomb" else 2), 30, "no workload")
    c = Container.podman(ctr)
    r = freeze(c, nonce="pm-1")
    assert r.state == "quiescent" and agents(ctr) == 0
    assert r.marker is not None
    pem = c.read_file("/run/quiesce/signing.pub")
    assert verify_marker(r.marker, pem, nonce="pm-1", container=c)["jti"] == r.freeze_id
    done = run_verifier(c, "echo scored", nonce="pm-1")
    assert (done.returncode, done.stdout) == (0, b"scored\n")


def test_podman_unreachable() -> None:
    if shutil.which("podman") is None:
        pytest.skip("no podman")
    with pytest.raises(Unreachable):
        freeze(Container.podman("qhk-no-such-container"), timeout=5)


def test_podman_exec_sets_the_environment_it_is_given() -> None:
    # The argv alone: run_verifier sets QUIESCE_ACCEPT_PRIVILEGE_ESCALATION=0 this way.
    c = Container.podman("box", podman="/usr/bin/podman")
    argv = c._cli_exec_argv(["quiesce", "verify"], "agent", {"QUIESCE_X": "0"})
    assert argv == [
        "/usr/bin/podman", "exec", "-u", "agent", "-e", "QUIESCE_X=0", "box", "quiesce", "verify",
    ]  # fmt: skip


def test_podman_exec_with_stdin_keeps_it_open() -> None:
    # The argv alone: exec_with_stdin's input reaches the command only with -i.
    c = Container.podman("box")
    argv = c._cli_exec_argv(["sh", "-c", "cat > /x"], "0", interactive=True)
    assert argv == ["podman", "exec", "-i", "-u", "0", "box", "sh", "-c", "cat > /x"]
