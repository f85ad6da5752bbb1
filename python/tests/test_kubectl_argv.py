"""The command lines the kit gives `kubectl`, checked against a fake `kubectl` on PATH.

ARGV ONLY: no Kubernetes cluster can run on this machine (no kube-apiserver or kubelet in
Debian's archive; kind, k3s and minikube fetch their own binaries from outside the package
registries), so these tests check what the kit asks kubectl to do, never what a cluster does
with it. The fake records each call's argv and answers the way `kubectl exec` passes on what
the command in the pod printed and its exit code.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from quiesce_harness import Container, Unreachable, freeze, run_verifier
from quiesce_harness.container import _SAFE_SH

FAKE = """#!{python}
import json, os, sys
argv = sys.argv[1:]
with open(os.environ["FAKE_KUBECTL_LOG"], "a") as f:
    f.write(json.dumps(argv) + "\\n")
mode = os.environ.get("FAKE_KUBECTL_MODE", "ok")
if mode == "no-exec":
    sys.stderr.write("OCI runtime exec failed: exec failed: unable to start container "
                     "process: read init-p: connection reset by peer\\n")
    sys.exit(126)
cmd = argv[argv.index("--") + 1:]
if cmd[:2] == ["/bin/sh", "-c"] and cmd[2].startswith("PATH="):
    cmd = cmd[4:]  # the kit's bare command, run with its fixed PATH
if "freeze" in cmd:
    nonce = cmd[cmd.index("--nonce") + 1]
    print(json.dumps({{"id": "f1", "request_id": "r1", "nonce": nonce, "state": "quiescent",
                      "reason": None, "survivors": [], "killed": 2,
                      "phases_ms": {{"stop": 0, "walk": 0, "kill": 0, "probe": 0, "total": 1}},
                      "marker": os.environ["FAKE_KUBECTL_MARKER"]}}))
    sys.exit(0)
if "verify" in cmd:
    print("scored")
    sys.exit(0)
if cmd[:2] == ["sh", "-c"]:
    with open(os.environ["FAKE_KUBECTL_LOG"] + ".stdin", "wb") as f:
        f.write(sys.stdin.buffer.read())
    sys.exit(0)
sys.exit(1)
"""


def _marker(jti: str) -> str:
    """A token shaped like a marker naming `jti` (the kit's freeze() checks only its jti)."""

    def b64(d: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")

    return f"{b64({'alg': 'EdDSA'})}.{b64({'jti': jti})}.c2ln"


@pytest.fixture
def kubectl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake `kubectl` first on PATH; returns the file its calls are recorded in."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "kubectl"
    fake.write_text(FAKE.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_KUBECTL_LOG", str(log))
    monkeypatch.setenv("FAKE_KUBECTL_MARKER", _marker("f1"))
    return log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_freeze_execs_quiesce_in_the_named_pod_and_container(kubectl: Path) -> None:
    c = Container.kubectl("task-0", namespace="evals", container="main", binary="/sbin/quiesce")
    r = freeze(c, nonce="n-k8s", timeout=30)
    assert r.state == "quiescent" and r.marker == _marker("f1") and not r.via_signal
    (argv,) = calls(kubectl)
    head = ["exec", "-n", "evals", "task-0", "-c", "main", "--"]
    assert argv[: len(head)] == head
    cmd = argv[len(head) :]
    assert cmd[:6] == ["/sbin/quiesce", "freeze", "--wait", "--json", "--nonce", "n-k8s"]
    assert cmd[6] == "--timeout" and 1 <= int(cmd[7]) <= 30 and len(cmd) == 8


def test_without_namespace_or_container_kubectl_picks_its_defaults(kubectl: Path) -> None:
    c = Container.kubectl("task-1", binary="/run/quiesce-bin/quiesce")
    freeze(c, nonce="n-2")
    (argv,) = calls(kubectl)
    assert argv[:4] == ["exec", "task-1", "--", "/run/quiesce-bin/quiesce"]


def test_run_verifier_puts_the_verifier_behind_quiesce_verify(kubectl: Path) -> None:
    c = Container.kubectl("task-0", namespace="evals", container="main", binary="/sbin/quiesce")
    done = run_verifier(c, "pytest /tests", nonce="n-k8s", sandbox_user="agent")
    assert (done.returncode, done.stdout) == (0, b"scored\n")
    (argv,) = calls(kubectl)
    assert argv == [
        "exec", "-n", "evals", "task-0", "-c", "main", "--",
        "/sbin/quiesce", "verify", "--nonce", "n-k8s", "--sandbox-user", "agent",
        "--", "/bin/sh", "-c", "pytest /tests",
    ]  # fmt: skip


def test_run_verifier_accepts_privilege_escalation_only_when_asked(kubectl: Path) -> None:
    c = Container.kubectl("task-0", binary="/sbin/quiesce")
    run_verifier(c, ["./score"], nonce="n-k8s", accept_privilege_escalation=True)
    (argv,) = calls(kubectl)
    assert argv == [
        "exec", "task-0", "--",
        "/sbin/quiesce", "verify", "--nonce", "n-k8s", "--accept-privilege-escalation",
        "--", "./score",
    ]  # fmt: skip


def test_kubectl_cannot_choose_the_exec_user_or_environment(kubectl: Path) -> None:
    c = Container.kubectl("task-0")
    with pytest.raises(ValueError, match="quiesce exec --user"):
        c.exec(["id"], user="agent")
    with pytest.raises(ValueError, match="environment"):
        c.exec(["id"], env={"A": "1"})
    assert calls(kubectl) == []


def test_no_exec_can_start_and_no_signal_exists_is_unreachable(
    kubectl: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_KUBECTL_MODE", "no-exec")
    c = Container.kubectl("task-0", namespace="evals")
    with pytest.raises(Unreachable, match="no API that signals"):
        freeze(c, nonce="n-3", timeout=5)
    # One exec tried, no `kubectl` command that would claim to signal the init.
    assert [a[0] for a in calls(kubectl)] == ["exec"]


def test_a_file_goes_in_on_the_execs_stdin(kubectl: Path, tmp_path: Path) -> None:
    # kubectl has no copy that needs nothing in the pod: start_sidecar's binary goes in through
    # `kubectl exec -i ... sh -c 'cat > PATH'`, as the pod's own user (kubectl chooses none).
    f = tmp_path / "quiesce"
    f.write_bytes(b"\x7fELF binary")
    Container.kubectl("task-0", namespace="evals").upload(f, "/run/quiesce-bin/.quiesce.new")
    (argv,) = calls(kubectl)
    assert argv == [
        "exec", "-i", "-n", "evals", "task-0", "--", *_SAFE_SH,
        "sh", "-c", 'cat > "$1"', "sh", "/run/quiesce-bin/.quiesce.new",
    ]  # fmt: skip
    assert Path(f"{kubectl}.stdin").read_bytes() == b"\x7fELF binary"
