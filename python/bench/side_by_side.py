"""Side by side, in one run, against real containers: how each harness ends the agent before it
scores, against the kit's freeze().

Ways of ending the agent:
  benchflow  BenchFlow 0.7.11's own `_kill_sandbox_user_procs` (imported from the wheel), run
             through an env whose exec is `docker exec [-u USER] CTR sh -c CMD`, as its
             DockerSandbox.exec runs `docker compose exec -T [-u USER] main sh -c CMD`
  nothing    what Harbor, terminal-bench and Inspect AI do: the verifier starts next to it all
  kit        quiesce_harness.freeze()
Per cell: agent processes seen in the second after the step returned (the most of five
looks), bytes the workload wrote in that second, and the step's time. Observed from the engine
(`docker top`, the archive API), never by an exec. Run by python/bench/run (the venv with the
pinned benchflow wheel); --write puts the table into docs/harnesses.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import docker
from benchflow.sandbox._base import ExecResult
from benchflow.sandbox.lockdown import _kill_sandbox_user_procs

from quiesce_harness import Container, FreezeFailed, Unreachable, freeze

import support
from support import PROCPS, SLIM, Box, box

WORKLOADS = ["setsid-writer", "respawn-chain", "fork-bomb", "fd-writer"]
METHODS = ["benchflow", "nothing", "kit"]
OBSERVE_S = 1.0


class DockerExecEnv:
    """The part of BenchFlow's sandbox that `_kill_sandbox_user_procs` uses: exec()."""

    default_user = None

    def __init__(self, name: str) -> None:
        self.name = name
        self.codes: list[int] = []

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        argv = ["docker", "exec", *(["-u", str(user)] if user is not None else [])]
        p = await asyncio.create_subprocess_exec(
            *argv,
            self.name,
            "sh",
            "-c",
            command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(p.communicate(), timeout_sec)
        self.codes.append(p.returncode or 0)
        return ExecResult(stdout=out.decode(errors="replace"), return_code=p.returncode or 0)


def benchflow_kill(b: Box) -> str:
    env = DockerExecEnv(b.name)
    asyncio.run(_kill_sandbox_user_procs(env, "agent"))
    return "returned; exec codes " + ",".join(map(str, env.codes)) + " (ignored)"


def nothing(b: Box) -> str:
    return "-"


def kit(b: Box) -> str:
    try:
        r = freeze(Container.docker(b.name, client=b.client))
    except (FreezeFailed, Unreachable) as e:
        return f"raised {type(e).__name__}: {e}"
    return f"{r.state}, {r.killed} killed" + (" (engine signal)" if r.via_signal else "")


STEPS: dict[str, Callable[[Box], str]] = {
    "benchflow": benchflow_kill,
    "nothing": nothing,
    "kit": kit,
}


@dataclass
class Run:
    workload: str
    image: str
    method: str
    seconds: float
    survivors: int
    bytes_after: int
    note: str


def one(client: docker.DockerClient, workload: str, image: str, method: str) -> Run:
    with box(client, image) as b:
        b.start(workload)
        t0 = time.perf_counter()
        note = STEPS[method](b)
        seconds = time.perf_counter() - t0
        s0 = b.size() or 0
        # A respawning chain is one short-lived process at a time, which one `ps` can miss:
        # the most seen by five looks over the second.
        seen = 0
        for _ in range(5):
            time.sleep(OBSERVE_S / 5)
            seen = max(seen, b.agents())
        return Run(workload, image, method, seconds, seen, (b.size() or 0) - s0, note)


def table(runs: list[Run]) -> str:
    lines = [
        "| workload | image | step | survivors | bytes after | time (median) | the step's answer |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for w in WORKLOADS:
        for image in (SLIM, PROCPS):
            for m in METHODS:
                cell = [r for r in runs if (r.workload, r.image, r.method) == (w, image, m)]
                if not cell:
                    continue
                surv = max(r.survivors for r in cell)
                nbytes = max(r.bytes_after for r in cell)
                t = statistics.median(r.seconds for r in cell)
                notes = sorted({re.sub(r"\d+ killed", "N killed", r.note) for r in cell})
                name = {"benchflow": "BenchFlow's kill", "nothing": "nothing", "kit": "freeze()"}
                lines.append(
                    f"| {w} | {image.removeprefix('qhk-')} | {name[m]} | {surv} | {nbytes} | "
                    f"{t:.2f} s | {'; '.join(notes)} |"
                )
    return "\n".join(lines)


def summary(runs: list[Run]) -> dict[str, Any]:
    kit_runs = [r for r in runs if r.method == "kit"]
    ordinary = [r.seconds for r in kit_runs if r.workload != "fork-bomb"]
    bomb = [r.seconds for r in kit_runs if r.workload == "fork-bomb"]
    bf = [r.seconds for r in runs if r.method == "benchflow"]
    return {
        "runs_per_cell": max(
            sum(1 for r in runs if (r.workload, r.image, r.method) == k)
            for k in {(r.workload, r.image, r.method) for r in runs}
        ),
        "kit_median_s_ordinary": statistics.median(ordinary) if ordinary else None,
        "kit_max_s_ordinary": max(ordinary) if ordinary else None,
        "kit_median_s_bomb": statistics.median(bomb) if bomb else None,
        "benchflow_min_s": min(bf) if bf else None,
        "benchflow_max_s": max(bf) if bf else None,
        "kit_via_engine_signal": sum(1 for r in kit_runs if "engine signal" in r.note),
        "kit_survivors": sum(r.survivors for r in kit_runs),
        "kit_bytes_after": sum(r.bytes_after for r in kit_runs),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--write", type=Path, help="docs/harnesses.md: replace its side-by-side table")
    p.add_argument("--json", type=Path, help="every run, as JSON")
    a = p.parse_args()
    client = docker.from_env(timeout=300)
    support.build_images(client)
    runs: list[Run] = []
    for i in range(a.runs):
        for w in WORKLOADS:
            for image in (SLIM, PROCPS):
                for m in METHODS:
                    r = one(client, w, image, m)
                    runs.append(r)
                    print(
                        f"run {i + 1}: {w:14} {image:10} {m:9} {r.seconds:6.2f} s "
                        f"survivors={r.survivors:3} bytes={r.bytes_after:6} {r.note}",
                        file=sys.stderr,
                    )
    t = table(runs)
    s = summary(runs)
    print(t)
    print(json.dumps(s, indent=1))
    if a.json:
        a.json.write_text(json.dumps({"summary": s, "runs": [asdict(r) for r in runs]}, indent=1))
    if a.write:
        doc = a.write.read_text()
        start, end = "<!-- side-by-side:start -->", "<!-- side-by-side:end -->"
        head, rest = doc.split(start, 1)
        _, tail = rest.split(end, 1)
        a.write.write_text(f"{head}{start}\n{t}\n{end}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
