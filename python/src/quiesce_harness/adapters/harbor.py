"""Harbor: trial hooks that freeze the trial's main service through quiesce.

For a task that does not know about quiesce, and a run that writes no Python, use the switch
instead (quiesce_harness.harbor): `--env quiesce_harness.harbor:QuiescedEnvironment --verifier
quiesce_harness.harbor:QuiescedVerifier`. These hooks are for a harness that drives Harbor's
Trial itself, on an image that already runs quiesce as its init.

    from harbor.trial.trial import Trial
    from quiesce_harness.adapters.harbor import add_freeze_hooks

    trial = await Trial.create(config)
    add_freeze_hooks(trial)            # or a Job / TrialQueue: the same add_hook()
    result = await trial.run()

The hook runs at `verification_start` (and, with at_agent_end=True, at `agent_end` too); a
freeze that is not `quiescent` raises there, which Harbor records as the step's exception:
the verifier does not run and no reward is kept. The task's image must run quiesce as its init
(ENTRYPOINT ["quiesce", "--sandbox-user", "agent", "--"]), and its tests/test.sh should run the
scorer as `quiesce verify -- ...`, so that nothing started after the freeze is scored.
Harbor's Docker environment names its Compose project after `<trial_name>__env`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..container import Container
from ..freeze import freeze
from ..result import FreezeResult


def trial_container(event: Any, *, binary: str = "quiesce") -> Container:
    """The `main` service of the trial's agent environment (Harbor's Docker environment)."""
    from harbor.environments.docker.docker import _sanitize_docker_compose_project_name

    project = _sanitize_docker_compose_project_name(f"{event.config.trial_name}__env")
    return Container.compose("main", project=project, binary=binary)


def freeze_hook(
    *,
    binary: str = "quiesce",
    timeout: float = 30.0,
    container_for: Callable[[Any], Container] | None = None,
    results: list[FreezeResult] | None = None,
) -> Callable[[Any], Any]:
    """A Harbor HookCallback that freezes the trial's container and raises unless quiescent."""

    async def hook(event: Any) -> None:
        c = (container_for or (lambda e: trial_container(e, binary=binary)))(event)
        r = await asyncio.to_thread(freeze, c, None, timeout)
        if results is not None:
            results.append(r)

    return hook


def add_freeze_hooks(target: Any, *, at_agent_end: bool = False, **kw: Any) -> Any:
    """Register the freeze on a Trial, TrialQueue or Job (anything with add_hook or on_*)."""
    from harbor.trial.hooks import TrialEvent

    hook = freeze_hook(**kw)
    events = [TrialEvent.VERIFICATION_START]
    if at_agent_end:
        events.insert(0, TrialEvent.AGENT_END)
    for ev in events:
        if hasattr(target, "add_hook"):
            target.add_hook(ev, hook)
        elif ev is TrialEvent.AGENT_END:
            target.on_agent_ended(hook)
        else:
            target.on_verification_started(hook)
    return target
