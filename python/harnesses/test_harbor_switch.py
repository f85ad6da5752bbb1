"""Harbor 0.25.0 through its own CLI (`harbor run`, `harbor trials start`), offline, on local
tasks with no quiesce in them: the image is plain Debian with an `agent` user, tests/ and
solution/ are a task's own, and only task.toml's `[agent] user` is set. quiesce is switched on
by the command line alone:

    harbor run -p TASK -a oracle \\
        --env quiesce_harness.harbor:QuiescedEnvironment \\
        --verifier quiesce_harness.harbor:QuiescedVerifier

The hostile "oracle" solves nothing and leaves a setsid loop (ignoring TERM) that copies the
tests' expected answer into its output once the tests arrive: it wins unless it is gone before
they do.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import docker
import docker.errors
import pytest

from quiesce_harness.harbor import QuiescedVerifier

import support

SWITCH = [
    "--env",
    "quiesce_harness.harbor:QuiescedEnvironment",
    "--verifier",
    "quiesce_harness.harbor:QuiescedVerifier",
]
# The sidecar path, as a Daytona or Modal sandbox gets it: it cannot set no-new-privileges on a
# container it did not start, so the run accepts that in so many words.
SIDECAR = [
    "--environment-kwarg",
    "via=sidecar",
    "--environment-kwarg",
    "accept_privilege_escalation=true",
]
# Each container of these tests: a pids limit well below the machine's.
PIDS = ["--environment-kwarg", "pids_limit=256"]

HOSTILE = (
    "#!/bin/sh\n"
    'nohup setsid sh -c \'trap "" TERM; : > /tmp/hostile.started; while :; do '
    # Copied beside the answer and renamed over it: a `cp` straight onto it truncates first, and
    # a test that reads it in that instant scores 0 although the loop is alive.
    "[ -f /tests/expected.txt ] && cp /tests/expected.txt /app/.answer "
    "&& mv -f /app/.answer /app/answer.txt; "
    "sleep 0.01; done' >/dev/null 2>&1 &\n"
    # It ends only once the loop runs in a session of its own, so that the end of the exec
    # cannot take the loop along before it got there.
    "for i in $(seq 100); do [ -e /tmp/hostile.started ] && exit 0; sleep 0.1; done; exit 1\n"
)
HONEST = "#!/bin/sh\necho 42 > /app/answer.txt\n"
# The task's test: a second, as a real one takes, then the answer against what it expects.
TEST_SH = (
    "#!/bin/bash\nsleep 1\n"
    'if [ "$(cat /app/answer.txt 2>/dev/null)" = "$(cat /tests/expected.txt)" ]; '
    "then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
)
PLAIN_DOCKERFILE = """FROM debian:bookworm-slim
RUN useradd --create-home --uid 1000 --shell /bin/sh agent \\
 && mkdir -p /app && chown agent:agent /app
WORKDIR /app
{extra}"""


def _entrypoint(script: str) -> str:
    """An exec-form ENTRYPOINT running `script` with sh, the service's command as "$@"."""
    return f"ENTRYPOINT {json.dumps(['/bin/sh', '-c', script, 'sh'])}\n"


# PID 1 a shell of the image's own, whatever command Harbor's Compose file gives.
SHELL_PID1 = _entrypoint("trap : TERM; while :; do sleep 1; done")
# A root daemon the image starts beside its PID 1: it double-forks all the time, so that a
# sidecar's freeze finds processes it cannot vouch for (their parent is the image's PID 1).
ROOT_DAEMON = _entrypoint(support.WORKLOADS_ROOT_DAEMON + ' >/dev/null 2>&1 & exec "$@"')
# Under the init, the daemon's double-forks are the init's own to vouch for; this root daemon
# instead starts a process of the agent's UID every 20 ms, so that one is born during the
# freeze or after it, and the freeze fails or the gate refuses.
SPAWNER = _entrypoint(
    "while :; do setpriv --reuid=1000 --regid=1000 --clear-groups sleep 1 & sleep 0.02; "
    'done >/dev/null 2>&1 & exec "$@"'
)


# An image that left /tests writable by the agent.
TESTS_THE_AGENTS = "RUN mkdir /tests && chown agent /tests\n"
# An image whose PATH starts with a directory of the agent's (a venv in the workspace).
PATH_THE_AGENTS = "RUN mkdir -p /app/bin && chown agent /app/bin\nENV PATH=/app/bin:$PATH\n"
# Its agent solves nothing and leaves, first on that PATH, what Harbor and the kit might run
# as root: each, run as root, starts a root loop that copies the expected answer once the
# tests arrive (a root process no freeze ends), then runs the real one.
PATH_FAKE = (
    "#!/bin/sh\n"
    'if [ "$(/usr/bin/id -u)" = 0 ]; then /usr/bin/setsid /bin/sh -c '
    "'for i in $(/usr/bin/seq 1200); do [ -e /tests/expected.txt ] && "
    "/bin/cp /tests/expected.txt /app/answer.txt; /bin/sleep 0.05; done' "
    ">/dev/null 2>&1 </dev/null & fi\n"
    "n=${0##*/}; for d in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do "
    '[ -x "$d/$n" ] && exec "$d/$n" "$@"; done; exit 127\n'
)
PATH_PLANTER = (
    "#!/bin/sh\n"
    f"printf '%s' {shlex.quote(PATH_FAKE)} > /app/bin/.fake && chmod 755 /app/bin/.fake\n"
    "for n in bash sh find rm mkdir chown chmod cat tr sed head quiesce true; do "
    "cp /app/bin/.fake /app/bin/$n; done\n"
)

# An image whose environment names a startup file the agent can write (BASH_ENV, as PATH names
# a venv in the workspace above): every exec inherits it, and every non-interactive bash
# (Harbor wraps each command in `bash -c`) sources it first, as whoever runs.
BASH_ENV_THE_AGENTS = (
    "RUN touch /app/.bashenv && chown agent /app/.bashenv\nENV BASH_ENV=/app/.bashenv\n"
)
# Its agent solves nothing and writes there a root loop that copies the expected answer once
# the tests arrive, started by any bash run as root.
BASH_ENV_HOOK = (
    'if [ "$(id -u)" = 0 ]; then setsid sh -c \'for i in $(seq 1200); do '
    "[ -e /tests/expected.txt ] && cp /tests/expected.txt /app/.a$$ && mv -f /app/.a$$ "
    "/app/answer.txt; sleep 0.05; done' </dev/null >/dev/null 2>&1 & fi\n"
)
BASH_ENV_PLANTER = f"#!/bin/sh\nprintf '%s' {shlex.quote(BASH_ENV_HOOK)} > /app/.bashenv\n"


def _build(client: docker.DockerClient, tag: str, extra: str) -> None:
    with tempfile.TemporaryDirectory() as ctx:
        (Path(ctx) / "Dockerfile").write_text(PLAIN_DOCKERFILE.format(extra=extra))
        client.images.build(path=ctx, tag=tag, rm=True, labels={support.LABEL: "1"})


@pytest.fixture(scope="module")
def images(client: docker.DockerClient) -> Iterator[dict[str, str]]:
    """Task images with no quiesce in them: plain, PID 1 a shell, a root daemon beside it."""
    run = uuid.uuid4().hex[:6]
    tags = {
        "plain": f"{support.PREFIX}hb-plain-{run}",
        "shell": f"{support.PREFIX}hb-shell-{run}",
        "daemon": f"{support.PREFIX}hb-daemon-{run}",
        "spawner": f"{support.PREFIX}hb-spawner-{run}",
        "tests": f"{support.PREFIX}hb-tests-{run}",
        "path": f"{support.PREFIX}hb-path-{run}",
        "bash_env": f"{support.PREFIX}hb-bashenv-{run}",
    }
    _build(client, tags["plain"], "")
    _build(client, tags["shell"], SHELL_PID1)
    _build(client, tags["daemon"], ROOT_DAEMON)
    _build(client, tags["spawner"], SPAWNER)
    _build(client, tags["tests"], TESTS_THE_AGENTS)
    _build(client, tags["path"], PATH_THE_AGENTS)
    _build(client, tags["bash_env"], BASH_ENV_THE_AGENTS)
    yield tags
    for t in tags.values():
        with contextlib.suppress(docker.errors.DockerException):
            client.images.remove(t, force=True)


def make_task(
    root: Path, name: str, image: str, solve: str, *, compose: str = "", user: str | None = "agent"
) -> Path:
    t = root / name
    for d in ("environment", "tests", "solution"):
        (t / d).mkdir(parents=True)
    (t / "task.toml").write_text(
        'schema_version = "1.4"\n[metadata]\n'
        "[agent]\ntimeout_sec = 120.0\n"
        + (f'user = "{user}"\n' if user is not None else "")
        + "[verifier]\ntimeout_sec = 120.0\n"
        f'[environment]\ndocker_image = "{image}"\n'
    )
    (t / "instruction.md").write_text("Write the expected answer to /app/answer.txt\n")
    (t / "environment" / "Dockerfile").write_text(f"FROM {image}\n")
    if compose:
        (t / "environment" / "docker-compose.yaml").write_text(compose)
    (t / "solution" / "solve.sh").write_text(solve)
    (t / "tests" / "test.sh").write_text(TEST_SH)
    (t / "tests" / "expected.txt").write_text("42\n")
    for f in ("solution/solve.sh", "tests/test.sh"):
        (t / f).chmod(0o755)
    return t


@dataclass
class Outcome:
    """One trial as Harbor wrote it down (its result.json)."""

    task: str
    reward: float | None
    exception: str | None
    message: str
    traceback: str
    seconds: float
    log: str

    @property
    def unscored(self) -> bool:
        return self.exception is not None and self.reward in (None, 0.0)


def _outcome(path: Path) -> Outcome:
    r = json.loads(path.read_text())
    vr = r.get("verifier_result") or {}
    ex = r.get("exception_info") or {}
    started, finished = r.get("started_at"), r.get("finished_at")
    from datetime import datetime

    secs = (
        (datetime.fromisoformat(finished) - datetime.fromisoformat(started)).total_seconds()
        if started and finished
        else 0.0
    )
    return Outcome(
        task=str(r.get("task_name")),
        reward=(vr.get("rewards") or {}).get("reward"),
        exception=ex.get("exception_type"),
        message=str(ex.get("exception_message", "")),
        traceback=str(ex.get("exception_traceback", "")),
        seconds=secs,
        log=(path.parent / "trial.log").read_text(errors="replace")
        if (path.parent / "trial.log").exists()
        else "",
    )


def harbor(argv: list[str], out: Path, timeout: float = 600) -> list[Outcome]:
    """Harbor's CLI in a subprocess; the trials it wrote down under `out`."""
    exe = str(Path(sys.executable).with_name("harbor"))
    p = subprocess.run(
        [exe, *argv],
        capture_output=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    found = [_outcome(f) for f in sorted(out.rglob("result.json")) if "trial_name" in f.read_text()]
    if not found:
        pytest.fail(
            f"harbor {' '.join(argv)} wrote no trial (exit {p.returncode}):\n"
            + (p.stdout + p.stderr).decode(errors="replace")[-3000:]
        )
    return found


def run_one(tmp: Path, task: Path, *opts: str) -> Outcome:
    """`harbor run` of one task with the oracle agent."""
    out = tmp / f"jobs-{uuid.uuid4().hex[:6]}"
    [o] = harbor(["run", "-p", str(task), "-a", "oracle", "-o", str(out), "-y", *opts], out)
    return o


def start_one(tmp: Path, task: Path, *opts: str) -> Outcome:
    """`harbor trials start` of one task with the oracle agent."""
    out = tmp / f"trials-{uuid.uuid4().hex[:6]}"
    argv = ["trials", "start", "-p", str(task), "-a", "oracle", "--trials-dir", str(out)]
    [o] = harbor([*argv, *opts], out)
    return o


# --- the attack is real, and the switch stops it ----------------------------------------------


def test_without_the_switch_the_hostile_oracle_scores(
    tmp_path: Path, images: dict[str, str]
) -> None:
    o = run_one(tmp_path, make_task(tmp_path, "hostile", images["plain"], HOSTILE))
    assert (o.reward, o.exception) == (1.0, None), o


# --- a root agent: the task names no agent user (as Terminal-Bench's tasks) -------------------

# An honest agent that needs root: a user of its own, a tool in /usr/local/bin, then the answer.
# It finds no signing key in the container (a root agent would read one).
HONEST_ROOT = (
    "#!/bin/sh\nset -e\n! ls /run/quiesce-harbor-key/signing.key\nuseradd --no-create-home helper\n"
    "printf '#!/bin/sh\\necho 42\\n' > /usr/local/bin/answer && chmod 755 /usr/local/bin/answer\n"
    "answer > /app/answer.txt\n"
)


ROOT = ["--environment-kwarg", "accept_root_agent=true"]


def test_a_root_agent_is_refused_unless_accepted(tmp_path: Path, images: dict[str, str]) -> None:
    task = make_task(tmp_path, "honest-root", images["plain"], HONEST_ROOT, user=None)
    o = start_one(tmp_path, task, *SWITCH, *PIDS)
    assert o.reward is None and o.exception is not None, o
    assert "accept_root_agent=true" in o.message, o.message


def test_a_root_agent_s_loop_scores_without_the_switch_and_is_frozen_with_it(
    tmp_path: Path, images: dict[str, str]
) -> None:
    task = make_task(tmp_path, "hostile-root", images["plain"], HOSTILE, user=None)
    o = run_one(tmp_path, task)
    assert (o.reward, o.exception) == (1.0, None), o
    o = start_one(tmp_path, task, *SWITCH, *PIDS, *ROOT)
    assert o.reward in (None, 0.0), o
    # Frozen, not refused: the root loop was a sandbox process by its lineage, and was killed.
    kills = re.findall(r"quiescent in [0-9.]+ s \(killed ([0-9]+)", o.log)
    assert kills and int(kills[0]) >= 1, (o.exception, o.message, o.log[-1500:])
    assert o.exception is None, o


def test_a_root_agent_that_needs_root_scores_with_the_switch(
    tmp_path: Path, images: dict[str, str]
) -> None:
    task = make_task(tmp_path, "honest-root", images["plain"], HONEST_ROOT, user=None)
    o = start_one(tmp_path, task, *SWITCH, *PIDS, *ROOT)
    assert (o.reward, o.exception) == (1.0, None), (o.message, o.log[-1500:])


# A root agent that rewrites the image's bash: the real one moved aside, a wrapper in its place
# that, each time it runs, leaves a root loop copying the expected answer once the tests arrive.
# Before, Harbor's later `bash -c` (its root commands after the freeze) ran it untagged, and
# the loop scored beside a genuine marker. Now every exec of the switch's after the agent's
# first starts with quiesce's argv: the loop is the sandbox's, and the gate's live probe finds
# it alive before the tests run.
WRAPPER = (
    "#!/bin/bash.real\n"
    "setsid /bin/sh -c 'for i in $(seq 1200); do [ -e /tests/expected.txt ] && "
    "cp /tests/expected.txt /app/answer.txt; sleep 0.05; done' </dev/null >/dev/null 2>&1 &\n"
    'exec /bin/bash.real "$@"\n'
)
BASH_REWRITER = (
    "#!/bin/sh\nset -e\nmv /bin/bash /bin/bash.real\n"
    f"printf '%s' {shlex.quote(WRAPPER)} > /bin/bash\nchmod 755 /bin/bash\n"
)


@pytest.mark.parametrize("user", ["root", None], ids=["named-root", "unnamed"])
def test_a_root_agent_that_names_its_user_is_frozen(
    tmp_path: Path, images: dict[str, str], user: str | None
) -> None:
    # Terminus-2 runs every command with user=environment.default_user, which Harbor sets to
    # the task's `[agent] user`: "root" here, None where the task names none. Both are root
    # agents, and both launches are tagged: the loop is killed by the freeze.
    task = make_task(tmp_path, "named-root", images["plain"], "#!/bin/sh\ntrue\n", user=user)
    out = tmp_path / "trials"
    argv = ["trials", "start", "-p", str(task), "-a", "harbor_agents:DefaultUserAgent"]
    with mock.patch.dict(os.environ, {"DEFAULT_USER_AGENT_CMD": HOSTILE}):
        [o] = harbor([*argv, "--trials-dir", str(out), *SWITCH, *PIDS, *ROOT], out)
    assert o.reward in (None, 0.0), (o.message, o.log[-1500:])
    kills = re.findall(r"quiescent in [0-9.]+ s \(killed ([0-9]+)", o.log)
    assert kills and int(kills[0]) >= 1, (o.exception, o.message, o.log[-1500:])


def test_a_root_agent_s_rewritten_bash_runs_nothing_untagged_before_the_tests(
    tmp_path: Path, images: dict[str, str]
) -> None:
    task = make_task(tmp_path, "bash-rewriter", images["plain"], BASH_REWRITER, user=None)
    o = start_one(tmp_path, task, *SWITCH, *PIDS, *ROOT)
    assert o.reward in (None, 0.0), (o.message, o.log[-1500:])
    assert o.exception == "GateRefused" and "a sandbox process is alive" in o.message, o


def test_the_init_path_runs_quiesce_s_argv_in_place_of_the_image_s_bash() -> None:
    # The argv the init path hands Compose for an exec the switch made (Harbor 0.25.0's
    # `exec [-w D] [-e K=V] [-u U] main bash -c TEXT`), without and with one to run instead.
    import asyncio

    from quiesce_harness import harbor as hb

    ran: list[list[str]] = []

    class Compose:
        async def _run_docker_compose_command(self, command: list[str], *a: Any, **k: Any) -> None:
            ran.append(command)

    class Init(hb._ComposeInit, Compose):
        pass

    text = "exec /quiesce exec -- bash -c true"
    argv = [hb.INIT_BINARY, "exec", "--", "bash", "-c", "true"]
    given = ["exec", "-w", "/app", "-u", "root", "main", "bash", "-c", text]

    async def go(instead: tuple[str, list[str]] | None, command: list[str]) -> None:
        token = hb._INSTEAD.set(instead)
        try:
            await Init()._run_docker_compose_command(command)
        finally:
            hb._INSTEAD.reset(token)

    asyncio.run(go(None, given))
    asyncio.run(go((text, argv), given))
    assert ran == [given, ["exec", "-w", "/app", "-u", "root", "main", *argv]]
    with pytest.raises(hb.QuiesceNotOn):
        asyncio.run(go((text, argv), ["exec", "main", "sh", "-c", text]))


def test_a_root_agent_is_refused_on_the_sidecar_path(
    tmp_path: Path, images: dict[str, str]
) -> None:
    task = make_task(tmp_path, "honest-root", images["plain"], HONEST_ROOT, user=None)
    o = start_one(tmp_path, task, *SWITCH, *SIDECAR, *ROOT)
    assert o.reward is None and o.exception is not None, o
    assert "only the init path follows a root agent" in o.message, o.message


def test_trials_start_with_the_switch_scores_an_honest_oracle(
    tmp_path: Path, images: dict[str, str]
) -> None:
    task = make_task(tmp_path, "honest", images["plain"], HONEST)
    o = start_one(tmp_path, task, *SWITCH, *PIDS)
    assert (o.reward, o.exception) == (1.0, None), o


def job(tmp: Path, tasks: Path, n: int, *opts: str) -> tuple[list[Outcome], float]:
    """`harbor run` of every task under `tasks` at -n N; the trials and the wall time."""
    out = tmp / "jobs"
    t0 = time.monotonic()
    argv = ["run", "-p", str(tasks), "-a", "oracle", "-n", str(n), "-o", str(out), "-y"]
    found = harbor([*argv, *opts], out, timeout=900)
    return found, time.monotonic() - t0


def assert_job(found: list[Outcome], trials: int) -> None:
    """Every hostile trial unscored (no reward, or 0.0), every honest one 1.0."""
    assert len(found) == trials, found
    hostile = [o for o in found if o.task.startswith("hostile")]
    honest = [o for o in found if o.task.startswith("honest")]
    assert len(hostile) == len(honest) == trials // 2, found
    assert all(o.reward in (None, 0.0) for o in hostile), hostile
    assert all((o.reward, o.exception) == (1.0, None) for o in honest), honest
    # The hostile loop was alive until the freeze, which killed it.
    kills = {
        o.task: re.findall(r"quiescent in [0-9.]+ s \(killed ([0-9]+)", o.log) for o in hostile
    }
    assert all(k and int(k[0]) >= 1 for k in kills.values()), kills


def freeze_times(root: Path) -> list[float]:
    """The freezes' times as QuiescedEnvironment logged them in each trial.log."""
    out = []
    for log in root.rglob("trial.log"):
        for m in re.finditer(r"quiescent in ([0-9.]+) s", log.read_text(errors="replace")):
            out.append(float(m.group(1)))
    return sorted(out)


def test_a_job_of_sixteen(tmp_path: Path, images: dict[str, str]) -> None:
    # 8 hostile, 8 honest, half of each on the image whose PID 1 is a shell; the init path.
    tasks = tmp_path / "tasks"
    for i in range(8):
        image = images["plain" if i % 2 else "shell"]
        make_task(tasks, f"hostile-{i}", image, HOSTILE)
        make_task(tasks, f"honest-{i}", image, HONEST)
    found, wall = job(tmp_path, tasks, 8, *SWITCH, *PIDS)
    assert_job(found, 16)
    ft = freeze_times(tmp_path / "jobs")
    assert len(ft) == 16, ft
    print(
        f"\njob of 16 at -n 8: {wall:.1f} s wall; trials {min(o.seconds for o in found):.1f}-"
        f"{max(o.seconds for o in found):.1f} s; freezes {ft[0]:.2f}-{ft[-1]:.2f} s "
        f"(median {ft[len(ft) // 2]:.2f})"
    )


# --- the sidecar path: only BaseEnvironment's exec and upload_file reach the container ---------


def test_the_sidecar_path(tmp_path: Path, images: dict[str, str]) -> None:
    tasks = tmp_path / "tasks"
    for image in ("plain", "shell"):
        make_task(tasks, f"hostile-{image}", images[image], HOSTILE)
        make_task(tasks, f"honest-{image}", images[image], HONEST)
    found, _ = job(tmp_path, tasks, 4, *SWITCH, *SIDECAR)
    assert_job(found, 4)
    assert len(freeze_times(tmp_path / "jobs")) == 4


# --- failure is loud: an exception for the trial, and no reward --------------------------------


def honest_trial_fails(
    tmp: Path, images: dict[str, str], exception: str, *opts: str, compose: str = ""
) -> Outcome:
    """A trial of an honest task on the plain image, started with the switch and `opts`, that
    must end in `exception` with no reward: a refusal, not a score."""
    task = make_task(tmp, "honest", images["plain"], HONEST, compose=compose)
    o = start_one(tmp, task, *SWITCH, *opts)
    assert o.reward is None and o.exception == exception, o
    return o


@pytest.mark.parametrize(("image", "via"), [("spawner", []), ("daemon", SIDECAR)])
def test_a_failed_freeze_keeps_no_reward(
    tmp_path: Path, images: dict[str, str], image: str, via: list[str]
) -> None:
    task = make_task(tmp_path, "honest", images[image], HONEST)
    o = start_one(tmp_path, task, *SWITCH, *PIDS, *via)
    assert o.reward is None and o.exception in ("FreezeFailed", "GateRefused"), o


def test_an_architecture_with_no_binary_fails_the_trial(
    tmp_path: Path, images: dict[str, str]
) -> None:
    o = honest_trial_fails(tmp_path, images, "InstallFailed", "--environment-kwarg", "arch=riscv64")
    assert "riscv64" in o.message and "x86_64" in o.message, o


@pytest.mark.parametrize(("via", "fix"), [([], "tmpfs"), (SIDECAR, "install_path")])
def test_a_read_only_root_fails_naming_the_fix(
    tmp_path: Path, images: dict[str, str], via: list[str], fix: str
) -> None:
    ro = "services:\n  main:\n    read_only: true\n"
    o = honest_trial_fails(tmp_path, images, "InstallFailed", *PIDS, *via, compose=ro)
    assert fix in o.message, o


def test_a_main_service_not_root_fails_the_init_naming_the_fix(
    tmp_path: Path, images: dict[str, str]
) -> None:
    as_agent = "services:\n  main:\n    user: '1000'\n"
    o = honest_trial_fails(tmp_path, images, "InstallFailed", *PIDS, compose=as_agent)
    assert "root" in o.message, o


def test_a_bare_uid_from_the_command_line_is_the_sandbox_user(
    tmp_path: Path, images: dict[str, str]
) -> None:
    # The task names no agent user; the run names a UID the image does not know. The agent's
    # commands ran as it: its loop is a sandbox process, which the freeze killed.
    task = make_task(tmp_path, "hostile", images["plain"], HOSTILE, user=None)
    o = start_one(tmp_path, task, *SWITCH, *PIDS, "--environment-kwarg", "sandbox_user=4242")
    assert (o.reward, o.exception) == (0.0, None), o
    assert re.search(r"quiescent in [0-9.]+ s \(killed [1-9]", o.log), o.log[-800:]


def test_the_sidecar_refuses_a_sandbox_without_no_new_privileges(
    tmp_path: Path, images: dict[str, str]
) -> None:
    o = honest_trial_fails(tmp_path, images, "MarkerInvalid", "--environment-kwarg", "via=sidecar")
    assert "accept_privilege_escalation=true" in o.message, o


def test_half_the_switch_is_refused(tmp_path: Path, images: dict[str, str]) -> None:
    task = make_task(tmp_path, "honest", images["plain"], HONEST)
    o = start_one(tmp_path, task, *SWITCH[:2])
    # Harbor 0.25.0's Verifier records the upload's failure as AddTestsDirError, from ours.
    assert o.reward is None and o.exception == "AddTestsDirError", o
    assert "QuiesceNotOn" in o.traceback, o
    assert "--verifier quiesce_harness.harbor:QuiescedVerifier" in o.traceback, o


class NamedUserVerifier(QuiescedVerifier):
    """A verifier whose every exec names its user, as a later Harbor's might: the tests then
    run past the gate, and the trial must keep no reward."""

    async def verify(self) -> Any:
        env = self.environment
        plain = env.exec

        async def named(command: str, **kw: Any) -> Any:
            kw["user"] = kw.get("user") or "root"
            return await plain(command, **kw)

        env.exec = named
        try:
            return await super().verify()
        finally:
            del env.exec


def test_tests_run_past_the_gate_keep_no_reward(tmp_path: Path, images: dict[str, str]) -> None:
    task = make_task(tmp_path, "honest", images["plain"], HONEST)
    named = ["--verifier", "test_harbor_switch:NamedUserVerifier"]
    o = start_one(tmp_path, task, *SWITCH[:2], *named, *PIDS)
    assert o.reward is None and o.exception == "GateRefused", o
    assert "behind quiesce verify" in o.message, o


# --- a multi-step task: every step's agent is frozen before its tests -------------------------


def make_steps_task(
    root: Path,
    name: str,
    image: str,
    solves: list[str],
    users: list[str | None],
    *,
    strategy: str | None = "final",
) -> Path:
    """A [[steps]] task, one step per solve, each step's agent user as given."""
    t = root / name
    (t / "environment").mkdir(parents=True)
    (t / "environment" / "Dockerfile").write_text(f"FROM {image}\n")
    (t / "instruction.md").write_text("Write the expected answer to /app/answer.txt\n")
    toml = 'schema_version = "1.4"\n'
    if strategy is not None:
        toml += f'multi_step_reward_strategy = "{strategy}"\n'
    toml += (
        "[metadata]\n[agent]\ntimeout_sec = 120.0\n[verifier]\ntimeout_sec = 120.0\n"
        f'[environment]\ndocker_image = "{image}"\n'
    )
    for i, (solve, user) in enumerate(zip(solves, users, strict=True)):
        step = t / "steps" / f"s{i}"
        for d in ("tests", "solution"):
            (step / d).mkdir(parents=True)
        (step / "instruction.md").write_text("Write the expected answer to /app/answer.txt\n")
        (step / "solution" / "solve.sh").write_text(solve)
        (step / "tests" / "test.sh").write_text(TEST_SH)
        (step / "tests" / "expected.txt").write_text("42\n")
        for f in ("solution/solve.sh", "tests/test.sh"):
            (step / f).chmod(0o755)
        toml += f'\n[[steps]]\nname = "s{i}"\n'
        if user is not None:
            toml += f'[steps.agent]\nuser = "{user}"\n'
    (t / "task.toml").write_text(toml)
    return t


def test_a_later_step_s_agent_runs_as_the_sandbox_user_and_is_frozen(
    tmp_path: Path, images: dict[str, str]
) -> None:
    # No agent user anywhere: the run's sandbox_user is every step's, not only the first's. The
    # second step's hostile loop is a sandbox process, and its own freeze kills it.
    hostile = HOSTILE.replace("#!/bin/sh\n", "#!/bin/sh\nrm -f /app/answer.txt\n", 1)
    task = make_steps_task(tmp_path, "steps", images["plain"], [HONEST, hostile], [None, None])
    user = ["--environment-kwarg", "sandbox_user=agent"]
    o = start_one(tmp_path, task, *SWITCH, *PIDS, *user)
    assert (o.reward, o.exception) == (0.0, None), o
    kills = re.findall(r"quiescent in [0-9.]+ s \(killed ([0-9]+)", o.log)
    assert len(kills) == 2 and int(kills[1]) >= 1, (kills, o.log[-800:])


@pytest.mark.parametrize(
    ("users", "strategy", "fix"),
    [
        # The second step would run as the image's root, whom no freeze kills.
        (["agent", None], "final", "[steps.agent] user"),
        # "mean" leaves a step whose freeze was refused out of the trial's reward.
        (["agent", "agent"], None, 'multi_step_reward_strategy = "final"'),
        (["agent", "agent"], "mean", 'multi_step_reward_strategy = "final"'),
    ],
)
def test_a_multi_step_task_the_freeze_cannot_cover_is_refused(
    tmp_path: Path, images: dict[str, str], users: list[str | None], strategy: str, fix: str
) -> None:
    task = make_steps_task(
        tmp_path, "steps", images["plain"], [HOSTILE, HOSTILE], users, strategy=strategy
    )
    o = start_one(tmp_path, task, *SWITCH, *PIDS)
    assert o.reward is None and o.exception == "InstallFailed", o
    assert fix in o.message, o


# --- what the agent leaves where the verifier writes ------------------------------------------

# A task whose tests source what tests/conf.d holds, as pytest runs a tests dir's conftest.py.
CONF_TEST_SH = (
    '#!/bin/bash\nfor f in /tests/conf.d/*; do . "$f"; done\n' + TEST_SH.split("\n", 1)[1]
)
# The agent (no answer) plants a symlink where the root verifier redirects the tests' output,
# which truncates the expected answer once it is there, and a file the tests will source.
PLANTER = (
    "#!/bin/sh\nset -e\nrm -f /app/answer.txt\n"
    "ln -s /tests/expected.txt /logs/verifier/test-stdout.txt\n"
    "mkdir -p /tests/conf.d\n"
    "echo 'cp /tests/expected.txt /app/answer.txt' > /tests/conf.d/99-planted\n"
)


def test_what_the_agent_plants_for_the_verifier_scores_nothing(
    tmp_path: Path, images: dict[str, str]
) -> None:
    task = make_task(tmp_path, "planter", images["tests"], PLANTER)
    (task / "tests" / "test.sh").write_text(CONF_TEST_SH)
    (task / "tests" / "conf.d").mkdir()
    (task / "tests" / "conf.d" / "00-base").write_text(":\n")
    o = start_one(tmp_path, task, *SWITCH, *PIDS)
    assert (o.reward, o.exception) == (0.0, None), o


@pytest.mark.parametrize("via", [[], SIDECAR])
def test_a_path_the_agent_owns_runs_nothing_of_its_as_root(
    tmp_path: Path, images: dict[str, str], via: list[str]
) -> None:
    # Nothing the agent left first on the image's PATH runs as root once it ran: not the
    # kit's commands, not Harbor's own (`bash -c`), not the gate's; the tests get the image's
    # PATH back behind the gate.
    task = make_task(tmp_path, "path", images["path"], PATH_PLANTER)
    o = start_one(tmp_path, task, *SWITCH, *PIDS, *via)
    assert (o.reward, o.exception) == (0.0, None), o


@pytest.mark.parametrize("via", [[], SIDECAR])
def test_a_startup_file_the_agent_owns_runs_nothing_of_its_as_root(
    tmp_path: Path, images: dict[str, str], via: list[str]
) -> None:
    # The image's BASH_ENV names the agent's file: no root exec of Harbor's or the kit's once
    # the agent ran (Harbor's checks, the verifier dirs' reset, the sidecar's freeze client
    # through Harbor's `bash -c`, the gate's bash) sources it; each runs with the kit's SAFE_ENV.
    task = make_task(tmp_path, "bash-env", images["bash_env"], BASH_ENV_PLANTER)
    o = start_one(tmp_path, task, *SWITCH, *PIDS, *via)
    assert (o.reward, o.exception) == (0.0, None), (o.message, o.log[-1500:])


# --- services the tests need: the agent's handed over to them (hand_over_services=true) --------

HAND_OVER = ["--environment-kwarg", "hand_over_services=true"]

# An image with the whole Python standard library (http.server, urllib): the base image's
# python3-minimal and, unpacked over it, Debian's libpython3.X-stdlib of the machine's apt
# sources (as support.build_images gets procps).
PY_DOCKERFILE = """FROM quiesce-test/python-base
COPY debs /tmp/debs
RUN for d in /tmp/debs/*.deb; do dpkg-deb -x "$d" /; done && rm -rf /tmp/debs \\
 && useradd --create-home --uid 1000 --shell /bin/sh agent \\
 && mkdir -p /app && chown agent:agent /app
WORKDIR /app
"""


@pytest.fixture(scope="module")
def py_image(client: docker.DockerClient) -> Iterator[str]:
    """A task image with python3 and its whole standard library, no quiesce in it."""
    base = "quiesce-test/python-base"
    try:
        client.images.get(base)
    except docker.errors.ImageNotFound:
        subprocess.run(["bash", str(support.REPO / "docker/base-images")], check=True)
    version = client.containers.run(
        base, ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], remove=True
    )
    tag = f"{support.PREFIX}hb-py-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory() as ctx:
        debs = Path(ctx) / "debs"
        debs.mkdir()
        pkg = f"libpython{version.decode().strip()}-stdlib"
        subprocess.run(
            ["apt-get", "download", "-q", pkg], cwd=debs, check=True, capture_output=True
        )
        (Path(ctx) / "Dockerfile").write_text(PY_DOCKERFILE)
        client.images.build(path=ctx, tag=tag, rm=True, labels={support.LABEL: "1"})
    yield tag
    with contextlib.suppress(docker.errors.DockerException):
        client.images.remove(tag, force=True)


# Waits until something answers on :8080 (the oracle's exec must not end before its server
# listens), then ends.
WAIT_8080 = (
    "for i in $(seq 100); do python3 -c 'import urllib.request; "
    'urllib.request.urlopen("http://127.0.0.1:8080/", timeout=1)\' 2>/dev/null && exit 0; '
    "sleep 0.1; done; exit 1\n"
)
# The honest agent: the answer in a directory it serves with python3 -m http.server, left
# running in a session of its own.
HONEST_SERVER = (
    "#!/bin/sh\nset -e\nmkdir -p /app/www\necho 42 > /app/www/answer.txt\ncd /app/www\n"
    "nohup setsid python3 -m http.server 8080 >/dev/null 2>&1 &\n" + WAIT_8080
)
# The hostile agent: it knows no answer and serves /tmp/www (its own, world-writable), and its
# server process loops: the tests' expected answer copied to what it serves and to
# /app/answer.txt, and 1 written to the reward file, every 10 ms.
HOSTILE_SERVER_PY = """import http.server, os, threading, time

def put(text, dst):
    # Beside it, then renamed over it: no reader ever sees it half-written.
    try:
        with open(dst + ".new", "w") as f:
            f.write(text)
        os.replace(dst + ".new", dst)
    except OSError:
        pass

def forge():
    while True:
        try:
            with open("/tests/expected.txt") as f:
                expected = f.read()
        except OSError:
            expected = None
        if expected is not None:
            put(expected, "/tmp/www/answer.txt")
            put(expected, "/app/answer.txt")
        put("1\\n", "/logs/verifier/reward.txt")
        time.sleep(0.01)

threading.Thread(target=forge, daemon=True).start()
os.chdir("/tmp/www")
http.server.ThreadingHTTPServer(("", 8080), http.server.SimpleHTTPRequestHandler).serve_forever()
"""
HOSTILE_SERVER = (
    "#!/bin/sh\nset -e\nmkdir -p /tmp/www && chmod 0777 /tmp/www\n"
    "echo 0 > /tmp/www/answer.txt && chmod 0666 /tmp/www/answer.txt\n"
    f"printf '%s' {shlex.quote(HOSTILE_SERVER_PY)} > /tmp/serve.py\n"
    "nohup setsid python3 /tmp/serve.py >/dev/null 2>&1 &\n" + WAIT_8080
)
# An agent whose server first writes a pid file where only root may: it served while the agent
# ran (as root), and exits at once when started again as the service user.
PIDFILE_SERVER_PY = """import http.server, os
with open("/run/answer-server.pid", "w") as f:
    f.write(str(os.getpid()))
os.chdir("/app/www")
http.server.ThreadingHTTPServer(("", 8080), http.server.SimpleHTTPRequestHandler).serve_forever()
"""
PIDFILE_SERVER = (
    "#!/bin/sh\nset -e\nmkdir -p /app/www\necho 42 > /app/www/answer.txt\n"
    f"printf '%s' {shlex.quote(PIDFILE_SERVER_PY)} > /app/serve.py\n"
    "nohup setsid python3 /app/serve.py >/dev/null 2>&1 &\n" + WAIT_8080
)
# An agent that writes the answer and serves nothing: the run declares the service.
ANSWER_ONLY = "#!/bin/sh\nset -e\nmkdir -p /app/www\necho 42 > /app/www/answer.txt\n"
# An honest agent that leaves its workspace writable by everyone (the service user included).
OPEN_WORKSPACE = HONEST_SERVER.replace("cd /app/www\n", "cd /app/www\nchmod 0777 /app/www\n", 1)
# The tests: the answer fetched from the service with urllib, against what they expect.
FETCH_TEST_SH = (
    "#!/bin/bash\nsleep 1\n"
    "got=$(python3 -c 'import urllib.request; print(urllib.request.urlopen("
    '"http://127.0.0.1:8080/answer.txt", timeout=5).read().decode().strip())\' 2>/dev/null)\n'
    'if [ "$got" = "$(cat /tests/expected.txt)" ]; '
    "then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
)


def service_task(tmp: Path, name: str, image: str, solve: str, *, user: str | None) -> Path:
    """A task whose tests fetch the answer from :8080."""
    task = make_task(tmp, name, image, solve, user=user)
    (task / "tests" / "test.sh").write_text(FETCH_TEST_SH)
    return task


def hand_over_note(o: Outcome) -> str:
    found = re.findall(r"quiesce: hand-over .*", o.log)
    return found[-1] if found else "(no hand-over note)"


def handed_over(o: Outcome) -> int:
    """How many services quiesce verify started for the tests, as the trial's log says."""
    m = re.search(r"quiesce: hand-over ended: ([0-9]+) service", o.log)
    return int(m.group(1)) if m else -1


def test_an_honest_root_agent_s_server_scores_only_when_handed_over(
    tmp_path: Path, py_image: str
) -> None:
    # A root agent (as Terminal-Bench's) leaves python3 -m http.server serving the answer.
    task = service_task(tmp_path, "honest-server", py_image, HONEST_SERVER, user=None)
    off = start_one(tmp_path, task, *SWITCH, *PIDS, *ROOT)
    assert (off.reward, off.exception) == (0.0, None), (off.message, off.log[-1500:])
    on = start_one(tmp_path, task, *SWITCH, *PIDS, *ROOT, *HAND_OVER)
    assert (on.reward, on.exception) == (1.0, None), (on.message, on.log[-1500:])
    assert handed_over(on) == 1, on.log[-1500:]
    print(
        f"\nroot agent's server: trial {off.seconds:.1f} s without the hand-over, "
        f"{on.seconds:.1f} s with it; {hand_over_note(on)}"
    )


def test_ports_names_the_services_that_come_back(tmp_path: Path, py_image: str) -> None:
    # ports=8080: the server on it is the one the tests get (verify --port 8080).
    task = service_task(tmp_path, "honest-server-ports", py_image, HONEST_SERVER, user=None)
    ports = ["--environment-kwarg", "ports=8080"]
    on = start_one(tmp_path, task, *SWITCH, *PIDS, *ROOT, *HAND_OVER, *ports)
    assert (on.reward, on.exception) == (1.0, None), (on.message, on.log[-1500:])
    assert handed_over(on) == 1, on.log[-1500:]


def test_an_honest_agent_user_s_server_scores_when_handed_over(
    tmp_path: Path, py_image: str
) -> None:
    task = service_task(tmp_path, "honest-server", py_image, HONEST_SERVER, user="agent")
    o = start_one(tmp_path, task, *SWITCH, *PIDS, *HAND_OVER)
    assert (o.reward, o.exception) == (1.0, None), (o.message, o.log[-1500:])
    assert handed_over(o) == 1, o.log[-1500:]
    print(f"\nagent user's server: trial {o.seconds:.1f} s; {hand_over_note(o)}")


@pytest.mark.parametrize("user", [None, "agent"], ids=["root-agent", "agent-user"])
def test_a_handed_over_server_cannot_forge_the_score(
    tmp_path: Path, py_image: str, user: str | None
) -> None:
    task = service_task(tmp_path, "hostile-server", py_image, HOSTILE_SERVER, user=user)
    # Unprotected, its loop copies the expected answer to what it serves and forges the reward.
    o = run_one(tmp_path, task)
    assert (o.reward, o.exception) == (1.0, None), o
    # Handed over, it runs (loop and all) as the service user: /tests is root's alone,
    # /logs/verifier and /app are not its to write. Scored, not refused: 0.
    root = ROOT if user is None else []
    o = start_one(tmp_path, task, *SWITCH, *PIDS, *root, *HAND_OVER)
    assert (o.reward, o.exception) == (0.0, None), (o.message, o.log[-1500:])
    assert handed_over(o) == 1, o.log[-1500:]


@pytest.mark.parametrize("via", [[], SIDECAR], ids=["init", "sidecar"])
def test_a_declared_service_scores(tmp_path: Path, py_image: str, via: list[str]) -> None:
    # The agent serves nothing; the run says how the tests' service starts.
    task = service_task(tmp_path, "declared", py_image, ANSWER_ONLY, user="agent")
    declared = [
        "--environment-kwarg",
        "services=8080=python3 -m http.server 8080 --directory /app/www",
    ]
    o = start_one(tmp_path, task, *SWITCH, *PIDS, *via, *HAND_OVER, *declared)
    assert (o.reward, o.exception) == (1.0, None), (o.message, o.log[-1500:])
    assert handed_over(o) == 1 and "(declared)" in o.log, o.log[-1500:]


@pytest.mark.parametrize(
    ("solve", "user", "why"),
    [
        # Started again as the service user, it cannot write its pid file and exits: verify's
        # reason names the port, and what the service printed follows it.
        (PIDFILE_SERVER, None, "/run/answer-server.pid"),
        # The service user could write the agent's workspace, which the tests read.
        (OPEN_WORKSPACE, "agent", "/app"),
    ],
    ids=["exits-as-the-service-user", "workspace-writable"],
)
def test_a_service_that_cannot_be_handed_over_fails_the_trial(
    tmp_path: Path, py_image: str, solve: str, user: str | None, why: str
) -> None:
    task = service_task(tmp_path, "unhandable", py_image, solve, user=user)
    root = ROOT if user is None else []
    o = start_one(tmp_path, task, *SWITCH, *PIDS, *root, *HAND_OVER)
    assert o.reward is None and o.exception == "HandOverRefused", (o, o.log[-1500:])
    assert "could not hand the agent's services over" in o.message, o.message
    assert why in o.message, o.message
    print(f"\n{o.exception}: {o.message}")


def test_services_without_the_hand_over_are_refused_at_start(
    tmp_path: Path, images: dict[str, str]
) -> None:
    task = make_task(tmp_path, "honest", images["plain"], HONEST)
    declared = ["--environment-kwarg", "services=8080=python3 -m http.server 8080"]
    o = start_one(tmp_path, task, *SWITCH, *PIDS, *declared)
    assert o.reward is None and o.exception == "InstallFailed", o
    assert "hand_over_services=true" in o.message, o.message


def test_the_hand_over_kwargs() -> None:
    from quiesce_harness.errors import InstallFailed
    from quiesce_harness.harbor import _Guard, _hand_over_settings, _parse_ports, _parse_services

    assert _parse_services("8080=python3 -m http.server 8080; 9000 = ./api --port=9000") == {
        8080: "python3 -m http.server 8080",
        9000: "./api --port=9000",
    }
    # From the command line's JSON: a command may hold a ";".
    assert _parse_services({"8080": "cd /srv; exec ./serve"}) == {8080: "cd /srv; exec ./serve"}
    for bad in ("8080", "http=./serve", "70000=./serve", "8080=", "1=a;1=b", 8080):
        with pytest.raises(InstallFailed):
            _parse_services(bad)
    assert _parse_ports("8080, 5000,8080") == (8080, 5000)
    assert _parse_ports([5328]) == (5328,) and _parse_ports(8080) == (8080,)
    bad_ports: tuple[object, ...] = ("http", "0", "70000", [True], 1.5, "8080;5000")
    for bad_port in bad_ports:
        with pytest.raises(InstallFailed, match="is not a TCP port"):
            _parse_ports(bad_port)
    assert _hand_over_settings(False, None, None, None) == (False, {}, None, None, ())
    assert _hand_over_settings(True, None, None, None, "8080")[4] == (8080,)
    for off in (
        ("services", "8080=x"),
        ("service_user", 65533),
        ("service_wait", 5),
        ("ports", "8080"),
    ):
        kw: dict[str, Any] = {"services": None, "service_user": None, "service_wait": None}
        kw[off[0]] = off[1]
        with pytest.raises(InstallFailed, match="hand_over_services=true"):
            _hand_over_settings(
                False, kw["services"], kw["service_user"], kw["service_wait"], kw.get("ports")
            )
    with pytest.raises(InstallFailed):
        _hand_over_settings("yes", None, None, None)
    g = _Guard(way="init", users=("agent",), hand_over=True, workdir="/app")
    g.services, g.service_wait = {8080: "python3 -m http.server 8080"}, 5
    g.ports = (5000,)
    assert g.hand_over_args() == [
        "--hand-over",
        "--service-wait",
        "5",
        "--protect",
        "/tests",
        "--protect",
        "/logs/verifier",
        "--protect",
        "/app",
        "--hide",
        "/tests",
        "--port",
        "5000",
        "--service",
        "8080=python3 -m http.server 8080",
    ]
    assert _Guard(way="init", users=(), workdir="/").hand_over_args() == []
    # Exit 20 is the hand-over's, with verify's reason; any other refusal stays a GateRefused.
    from quiesce_harness.harbor import GateRefused, HandOverRefused, _check_gate

    line = "quiesce verify: hand-over check failed: "
    with pytest.raises(HandOverRefused, match=r"which did not run: port\(s\) \[8080\]"):
        _check_gate(20, f"noise\n{line}port(s) [8080] not listened on by user 65530\n")
    with pytest.raises(HandOverRefused, match="is not scored: the services' end"):
        _check_gate(20, f"{line}the services' end: 1 process(es) still alive\n")
    with pytest.raises(GateRefused) as refused:
        _check_gate(16, "quiesce verify: a sandbox process is alive\n")
    assert type(refused.value) is GateRefused
    _check_gate(0, "")
