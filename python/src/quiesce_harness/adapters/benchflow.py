"""BenchFlow: rollout planes whose agent quiescing and pre-verify hardening freeze through quiesce.

    from benchflow.rollout import RolloutConfig
    from quiesce_harness.adapters.benchflow import QuiescePlanes

    config = RolloutConfig(..., sandbox_user="agent", planes=QuiescePlanes())

BenchFlow's own `quiesce_agent` / `harden_before_verify` run `pkill -u agent; sleep 1; pkill -9`
and ignore the result. Here both freeze first (FreezeFailed / Unreachable propagate, so BenchFlow
records a verifier error and keeps no reward); the rest of BenchFlow's hardening then runs as
before. Needs the task image's init to be quiesce (ENTRYPOINT, or the engine's init).
Supports BenchFlow's DockerSandbox (a Compose project) and any sandbox given by `container_for`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from benchflow.rollout_planes import DefaultRolloutPlanes

from ..container import Container
from ..errors import Unreachable
from ..freeze import freeze
from ..result import FreezeResult


def docker_sandbox_container(env: Any, *, binary: str = "quiesce") -> Container:
    """The `main` service of a BenchFlow DockerSandbox, found by its Compose project's labels."""
    from benchflow.sandbox.docker import DockerSandbox, _sanitize_docker_compose_project_name

    if not isinstance(env, DockerSandbox):
        raise Unreachable(
            f"{type(env).__name__}: the kit reaches BenchFlow's DockerSandbox only; "
            "pass container_for= to QuiescePlanes for other sandboxes"
        )
    project = _sanitize_docker_compose_project_name(env.session_id)
    return Container.compose("main", project=project, binary=binary)


class QuiescePlanes(DefaultRolloutPlanes):  # type: ignore[misc]
    """BenchFlow's default planes, with a freeze where it kills the sandbox user's processes."""

    def __init__(
        self,
        *,
        binary: str = "quiesce",
        timeout: float = 30.0,
        container_for: Callable[[Any], Container] | None = None,
        on_result: Callable[[FreezeResult], None] | None = None,
    ) -> None:
        super().__init__()
        self.binary = binary
        self.timeout = timeout
        self.container_for = container_for or (
            lambda env: docker_sandbox_container(env, binary=binary)
        )
        self.on_result = on_result
        self.results: list[FreezeResult] = []

    async def freeze(self, env: Any) -> FreezeResult:
        c = self.container_for(env)
        r = await asyncio.to_thread(freeze, c, None, self.timeout)
        self.results.append(r)
        if self.on_result is not None:
            self.on_result(r)
        return r

    async def quiesce_agent(self, env: Any, sandbox_user: str) -> None:
        await self.freeze(env)

    async def harden_before_verify(self, *args: Any, **kwargs: Any) -> None:
        env = args[0] if args else kwargs["env"]
        await self.freeze(env)
        await super().harden_before_verify(*args, **kwargs)
