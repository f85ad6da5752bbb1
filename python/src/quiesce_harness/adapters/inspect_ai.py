"""Inspect AI: a scorer wrapper that freezes the sample's sandboxes before the scorer reads them.

    from inspect_ai.scorer import includes
    from quiesce_harness.adapters.inspect_ai import quiesced

    Task(dataset=..., solver=..., scorer=quiesced(includes(), public_key=PEM), sandbox="docker")

The wrapper freezes every sandbox of the sample (every service of its Compose project, found
through the project's labels), each through the quiesce that is its init, and checks each
marker against `public_key` (verify_marker) before it calls the wrapped scorer: a writer left
in any service (one that shares a volume with the one the scorer reads) is ended, or the
sample is an error, no score. The freeze is the hook's own (quiesce_harness.inspect_ai).

`public_key` is the key quiesce signs with, kept outside the sandbox: the orchestrator makes
it (`quiesce keygen`) and starts each service's init with `--signing-key` (the private key
file root's, 0600). One PEM for every sandbox, or a mapping from sandbox name to PEM. A key
read back from the sandbox at scoring time would be whatever root there wrote.

For a task left as it is (its image, sandbox and scorer unchanged), the kit's hook does this
with one setting, INSPECT_REQUIRED_HOOKS=quiesce_harness/freeze, and reads each quiesce's key
before the agent runs: see quiesce_harness.inspect_ai.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..container import Container
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
    public_key: str | Mapping[str, str],
    binary: str = "quiesce",
    accept_privilege_escalation: bool = False,
    results: list[FreezeResult] | None = None,
) -> Any:
    """Wrap a Scorer: freeze every sandbox of the sample and check each marker against
    `public_key`, then score. Keeps the scorer's metrics. `accept_privilege_escalation` is
    verify_marker's (a service without no-new-privileges); `results` collects each freeze."""
    from inspect_ai._util.registry import registry_info
    from inspect_ai.scorer import scorer
    from inspect_ai.scorer._scorer import scorer_metrics

    from ..inspect_ai import freeze_sample

    info = registry_info(inner)
    metrics = scorer_metrics(inner)

    @scorer(metrics=metrics, name=f"quiesced_{info.name.split('/')[-1]}")  # type: ignore[untyped-decorator]
    def wrapper() -> Any:
        async def score(state: Any, target: Any) -> Any:
            done = await freeze_sample(
                public_key, binary=binary, accept_setuid=accept_privilege_escalation
            )
            if results is not None:
                results.extend(done)
            return await inner(state, target)

        return score

    return wrapper()
