"""freeze(), run_verifier() and the CLI against real containers on a real Docker engine."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import docker
import pytest

from quiesce_harness import (
    GATE_EXIT_CODES,
    HAND_OVER_EXIT,
    Container,
    ExecResult,
    FreezeFailed,
    FreezeResult,
    HandOver,
    MarkerInvalid,
    Unreachable,
    freeze,
    run_verifier,
    verify_marker,
)

import support
from support import PROCPS, SLIM, Box, box

HOSTILE = ["setsid-writer", "respawn-chain", "fork-bomb", "fd-writer"]


def settled(b: Box) -> tuple[int, int]:
    """(bytes written, live agent processes) in the 0.5 s after the caller's step returned."""
    s0 = b.size() or 0
    time.sleep(0.5)
    return (b.size() or 0) - s0, b.agents()


@pytest.mark.parametrize("image", [SLIM, PROCPS])
@pytest.mark.parametrize("workload", HOSTILE)
def test_freeze_ends_every_hostile_workload(
    client: docker.DockerClient, image: str, workload: str
) -> None:
    with box(client, image) as b:
        b.start(workload)
        c = Container.docker(b.name, client=client)
        r = freeze(c)
        assert b.agents() == 0
        after, alive = settled(b)
        assert (after, alive) == (0, 0)
        assert r.state == "quiescent" and r.survivors == [] and r.killed >= 1
        # Only at the pids limit may the engine's signal be needed: where the runtime joins the
        # exec to the cgroup after its fork (runc 1.1 on cgroup v1), `quiesce freeze`, which
        # does not fork, still starts; where it cannot start, the kit signals the init.
        assert r.via_signal is False or workload == "fork-bomb"
        assert r.marker is not None and r.nonce is not None
        pem = c.read_file("/run/quiesce/signing.pub")
        claims = verify_marker(r.marker, pem, nonce=r.nonce, container=c)
        assert claims["jti"] == r.freeze_id


def test_run_verifier_runs_behind_the_gate(client: docker.DockerClient) -> None:
    # The kit's own container: run with no-new-privileges, so its marker says setuid=false.
    with box(client) as b:
        assert b.ctr.attrs["HostConfig"]["SecurityOpt"] == [support.SECURITY_OPT]
        b.start("setsid-writer")
        c = Container.docker(b.name, client=client)
        r = freeze(c, nonce="n-1")
        assert r.marker is not None
        pem = c.read_file("/run/quiesce/signing.pub")
        assert verify_marker(r.marker, pem, nonce="n-1", container=c)["setuid"] is False
        done = run_verifier(c, ["sh", "-c", "echo scored"], nonce="n-1")
        assert (done.returncode, done.stdout) == (0, b"scored\n")
        # The marker of this freeze offered for another: code 13, the verifier never ran.
        other = run_verifier(c, "echo scored", nonce="n-2")
        assert other.returncode == 13 and b"scored" not in other.stdout
        # An agent process started after the freeze: the live probe refuses (16).
        b.agent_exec("exec sleep 100")
        support.until(lambda: b.agents() == 1, 15, "the late agent process never ran")
        late = run_verifier(c, "echo scored", nonce=r.nonce)
        assert late.returncode == 16 and b"scored" not in late.stdout


def test_without_no_new_privileges_the_freeze_holds_but_nothing_is_scored(
    client: docker.DockerClient,
) -> None:
    # Docker's default: setuid binaries work. The freeze is as quiescent as anywhere, but a
    # sandbox process made root by one could keep a root process working for it, which no
    # freeze tells apart: the marker says so, and the gate refuses to score (18) unless asked.
    # The image's environment accepting it does not count: only the caller's keyword does.
    accept_env = {"QUIESCE_ACCEPT_PRIVILEGE_ESCALATION": "1"}
    with box(client, no_new_privileges=False, environment=accept_env) as b:
        b.start("setsid-writer")
        c = Container.docker(b.name, client=client)
        r = freeze(c, nonce="s-1")
        assert r.state == "quiescent" and r.killed >= 1 and r.marker is not None
        assert settled(b) == (0, 0)
        pem = c.read_file("/run/quiesce/signing.pub")
        with pytest.raises(MarkerInvalid) as e:
            verify_marker(r.marker, pem, nonce="s-1", container=c)
        assert e.value.check == "setuid" and "no-new-privileges" in e.value.reason
        claims = verify_marker(
            r.marker, pem, nonce="s-1", container=c, accept_privilege_escalation=True
        )
        assert claims["setuid"] is True and claims["jti"] == r.freeze_id
        refused = run_verifier(c, "echo scored", nonce="s-1")
        assert refused.returncode == 18 and b"scored" not in refused.stdout
        assert b"--security-opt no-new-privileges" in refused.stderr, refused.stderr
        assert GATE_EXIT_CODES[18].startswith("marker from a configuration")
        done = run_verifier(c, "echo scored", nonce="s-1", accept_privilege_escalation=True)
        assert (done.returncode, done.stdout) == (0, b"scored\n"), done.stderr
        # The command line, the same way.
        bad = cli("verify", "--docker", b.name, "--nonce", "s-1")
        assert bad.returncode == 1 and json.loads(bad.stdout)["check"] == "setuid"
        ok = cli("verify", "--docker", b.name, "--nonce", "s-1", "--accept-privilege-escalation")
        assert ok.returncode == 0 and json.loads(ok.stdout)["valid"], ok.stderr


class RefusedExecs(Container):
    """A container whose first `refuse` execs the engine could not start, as on engines that
    create the exec'd process inside the container's cgroup at its pids limit (runc with
    CLONE_INTO_CGROUP, crun); Debian's runc 1.1 on cgroup v1 joins the cgroup after the fork,
    so there a bomb at the limit leaves execs of non-forking commands free to start."""

    refuse: int = 0

    def exec(self, argv: Sequence[str], **kw: Any) -> ExecResult:
        if self.refuse > 0:
            object.__setattr__(self, "refuse", self.refuse - 1)
            return ExecResult(126, b"", b"OCI runtime exec failed: read init-p", started=False)
        return super().exec(argv, **kw)


def test_the_bomb_at_the_pids_limit_through_the_engines_signal(
    client: docker.DockerClient,
) -> None:
    with box(client) as b:
        b.start("fork-bomb")
        assert b.pids() >= support.PIDS_LIMIT - 2
        c = RefusedExecs("docker", b.name, _client=client)
        object.__setattr__(c, "refuse", 3)
        r = freeze(c, nonce="after-signal")
        assert r.via_signal and r.state == "quiescent"
        # The signal's own freeze (null nonce) killed the bomb; the kit read its status...
        assert r.signal_status is not None and r.signal_status["state"] == "quiescent"
        assert r.signal_status["nonce"] is None and r.signal_status["killed"] >= 100
        # ...and the freeze with the caller's nonce is the one the marker answers.
        assert r.marker is not None
        pem = c.read_file("/run/quiesce/signing.pub")
        assert verify_marker(r.marker, pem, nonce="after-signal")["jti"] == r.freeze_id
        assert settled(b) == (0, 0)


def test_a_failed_freeze_raises_with_its_survivors(client: docker.DockerClient) -> None:
    with box(client) as b:
        # A root daemon that double-forks all the time: children no parent vouches for
        # (support.WORKLOADS_ROOT_DAEMON says how many, and how long each lives).
        daemon = ["sh", "-c", support.WORKLOADS_ROOT_DAEMON]
        client.api.exec_start(client.api.exec_create(b.id, daemon)["Id"], detach=True)
        rc, out = b.ctr.exec_run(["sh", "-c", support.ROOT_DAEMON_STARTED])
        assert rc == 0, f"the root daemon did not start within 10 s: {out!r}"
        b.start("setsid-writer")
        c = Container.docker(b.name, client=client)
        # A freeze whose whole window passed without one of the daemon's forks (the daemon not
        # scheduled for those milliseconds, seen in CI) is rightly quiescent: up to three asks,
        # one of which must fail.
        passed: list[FreezeResult] = []
        failed: FreezeFailed | None = None
        for _ in range(3):
            try:
                passed.append(freeze(c))
            except FreezeFailed as e:
                failed = e
                break
        assert failed is not None, f"three freezes beside the root daemon succeeded: {passed}"
        assert failed.result.state == "failed" and failed.result.marker is None
        assert failed.survivors and "vouch" in (failed.result.reason or "")


def test_unreachable_inits(client: docker.DockerClient) -> None:
    with pytest.raises(Unreachable, match="does not exist"):
        freeze(Container.docker("qhk-no-such-container", client=client))
    with box(client) as b:
        with pytest.raises(Unreachable, match="not found"):
            freeze(Container.docker(b.name, binary="/nowhere/quiesce", client=client))
        # An init without a sandbox user has no state dir: nothing to freeze, no result.
        b.ctr.stop(timeout=5)
        with pytest.raises(Unreachable, match="not running"):
            freeze(Container.docker(b.name, client=client))


def test_an_image_whose_init_is_not_quiesce(client: docker.DockerClient) -> None:
    sleep = ["sleep", "infinity"]
    plain = support.foreign_box(client, "debian:bookworm-slim", sleep, workspace=False)
    with plain as b, pytest.raises(Unreachable, match="not found"):
        freeze(Container.docker(b.name, client=client), timeout=5)


def test_compose_service_found_by_its_labels(client: docker.DockerClient) -> None:
    project = "qhk-proj-" + str(time.monotonic_ns())
    labels = {"com.docker.compose.project": project, "com.docker.compose.service": "main"}
    with box(client, labels=labels) as b:
        b.start("setsid-writer")
        c = Container.compose("main", project=project, client=client)
        assert freeze(c).state == "quiescent"
        assert settled(b) == (0, 0)
    with pytest.raises(Unreachable, match="no container"):
        freeze(Container.compose("main", project=project, client=client))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quiesce_harness", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_command_line(client: docker.DockerClient) -> None:
    with box(client) as b:
        b.start("fd-writer")
        f = cli("freeze", "--docker", b.name, "--nonce", "cli-1")
        assert f.returncode == 0, f.stderr
        out = json.loads(f.stdout)
        assert out["state"] == "quiescent" and out["nonce"] == "cli-1" and out["marker"]
        ok = cli("verify", "--docker", b.name, "--nonce", "cli-1")
        assert ok.returncode == 0 and json.loads(ok.stdout)["valid"], ok.stderr
        bad = cli("verify", "--docker", b.name, "--nonce", "cli-2")
        assert bad.returncode == 1 and json.loads(bad.stdout)["check"] == "nonce"
    gone = cli("freeze", "--docker", "qhk-no-such-container", "--timeout", "5")
    assert gone.returncode == 3 and "unreachable" in gone.stderr


SCRATCH = f"{support.PREFIX}scratch"


@pytest.fixture(scope="module")
def scratch_image(client: docker.DockerClient) -> str:
    """FROM scratch: the static quiesce, the static test adversary as the agent's workload, an
    /etc/passwd naming the agent, and nothing else (no shell, no cat, no libc)."""
    adversary = support.binary().parent / "examples" / "adversary"
    if not adversary.exists():
        support.skip_log(
            "scratch image", f"no {adversary}: build it with `cargo build --release --examples`"
        )
        pytest.skip("no static adversary binary to run in a scratch image")
    with tempfile.TemporaryDirectory() as ctx:
        root = Path(ctx) / "root"
        for d in ("sbin", "bin", "etc", "run", "tmp", "workspace"):
            (root / d).mkdir(parents=True)
        shutil.copy(support.binary(), root / "sbin/quiesce")
        shutil.copy(adversary, root / "bin/adversary")
        (root / "etc/passwd").write_text("root:x:0:0::/:/nonexistent\nagent:x:1000:1000::/:/\n")
        (root / "etc/group").write_text("root:x:0:\nagent:x:1000:\n")
        # COPY keeps the modes: /workspace the agent may write in, /tmp everyone's.
        (root / "workspace").chmod(0o777)
        (root / "tmp").chmod(0o1777)
        (Path(ctx) / "Dockerfile").write_text(
            "FROM scratch\nCOPY root/ /\n"
            'ENTRYPOINT ["/sbin/quiesce", "--sandbox-user", "agent", "--"]\n'
            'CMD ["/bin/adversary", "sleepers", "0"]\n'
        )
        client.images.build(path=ctx, tag=SCRATCH, rm=True, labels={support.LABEL: "1"})
    return SCRATCH


def archive_file(client: docker.DockerClient, cid: str, path: str) -> bytes:
    """A file of the container through the engine's archive API: no exec, no cat."""
    stream, _ = client.api.get_archive(cid, path)
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as t:
        member = t.next()
        f = t.extractfile(member) if member is not None else None
        assert f is not None, path
        return f.read()


def test_an_image_with_no_shell_and_no_cat(client: docker.DockerClient, scratch_image: str) -> None:
    with box(client, scratch_image) as b:
        for args in (["daemon"], ["ignore"], ["writer", support.OUT]):
            e = client.api.exec_create(b.id, ["/bin/adversary", *args], user=support.AGENT_UID)
            client.api.exec_start(e["Id"], detach=True)
        # The daemon's double-forked, setsid'd pair and its parent, the ignorer, the writer.
        support.until(lambda: b.agents() >= 5, 15, "the agent's processes never ran")
        support.until(lambda: (b.size() or 0) > 0, 15, "the writer never wrote")
        # No shell to look a relative binary up with, and check its directories: refused,
        # naming binary= (the image's PATH is never read); the absolute path works.
        with pytest.raises(Unreachable, match=r"no /bin/sh .*binary="):
            freeze(Container.docker(b.name, client=client), nonce="no-shell")
        c = Container.docker(b.name, binary="/sbin/quiesce", client=client)
        r = freeze(c, nonce="no-shell")
        assert r.state == "quiescent" and r.killed >= 5 and not r.via_signal
        assert settled(b) == (0, 0)
        # The marker came in the freeze's own output: the image has nothing to read it with.
        assert r.marker is not None and r.status.get("marker") == r.marker
        pem = archive_file(client, b.id, "/run/quiesce/signing.pub")
        claims = verify_marker(r.marker, pem, nonce="no-shell", container=c)
        assert claims["jti"] == r.freeze_id
        done = run_verifier(c, ["/sbin/quiesce", "--version"], nonce="no-shell")
        assert done.returncode == 0 and done.stdout.startswith(b"quiesce "), done.stderr


# The agent's service: a TCP server on 8080 that answers each connection with one line, in a
# session of its own (it outlives the exec), as bookworm-slim's perl can run it.
_SERVER = (
    "setsid perl -MIO::Socket::INET -e '"
    '$s = IO::Socket::INET->new(LocalAddr => "127.0.0.1:8080", Listen => 5, ReuseAddr => 1) '
    'or die; while ($c = $s->accept) { print $c "served\\n"; close $c }'
    "' </dev/null >/dev/null 2>&1 &"
)
# The tests: what the service answers, or "down".
_QUERY = [
    "perl",
    "-MIO::Socket::INET",
    "-e",
    '$c = IO::Socket::INET->new("127.0.0.1:8080") or do { print "down\\n"; exit 1 }; print <$c>',
]


def _serving(b: Box, client: docker.DockerClient) -> Container:
    """The box's container once the agent's server answers on 8080."""
    b.agent_exec(_SERVER)
    c = Container.docker(b.name, client=client)
    support.until(lambda: c.exec(_QUERY).returncode == 0, 15, "the agent's server never answered")
    return c


def test_run_verifier_hands_the_agents_service_over(client: docker.DockerClient) -> None:
    # The freeze kills the agent's server with the rest; with hand_over, verify starts it again
    # as the service user, confined, and the tests reach it; without, they find it down.
    with box(client) as b:
        c = _serving(b, client)
        r = freeze(c, nonce="n-h")
        assert r.state == "quiescent" and r.marker is not None
        down = run_verifier(c, _QUERY, nonce="n-h")
        assert (down.returncode, down.stdout) == (1, b"down\n")
        hand_over = HandOver(protect=["/workspace"], ports=[8080], service_wait=10)
        served = run_verifier(c, _QUERY, nonce="n-h", hand_over=hand_over)
        assert (served.returncode, served.stdout) == (0, b"served\n"), served.stderr
        record = json.loads(c.read_file("/run/quiesce/handover.json"))
        assert [s["ports"] for s in record["services"]] == [[8080]], record


def test_a_hand_over_verify_refuses_is_exit_20(client: docker.DockerClient) -> None:
    # A protected path the service user could write: verify refuses before any service starts.
    with box(client) as b:
        c = _serving(b, client)
        assert c.exec(["sh", "-c", "mkdir -p /srv/open && chmod 0777 /srv/open"]).returncode == 0
        r = freeze(c, nonce="n-r")
        assert r.state == "quiescent"
        refused = run_verifier(
            c, ["echo", "scored"], nonce="n-r", hand_over=HandOver(protect=["/srv/open"])
        )
        assert refused.returncode == HAND_OVER_EXIT, refused
        assert refused.stdout == b""
        assert b"/srv/open" in refused.stderr, refused.stderr
