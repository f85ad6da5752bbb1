"""The Harbor switch on tasks as their authors write them: laid out by `harbor tasks init` (the
harness's own template: environment/Dockerfile, no docker_image), then given only what each
case needs. Every way a task names its environment, through `harbor run`, hostile and honest:

- a Dockerfile only: Harbor builds it, and Compose names the image;
- a prebuilt docker_image beside the Dockerfile: Harbor runs the prebuilt one;
- --force-build over that prebuilt one: Harbor builds the Dockerfile instead;
- the task's own docker-compose.yaml, with services beside main;
- a read-only root (a tmpfs /run and the volumes the task then needs);
- the template's own default, a separate verifier built from tests/Dockerfile (honest only);
- `[environment]` limits (cpus, memory_mb).

The Dockerfile's ENTRYPOINT (and the prebuilt image's, a different one) writes which image
started into /run/task-entry; the tests score only when it is the image Harbor was to run, so
an override that put quiesce in front of another image's ENTRYPOINT scores nothing.

One `harbor run` job at -n 5 holds every case but --force-build (a second job, at -n 2): the
Dockerfiles start FROM an image built once per module, so each trial's build is a cache hit.
Here (2 cores, shared) the module takes ~75 s: the first job ~50 s, the second ~20 s.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from test_harbor_switch import (
    HONEST,
    HOSTILE,
    PIDS,
    SWITCH,
    Outcome,
    _build,
    assert_job,
    job,
)

import support

# The task's test: the answer, and the image that started (what tests/entry.txt names).
TEST_SH = (
    "#!/bin/bash\nsleep 1\n"
    'if [ "$(cat /app/answer.txt 2>/dev/null)" = "$(cat /tests/expected.txt)" ] && '
    '[ "$(cat /run/task-entry 2>/dev/null)" = "$(cat /tests/entry.txt)" ]; '
    "then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
)


def _marking_entrypoint(name: str) -> str:
    """An exec-form ENTRYPOINT that writes `name` to /run/task-entry, then runs the command."""
    script = f'echo {name} > /run/task-entry; exec "$@"'
    return f"ENTRYPOINT {json.dumps(['/bin/sh', '-c', script, 'sh'])}\n"


@pytest.fixture(scope="module")
def base(client: docker.DockerClient) -> Iterator[dict[str, str]]:
    """The image the tasks' Dockerfiles start FROM, and a prebuilt task image of another
    ENTRYPOINT."""
    run = uuid.uuid4().hex[:6]
    tags = {
        "plain": f"{support.PREFIX}hbt-plain-{run}",
        "prebuilt": f"{support.PREFIX}hbt-prebuilt-{run}",
    }
    _build(client, tags["plain"], "")
    _build(client, tags["prebuilt"], _marking_entrypoint("prebuilt"))
    yield tags
    for t in tags.values():
        with contextlib.suppress(docker.errors.DockerException):
            client.images.remove(t, force=True)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A task as `harbor tasks init` lays it out, with the shared verifier (the tests run in
    the agent's container)."""
    root = tmp_path_factory.mktemp("template")
    exe = str(Path(sys.executable).with_name("harbor"))
    p = subprocess.run(
        [exe, "tasks", "init", "demo/task", "-p", str(root), "--verifier-mode", "shared"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    t = root / "task"
    assert p.returncode == 0 and (t / "task.toml").exists(), p
    toml = (t / "task.toml").read_text()
    # What this test relies on the template giving: a Dockerfile and no image.
    assert (t / "environment" / "Dockerfile").exists() and "docker_image" not in toml, toml
    return t


@pytest.fixture(scope="module")
def separate_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`harbor tasks init`'s default: the verifier in an environment of its own, built from
    tests/Dockerfile."""
    root = tmp_path_factory.mktemp("separate")
    exe = str(Path(sys.executable).with_name("harbor"))
    p = subprocess.run(
        [exe, "tasks", "init", "demo/task", "-p", str(root), "--no-pytest"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    t = root / "task"
    assert p.returncode == 0 and (t / "tests" / "Dockerfile").exists(), p
    assert 'environment_mode = "separate"' in (t / "task.toml").read_text()
    return t


def _section(toml: str, name: str, lines: str) -> str:
    """task.toml with `lines` added at the top of its `[name]` section."""
    head = f"[{name}]\n"
    assert head in toml, toml
    return toml.replace(head, head + lines, 1)


def task(
    template: Path,
    root: Path,
    name: str,
    base: str,
    solve: str,
    *,
    entry: str = "built",
    environment: str = "",
    compose: str = "",
) -> Path:
    """The template, with what a test adds: the agent user, the Dockerfile FROM `base` with a
    marking ENTRYPOINT, a solution, the tests; `environment` lines for [environment]."""
    t = root / name.replace("/", "-")
    shutil.copytree(template, t)
    toml = (t / "task.toml").read_text()
    # Named KIND/CASE (hostile/compose): the name Harbor's result.json gives the trial.
    assert 'name = "demo/task"\n' in toml, toml
    toml = toml.replace('name = "demo/task"\n', f'name = "{name}"\n', 1)
    toml = _section(toml, "agent", 'user = "agent"\n')
    if environment:
        toml = _section(toml, "environment", environment)
    verifier_image = t / "tests" / "Dockerfile"
    if verifier_image.exists():
        # The separate verifier's environment: its own image, of its own ENTRYPOINT, and the
        # agent's answer carried over as an artifact.
        assert toml.startswith('schema_version = "1.4"\nartifacts = []\n'), toml
        toml = toml.replace("artifacts = []", 'artifacts = ["/app/answer.txt"]', 1)
        text = verifier_image.read_text()
        rest = text.split("\n", 1)[1] if "\n" in text else ""
        verifier_image.write_text(f"FROM {base}\n{_marking_entrypoint('verifier')}{rest}\n")
        entry = "verifier"
    (t / "task.toml").write_text(toml)
    dockerfile = t / "environment" / "Dockerfile"
    text = dockerfile.read_text()
    assert text.startswith("FROM "), text
    rest = text.split("\n", 1)[1] if "\n" in text else ""
    dockerfile.write_text(f"FROM {base}\n{_marking_entrypoint('built')}{rest}\n")
    if compose:
        (t / "environment" / "docker-compose.yaml").write_text(compose)
    (t / "instruction.md").write_text("Write the expected answer to /app/answer.txt\n")
    (t / "solution" / "solve.sh").write_text(solve)
    (t / "tests" / "test.sh").write_text(TEST_SH)
    (t / "tests" / "expected.txt").write_text("42\n")
    (t / "tests" / "entry.txt").write_text(f"{entry}\n")
    for f in ("solution/solve.sh", "tests/test.sh"):
        (t / f).chmod(0o755)
    return t


# A task's own Compose file: two services beside main, one of them built.
SERVICES = """services:
  main:
    depends_on: [cache, worker]
  cache:
    image: {plain}
    command: ["sleep", "infinity"]
  worker:
    build: .
    entrypoint: ["sleep", "infinity"]
"""
# A read-only root, and what a task on one needs writable: the init's state dir (/run, a tmpfs
# as the init's refusal on a read-only /run advises), the agent's workspace, /tmp, /logs (Harbor
# makes its directories there), and /solution and /tests for Harbor's uploads (volumes: its
# uploads go through the engine's archive API, which does not reach into a tmpfs).
READ_ONLY = """services:
  main:
    read_only: true
    tmpfs: [/run]
    volumes: [/tmp, /logs, /solution, /tests, /app]
"""


def _pair(template: Path, root: Path, case: str, base: str, **kw: str) -> None:
    task(template, root, f"hostile/{case}", base, HOSTILE, **kw)
    task(template, root, f"honest/{case}", base, HONEST, **kw)


CASES = ("dockerfile", "prebuilt", "compose", "readonly", "limits", "separate")


@pytest.fixture(scope="module")
def one_job(
    template: Path,
    separate_template: Path,
    base: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, list[Outcome]]:
    """Every case but --force-build in one `harbor run` with the switch: its trials by case."""
    tmp = tmp_path_factory.mktemp("job")
    tasks = tmp / "tasks"
    plain = base["plain"]
    _pair(template, tasks, "dockerfile", plain)
    _pair(
        template,
        tasks,
        "prebuilt",
        plain,
        entry="prebuilt",
        environment=f'docker_image = "{base["prebuilt"]}"\n',
    )
    _pair(template, tasks, "compose", plain, compose=SERVICES.format(plain=plain))
    _pair(template, tasks, "readonly", plain, compose=READ_ONLY)
    _pair(template, tasks, "limits", plain, environment="cpus = 1\nmemory_mb = 512\n")
    # The template as it comes: a separate verifier. Honest only: no process of the agent's
    # environment meets the tests there.
    task(separate_template, tasks, "honest/separate", plain, HONEST)
    found, wall = job(tmp, tasks, 5, *SWITCH, *PIDS)
    print(f"\nharbor run of {len(found)} trials at -n 5: {wall:.1f} s")
    return {c: [o for o in found if o.task.endswith(f"/{c}")] for c in CASES}


@pytest.mark.parametrize("case", [c for c in CASES if c not in ("readonly", "separate")])
def test_a_task_as_its_author_writes_it(one_job: dict[str, list[Outcome]], case: str) -> None:
    assert_job(one_job[case], 2)


def test_the_template_s_separate_verifier_runs_under_quiesce_too(
    one_job: dict[str, list[Outcome]],
) -> None:
    [o] = one_job["separate"]
    assert (o.reward, o.exception) == (1.0, None), (o.message, o.log[-1500:])
    # Both environments, each built from its own Dockerfile, had quiesce as main's init.
    assert o.log.count("quiesce: the main service runs") == 2, o.log[-3000:]


def test_a_read_only_root_scores_as_any_other(one_job: dict[str, list[Outcome]]) -> None:
    # The init's key read from a tmpfs /run (the archive API does not reach it), and /tests, a
    # volume there, emptied and made root's after the freeze instead of made anew.
    assert_job(one_job["readonly"], 2)


def test_force_build_runs_the_built_image_not_the_prebuilt_one(
    template: Path, base: dict[str, str], tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks"
    _pair(
        template,
        tasks,
        "forced",
        base["plain"],
        environment=f'docker_image = "{base["prebuilt"]}"\n',
    )
    found, _ = job(tmp_path, tasks, 2, *SWITCH, *PIDS, "--force-build")
    assert_job(found, 2)


def test_the_built_image_is_the_one_compose_names_for_main() -> None:
    from quiesce_harness.errors import InstallFailed
    from quiesce_harness.harbor import _built_image_name

    # Compose lists main's dependencies' images too, and its warnings share Harbor's output.
    out = (
        'time="2026-12-06T03:58:43Z" level=warning msg="the attribute `version` is obsolete"\n'
        "qhk-plain\nt1__abc__env-worker\nt1__abc__env-main\n"
    )
    assert _built_image_name(out, "t1__abc__env", "t1") == "t1__abc__env-main"
    assert _built_image_name("t1__abc__env_main\n", "t1__abc__env", "t1") == "t1__abc__env_main"
    # Neither default name (another Compose's rule), or both: refused, not guessed.
    for said in ("other-main\n", "", "t1__abc__env-main\nt1__abc__env_main\n"):
        with pytest.raises(InstallFailed, match="docker_image"):
            _built_image_name(said, "t1__abc__env", "t1")
