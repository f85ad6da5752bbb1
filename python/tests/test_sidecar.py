"""start_sidecar() on real containers whose PID 1 is not quiesce, reached only through
Container.from_exec over `docker exec -i` (and `podman exec -i`; beside tini through asyncio's
subprocesses, run on the kit's own loop): the hostile workloads run as
the sandbox user through `quiesce exec`, freeze() through the sidecar, the marker checked with
the key its start printed, the verifier behind `quiesce verify`; and each refused start."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from quiesce_harness import (
    Container,
    FreezeFailed,
    FreezeResult,
    InstallFailed,
    SidecarRefused,
    freeze,
    run_verifier,
    start_sidecar,
    verify_marker,
)
from quiesce_harness.sidecar import DEFAULT_INSTALL_PATH, _install

import support
from support import PREFIX, Box, cli_exec, cli_exec_async

UID = support.AGENT_UID  # a bare UID: the images name no such user
BASE = "debian:bookworm-slim"
BUSYBOX = f"{PREFIX}busybox"
# What each image runs as PID 1 (Docker's --init: its tini, then sleep).
PID1 = {
    "sleep": (BASE, ["sleep", "infinity"], False),
    "tini": (BASE, ["sleep", "infinity"], True),
    "sh-loop": (BASE, ["sh", "-c", "while :; do sleep 1; done"], False),
    "busybox": (BUSYBOX, ["sleep", "1000000"], False),
}
# The hostile workloads need perl, which the busybox image has not: its own is the writer.
# The bomb runs under `quiesce exec --nproc` (BOMB_NPROC, below the pids limit), as
# orchestrator.md says to, so that root's execs, the freeze's among them, still start. Beside a
# PID 1 that never reaps (sleep), every process the bomb loses stays a zombie holding its pid:
# with the respawning chain's links beside it, the pids limit fills, the sidecar has no pid for
# its final look, and the freeze rightly fails (no marker); there the bomb is left out.
BOMB_NPROC = support.PIDS_LIMIT // 2
WORKLOADS = {
    "sleep": ["setsid-writer", "respawn-chain", "fd-writer"],
    "tini": ["setsid-writer", "respawn-chain", "fd-writer", "fork-bomb"],
    "sh-loop": ["setsid-writer", "respawn-chain", "fd-writer", "fork-bomb"],
    "busybox": ["setsid-writer"],
}


@pytest.fixture(scope="module")
def client() -> Iterator[docker.DockerClient]:
    """A Docker engine that answers, with debian:bookworm-slim (the kit's own images, which
    the other modules build, are not needed: no image here has quiesce in it)."""
    try:
        c = docker.from_env(timeout=300)
        c.ping()
    except docker.errors.DockerException as e:
        support.skip_log("sidecar", f"no Docker engine answers ({e}); start one with docker/engine")
        pytest.skip("no Docker engine answers")
    try:
        c.images.get(BASE)
    except docker.errors.ImageNotFound:
        subprocess.run(["bash", str(support.REPO / "docker/base-images")], check=True)
    yield c
    c.close()


@pytest.fixture(scope="module")
def quiesce_bin(client: docker.DockerClient) -> Path:
    """The release binary, where it has the sidecar subcommand."""
    b = support.need_binary()
    p = subprocess.run([str(b), "sidecar", "--help"], capture_output=True, timeout=30, check=False)
    if p.returncode != 0:
        support.skip_log("sidecar", f"{b} has no sidecar subcommand: build one with it")
        pytest.skip(f"{b} has no sidecar subcommand")
    return b


@pytest.fixture(scope="module")
def busybox_image(client: docker.DockerClient) -> str:
    """FROM scratch with the host's static BusyBox (Debian's busybox-static) and nothing else."""
    bb = shutil.which("busybox")
    static = bb is not None and b"ld-linux" not in Path(bb).read_bytes()[:4096]
    if bb is None or not static:
        support.skip_log(
            "sidecar busybox", "no static busybox here (apt-get install busybox-static)"
        )
        pytest.skip("no static busybox binary")
    with tempfile.TemporaryDirectory() as ctx:
        root = Path(ctx) / "root"
        for d in ("bin", "run", "tmp", "proc", "workspace"):
            (root / d).mkdir(parents=True)
        (root / "tmp").chmod(0o1777)
        shutil.copy(bb, root / "bin/busybox")
        (Path(ctx) / "Dockerfile").write_text(
            'FROM scratch\nCOPY root/ /\nRUN ["/bin/busybox", "--install", "-s", "/bin"]\n'
            "ENV PATH=/bin\n"
        )
        client.images.build(path=ctx, tag=BUSYBOX, rm=True, labels={support.LABEL: "1"})
    return BUSYBOX


def plain_box(
    client: docker.DockerClient, pid1: str = "sleep", *, workspace: bool = True, **run: Any
) -> contextlib.AbstractContextManager[Box]:
    """A container whose PID 1 is `pid1`'s, not quiesce, with /workspace the sandbox user's."""
    image, cmd, init = PID1[pid1]
    return support.foreign_box(
        client, image, cmd, kind="sc-", workspace=workspace, init=init, **run
    )


def outside_parents(b: Box) -> list[int]:
    """Host pids of the container's processes whose parent is outside it, by `docker top` and
    the engine's record (no exec): PID 1 alone, once every exec has ended (an exec's process is
    a child of the engine's shim, outside the container)."""
    top = b.client.api.top(b.id, ps_args="-o pid,ppid")
    procs = [(int(p[0]), int(p[1])) for p in top["Processes"] or []]
    pids = {pid for pid, _ in procs}
    return sorted(pid for pid, ppid in procs if ppid not in pids)


def host_pid1(b: Box) -> int:
    b.ctr.reload()
    return int(b.ctr.attrs["State"]["Pid"])


def launch(b: Box, sc_binary: str, workload: str, nproc: int | None = None) -> None:
    """A workload as the sandbox user through `quiesce exec [--nproc N]`, detached."""
    cap = ["--nproc", str(nproc)] if nproc is not None else []
    cmd = [sc_binary, "exec", "--user", UID, *cap, "--", "sh", "-c", support.WORKLOADS[workload]]
    # The runtime now and then fails to join a busy container ("error executing setns
    # process"): that launch is tried again, a few times.
    for attempt in range(3):
        try:
            e = b.client.api.exec_create(b.id, cmd)
            b.client.api.exec_start(e["Id"], detach=True)
            return
        except docker.errors.APIError:
            if attempt == 2:
                raise
            time.sleep(0.5)


def freeze_beside(pid1: str, c: Container, nonce: str) -> tuple[FreezeResult, int]:
    """freeze(); beside the shell loop, asked up to three times. The loop's PID 1 starts a root
    `sleep` every second, which no parent can vouch for to the sidecar (PID 1 is not its to
    trust): a freeze that sees one start fails, naming it, and the next may not. Returns the
    last result and how many processes all the attempts killed (a failed one kills too, so the
    one that signs may find nothing left to kill)."""
    killed = 0
    for _ in range(2 if pid1 == "sh-loop" else 0):
        try:
            r = freeze(c, nonce=nonce)
            return r, killed + r.killed
        except FreezeFailed as e:
            failed = e
            killed += e.result.killed
        assert failed.survivors and all(s.uid == 0 for s in failed.survivors), failed
    r = freeze(c, nonce=nonce)
    return r, killed + r.killed


@pytest.mark.parametrize("pid1", list(PID1))
def test_the_sidecar_freezes_beside_a_foreign_pid1(
    client: docker.DockerClient, quiesce_bin: Path, pid1: str, request: pytest.FixtureRequest
) -> None:
    if pid1 == "busybox":
        request.getfixturevalue("busybox_image")
    with plain_box(client, pid1) as b:
        # Beside tini, the exec function is a coroutine function: the kit's own loop runs it.
        exec_fn = (cli_exec_async if pid1 == "tini" else cli_exec)("docker", b.name)
        c = Container.from_exec(exec_fn, name=b.name)
        pid1_before = c.read_file("/proc/1/stat")
        sc = start_sidecar(c, UID, binary=quiesce_bin)
        assert sc.started and sc.sandbox_uids == (int(UID),) and sc.binary == DEFAULT_INSTALL_PATH
        assert (sc.container.binary, sc.container.sidecar_pid) == (sc.binary, sc.pid)
        # The exec that started it has ended; the sidecar lives on, a child of PID 1.
        stat = c.read_file(f"/proc/{sc.pid}/stat").decode()
        fields = stat.rsplit(")", 1)[1].split()
        assert (fields[1], int(fields[19])) == ("1", sc.start_time)
        assert outside_parents(b) == [host_pid1(b)]
        # A second start changes nothing and says so.
        again = start_sidecar(c, UID, binary=quiesce_bin)
        assert (again.pid, again.public_key, again.started) == (sc.pid, sc.public_key, False)

        workloads = WORKLOADS[pid1]
        for w in workloads:
            launch(b, sc.binary, w, BOMB_NPROC if w == "fork-bomb" else None)
            support.until(lambda: (b.size() or 0) > 0, 30, f"{w} never wrote")
        support.until(lambda: b.agents() >= len(workloads), 30, "the workloads never ran")
        if "fork-bomb" in workloads:
            # At its cap: a fork was refused, and the bomb wrote a "b" for it.
            support.until(
                lambda: c.exec(["grep", "-q", "b", support.OUT]).returncode == 0,
                30,
                "the bomb never reached its cap",
            )

        r, killed = freeze_beside(pid1, sc.container, f"sc-{pid1}")
        assert r.state == "quiescent" and killed >= len(workloads) and r.marker is not None, (
            r,
            killed,
        )
        support.until(lambda: b.agents() == 0, 5, "sandbox processes left after the freeze")
        s0 = b.size() or 0
        support.until(lambda: b.size() == s0, 2, "a write after the freeze")
        claims = verify_marker(r.marker, sc.public_key, nonce=r.nonce, container=sc.container)
        assert claims["jti"] == r.freeze_id and claims["setuid"] is False
        done = run_verifier(sc.container, ["sh", "-c", "echo scored"], nonce=r.nonce)
        assert (done.returncode, done.stdout) == (0, b"scored\n"), done.stderr
        # PID 1 is the same process, and the sidecar still runs for the next freeze.
        assert c.read_file("/proc/1/stat").split()[:2] == pid1_before.split()[:2]
        assert c.exec(["test", "-d", f"/proc/{sc.pid}"]).returncode == 0


def test_a_start_the_sidecar_refuses_names_its_fix(
    client: docker.DockerClient, quiesce_bin: Path
) -> None:
    cases: list[tuple[str, dict[str, Any], str | None, tuple[str, ...]]] = [
        ("no capabilities", {"cap_drop": ["ALL"]}, None, ("cap",)),
        ("no CAP_KILL", {"cap_drop": ["KILL"]}, None, ("cap_kill",)),
        ("read-only state dir", {}, None, ("read-only", "state")),
        ("not root", {}, UID, ("root",)),
    ]
    with tempfile.TemporaryDirectory() as ro:
        for what, opts, user, words in cases:
            if what == "read-only state dir":
                opts = {"volumes": {ro: {"bind": "/run/quiesce", "mode": "ro"}}}
            with plain_box(client, workspace=False, **opts) as b:
                c = Container.from_exec(cli_exec("docker", b.name), name=b.name)
                if user is not None:
                    # Put there by root, started by the sandbox user: the sidecar's own refusal.
                    _install(c, quiesce_bin, None, DEFAULT_INSTALL_PATH, "0", time.monotonic() + 60)
                with pytest.raises(SidecarRefused) as e:
                    start_sidecar(c, UID, binary=quiesce_bin, user=user)
                line = e.value.line
                assert e.value.returncode == 2 and "\n" not in line, (what, line)
                assert all(w in line.lower() for w in words), (what, line)
                # Nothing was left running: PID 1 alone.
                assert b.pids() == 1, (what, b.pids())


def test_an_install_the_kit_refuses_names_its_fix(
    client: docker.DockerClient, quiesce_bin: Path
) -> None:
    # Docker's --tmpfs is noexec unless told otherwise.
    with plain_box(client, tmpfs={"/run": ""}) as b:
        c = Container.from_exec(cli_exec("docker", b.name), name=b.name)
        with pytest.raises(InstallFailed, match=r"noexec: pass install_path="):
            start_sidecar(c, UID, binary=quiesce_bin)
        with pytest.raises(InstallFailed, match=r"/tmp mode 1777 .* pass another install_path"):
            start_sidecar(c, UID, binary=quiesce_bin, install_path="/tmp/q/quiesce")
        with pytest.raises(InstallFailed, match="arch='aarch64' was given"):
            start_sidecar(c, UID, binary=quiesce_bin, arch="aarch64")
        assert c.exec(["test", "-e", "/tmp/q"]).returncode == 1
        # The engines' own copies: Docker's archive API, and a caller's upload_fn.
        d = Container.docker(b.name, client=client)
        d.upload(quiesce_bin, "/usr/local/sbin/q1")
        copied: list[str] = []

        def docker_cp(local: str, remote: str) -> None:
            subprocess.run(["docker", "cp", local, f"{b.name}:{remote}"], check=True, timeout=60)
            copied.append(remote)

        up = Container.from_exec(cli_exec("docker", b.name), docker_cp, name=b.name)
        _install(up, quiesce_bin, None, "/usr/local/sbin/q2", "0", time.monotonic() + 60)
        assert copied == ["/usr/local/sbin/.q2.new"]
        sums = c.exec(["sha256sum", "/usr/local/sbin/q1", "/usr/local/sbin/q2"]).stdout.split()
        assert sums[0] == sums[2] and b"q2" in sums[3]


def live_uids(b: Box) -> list[str]:
    """The UID of each live (non-zombie) process of the container, by `docker top` (no exec)."""
    top = b.client.api.top(b.id, ps_args="-o pid,uid,stat")
    return [p[1] for p in top["Processes"] or [] if not p[2].startswith("Z")]


def test_a_sidecar_for_several_sandbox_users(
    client: docker.DockerClient, quiesce_bin: Path
) -> None:
    other = str(int(UID) + 1)
    with plain_box(client) as b:
        c = Container.from_exec(cli_exec("docker", b.name), name=b.name)
        with pytest.raises(ValueError, match="no sandbox user given"):
            start_sidecar(c, [], binary=quiesce_bin)
        assert b.pids() == 1  # refused before anything went in or ran
        sc = start_sidecar(c, [UID, other], binary=quiesce_bin)
        assert sc.started and sorted(sc.sandbox_uids) == [int(UID), int(other)]
        # The same users in another order: the running sidecar, unchanged.
        again = start_sidecar(c, (other, UID), binary=quiesce_bin)
        assert (again.pid, again.started) == (sc.pid, False)
        with pytest.raises(SidecarRefused, match="sandbox UIDs"):
            start_sidecar(c, UID, binary=quiesce_bin)
        for u in (UID, other):
            cmd = [sc.binary, "exec", "--user", u, "--", "sleep", "1000"]
            b.client.api.exec_start(b.client.api.exec_create(b.id, cmd)["Id"], detach=True)
        support.until(
            lambda: {UID, other} <= set(live_uids(b)), 30, "a sandbox user's sleep never ran"
        )
        r = freeze(sc.container, nonce="two-users")
        assert r.state == "quiescent" and r.killed >= 2 and r.marker is not None
        support.until(
            lambda: not {UID, other} & set(live_uids(b)), 5, "a sandbox user's process outlived"
        )


PODMAN_RUN = [
    "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--network", "none",
    "--security-opt", support.SECURITY_OPT, "--pids-limit", str(support.PIDS_LIMIT),
]  # fmt: skip


def test_the_sidecar_in_a_podman_container(quiesce_bin: Path) -> None:
    if shutil.which("podman") is None:
        support.skip_log("sidecar podman", "podman is not installed (docker/matrix installs it)")
        pytest.skip("no podman")
    if subprocess.run(["podman", "image", "exists", BASE], check=False).returncode != 0:
        save = subprocess.Popen(["docker", "save", BASE], stdout=subprocess.PIPE)
        subprocess.run(["podman", "load", "-q"], stdin=save.stdout, check=True, timeout=300)
        save.wait(timeout=60)
    name = f"{PREFIX}sc-pm-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["podman", "run", "-d", "--name", name, *PODMAN_RUN, BASE, "sleep", "infinity"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    try:
        c = Container.from_exec(cli_exec("podman", name), name=name)
        # `podman cp` is the Podman container's own copy.
        Container.podman(name).upload(quiesce_bin, "/usr/local/sbin/quiesce")
        sc = start_sidecar(c, UID, binary=quiesce_bin)
        assert sc.started
        writer = support.WORKLOADS["setsid-writer"].replace("/workspace/out", "/tmp/out")
        subprocess.run(
            [
                "podman",
                "exec",
                "-d",
                name,
                sc.binary,
                "exec",
                "--user",
                UID,
                "--",
                "sh",
                "-c",
                writer,
            ],
            check=True,
            timeout=60,
        )
        support.until(lambda: c.exec(["test", "-s", "/tmp/out"]).returncode == 0, 30, "no write")
        r = freeze(sc.container, nonce="sc-podman")
        assert r.state == "quiescent" and r.killed >= 2 and r.marker is not None
        verify_marker(r.marker, sc.public_key, nonce="sc-podman", container=sc.container)
        done = run_verifier(sc.container, "echo scored", nonce="sc-podman")
        assert (done.returncode, done.stdout) == (0, b"scored\n"), done.stderr
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, check=False)


def agent_sh(b: Box, script: str) -> None:
    """A shell script run as the sandbox user, to its end (it must succeed)."""
    rc, out = b.ctr.exec_run(["sh", "-c", script], user=UID)
    assert rc == 0, out


# The sandbox user's look-alike: it leaves a mark of whoever ran it, then runs the real one,
# so that the freeze it fronts still answers as quiesce would.
LOOKALIKE = '#!/bin/sh\ntouch "/tmp/evil/ran-as-$(id -u)"\nexec /usr/local/sbin/quiesce "$@"\n'


def test_a_link_on_the_way_is_resolved_once_and_never_followed_again(
    client: docker.DockerClient, quiesce_bin: Path
) -> None:
    # The sandbox user plants links in /tmp (its sticky 1777) before the start: one to a
    # directory of root's for the binary, one for the state dir. The kit resolves each,
    # checks the resolved directory, and runs only that; re-pointing the links afterwards at
    # directories of the user's own redirects nothing: no exec of the kit's runs its file.
    with plain_box(client) as b:
        c = Container.docker(b.name, client=client)
        agent_sh(b, "ln -s /usr/local/sbin /tmp/quiesce-bin && ln -s /run /tmp/qs")
        sc = start_sidecar(
            c, UID, binary=quiesce_bin, install_path="/tmp/quiesce-bin/quiesce",
            state_dir="/tmp/qs/quiesce-sc",
        )  # fmt: skip
        assert (sc.binary, sc.container.binary) == ("/usr/local/sbin/quiesce",) * 2
        assert (sc.state_dir, sc.container.state_dir) == ("/run/quiesce-sc",) * 2
        launch(b, sc.binary, "setsid-writer")
        support.until(lambda: b.agents() >= 1, 30, "the writer never ran")
        agent_sh(
            b,
            f"mkdir -p /tmp/evil /tmp/evil-state/quiesce-sc && printf '%s' '{LOOKALIKE}' "
            "> /tmp/evil/quiesce && chmod 755 /tmp/evil/quiesce "
            "&& ln -sfn /tmp/evil /tmp/quiesce-bin && ln -sfn /tmp/evil-state /tmp/qs",
        )
        assert c.exec(["readlink", "/tmp/quiesce-bin"]).stdout == b"/tmp/evil\n"
        r = freeze(sc.container, nonce="sc-link")
        assert r.state == "quiescent" and r.killed >= 1 and r.marker is not None
        verify_marker(r.marker, sc.public_key, nonce="sc-link", container=sc.container)
        done = run_verifier(sc.container, ["sh", "-c", "echo scored"], nonce="sc-link")
        assert (done.returncode, done.stdout) == (0, b"scored\n"), done.stderr
        ran = c.exec(["sh", "-c", "ls /tmp/evil | grep ran-as || true"]).stdout
        assert ran == b"", f"the sandbox user's look-alike ran: {ran!r}"
        # A link to a directory the sandbox user owns is refused, naming the fix.
        agent_sh(b, "mkdir -p /tmp/mine && ln -s /tmp/mine /tmp/qb")
        with pytest.raises(InstallFailed, match=r"/tmp/mine owner 1000 .* another install_path"):
            start_sidecar(c, UID, binary=quiesce_bin, install_path="/tmp/qb/quiesce")
        with pytest.raises(InstallFailed, match=r"/tmp/mine owner 1000 .* another state_dir"):
            start_sidecar(c, UID, binary=quiesce_bin, state_dir="/tmp/qb/state")


def test_a_copy_there_that_is_not_roots_alone_is_replaced(
    client: docker.DockerClient, quiesce_bin: Path
) -> None:
    # The same binary, but the sandbox user's to write (an image that handed it over): it could
    # rewrite it between the check and the run, so the kit puts a copy of root's in its place.
    with plain_box(client, workspace=False) as b:
        c = Container.docker(b.name, client=client)
        path = "/usr/local/sbin/quiesce"
        _install(c, quiesce_bin, None, path, "0", time.monotonic() + 60)
        assert c.exec(["chown", UID, path]).returncode == 0
        sc = start_sidecar(c, UID, binary=quiesce_bin, install_path=path)
        assert sc.binary == path
        assert c.exec(["stat", "-c", "%u %a", path]).stdout == b"0 755\n"


def test_a_tmpfs_docker_cannot_copy_into_is_refused_and_a_volume_works(
    client: docker.DockerClient, quiesce_bin: Path
) -> None:
    # A read-only root file system with `--tmpfs /run:exec`: Docker's archive API, the kit's
    # copy for Docker, does not reach a tmpfs (the engine answers 404), so the start refuses,
    # naming a volume; on a named volume (0755, root's, exec-able) it installs and freezes.
    vol = f"{PREFIX}sc-vol-{uuid.uuid4().hex[:8]}"
    run: dict[str, Any] = {"read_only": True, "tmpfs": {"/run": "exec"}, "workspace": False}
    try:
        with plain_box(client, **run) as b:
            c = Container.docker(b.name, client=client)
            with pytest.raises(InstallFailed, match=r"on /run, a tmpfs, .* named volume"):
                start_sidecar(c, UID, binary=quiesce_bin)
            assert b.pids() == 1
        volumes = {vol: {"bind": "/opt/quiesce-bin", "mode": "rw"}}
        with plain_box(client, volumes=volumes, **run) as b:
            c = Container.docker(b.name, client=client)
            sc = start_sidecar(c, UID, binary=quiesce_bin, install_path="/opt/quiesce-bin/quiesce")
            assert sc.state_dir == "/run/quiesce"
            cmd = [sc.binary, "exec", "--user", UID, "--", "sleep", "1000"]
            b.client.api.exec_start(b.client.api.exec_create(b.id, cmd)["Id"], detach=True)
            support.until(lambda: UID in live_uids(b), 30, "the sandbox user's sleep never ran")
            r = freeze(sc.container, nonce="sc-volume")
            assert r.state == "quiescent" and r.killed >= 1 and r.marker is not None
            verify_marker(r.marker, sc.public_key, nonce="sc-volume", container=sc.container)
    finally:
        with contextlib.suppress(docker.errors.DockerException):
            client.volumes.get(vol).remove(force=True)
