"""Inspect AI: one setting freezes every sample's sandboxes before any scorer reads them.

    pip install quiesce
    INSPECT_REQUIRED_HOOKS=quiesce_harness/freeze inspect eval task.py

The task is not changed: no image rebuilt, no sandbox spec or scorer edited. Installing the kit
registers a hook with Inspect through its `inspect_ai` entry point; the hook is enabled only
when INSPECT_REQUIRED_HOOKS names it, and Inspect itself refuses to run when that variable
names a hook that is not installed, so "protection on" never runs without the kit.

Why a required hook, not a sandbox type (`--sandbox quiesced`): a sandbox type must be named in
the task (or in every `--sandbox` given), which is an edit of the task; the variable is set
once in the environment of `inspect eval`, and the task's own `sandbox="docker"` and compose
file stay as they are. Hook exceptions are the catch: Inspect 0.3.285 logs and swallows every
exception a hook raises except LimitExceededError (hooks/_hooks.py `_emit_to_all`). So every
refusal here is a `QuiesceRefused`, a LimitExceededError, and the one that counts is raised
from `on_sample_scoring`, which Inspect 0.3.285 awaits before the first scorer and outside the
try that records a scorer's error (_eval/task/run.py): it reaches the sample's own error
handler, the sample is an error and no scorer runs.

Per sample (each attempt), for each of its sandboxes (Inspect's docker sandbox: a Compose
project, every service of it):

- at `on_sample_attempt_start` (Inspect 0.3.285: after the sandboxes are up, before the
  solver), the sandbox's `exec` is wrapped. The sandbox user is QUIESCE_SANDBOX_USER when set
  (comma-separated for several), else the service's compose `user:` when it is not root; then
  quiesce is put in and started as a sidecar (start_sidecar) there and then. Otherwise the
  first exec that names a non-root `user=` starts it for that user before that exec runs.
  An exec as another non-root user is refused (the sidecar guards the users it started for).
  A compose `user:` also makes the service's PID 1 that user's, which no freeze from beside it
  can end: the sidecar refuses to start there, and the sample is an error saying so.
- at `on_sample_scoring`, each sandbox is frozen (freeze()) and its marker checked against the
  key the sidecar printed when it started (verify_marker); from then on an exec as any
  non-root user (a scorer running the tests as the agent) is refused: the scorer execs as root.
  A sandbox in which no sandbox user became known, a freeze that is not quiescent, an
  unreachable sidecar, a marker that fails a check: QuiesceRefused, the sample is an error.

When quiesce cannot get in (no root exec, no upload, an architecture with no binary, a
read-only file system), the exec that needed it is refused, the solver stops there (its agent
never ran unprotected), and the sample is an error naming the fix. Other settings, all read
on the machine that runs `inspect eval`:

- QUIESCE_SANDBOX_USER: the sandbox user(s), where neither compose nor an exec names one.
- QUIESCE_INSTALL_PATH, QUIESCE_STATE_DIR: where the binary and the sidecar's state go
  (defaults /run/quiesce-bin/quiesce and /run/quiesce; a read-only root file system needs a
  writable, exec-able mount owned by root for both).
- QUIESCE_SANDBOX_ARCH: the sandbox's architecture (x86_64, aarch64) where it has no uname.
- QUIESCE_ACCEPT_PRIVILEGE_ESCALATION=1: accept markers of a sandbox where setuid binaries can
  make a sandbox process root (no `security_opt: [no-new-privileges]`); refused otherwise.

Each freeze's result is written to the sample's transcript (an info event, source "quiesce").
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

from inspect_ai.hooks import Hooks, SampleAttemptStart, SampleEnd, SampleScoring, hooks
from inspect_ai.util import LimitExceededError

from .container import DEFAULT_STATE_DIR, Container
from .errors import QuiesceError
from .freeze import freeze
from .marker import key_id, load_public_key, verify_marker
from .result import FreezeResult
from .sidecar import DEFAULT_INSTALL_PATH, Sidecar, start_sidecar

HOOK_NAME = "freeze"
# The name Inspect registers the hook under: the package of its module, then its name.
REGISTERED_NAME = f"quiesce_harness/{HOOK_NAME}"
SWITCH = "INSPECT_REQUIRED_HOOKS"
USER_SETTING = "QUIESCE_SANDBOX_USER"
INSTALL_SETTING = "QUIESCE_INSTALL_PATH"
STATE_SETTING = "QUIESCE_STATE_DIR"
SETUID_SETTING = "QUIESCE_ACCEPT_PRIVILEGE_ESCALATION"
ARCH_SETTING = "QUIESCE_SANDBOX_ARCH"
FREEZE_TIMEOUT_S = 30.0
START_TIMEOUT_S = 60.0
_ROOT_NAMES = ("", "0", "root")


class QuiesceRefused(LimitExceededError):  # type: ignore[misc]
    """quiesce could not protect this sample: it must not be scored.

    A LimitExceededError because Inspect 0.3.285 re-raises only that from a hook; raised from
    on_sample_scoring it makes the sample an error before any scorer runs.
    """

    def __init__(self, message: str) -> None:
        super().__init__("custom", value=1, limit=0, message=f"quiesce: {message}")


def switched_on() -> bool:
    """Whether INSPECT_REQUIRED_HOOKS names this hook (the one setting that turns it on)."""
    names = {n.strip() for n in os.environ.get(SWITCH, "").split(",")}
    return REGISTERED_NAME in names


def _users_setting() -> list[str]:
    return [u.strip() for u in os.environ.get(USER_SETTING, "").split(",") if u.strip()]


def _is_root(user: str | None) -> bool:
    return user is None or user.split(":")[0] in _ROOT_NAMES


@dataclass
class _Guard:
    """One sandbox of one sample attempt: its container and the sidecar started in it."""

    name: str
    container: Container
    users: list[str] = field(default_factory=list)
    sidecar: Sidecar | None = None
    failure: str | None = None
    frozen: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def start(self, users: list[str]) -> None:
        """The sidecar for `users`, started once; QuiesceRefused (and remembered) otherwise."""
        async with self.lock:
            if self.failure is not None:
                raise QuiesceRefused(self.failure)
            if self.sidecar is not None:
                missing = [u for u in users if u not in self.users]
                if missing:
                    self.failure = (
                        f"sandbox {self.name!r}: an exec as {missing[0]!r}, but quiesce guards "
                        f"{','.join(self.users)} here: set {USER_SETTING}="
                        f"{','.join([*self.users, *missing])} to guard every sandbox user"
                    )
                    raise QuiesceRefused(self.failure)
                return
            try:
                self.sidecar = await asyncio.to_thread(_start, self.container, users)
            except Exception as e:  # any error: the agent must not run unguarded
                self.failure = (
                    f"sandbox {self.name!r}: quiesce could not get in, so the agent did not "
                    f"run: {_named(e)}{_setting_hint(e)}"
                )
                raise QuiesceRefused(self.failure) from None
            self.users = list(users)


def _named(e: Exception) -> str:
    """The kit's errors say what and why; any other is named by its type too."""
    return str(e) if isinstance(e, QuiesceError) else f"{type(e).__name__}: {e}"


def _setting_hint(e: Exception) -> str:
    """The kit's messages name its keyword arguments; through Inspect they are settings."""
    text = str(e)
    if "install_path=" in text:
        return f" (through Inspect: set {INSTALL_SETTING} and {STATE_SETTING})"
    if "PID 1" in text and "sandbox UID" in text:
        return (
            " (through Inspect: drop the service's compose `user:` and run the agent's "
            "execs with user=)"
        )
    if "arch=" in text:
        return f" (through Inspect, arch= is the setting {ARCH_SETTING})"
    if "accept_privilege_escalation=" in text:
        return (
            " (through Inspect: `security_opt: [no-new-privileges]` in the service's compose, "
            f"or {SETUID_SETTING}=1)"
        )
    return ""


def _start(container: Container, users: list[str]) -> Sidecar:
    extra: list[str] = []
    for u in users[1:]:
        extra += ["--sandbox-user", u]
    return start_sidecar(
        container,
        users[0],
        state_dir=os.environ.get(STATE_SETTING) or DEFAULT_STATE_DIR,
        install_path=os.environ.get(INSTALL_SETTING) or DEFAULT_INSTALL_PATH,
        arch=os.environ.get(ARCH_SETTING) or None,
        timeout=START_TIMEOUT_S,
        extra_args=extra,
    )


def _freeze_checked(g: _Guard, sc: Sidecar) -> tuple[FreezeResult, dict[str, Any]]:
    r = freeze(sc.container, None, FREEZE_TIMEOUT_S)
    if r.marker is None:
        raise QuiesceRefused(f"sandbox {g.name!r}: the freeze returned no marker of its own")
    claims = verify_marker(
        r.marker,
        sc.public_key,
        nonce=r.nonce,
        container=sc.container,
        accept_privilege_escalation=os.environ.get(SETUID_SETTING) == "1",
    )
    return r, claims


def _wrap_exec(env: Any, guard: _Guard) -> None:
    """Put the guard in front of the sandbox's own exec (the instance's, not its class's).

    Inspect 0.3.285's SandboxEnvironmentProxy counts the parameters of the inner exec (8:
    it passes `concurrency`), so the wrapper keeps the docker sandbox's signature.
    """
    inner = env.exec

    async def exec(
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> Any:
        if guard.failure is not None:
            raise QuiesceRefused(guard.failure)
        if not _is_root(user):
            if guard.frozen:
                # A scorer's exec as a sandbox user runs that user's code again (its files, its
                # PATH), which could leave a writer behind while the scorer reads: unproven.
                raise QuiesceRefused(
                    f"sandbox {guard.name!r}: an exec as {user!r} after the freeze would run "
                    "the sandbox user's processes again before the score: run the scorer's "
                    "execs as root"
                )
            await guard.start([str(user)])
        return await inner(
            cmd,
            input=input,
            cwd=cwd,
            env=env,
            user=user,
            timeout=timeout,
            timeout_retry=timeout_retry,
            concurrency=concurrency,
        )

    env.exec = exec


def _container_of(name: str, env: Any) -> Container:
    from .adapters.inspect_ai import sandbox_container
    from .errors import Unreachable

    try:
        return sandbox_container(env)
    except Unreachable:
        raise QuiesceRefused(
            f"sandbox {name!r} is {type(getattr(env, '_sandbox', env)).__name__}: the hook "
            "knows Inspect's docker sandbox only; unset INSPECT_REQUIRED_HOOKS's "
            f"{REGISTERED_NAME} for this task or run it on the docker sandbox"
        ) from None


def _compose_user(container: Container) -> str | None:
    """The container's configured user (compose `user:`), None when it is root."""
    from .errors import Unreachable

    try:
        user = str(container.inspect().get("Config", {}).get("User") or "")
    except Unreachable as e:
        raise QuiesceRefused(f"{container.name}: cannot read its configured user: {e}") from None
    return None if _is_root(user) else user.split(":")[0]


@dataclass
class _Sample:
    """One attempt of one sample: a guard per sandbox, and the refusal that ended it, if any."""

    guards: list[_Guard] = field(default_factory=list)
    failure: str | None = None


def _refusal(e: Exception) -> str:
    """The message of a refusal: a QuiesceRefused's own, else the error named (never lost)."""
    if isinstance(e, QuiesceRefused):
        return str(e.message).removeprefix("quiesce: ")
    return _named(e)


async def _guard_sandboxes(sample: _Sample) -> None:
    """Wrap each sandbox's exec; start the sidecar where the sandbox user is known now."""
    from inspect_ai.util._sandbox.context import sandbox_environments_context_var

    envs = sandbox_environments_context_var.get(None) or {}
    for name, env in envs.items():
        guard = _Guard(name, _container_of(name, env))
        sample.guards.append(guard)
        _wrap_exec(getattr(env, "_sandbox", env), guard)
    for guard in sample.guards:
        users = _users_setting()
        if not users:
            found = await asyncio.to_thread(_compose_user, guard.container)
            users = [found] if found else []
        if users:
            await guard.start(users)


async def _freeze_sandbox(g: _Guard) -> None:
    """Freeze one sandbox and check its marker; QuiesceRefused unless both hold."""
    from inspect_ai.log._transcript import transcript

    if g.failure is not None:
        raise QuiesceRefused(g.failure)
    sc = g.sidecar
    if sc is None:
        raise QuiesceRefused(
            f"sandbox {g.name!r}: no exec named a non-root user and its compose service "
            f"has none, so quiesce does not know whom to freeze: set {USER_SETTING}"
        )
    # From here on no exec as a sandbox user is let through (see _wrap_exec).
    g.frozen = True
    try:
        r, claims = await asyncio.to_thread(_freeze_checked, g, sc)
    except QuiesceError as e:
        g.failure = f"sandbox {g.name!r}: the freeze did not prove it quiet: {e}{_setting_hint(e)}"
        raise QuiesceRefused(g.failure) from None
    transcript().info(
        {
            "sandbox": g.name,
            "state": r.state,
            "freeze_id": r.freeze_id,
            "killed": r.killed,
            "elapsed_s": round(r.elapsed_s, 3),
            "key_id": key_id(load_public_key(sc.public_key)),
            "sandbox_users": g.users,
            "setuid": claims.get("setuid"),
        },
        source="quiesce",
    )


@hooks(
    name=HOOK_NAME,
    description="quiesce: freeze each sample's sandboxes before the scorers read them",
)
class QuiesceHooks(Hooks):  # type: ignore[misc]
    """The hook INSPECT_REQUIRED_HOOKS=quiesce_harness/freeze turns on (see the module)."""

    def __init__(self) -> None:
        # Inspect 0.3.285 makes one instance for the process; samples run concurrently on one
        # loop: state is per sample (its uuid), dropped at its end.
        self._samples: dict[str, _Sample] = {}

    def enabled(self) -> bool:
        return switched_on()

    async def on_sample_attempt_start(self, data: SampleAttemptStart) -> None:
        # Inspect 0.3.285: emitted on every attempt (a retry gets new sandboxes), after the
        # sandboxes are up and before the solver runs, in the sample's own context. A refusal
        # here ends the attempt as a limit, before the solver; Inspect then goes on to scoring,
        # where on_sample_scoring raises it again, so it is remembered for the sample.
        sample = _Sample()
        self._samples[data.sample_id] = sample
        try:
            await _guard_sandboxes(sample)
        except Exception as e:
            sample.failure = _refusal(e)
            raise QuiesceRefused(sample.failure) from None

    async def on_sample_scoring(self, data: SampleScoring) -> None:
        # Inspect 0.3.285 swallows any other exception of a hook: every one becomes a refusal.
        sample = self._samples.get(data.sample_id)
        if sample is None:
            raise QuiesceRefused(
                "the sample started before the hook saw it: its sandboxes are unguarded"
            )
        try:
            if sample.failure is not None:
                raise QuiesceRefused(sample.failure)
            for g in sample.guards:
                await _freeze_sandbox(g)
        except Exception as e:
            sample.failure = _refusal(e)
            raise QuiesceRefused(sample.failure) from None

    async def on_sample_end(self, data: SampleEnd) -> None:
        self._samples.pop(data.sample_id, None)
