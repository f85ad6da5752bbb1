"""Inspect AI: a scorer wrapper that freezes the sample's sandbox before the scorer reads it.

    from inspect_ai.scorer import includes
    from quiesce_harness.adapters.inspect_ai import quiesced

    Task(dataset=..., solver=..., scorer=quiesced(includes()), sandbox="docker")

The wrapper freezes the sandbox of the sample (`sandbox()` by default, or `sandbox_name`),
then calls the wrapped scorer. A freeze that is not `quiescent` raises, and Inspect records the
sample as an error: no score. The sandbox image must run quiesce as its init. Inspect's docker
sandbox is a Compose project: the container is found through the project's labels.

For a task left as it is (its image, sandbox and scorer unchanged), the kit's hook does this
with one setting, INSPECT_REQUIRED_HOOKS=quiesce_harness/freeze: see quiesce_harness.inspect_ai.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..container import Container
from ..freeze import freeze
from ..result import FreezeResult


def sandbox_container(env: Any, *, binary: str = "quiesce") -> Container:
    """The container of an Inspect DockerSandboxEnvironment (its Compose project and service)."""
    from inspect_ai.util._sandbox.docker.docker import DockerSandboxEnvironment

    from ..errors import Unreachable

    try:
        env = env.as_type(DockerSandboxEnvironment)
    except (TypeError, AttributeError):
        raise Unreachable(f"{type(env).__name__}: not Inspect's docker sandbox") from None
    project = getattr(getattr(env, "_project", None), "name", None)
    service = getattr(env, "_service", None)
    if not project or not service:
        raise Unreachable(
            f"{type(env).__name__}: not Inspect's docker sandbox (no compose project/service)"
        )
    return Container.compose(str(service), project=str(project), binary=binary)


def quiesced(
    inner: Any,
    *,
    sandbox_name: str | None = None,
    binary: str = "quiesce",
    timeout: float = 30.0,
    results: list[FreezeResult] | None = None,
) -> Any:
    """Wrap a Scorer: freeze the sample's sandbox, then score. Keeps the scorer's metrics."""
    from inspect_ai._util.registry import registry_info
    from inspect_ai.scorer import scorer
    from inspect_ai.scorer._scorer import scorer_metrics
    from inspect_ai.util import sandbox

    info = registry_info(inner)
    metrics = scorer_metrics(inner)

    @scorer(metrics=metrics, name=f"quiesced_{info.name.split('/')[-1]}")  # type: ignore[untyped-decorator]
    def wrapper() -> Any:
        async def score(state: Any, target: Any) -> Any:
            c = sandbox_container(sandbox(sandbox_name), binary=binary)
            r = await asyncio.to_thread(freeze, c, None, timeout)
            if results is not None:
                results.append(r)
            return await inner(state, target)

        return score

    return wrapper()
