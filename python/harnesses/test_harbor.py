"""Harbor 0.25.0 (the wheel from PyPI): its own Trial end to end, offline: a local task, its
Docker environment (Compose v2), the oracle agent running solution/solve.sh as the task's
agent user, and the verifier in shared mode. The oracle "solution" solves nothing and leaves
a loop that rewrites the reward to 1."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from harbor.models.trial.config import AgentConfig, TaskConfig, TrialConfig
from harbor.models.trial.result import TrialResult
from harbor.trial.hooks import TrialEvent
from harbor.trial.trial import Trial

from quiesce_harness import FreezeResult
from quiesce_harness.adapters.harbor import add_freeze_hooks

import support
from conftest import REWARD_FORGER

SCORER = (
    'if [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ]; then r=1; else r=0; fi; '
    "echo $r > /logs/verifier/reward.txt; sleep 0.3"
)


def make_task(root: Path, image: str, test_sh: str) -> Path:
    t = root / "task"
    for d in ("environment", "tests", "solution"):
        (t / d).mkdir(parents=True)
    (t / "task.toml").write_text(
        'schema_version = "1.4"\n[metadata]\n'
        '[agent]\ntimeout_sec = 120.0\nuser = "agent"\n'
        '[verifier]\ntimeout_sec = 120.0\nenvironment_mode = "shared"\n'
        f'[environment]\ndocker_image = "{image}"\n'
    )
    (t / "instruction.md").write_text("Write 42 to /app/answer.txt\n")
    (t / "environment" / "Dockerfile").write_text(f"FROM {image}\n")
    # Merged by Harbor's Docker environment over its own compose files: no-new-privileges
    # (quiesce verify refuses a marker signed without it).
    (t / "environment" / "docker-compose.yaml").write_text(
        f"services:\n  main:\n    security_opt:\n      - {support.SECURITY_OPT}\n"
    )
    (t / "solution" / "solve.sh").write_text("#!/bin/sh\n" + REWARD_FORGER + "\n")
    (t / "tests" / "test.sh").write_text("#!/bin/sh\n" + test_sh + "\n")
    for f in ("solution/solve.sh", "tests/test.sh"):
        (t / f).chmod(0o755)
    return t


def trial(
    tmp_path: Path,
    image: str,
    test_sh: str = SCORER,
    *,
    hooks: bool = False,
    results: list[FreezeResult] | None = None,
    before_verify: str | None = None,
) -> TrialResult:
    path = make_task(tmp_path, image, test_sh)

    async def run() -> TrialResult:
        cfg = TrialConfig(
            task=TaskConfig(path=path),
            trial_name=f"qhk-{uuid.uuid4().hex[:8]}",
            trials_dir=tmp_path / "trials",
            agent=AgentConfig(name="oracle"),
        )
        t = await Trial.create(cfg)
        if before_verify is not None:
            cmd = before_verify

            async def start_daemon(event: object) -> None:
                await t.agent_environment.exec(cmd, user="root")

            t.add_hook(TrialEvent.AGENT_END, start_daemon)
        if hooks:
            add_freeze_hooks(t, results=results)
        return await t.run()

    return asyncio.run(run())


def rewards(r: TrialResult) -> dict[str, float] | None:
    return r.verifier_result.rewards if r.verifier_result else None


def test_harbor_own_trial_keeps_a_forged_reward(tmp_path: Path, task_image: str) -> None:
    r = trial(tmp_path, task_image)
    assert (rewards(r), r.exception_info) == ({"reward": 1.0}, None)


def test_the_freeze_hook_scores_what_the_test_scored(tmp_path: Path, task_image: str) -> None:
    res: list[FreezeResult] = []
    r = trial(tmp_path, task_image, hooks=True, results=res)
    assert (rewards(r), r.exception_info) == ({"reward": 0.0}, None)
    [f] = res
    assert f.state == "quiescent" and f.killed >= 1 and f.marker
    assert support.unverified_claims(f.marker)["setuid"] is False


def test_hook_and_a_scorer_behind_quiesce_verify(tmp_path: Path, task_image: str) -> None:
    gated = f"exec quiesce verify --sandbox-user agent -- sh -c '{SCORER}'"
    r = trial(tmp_path, task_image, gated, hooks=True)
    assert (rewards(r), r.exception_info) == ({"reward": 0.0}, None)


def test_the_task_alone_freezes_in_its_test_sh(tmp_path: Path, task_image: str) -> None:
    # No kit in the harness: tests/test.sh freezes and scores behind the gate itself.
    own = (
        "N=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n'); "
        'quiesce freeze --wait --nonce "$N" >/dev/null || exit 1; '
        f"exec quiesce verify --nonce \"$N\" -- sh -c '{SCORER}'"
    )
    r = trial(tmp_path, task_image, own)
    assert (rewards(r), r.exception_info) == ({"reward": 0.0}, None)


def test_a_failed_freeze_keeps_no_reward(tmp_path: Path, task_image: str) -> None:
    daemon = support.ROOT_DAEMON_BACKGROUND
    r = trial(tmp_path, task_image, hooks=True, before_verify=daemon)
    assert rewards(r) is None
    assert r.exception_info is not None and "FreezeFailed" in r.exception_info.exception_type
