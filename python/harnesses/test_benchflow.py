"""BenchFlow 0.7.11 (the wheel from PyPI): its own DockerSandbox (Compose v2), its own
verify step (`_verify_rollout`: harden_before_verify, then its Verifier running tests/test.sh),
with BenchFlow's default planes and with QuiescePlanes, on an image that runs quiesce as its init
(qhk-slim) and on one without quiesce (debian:bookworm-slim: the planes start it as a sidecar).
The agent phase is not run (it needs an ACP agent and a model): BenchFlow's setup_sandbox_user
plane runs as it does before the agent, then the "agent" is a leftover process started as the
sandbox user."""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker
import pytest
from benchflow.rollout import Rollout, RolloutConfig
from benchflow.rollout._setup import _verify_rollout
from benchflow.rollout_planes import DefaultRolloutPlanes
from benchflow.sandbox.setup import _create_environment
from benchflow.task import Task
from benchflow.task.paths import RolloutPaths

from quiesce_harness import Container, InstallFailed
from quiesce_harness.adapters.benchflow import QuiescePlanes

import support
from conftest import REWARD_FORGER

# An image without quiesce: PID 1 is BenchFlow's `sh -c "sleep infinity"`, and no agent user.
BARE = "debian:bookworm-slim"
HONEST = "echo 42 > /app/answer.txt; nohup sleep 1000 >/dev/null 2>&1 &"

TEST_SH = """#!/bin/sh
# The scorer: 1 only for the right answer; it takes a moment, as scorers do.
if [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ]; then r=1; else r=0; fi
echo $r > /logs/verifier/reward.txt
sleep 0.3
"""


def make_task(root: Path, image: str, compose: str = "", *, nnp: bool = True) -> Path:
    t = root / "task"
    (t / "environment").mkdir(parents=True)
    (t / "tests").mkdir()
    (t / "task.toml").write_text(
        'version = "1.0"\n[agent]\ntimeout_sec = 120\n[verifier]\ntimeout_sec = 60\n'
        f'[environment]\ndocker_image = "{image}"\ncpus = 1\nmemory_mb = 1024\n'
        "allow_internet = false\n"
    )
    (t / "instruction.md").write_text("Write 42 to /app/answer.txt\n")
    (t / "environment" / "Dockerfile").write_text(f"FROM {image}\n")
    # Merged by DockerSandbox over its own compose files: the pids limit, and no-new-privileges
    # (quiesce verify refuses a marker signed without it).
    (t / "environment" / "docker-compose.yaml").write_text(
        "services:\n  main:\n    deploy:\n      resources:\n        limits:\n"
        f"          pids: {support.PIDS_LIMIT}\n"
        + (f"    security_opt:\n      - {support.SECURITY_OPT}\n" if nnp else "")
        + compose
    )
    (t / "tests" / "test.sh").write_text(TEST_SH)
    return t


@contextlib.asynccontextmanager
async def started_sandbox(
    tmp_path: Path, image: str, project: str, compose: str = "", *, nnp: bool = True
) -> AsyncIterator[tuple[Any, Task, RolloutPaths]]:
    """BenchFlow's DockerSandbox of a task made here, started: its environment, the task and
    the rollout's paths; stopped and deleted on exit."""
    path = make_task(tmp_path, image, compose, nnp=nnp)
    task = Task(path)
    rp = RolloutPaths(rollout_dir=tmp_path / "rollout")
    rp.mkdir()
    env = _create_environment("docker", task, path, project, rp)
    await env.start(force_build=False)
    try:
        yield env, task, rp
    finally:
        _kill_main(project)
        await env.stop(delete=True)


async def rollout_verify(
    tmp_path: Path,
    image: str,
    project: str,
    planes: Any,
    leftover: list[str],
    *,
    bomb: bool = False,
    compose: str = "",
    wrote: bool = True,
    nnp: bool = True,
) -> tuple[dict[str, float] | None, str | None]:
    async with started_sandbox(tmp_path, image, project, compose, nnp=nnp) as (env, task, rp):
        # As Rollout.install_agent: the workspace, then the sandbox user's plane (where
        # QuiescePlanes starts quiesce), then the agent.
        await env.exec("mkdir -p /app", user="root")
        await planes.setup_sandbox_user(env, "agent", workspace="/app")
        for cmd in leftover:
            await env.exec(cmd, user="agent")
        box = Container.compose("main", project=project)
        if wrote:
            support.until(
                lambda: box.exec(["test", "-s", "/logs/verifier/reward.txt"]).returncode == 0,
                15,
                "the leftover never wrote",
            )
        if bomb:
            ctr = docker.from_env().containers.get(box._docker_id())
            b = support.Box(docker.from_env(), ctr)
            support.until(lambda: b.pids() >= support.PIDS_LIMIT - 2, 30, "the bomb never held")
        rewards, error, _ = await _verify_rollout(
            env, task, rp, {}, planes, sandbox_user="agent", workspace="/app"
        )
        return rewards, error


class RootCommandPlanes(QuiescePlanes):
    """QuiescePlanes whose harden_before_verify also runs `command` as root, a process of the
    image's own: before the kit's freeze (`before=True`) or once it is over."""

    def __init__(self, command: str, *, before: bool = False) -> None:
        super().__init__()
        self.command, self.before = command, before

    async def harden_before_verify(self, *a: Any, **kw: Any) -> None:
        if self.before:
            await self._run(a[0])
        await super().harden_before_verify(*a, **kw)
        if not self.before:
            await self._run(a[0])

    async def _run(self, env: Any) -> None:
        r = await env.exec(self.command, user="root")
        assert r.return_code == 0, f"{self.command!r} as root: exit {r.return_code}: {r.stdout}"


# A root process of the image's that starts the forger again as the sandbox user.
FORGER_AS_AGENT = f"su -s /bin/sh agent -c {shlex.quote(REWARD_FORGER)}"


def forger_restarted(tmp_path: Path, image: str, project: str, command: str) -> str:
    """The verifier's error of a rollout whose freeze held (quiescent) and after which a root
    `command` started the forger again: no reward is kept."""
    planes = RootCommandPlanes(command)
    rewards, error = asyncio.run(rollout_verify(tmp_path, image, project, planes, [REWARD_FORGER]))
    assert rewards is None and error is not None, (rewards, error)
    assert planes.results[0].state == "quiescent"
    return error


def _kill_main(project: str) -> None:
    # BenchFlow's stop gives a PID 1 that ignores SIGTERM (sh, sleep) 5 s: not spent here.
    c = docker.from_env()
    for ctr in c.containers.list(filters={"label": f"com.docker.compose.project={project}"}):
        ctr.kill()


@pytest.mark.parametrize(
    ("task_image", "quiesce"), [(BARE, False), (BARE, True)], indirect=["task_image"]
)
def test_a_rollout_of_an_unchanged_task(
    tmp_path: Path,
    task_image: str,
    project: str,
    quiesce: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A whole Rollout.run() of a task whose image has no quiesce, with BenchFlow's oracle agent
    # (no model needed) as the hostile agent: its solve.sh solves nothing and leaves a forger.
    # BenchFlow 0.7.11 runs solve.sh as root even with sandbox_user="agent" (_run_oracle(...,
    # sandbox_user=None), after setup_sandbox_user(..., guard_daemon=False)): its own planes
    # keep the forged 1; QuiescePlanes cannot tell a root agent's processes from the
    # verifier's, start nothing and keep no reward, naming why. The hostile 0.0 and honest
    # 1.0 of an agent run as the sandbox user are the tests below (the plane BenchFlow calls
    # before the agent, then its own verify step), as no agent BenchFlow runs as the sandbox
    # user works here without a model.
    monkeypatch.setenv("BENCHFLOW_AGENTS_SOURCE", "off")  # no registry fetch offline
    path = make_task(tmp_path, task_image)
    (path / "solution").mkdir()
    (path / "solution" / "solve.sh").write_text(
        f"id -u > /logs/agent/solve-uid\n{REWARD_FORGER}\nsleep 1\n"
    )
    planes = QuiescePlanes() if quiesce else DefaultRolloutPlanes()
    config = RolloutConfig(
        task_path=path,
        agent="oracle",
        sandbox_user="agent",
        rollout_name=project,
        jobs_dir=tmp_path / "jobs",
        planes=planes,
    )
    result = asyncio.run(Rollout(config).run())
    [uid] = list((tmp_path / "jobs").rglob("solve-uid"))
    assert uid.read_text().strip() == "0"  # BenchFlow ran the oracle as root
    if not quiesce:
        assert (result.rewards, result.verifier_error) == ({"reward": 1.0}, None)
        return
    assert result.rewards is None
    assert result.verifier_error is not None
    assert "guard_daemon=False" in result.verifier_error
    assert "the agent runs as root" in result.verifier_error
    assert isinstance(planes, QuiescePlanes)
    assert planes.guards == [] and planes.results == []


@pytest.mark.parametrize(
    ("task_image", "sidecar"), [(support.SLIM, False), (BARE, True)], indirect=["task_image"]
)
def test_quiesce_planes_score_what_the_test_scored(
    tmp_path: Path, task_image: str, project: str, sidecar: bool
) -> None:
    # qhk-slim runs quiesce as PID 1; on debian:bookworm-slim the planes start the sidecar.
    planes = QuiescePlanes()
    rewards, error = asyncio.run(
        rollout_verify(tmp_path, task_image, project, planes, [REWARD_FORGER])
    )
    assert (rewards, error) == ({"reward": 0.0}, None)
    [r] = planes.results
    assert r.state == "quiescent" and r.killed >= 1 and r.marker
    # The task's compose file asked for no-new-privileges: a marker quiesce verify scores.
    assert support.unverified_claims(r.marker)["setuid"] is False
    [g] = planes.guards
    assert g.sidecar is sidecar


@pytest.mark.parametrize("task_image", [BARE], indirect=True)
def test_sidecar_planes_keep_an_honest_reward(
    tmp_path: Path, task_image: str, project: str
) -> None:
    planes = QuiescePlanes()
    rewards, error = asyncio.run(
        rollout_verify(tmp_path, task_image, project, planes, [HONEST], wrote=False)
    )
    assert (rewards, error) == ({"reward": 1.0}, None)
    assert planes.results[0].killed >= 1


@pytest.mark.parametrize("task_image", [support.SLIM, BARE], indirect=True)
def test_quiesce_planes_through_a_bomb_at_the_pids_limit(
    tmp_path: Path, task_image: str, project: str
) -> None:
    # The task's compose file sets the pids limit that the bomb holds.
    bomb = "nohup " + support.WORKLOADS["fork-bomb"] + " >/dev/null 2>&1 &"
    planes = QuiescePlanes()
    rewards, error = asyncio.run(
        rollout_verify(tmp_path, task_image, project, planes, [REWARD_FORGER, bomb], bomb=True)
    )
    assert (rewards, error) == ({"reward": 0.0}, None)
    assert planes.results[0].killed >= 100


@pytest.mark.parametrize("task_image", [support.SLIM, BARE], indirect=True)
def test_a_failed_freeze_keeps_no_reward(tmp_path: Path, task_image: str, project: str) -> None:
    # A root daemon forking all the time makes the freeze fail: BenchFlow records the raise
    # as a verifier error and keeps no reward.
    planes = RootCommandPlanes(support.ROOT_DAEMON_BACKGROUND, before=True)
    rewards, error = asyncio.run(
        rollout_verify(tmp_path, task_image, project, planes, [REWARD_FORGER])
    )
    assert rewards is None
    assert error is not None and "vouch" in error


@pytest.mark.parametrize("task_image", [BARE], indirect=True)
def test_a_sandbox_process_started_after_the_freeze_stops_the_scoring(
    tmp_path: Path, task_image: str, project: str
) -> None:
    # A root process of the image starts the forger again as the sandbox user once the freeze
    # is over: quiesce verify's live probe, before BenchFlow's verifier, finds it alive.
    error = forger_restarted(tmp_path, task_image, project, FORGER_AS_AGENT)
    assert "exited 16" in error and "alive" in error


@pytest.mark.parametrize("task_image", [BARE], indirect=True)
def test_a_task_without_no_new_privileges_keeps_no_reward_naming_the_fix(
    tmp_path: Path, task_image: str, project: str
) -> None:
    # BenchFlow's compose files set no security_opt: a setuid binary could make a sandbox
    # process root, which no freeze can tell from root. Refused unless the task sets it.
    rewards, error = asyncio.run(
        rollout_verify(tmp_path, task_image, project, QuiescePlanes(), [REWARD_FORGER], nnp=False)
    )
    assert rewards is None
    assert error is not None and "security_opt: [no-new-privileges]" in error


def test_a_read_only_root_file_system_stops_the_rollout_naming_the_fix(
    tmp_path: Path, task_image: str, project: str
) -> None:
    # qhk-slim without its quiesce entrypoint, on a read-only root file system: the sidecar
    # has nowhere to go. The sandbox user's plane raises (the rollout ends before the agent),
    # and a verify step run anyway keeps no reward.
    compose = '    read_only: true\n    entrypoint: ["sh", "-c", "exec sleep infinity"]\n'

    async def run() -> tuple[str, dict[str, float] | None, str | None]:
        planes = QuiescePlanes()
        async with started_sandbox(tmp_path, task_image, project, compose) as (env, task, rp):
            with pytest.raises(InstallFailed) as e:
                await planes.setup_sandbox_user(env, "agent", workspace="/workspace")
            await env.exec(REWARD_FORGER, user="agent")
            rewards, error, _ = await _verify_rollout(
                env, task, rp, {}, planes, sandbox_user="agent", workspace="/workspace"
            )
            return str(e.value), rewards, error

    said, rewards, error = asyncio.run(run())
    assert "read-only root file system install_path= must name a writable" in said
    assert rewards is None
    assert error is not None and "could not get into" in error and "install_path=" in error


@pytest.mark.parametrize("task_image", [support.PROCPS], indirect=True)
def test_benchflow_own_hardening_with_procps(tmp_path: Path, task_image: str, project: str) -> None:
    # With pkill in the image BenchFlow's own kill ends this leftover (TERM ignored, so after
    # its sleep 1 and the -9): the kit's adapter is needed for the slim image and the bomb.
    rewards, error = asyncio.run(
        rollout_verify(tmp_path, task_image, project, DefaultRolloutPlanes(), [REWARD_FORGER])
    )
    assert (rewards, error) == ({"reward": 0.0}, None)


# A task whose image puts a workspace tool directory first on PATH (a project venv, say):
# BenchFlow makes the workspace the sandbox user's, which plants its own `true`, `quiesce`,
# `stat`, `id` ... there. Each records a root run in a file BenchFlow copies out. Not `sh` and
# `cat`: BenchFlow 0.7.11's own root execs (`sh -c ...` through the image's PATH, its
# hardening, its test.sh) run those, which no plane can change (docs/threat-model.md).
IMAGE_PATH = "/app/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FAKE = (
    "#!/bin/sh\n"
    '[ "$(/usr/bin/id -u)" = 0 ] && echo "${0##*/} $*" >> /logs/agent/fake-ran.log\n'
    "for d in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do\n"
    '    [ -x "$d/${0##*/}" ] && exec "$d/${0##*/}" "$@"\n'
    "done\n"
)
PLANT = "mkdir -p /app/bin && cd /app/bin && " + " && ".join(
    f"printf '%s' {shlex.quote(FAKE)} > {n} && chmod 755 {n}"
    for n in ("true", "quiesce", "stat", "id", "kill", "uname", "readlink", "sha256sum")
)


@pytest.mark.parametrize(
    ("task_image", "sidecar"), [(support.SLIM, False), (BARE, True)], indirect=["task_image"]
)
def test_the_planes_run_nothing_of_a_path_the_sandbox_user_owns(
    tmp_path: Path, task_image: str, project: str, sidecar: bool
) -> None:
    compose = f"    environment:\n      - PATH={IMAGE_PATH}\n"
    planes = QuiescePlanes()
    rewards, error = asyncio.run(
        rollout_verify(
            tmp_path, task_image, project, planes, [PLANT, REWARD_FORGER], compose=compose
        )
    )
    assert (rewards, error) == ({"reward": 0.0}, None)
    [g] = planes.guards
    assert g.sidecar is sidecar and g.container.binary_path().startswith("/")
    assert not (tmp_path / "rollout" / "agent" / "fake-ran.log").exists()


@pytest.mark.parametrize("task_image", [BARE], indirect=True)
def test_a_sandbox_process_started_once_the_gate_passed_drops_the_reward(
    tmp_path: Path, task_image: str, project: str
) -> None:
    # A root service of the image that starts the sandbox user's forger again once BenchFlow
    # has uploaded the tests (after the gate's probe, while test.sh runs): the probe after the
    # scoring finds it alive, and the reward is dropped.
    later = (
        "nohup sh -c "
        + shlex.quote(f"while [ ! -e /tests/test.sh ]; do sleep 0.02; done; {FORGER_AS_AGENT}")
        + " >/dev/null 2>&1 &"
    )
    error = forger_restarted(tmp_path, task_image, project, later)
    assert "after the scoring exited 16" in error and "alive" in error
