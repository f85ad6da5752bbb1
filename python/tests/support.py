"""Real containers for the tests and the side-by-side: images, hostile workloads, observations.

Everything is named with the prefix `qhk-` and removed by its owner. Observations are made
from the engine's side (`docker top`, the archive API), never by an exec in the container, so
they work while the sandbox holds the pids limit.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
import pytest
from docker.models.containers import Container as DockerContainer

if TYPE_CHECKING:
    from quiesce_harness import SandboxExec

REPO = Path(__file__).resolve().parents[2]
PREFIX = "qhk-"
LABEL = "qhk-test"
AGENT_UID = "1000"
OUT = "/workspace/out"
SLIM = f"{PREFIX}slim"
PROCPS = f"{PREFIX}procps"
IMAGES = (SLIM, PROCPS)
# Every container the tests start runs with no-new-privileges, as the docs ask (quiesce verify and
# verify_marker refuse a marker signed without it); Docker 20.10, 26 and 28 and Podman all take
# the bare form. A test of a container without it says so (box(..., no_new_privileges=False)).
SECURITY_OPT = "no-new-privileges"
# What that option does to the init when it runs outside an engine: set before the exec, inherited
# by everything it starts.
NO_NEW_PRIVS = ["setpriv", "--no-new-privs"]


def binary() -> Path:
    return Path(
        os.environ.get("QUIESCE_BIN", REPO / "target/x86_64-unknown-linux-musl/release/quiesce")
    )


def skip_log(name: str, reason: str) -> None:
    """Record a case that cannot run here: scripts/test counts it as skipped, never passed."""
    log = os.environ.get("QUIESCE_SKIP_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"python/{name}: {reason}\n")


def need_binary() -> Path:
    """The release binary; a case that needs it fails without it (a missing build is no skip)."""
    b = binary()
    if not b.exists():
        pytest.fail(f"no quiesce binary at {b}: run `cargo build --release` (or set QUIESCE_BIN)")
    return b


def need_init(skip_as: str) -> Path:
    """The release binary, where it can run as PID 1 of a new PID namespace here.

    That takes root, unshare(1) and setpriv(1); without them the case is skipped and the skip
    recorded under `skip_as`.
    """
    b = need_binary()
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None:
        skip_log(skip_as, "needs root, unshare(1) and setpriv(1) to run the init")
        pytest.skip("needs root, unshare(1) and setpriv(1)")
    return b


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A directory of the case's own, removed with everything in it afterwards."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_init(
    b: Path, state: Path, script: str, *, init_args: Sequence[str] = (), setuid: bool = False
) -> None:
    """The init `b` as PID 1 of a new PID namespace, with 4242 as the sandbox user, its state in
    `state`, running `sh -c script` and exiting after the first freeze (`--after-freeze exit`).

    It runs with no_new_privs, as `--security-opt no-new-privileges` starts it, so that its
    marker says `setuid: false`; with `setuid`, without it (Docker's default). An init that
    fails fails the case, with what it said.
    """
    try:
        subprocess.run(
            [
                *([] if setuid else NO_NEW_PRIVS),
                "unshare",
                "--pid",
                "--fork",
                "--mount-proc",
                str(b),
                "--sandbox-user",
                "4242",
                "--state-dir",
                str(state),
                *init_args,
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
    except subprocess.CalledProcessError as e:
        pytest.fail(f"the init's freeze failed: {e.stderr.decode(errors='replace')}")


def docker_client(skip_as: str) -> Iterator[docker.DockerClient]:
    """The body of a session's `client` fixture: a Docker engine that answers, with the kit's
    test images built on it; afterwards the test containers left on it are removed.

    Without an engine the case is skipped and the skip recorded under `skip_as`.
    """
    try:
        c = docker.from_env(timeout=300)
        c.ping()
    except docker.errors.DockerException as e:
        skip_log(skip_as, f"no Docker engine answers ({e}); start one with docker/engine")
        pytest.skip("no Docker engine answers")
    need_binary()
    build_images(c)
    yield c
    for ctr in c.containers.list(all=True, filters={"label": LABEL}):
        if str(ctr.name).startswith(PREFIX):
            ctr.remove(force=True)
    c.close()


_DOCKERFILE = """FROM debian:bookworm-slim
COPY quiesce /sbin/quiesce
{extra}RUN useradd --create-home --uid 1000 --shell /bin/sh agent \\
 && mkdir -p /workspace && chown agent:agent /workspace
WORKDIR /workspace
ENTRYPOINT ["/sbin/quiesce", "--sandbox-user", "agent", "--"]
CMD ["sleep", "infinity"]
"""


def build_images(client: docker.DockerClient) -> None:
    """qhk-slim (bookworm-slim: no procps, as most slim images) and qhk-procps (with it).

    debian:bookworm-slim comes from docker/base-images (debootstrap, offline); procps and its
    two libraries from this machine's apt sources (`apt-get download`), installed with dpkg.
    """
    try:
        client.images.get("debian:bookworm-slim")
    except docker.errors.ImageNotFound:
        subprocess.run(["bash", str(REPO / "docker/base-images")], check=True)
    for name, with_procps in ((SLIM, False), (PROCPS, True)):
        with tempfile.TemporaryDirectory() as ctx:
            shutil.copy(binary(), Path(ctx) / "quiesce")
            extra = ""
            if with_procps:
                debs = Path(ctx) / "debs"
                debs.mkdir()
                subprocess.run(
                    ["apt-get", "download", "-q", "procps", "libproc2-0", "libncursesw6"],
                    cwd=debs,
                    check=True,
                    capture_output=True,
                )
                extra = "COPY debs /tmp/debs\nRUN dpkg -i /tmp/debs/*.deb && rm -rf /tmp/debs\n"
            (Path(ctx) / "Dockerfile").write_text(_DOCKERFILE.format(extra=extra))
            client.images.build(path=ctx, tag=name, rm=True, labels={LABEL: "1"})


def _perl(body: str) -> str:
    return 'perl -e \'$SIG{TERM}="IGNORE"; ' + body + "'"


# Each runs as the agent (`docker exec -u agent -d`), and all but the bomb detach from the exec.
WORKLOADS: dict[str, str] = {
    # A writer in a session of its own that ignores SIGTERM (so does its sleep).
    "setsid-writer": (
        "setsid sh -c 'trap \"\" TERM; while :; do echo x >> /workspace/out; sleep 0.01; done'"
    ),
    # A chain that respawns itself: each link forks the next and exits, so a pid read by
    # pkill is gone by the time it is signalled.
    "respawn-chain": "setsid "
    + _perl(
        "while(1){ my $p=fork(); if(defined $p && $p>0){ exit 0 } "
        'open(my $f,">>","/workspace/out"); print $f "r"; close $f; '
        "select(undef,undef,undef,0.005) }"
    ),
    # Every process forks forever and, whenever the pids limit refuses it, writes a byte.
    "fork-bomb": _perl(
        "while(1){ my $p=fork(); if(!defined $p){ "
        'open(my $f,">>","/workspace/out"); print $f "b"; close $f; '
        "select(undef,undef,undef,0.01) } }"
    ),
    # A double-forked writer in its own session that keeps one descriptor open.
    "fd-writer": 'perl -MPOSIX -e \'$SIG{TERM}="IGNORE"; fork and exit; setsid(); fork and exit; '
    'open(my $f,">>","/workspace/out") or die; select($f); $|=1; '
    'while(1){ print "f"; select(undef,undef,undef,0.01) }\'',
}
PIDS_LIMIT = 128

# A root daemon that double-forks all the time: processes that appear during a freeze with no
# parent that can vouch for them, so the freeze fails. One about every 1 ms, so that a freeze of
# a small sandbox (a few ms) finds one at its first look; most live 60 ms, and every 50th lives
# 3 s, so that the last look of the proof's grace still finds one born since the freeze began
# (with all of them short-lived, a look within the grace could find only vouched ones, and the
# freeze rightly succeeded). About 100 are alive, below PIDS_LIMIT (all living 3 s they held it,
# and a harness's own steps after the failed freeze could not fork). perl, so that a fork
# refused at the pids limit does not end it.
WORKLOADS_ROOT_DAEMON = (
    "perl -e 'my $n=0; while(1){ $n++; my $p=fork(); if(defined $p && $p==0){ "
    "fork() or select(undef,undef,undef,$n % 50 ? 0.06 : 3); exit 0 } "
    "waitpid($p,0) if $p; select(undef,undef,undef,0.001) }'"
)
# Waits (10 s at most, exit 1 then) until the daemon runs: its perls (itself, a child, orphans)
# are in /proc. A process started in the background, or by a detached exec, may not have run
# yet when the call returns, and a freeze then finds nothing of it and rightly succeeds.
ROOT_DAEMON_STARTED = (
    "for i in $(seq 100); do "
    "[ $(cat /proc/[0-9]*/comm 2>/dev/null | grep -cx perl) -ge 3 ] && exit 0; "
    "sleep 0.1; done; exit 1"
)
# The daemon in the background, returning once it runs.
ROOT_DAEMON_BACKGROUND = (
    "nohup " + WORKLOADS_ROOT_DAEMON + " >/dev/null 2>&1 & " + ROOT_DAEMON_STARTED
)


@dataclass
class Box:
    """A running test container and what the engine can tell about it without an exec."""

    client: docker.DockerClient
    ctr: DockerContainer

    @property
    def name(self) -> str:
        return str(self.ctr.name)

    @property
    def id(self) -> str:
        return str(self.ctr.id)

    def size(self) -> int | None:
        """Bytes in the agent's output file, through the archive API (no exec)."""
        try:
            stream, stat = self.client.api.get_archive(self.id, OUT)
        except docker.errors.NotFound:
            return None
        with contextlib.suppress(Exception):
            stream.close()
        return int(stat["size"])

    def agents(self) -> int:
        """Live (non-zombie) processes of the agent's UID, by `docker top` on the host."""
        top = self.client.api.top(self.id, ps_args="-o uid,stat,pid")
        titles = [t.upper() for t in top["Titles"]]
        iu, ist = titles.index("UID"), titles.index("STAT")
        return sum(
            1 for p in top["Processes"] or [] if p[iu] == AGENT_UID and not p[ist].startswith("Z")
        )

    def pids(self) -> int:
        top = self.client.api.top(self.id, ps_args="-o pid")
        return len(top["Processes"] or [])

    def agent_exec(self, cmd: str) -> None:
        e = self.client.api.exec_create(self.id, ["sh", "-c", cmd], user="agent")
        self.client.api.exec_start(e["Id"], detach=True)

    def start(self, workload: str, *, budget_s: float = 30.0) -> None:
        """Start a workload and wait until it is writing (and, for the bomb, at the limit)."""
        self.agent_exec(WORKLOADS[workload])
        until(lambda: (self.size() or 0) > 0, budget_s, f"{workload} never wrote")
        s = self.size() or 0
        until(lambda: (self.size() or 0) > s, budget_s, f"{workload} stopped writing")
        if workload == "fork-bomb":
            until(
                lambda: self.pids() >= PIDS_LIMIT - 2, budget_s, "the bomb never reached the limit"
            )

    def wait_running(self) -> None:
        until(lambda: self.size_of_state() is not None, 15, "the init never wrote sandbox.json")

    def size_of_state(self) -> int | None:
        try:
            stream, stat = self.client.api.get_archive(self.id, "/run/quiesce/sandbox.json")
        except docker.errors.NotFound:
            return None
        with contextlib.suppress(Exception):
            stream.close()
        return int(stat["size"])


def unverified_claims(jws: str) -> dict[str, object]:
    """A marker's claims, read without any check (verify_marker checks)."""
    payload = jws.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert isinstance(claims, dict)
    return claims


def until(cond: Callable[[], bool], budget_s: float, what: str) -> None:
    end = time.monotonic() + budget_s
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} within {budget_s:g} s")


@contextlib.contextmanager
def box(
    client: docker.DockerClient,
    image: str = SLIM,
    *,
    pids_limit: int | None = None,
    labels: dict[str, str] | None = None,
    no_new_privileges: bool = True,
    environment: dict[str, str] | None = None,
) -> Iterator[Box]:
    """A test container; `no_new_privileges=False` starts it as Docker does by default."""
    ctr = run_container(
        client,
        image,
        pids_limit=pids_limit,
        labels=labels,
        no_new_privileges=no_new_privileges,
        environment=environment,
    )
    b = Box(client, ctr)
    try:
        b.wait_running()
        yield b
    finally:
        with contextlib.suppress(docker.errors.DockerException):
            ctr.remove(force=True)


def run_container(
    client: docker.DockerClient,
    image: str,
    command: list[str] | None = None,
    *,
    kind: str = "",
    pids_limit: int | None = None,
    labels: dict[str, str] | None = None,
    no_new_privileges: bool = True,
    **run: Any,
) -> DockerContainer:
    """A detached test container as every test starts one: named with the prefix (then `kind`)
    and labelled for its removal, no network, the pids limit, and no-new-privileges unless
    told; `run` goes to the engine as given."""
    return client.containers.run(
        image,
        command,
        detach=True,
        name=f"{PREFIX}{kind}{uuid.uuid4().hex[:10]}",
        labels={LABEL: "1", **(labels or {})},
        network_mode="none",
        pids_limit=pids_limit or PIDS_LIMIT,
        security_opt=[SECURITY_OPT] if no_new_privileges else None,
        **run,
    )


@contextlib.contextmanager
def foreign_box(
    client: docker.DockerClient,
    image: str,
    command: list[str],
    *,
    kind: str = "",
    workspace: bool = True,
    **run: Any,
) -> Iterator[Box]:
    """A test container whose PID 1 is `command`, not quiesce, with /workspace the sandbox
    user's unless `workspace=False`; removed on exit."""
    ctr = run_container(client, image, command, kind=kind, **run)
    try:
        if workspace:
            rc, out = ctr.exec_run(
                ["/bin/sh", "-c", f"mkdir -p /workspace && chown {AGENT_UID} /workspace"]
            )
            assert rc == 0, out
        yield Box(client, ctr)
    finally:
        with contextlib.suppress(docker.errors.DockerException):
            ctr.remove(force=True)


def cli_exec(cli: str, name: str) -> SandboxExec:
    """The exec function a harness without an SDK writes: `CLI exec -i [-u USER] NAME argv`. It
    sets no environment: argv runs with the image's (PATH included)."""

    def run(
        argv: Sequence[str], *, user: str | None = None, stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        p = subprocess.run(
            [cli, "exec", "-i", *(["-u", user] if user else []), name, *argv],
            input=stdin or b"",
            capture_output=True,
            timeout=120,
            check=False,
        )
        return p.returncode, p.stdout, p.stderr

    return run


def cli_exec_async(cli: str, name: str) -> SandboxExec:
    """cli_exec as a coroutine function (asyncio's subprocesses), as async harnesses write it:
    the kit runs it on its own loop."""

    async def run(
        argv: Sequence[str], *, user: str | None = None, stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        p = await asyncio.create_subprocess_exec(
            cli, "exec", "-i", *(["-u", user] if user else []), name, *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(p.communicate(stdin or b""), 120)
        return p.returncode if p.returncode is not None else -1, out, err

    return run
