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

- before the project is brought up, a service that runs as a non-root user (its compose
  `user:`, else its image's USER) gets quiesce as its init: the project is brought up from a
  rewritten copy of its compose file, the kit's own (see "The init path" below), in which that
  service runs as root, quiesce (the kit's binary, mounted read-only) is PID 1 guarding that
  user, and runs the service's own command as that user. The task's files stay as they are.
- at `on_sample_attempt_start` (Inspect 0.3.285: after the sandboxes are up, before the
  solver), the sandbox's `exec` is wrapped. Where quiesce is the init, its key is read there
  and then, and every exec that names no `user=` runs as the user the service ran as (as it
  did before the rewrite). Elsewhere the sandbox user is QUIESCE_SANDBOX_USER when set
  (comma-separated for several), and quiesce is put in and started as a sidecar
  (start_sidecar) there and then; otherwise the first exec that names a non-root `user=`
  starts it for that user before that exec runs. An exec as another non-root user is refused
  (quiesce guards the users it started for). A PID 1 of the sandbox user's that the switch
  could not make quiesce (a service built here with no `image:` name and a Dockerfile USER)
  cannot be ended from beside it: the sidecar refuses to start, the sample is an error.
- during the solver (from the attempt's start to scoring), once a sandbox user is known for a
  sandbox, an exec as root is refused: Inspect's bash(), python(), bash_session() and
  text_editor() run as root unless given `user=`, and a process root leaves is one no freeze
  ends, so the marker would say nothing of it. The fix it names: the agent's tools with
  `user=` the sandbox user, or the service's compose `user:`. Inspect's own privileged execs
  are let through (write_file's mkdir and tee: a script under its pinned shell and PATH;
  read_file copies, it does not exec); its sandbox tools' server (text_editor,
  bash_session) starts as the tools' user, and as root it is refused like any tool. Root
  execs before a sandbox user is known (QUIESCE_SANDBOX_USER unset, no compose `user:`) run,
  but the first exec as a user after one is refused: the guard it would start could not vouch
  for what root left. A solver that only ever execs as root starts no guard, and the sample is
  an error at scoring.
- at `on_sample_scoring`, each sandbox is frozen (freeze()) and its marker checked against the
  key read before the agent ran (verify_marker). From then on every exec the wrapper lets
  through, as root or as a guarded user, runs one at a time and is followed, before its
  result goes back to the scorer, by another freeze through the same quiesce, its marker
  checked against the same key: a scorer that runs the agent's code (`su agent -c ...`,
  `setpriv --reuid`, the tests run as the agent) and leaves a process of a sandbox user
  behind makes that freeze kill it, and the sample is an error. So a scorer's exec with no
  `user=` on the init path (the compose user) and one as the sandbox user are allowed: each
  is followed by its proof. An exec as a non-root user quiesce does not guard is refused.
  A sandbox in which no sandbox user became known, a freeze that is not quiescent or killed
  anything after a scorer's exec, an unreachable quiesce, a marker that fails a check:
  QuiesceRefused, the sample is an error.

When quiesce cannot get in (no root exec, no upload, an architecture with no binary, a
read-only file system), the exec that needed it is refused, the solver stops there (its agent
never ran unprotected), and the sample is an error naming the fix. Other settings, all read
on the machine that runs `inspect eval`:

- QUIESCE_SANDBOX_USER: the sandbox user(s), where neither compose nor an exec names one
  (where quiesce is the init, more users it guards besides the service's own).
- QUIESCE_INSTALL_PATH, QUIESCE_STATE_DIR: where the binary and the sidecar's state go
  (defaults /run/quiesce-bin/quiesce and /run/quiesce; a read-only root file system needs a
  writable, exec-able mount owned by root for both). Each, and every directory above it,
  must be root's and writable by root alone (checked before the agent runs, for the init's
  state dir too): one under the agent's workspace is refused.
- QUIESCE_SANDBOX_ARCH: the sandbox's architecture (x86_64, aarch64) where it has no uname.
- QUIESCE_ACCEPT_PRIVILEGE_ESCALATION=1: accept markers of a sandbox where setuid binaries can
  make a sandbox process root (no `security_opt: [no-new-privileges]`); refused otherwise.
  Where quiesce is the init, the rewrite adds no-new-privileges unless this is set.
- QUIESCE_ALLOW_ROOT_EXECS=1: let root execs run during the solver. The marker then says
  nothing of root's processes: an agent whose tools run as root can leave a writer that no
  freeze ends.

The switch is the name Inspect registered the hook under: `quiesce_harness/freeze` when the
kit is installed (site-packages), `freeze` when it is imported from elsewhere (PYTHONPATH,
pip install --target); Inspect refuses the other one, the hook answers to either.

Each freeze's result is written to the sample's transcript (an info event, source "quiesce";
the freeze after each scorer exec, source "quiesce/after-exec").

Not covered: interim scoring (`inspect ctl task score`) emits no hook event and runs the
scorers on live sandboxes, unprotected. A writable bind mount or volume shared between
samples' containers (Inspect's unsafe_allow_writable_host_mounts) is written by the other
samples' agents while this one is scored: a per-sample freeze cannot cover it. A scorer's exec
that runs the agent's code as root leaves root's processes, which no freeze ends. A scorer
that catches the refusal raised by one of its execs and returns a score of its own is scored
(every later exec of the sample is refused).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import functools
import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inspect_ai.hooks import (
    Hooks,
    SampleAttemptStart,
    SampleEnd,
    SampleScoring,
    TaskStart,
    hooks,
)
from inspect_ai.util import LimitExceededError

from .container import DEFAULT_STATE_DIR, Container, sandbox_user_args
from .errors import QuiesceError
from .freeze import freeze
from .marker import key_id, load_public_key, verify_marker
from .result import FreezeResult
from .sidecar import DEFAULT_INSTALL_PATH, start_sidecar

HOOK_NAME = "freeze"
# The name Inspect registers the hook under: the package of its module, then its name.
REGISTERED_NAME = f"quiesce_harness/{HOOK_NAME}"
SWITCH = "INSPECT_REQUIRED_HOOKS"
USER_SETTING = "QUIESCE_SANDBOX_USER"
INSTALL_SETTING = "QUIESCE_INSTALL_PATH"
STATE_SETTING = "QUIESCE_STATE_DIR"
SETUID_SETTING = "QUIESCE_ACCEPT_PRIVILEGE_ESCALATION"
ARCH_SETTING = "QUIESCE_SANDBOX_ARCH"
ROOT_SETTING = "QUIESCE_ALLOW_ROOT_EXECS"
FREEZE_TIMEOUT_S = 30.0
# Passes over a sample's sandboxes (_freeze_all): the first, then until one kills nothing.
FREEZE_PASSES = 3
START_TIMEOUT_S = 60.0
_ROOT_NAMES = ("", "0", "root")
# Where the init path mounts the kit's binary (read-only) in a rewritten service: a file in /,
# which no process in the container can rename, unlink or redirect (Container.check_way_in);
# under a directory (/run/...) one that may write that directory, or a setuid helper, could
# rename it and put its own file in its place. Its name is what /proc/1/comm says when it is
# PID 1.
INIT_PATH = "/quiesce"
INIT_KEY_TIMEOUT_S = 10.0
DOCKER_TIMEOUT_S = 120


class QuiesceRefused(LimitExceededError):  # type: ignore[misc]
    """quiesce could not protect this sample: it must not be scored.

    A LimitExceededError because Inspect 0.3.285 re-raises only that from a hook; raised from
    on_sample_scoring it makes the sample an error before any scorer runs.
    """

    def __init__(self, message: str) -> None:
        super().__init__("custom", value=1, limit=0, message=f"quiesce: {message}")


def switched_on() -> bool:
    """Whether INSPECT_REQUIRED_HOOKS names this hook (the one setting that turns it on), by
    the name Inspect registered it under: imported from outside site-packages (PYTHONPATH,
    pip install --target) that is `freeze`, which Inspect's own check then accepts."""
    names = {n.strip() for n in os.environ.get(SWITCH, "").split(",")}
    return bool(names & _registered_names())


# Each instance Inspect made of the hook (its decorator makes one per import of this module).
_INSTANCES: list[Hooks] = []


def _registered_names() -> set[str]:
    from inspect_ai._util.registry import registry_info

    names = {REGISTERED_NAME}
    for hook in _INSTANCES:
        # One made by hand, not by Inspect's decorator, has no name of its own.
        with contextlib.suppress(ValueError):
            names.add(str(registry_info(hook).name))
    return names


def _users_setting() -> list[str]:
    return [u.strip() for u in os.environ.get(USER_SETTING, "").split(",") if u.strip()]


def _is_root(user: str | None) -> bool:
    return user is None or user.split(":")[0] in _ROOT_NAMES


@dataclass(frozen=True)
class _Quiesce:
    """The quiesce that guards a sandbox: the container pointed at it, and its public key as
    read before the agent's first exec (kept here, outside the sandbox)."""

    container: Container
    public_key: str
    how: str  # "sidecar" or "init"
    # verify_marker's accept_privilege_escalation: the setting, unless quiesced() was told.
    accept_setuid: bool = field(default_factory=lambda: os.environ.get(SETUID_SETTING) == "1")


@dataclass
class _Guard:
    """One sandbox of one sample attempt: its container and the quiesce that guards it.

    `default_user` is set on the init path: the compose `user:` the service ran as before its
    rewrite, which every exec that names no user= still runs as.
    """

    name: str
    container: Container
    users: list[str] = field(default_factory=list)
    quiesce: _Quiesce | None = None
    default_user: str | None = None
    failure: str | None = None
    frozen: bool = False
    # A root exec of the solver that ran before any sandbox user was known: what it left is
    # root's, so a later exec as a user must not start a guard that would vouch for it.
    root_ran: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # After the freeze: one exec at a time, each followed by its re-freeze (see _wrap_exec).
    scoring: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def start(self, users: list[str]) -> None:
        """The sidecar for `users`, started once; QuiesceRefused (and remembered) otherwise."""
        async with self.lock:
            if self.failure is not None:
                raise QuiesceRefused(self.failure)
            if self.quiesce is not None:
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
                sc = await asyncio.to_thread(_start, self.container, users)
            except Exception as e:  # any error: the agent must not run unguarded
                self.failure = (
                    f"sandbox {self.name!r}: quiesce could not get in, so the agent did not "
                    f"run: {_named(e)}{_setting_hint(e)}"
                )
                raise QuiesceRefused(self.failure) from None
            try:
                await asyncio.to_thread(_check_state_dir, sc.container)
            except Exception as e:
                self.failure = f"sandbox {self.name!r}: the agent did not run: {_named(e)}"
                raise QuiesceRefused(self.failure) from None
            self.quiesce = _Quiesce(sc.container, sc.public_key, "sidecar")
            self.users = list(users)


def _named(e: Exception) -> str:
    """The kit's errors say what and why; any other is named by its type too."""
    return str(e) if isinstance(e, QuiesceError) else f"{type(e).__name__}: {e}"


def _setting_hint(e: Exception) -> str:
    """The kit's messages name its keyword arguments; through Inspect they are settings."""
    text = str(e)
    if "install_path=" in text or "state_dir=" in text:
        return f" (through Inspect: set {INSTALL_SETTING} and {STATE_SETTING})"
    if "PID 1" in text and "sandbox UID" in text:
        return (
            " (through Inspect: the switch makes quiesce the init of a service whose compose "
            "`user:` or image USER is the sandbox user; name the service's `image:`, or give "
            "it that `user:`, so that the switch can see it)"
        )
    if "arch=" in text:
        return f" (through Inspect, arch= is the setting {ARCH_SETTING})"
    if "accept_privilege_escalation=" in text:
        return (
            " (through Inspect: `security_opt: [no-new-privileges]` in the service's compose, "
            f"or {SETUID_SETTING}=1)"
        )
    return ""


def _start(container: Container, users: list[str]) -> Any:
    return start_sidecar(
        container,
        users,
        state_dir=os.environ.get(STATE_SETTING) or DEFAULT_STATE_DIR,
        install_path=os.environ.get(INSTALL_SETTING) or DEFAULT_INSTALL_PATH,
        arch=os.environ.get(ARCH_SETTING) or None,
        timeout=START_TIMEOUT_S,
    )


def _check_state_dir(c: Container) -> None:
    """quiesce's state dir and every directory above it are root's and writable by root alone
    (the install's own check, sidecar.py `safe`): else the sandbox user could rename it
    away and answer in quiesce's place. Checked before the agent runs."""
    from .errors import InstallFailed
    from .sidecar import _lines, _script

    path = f"{c.state_dir.rstrip('/')}/signing.pub"
    r = _script(c, path, "check", c.root_user, time.monotonic() + START_TIMEOUT_S)
    said = _lines(r)
    if "unsafe" in said:
        raise InstallFailed(
            f"{c.name}: quiesce's state dir {c.state_dir} is not safe: {said['unsafe']} (it "
            "and every directory above it must be root's and writable by root alone, or the "
            f"sandbox user could move it away): set {STATE_SETTING} to another path"
        )
    if r.returncode != 0 or "dir" not in said:
        raise InstallFailed(
            f"{c.name}: cannot check quiesce's state dir {c.state_dir} "
            f"({r.text or f'exit {r.returncode}'})"
        )


def _freeze_checked(g: _Guard, q: _Quiesce) -> tuple[FreezeResult, dict[str, Any]]:
    r = freeze(q.container, None, FREEZE_TIMEOUT_S)
    if r.marker is None:
        raise QuiesceRefused(f"sandbox {g.name!r}: the freeze returned no marker of its own")
    claims = verify_marker(
        r.marker,
        q.public_key,
        nonce=r.nonce,
        container=q.container,
        accept_privilege_escalation=q.accept_setuid,
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
        if user is None and guard.default_user is not None:
            # The init path: the service now runs as root, so an exec with no user= is given
            # the compose `user:` it ran as before the rewrite.
            user = guard.default_user
        run = functools.partial(
            inner,
            cmd,
            input=input,
            cwd=cwd,
            env=env,
            user=user,
            timeout=timeout,
            timeout_retry=timeout_retry,
            concurrency=concurrency,
        )
        if guard.frozen:
            return await _after_freeze(guard, cmd, user, run)
        if not _is_root(user):
            if guard.root_ran and guard.quiesce is None and not _root_allowed([]):
                guard.failure = (
                    f"sandbox {guard.name!r}: an exec as {user!r}, after execs as root during "
                    "the solver: a process they left is root's, which no freeze ends: run every "
                    f"tool of the agent's with user={user!r}, set {USER_SETTING}={user} so that "
                    f"quiesce starts before the solver, or set {ROOT_SETTING}=1 to accept "
                    "markers that say nothing of root processes"
                )
                raise QuiesceRefused(guard.failure)
            await guard.start([str(user).split(":")[0]])
        elif guard.quiesce is None and not _root_allowed(cmd):
            guard.root_ran = True
        elif guard.quiesce is not None and not _root_allowed(cmd):
            # The solver: a root exec here runs what no freeze ends (bash() and the other
            # tools default to root): the marker would say nothing of it.
            guard.failure = (
                f"sandbox {guard.name!r}: an exec as root during the solver, while quiesce "
                f"guards {','.join(guard.users)} here: a process it leaves is root's, which no "
                f"freeze ends: run the agent's tools with user={guard.users[0]!r} (or the "
                f"service's compose `user:`), or set {ROOT_SETTING}=1 to accept markers that "
                "say nothing of root processes"
            )
            raise QuiesceRefused(guard.failure)
        return await run()

    env.exec = exec


def _root_allowed(cmd: list[str]) -> bool:
    """Whether a root exec may run during the solver: with ROOT_SETTING=1 any, else only
    Inspect's own privileged commands (write_file's mkdir and tee: a script under its pinned
    shell and PATH, which no tool call of the agent's produces; Inspect 0.3.285 _privileged.py)."""
    if os.environ.get(ROOT_SETTING) == "1":
        return True
    try:
        from inspect_ai.util._sandbox._privileged import SHELL_PATH, _pin
    except ImportError:
        return False
    pin = _pin()
    return len(cmd) >= 4 and cmd[:2] == [SHELL_PATH, "-c"] and cmd[2].startswith(pin)


async def _after_freeze(
    guard: _Guard, cmd: list[str], user: str | None, run: Callable[[], Awaitable[Any]]
) -> Any:
    """A scorer's exec: run it, then freeze again through the same quiesce before its result
    goes back; any process of a sandbox user it left (a `su agent`, a `setpriv`, the agent's
    code run as its user) is killed there, and then the sample is an error, not a score."""
    bare = None if _is_root(user) else str(user).split(":")[0]
    if bare is not None and bare not in guard.users:
        guard.failure = (
            f"sandbox {guard.name!r}: a scorer's exec as {bare!r}, a user quiesce does not "
            f"guard here ({','.join(guard.users)}): run it as root or as a guarded user, or "
            f"set {USER_SETTING}={','.join([*guard.users, bare])}"
        )
        raise QuiesceRefused(guard.failure)
    async with guard.scoring:
        if guard.failure is not None:
            raise QuiesceRefused(guard.failure)
        try:
            return await run()
        finally:
            # Also when the exec raised (a timeout): the scorer may catch that and read on.
            await _refreeze(guard, cmd)


async def _refreeze(guard: _Guard, cmd: list[str]) -> None:
    """The freeze after one scorer exec: quiescent, nothing killed, its marker checked against
    the kept key; QuiesceRefused (and remembered) otherwise."""
    from inspect_ai.log._transcript import transcript

    q = guard.quiesce
    what = " ".join(cmd)[:120]
    try:
        if q is None:  # frozen only once a quiesce guards it (see _freeze_sandbox)
            raise QuiesceError("no quiesce guards it")
        r, _ = await asyncio.to_thread(_freeze_checked, guard, q)
    except QuiesceError as e:
        guard.failure = (
            f"sandbox {guard.name!r}: the freeze after the scorer's exec {what!r} did not "
            f"prove it quiet: {e}"
        )
        raise QuiesceRefused(guard.failure) from None
    transcript().info(
        {"sandbox": guard.name, "after_exec": what, "state": r.state, "killed": r.killed},
        source="quiesce/after-exec",
    )
    if r.state != "quiescent" or r.killed:
        guard.failure = (
            f"sandbox {guard.name!r}: the scorer's exec {what!r} left {r.killed} process(es) "
            f"of {','.join(guard.users)} alive (the freeze after it: {r.state}, killed "
            f"{r.killed}): the sandbox user's code ran on after the freeze, so its result was "
            "not given to the scorer"
        )
        raise QuiesceRefused(guard.failure)


def _container_of(name: str, env: Any, binary: str = "quiesce") -> Container:
    from .adapters.inspect_ai import sandbox_container
    from .errors import Unreachable

    try:
        return sandbox_container(env, binary=binary)
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
        guard.default_user = _init_user(env)
        sample.guards.append(guard)
        _wrap_exec(getattr(env, "_sandbox", env), guard)
    for guard in sample.guards:
        if guard.default_user is not None:
            await _guard_init(guard, guard.default_user)
            continue
        users = _users_setting()
        if not users:
            found = await asyncio.to_thread(_compose_user, guard.container)
            users = [found] if found else []
        if users:
            await guard.start(users)


async def _freeze_all(guards: list[_Guard]) -> list[FreezeResult]:
    """Freeze every sandbox of a sample, each marker checked against its kept key; the last
    pass's results in order, or QuiesceRefused at the first that does not hold.

    The sandboxes are frozen one after another: a process alive in B when A's freeze signed
    can make A start a sandbox process after A's marker (a root login service of A's that B
    reaches). So with more than one sandbox every one is frozen again until a pass after the
    first kills nothing anywhere (what one pass killed was alive after the pass before it):
    at most FREEZE_PASSES passes, else refused."""
    results = [await _freeze_sandbox(g) for g in guards]
    if len(guards) < 2:
        return results
    for _ in range(FREEZE_PASSES - 1):
        results = [await _freeze_sandbox(g) for g in guards]
        if all(r.killed == 0 for r in results):
            return results
    killed = ", ".join(f"{g.name!r} {r.killed}" for g, r in zip(guards, results, strict=True))
    raise QuiesceRefused(
        f"the sample's sandboxes were frozen {FREEZE_PASSES} times in turn and the last pass "
        f"still killed sandbox processes ({killed}): a process in one starts processes in "
        "another after its freeze; give the sample's services no way into each other (a "
        "login service, a shared socket) before scoring it"
    )


async def freeze_sample(
    public_key: str | Mapping[str, str], *, binary: str = "quiesce", accept_setuid: bool = False
) -> list[FreezeResult]:
    """adapters.inspect_ai.quiesced()'s freeze, from inside a scorer: every sandbox of the
    running sample (every service of its compose project), each through the quiesce that is
    its init, its marker checked against `public_key` (one PEM for all, or one per sandbox
    name), the key the orchestrator kept, never one read back from the sandbox. The hook's
    own freeze (_freeze_all); QuiesceRefused, naming the sandbox, when any does not hold."""
    from inspect_ai.util._sandbox.context import sandbox_environments_context_var

    envs = sandbox_environments_context_var.get(None) or {}
    if not envs:
        raise QuiesceRefused("the sample has no sandbox to freeze")
    guards = []
    for name, env in envs.items():
        key = public_key if isinstance(public_key, str) else public_key.get(name)
        if key is None:
            raise QuiesceRefused(
                f"sandbox {name!r}: no public key given for it: pass public_key= one PEM for "
                f"every sandbox, or a mapping with one for {name!r} (the key its quiesce signs "
                "with, kept outside the sandbox)"
            )
        try:
            load_public_key(key)
        except QuiesceError as e:
            raise QuiesceRefused(f"sandbox {name!r}: the public key given: {e}") from None
        c = _container_of(name, env, binary)
        guard = _Guard(name, c, quiesce=_Quiesce(c, key, "init", accept_setuid))
        guards.append(guard)
    return await _freeze_all(guards)


async def _freeze_sandbox(g: _Guard) -> FreezeResult:
    """Freeze one sandbox and check its marker; QuiesceRefused unless both hold."""
    from inspect_ai.log._transcript import transcript

    if g.failure is not None:
        raise QuiesceRefused(g.failure)
    q = g.quiesce
    if q is None:
        raise QuiesceRefused(
            f"sandbox {g.name!r}: no exec named a non-root user and its compose service "
            f"has none, so quiesce does not know whom to freeze: set {USER_SETTING}"
        )
    # From here on no exec as a sandbox user is let through (see _wrap_exec).
    g.frozen = True
    try:
        r, claims = await asyncio.to_thread(_freeze_checked, g, q)
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
            "key_id": key_id(load_public_key(q.public_key)),
            "sandbox_users": g.users,
            "quiesce": q.how,
            "setuid": claims.get("setuid"),
        },
        source="quiesce",
    )
    return r


# --- The init path: a service whose container runs as the sandbox user ---------------------
#
# A compose `user:` (or an image USER) that is not root makes the container's PID 1 the
# sandbox user's process, which a sidecar cannot end. So, with the switch on, the compose file
# the sample's project is brought up from is replaced by a rewritten copy in which such a
# service runs as root with quiesce as its init, quiesce runs the service's own command as
# that user (--run-as), and the hook runs each exec that names no user= as that user: what
# the agent and the task's execs ran as before. Nothing of the task's files or image changes.
#
# Inspect 0.3.285 facts this relies on (inspect_ai/util/_sandbox/docker/):
# - DockerSandboxEnvironment.sample_init(task_name, config, metadata) brings up each sample's
#   project (each attempt's) with `docker compose -p NAME -f CONFIG up`, and every later
#   command of that project (exec, cp, ps, down at the sample's or the task's cleanup) uses
#   the ComposeProject it made, whose `config` is the path it was given: a path given there is
#   the file of the whole life of the project. No hook sees the config before it is used, so
#   the hook wraps that classmethod (once, when a task starts with the switch on).
# - A str config that exists is read only to find SAMPLE_METADATA_ references
#   (resolve_config_environment); `docker compose config` prints the file interpolated, with
#   every relative path made absolute, so the rewrite works from that print, not the text.
# - Its default compose files name `command: "tail -f /dev/null"` and `init: true`; a compose
#   `entrypoint:` clears the image's CMD (Compose), so a rewritten service's entrypoint is the
#   whole command line and it has no `command:`, and no `init:` (quiesce is the init).


class ComposeRewriteFailed(RuntimeError):
    """The compose file could not be rewritten to make quiesce the init: no sample runs."""

    def __init__(self, message: str) -> None:
        super().__init__(f"quiesce: {message}")


# Rewritten compose file -> {service: the user it ran as}; read at the attempt's start.
_REWRITTEN: dict[str, dict[str, str]] = {}
_rewrite_dir: Path | None = None


def _own_dir() -> Path:
    """A directory of this process's own (0700) for the rewritten files, removed at its exit
    (after Inspect's own cleanup, which still reads them for `compose down`)."""
    global _rewrite_dir
    if _rewrite_dir is None:
        _rewrite_dir = Path(tempfile.mkdtemp(prefix="quiesce-inspect-"))
        atexit.register(shutil.rmtree, _rewrite_dir, True)
    return _rewrite_dir


def _argv(value: Any, what: str) -> list[str]:
    """A compose or image command line as a list (a string is split as Compose splits it)."""
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ComposeRewriteFailed(f"{what} is {value!r}: neither a string nor a list of strings")


async def _image_config(service: str, image: str) -> dict[str, Any]:
    """The image's Config and Architecture (`docker image inspect`), as the engine has it."""
    import json

    from inspect_ai.util._subprocess import subprocess

    r = await subprocess(["docker", "image", "inspect", image], timeout=DOCKER_TIMEOUT_S)
    if not r.success:
        raise ComposeRewriteFailed(
            f"service {service!r}: `docker image inspect {image}` failed ({r.stderr.strip()}): "
            "the image must be present (pulled or built) before its samples start"
        )
    [info] = json.loads(r.stdout)
    config = dict(info.get("Config") or {})
    config["Architecture"] = info.get("Architecture")
    return config


def _init_service(svc: dict[str, Any], user: str, argv: list[str], binary: Path) -> None:
    """Rewrite one service (in place) so that quiesce is its init, guarding `user`."""
    bare = user.split(":")[0]
    others = [u for u in _users_setting() if u != bare]
    guard_args = sandbox_user_args([bare, *others])
    state = os.environ.get(STATE_SETTING)
    state_args = ["--state-dir", state] if state else []
    svc["user"] = "0"
    svc["entrypoint"] = [INIT_PATH, *guard_args, *state_args, "--run-as", bare, "--", *argv]
    svc.pop("command", None)
    svc.pop("init", None)
    mount = {"type": "bind", "source": str(binary), "target": INIT_PATH, "read_only": True}
    svc["volumes"] = [*(svc.get("volumes") or []), mount]
    opts = [str(o) for o in svc.get("security_opt") or []]
    if os.environ.get(SETUID_SETTING) != "1" and not any(
        o.replace("=", ":").startswith("no-new-privileges") for o in opts
    ):
        # Without it a setuid binary in the image makes a sandbox process root, which no
        # freeze can tell apart from root: the marker would be refused.
        opts.append("no-new-privileges")
    svc["security_opt"] = opts
    if svc.get("read_only"):
        # The init writes its state (key, markers) before anything runs: on a read-only root
        # file system it gets a tmpfs of root's own there, which the sandbox user cannot write.
        tmpfs = svc.get("tmpfs") or []
        tmpfs = [tmpfs] if isinstance(tmpfs, str) else list(tmpfs)
        svc["tmpfs"] = [*tmpfs, f"{state or DEFAULT_STATE_DIR}:mode=0755,uid=0,gid=0"]


async def _rewrite_service(name: str, svc: dict[str, Any]) -> str | None:
    """Rewrite `svc` in place when it runs as a non-root user; return that user, else None."""
    from .binary import binary_path

    image = svc.get("image")
    img = await _image_config(name, str(image)) if image else None
    user = str(svc.get("user") or (img or {}).get("User") or "")
    if _is_root(user):
        return None
    if "entrypoint" in svc:
        argv = _argv(svc["entrypoint"], f"service {name!r}: its entrypoint")
        argv += _argv(svc.get("command"), f"service {name!r}: its command")
    elif img is not None:
        argv = _argv(img.get("Entrypoint"), f"image {image}: its Entrypoint")
        if svc.get("command") is not None:
            argv += _argv(svc["command"], f"service {name!r}: its command")
        else:
            argv += _argv(img.get("Cmd"), f"image {image}: its Cmd")
    else:
        argv = []
    if not argv:
        raise ComposeRewriteFailed(
            f"service {name!r} runs as {user!r}, and its command is not known (no entrypoint "
            "or command in the compose file, and no image to read them from): give the "
            "service an `image:` name or a `command:`"
        )
    arch = os.environ.get(ARCH_SETTING) or (img or {}).get("Architecture") or None
    try:
        binary = binary_path(arch)
    except (ValueError, FileNotFoundError) as e:
        raise ComposeRewriteFailed(f"service {name!r}: {e}") from None
    _init_service(svc, user, argv, binary)
    return user


async def _rewritten_config(task_name: str, config: Any, metadata: dict[str, str]) -> Any:
    """The config to bring the sample's project up from: `config` itself when no service of it
    runs as a non-root user, else the path of a rewritten copy (see above)."""
    import yaml  # type: ignore[import-untyped]
    from inspect_ai.util._sandbox.docker.compose import compose_command
    from inspect_ai.util._sandbox.docker.docker import resolve_config_environment
    from inspect_ai.util._sandbox.docker.util import ComposeProject, task_project_name

    resolved = resolve_config_environment(config, metadata)
    env = resolved.env if resolved is not None else {}
    project = await ComposeProject.create(name=task_project_name(task_name), config=config, env=env)
    try:
        r = await compose_command(["config"], project=project, timeout=DOCKER_TIMEOUT_S)
    finally:
        # A Dockerfile or ComposeConfig becomes an auto compose file named by the project
        # (Inspect 0.3.285 config.py auto_compose_file): this throwaway project's is removed.
        made = Path(str(project.config))
        if str(config) != str(project.config) and made.name == f"{project.name}.yaml":
            made.unlink(missing_ok=True)
    if not r.success:
        raise ComposeRewriteFailed(f"`docker compose config` of {project.config}: {r.stderr}")
    doc = yaml.safe_load(r.stdout)
    users: dict[str, str] = {}
    for name, svc in (doc.get("services") or {}).items():
        user = await _rewrite_service(str(name), svc)
        if user is not None:
            users[str(name)] = user
    if not users:
        return config
    _drop_derived_names(doc, project.name)
    path = _own_dir() / f"{project.name}.yaml"
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    _REWRITTEN[str(path)] = users
    return str(path)


def _drop_derived_names(doc: dict[str, Any], project: str) -> None:
    """`docker compose config` names the project, and each network and volume by it
    (PROJECT_KEY): names of the throwaway project printed, not of the sample's. They are
    dropped, so that Compose derives them from the sample's project as it did before."""
    doc.pop("name", None)
    for kind in ("networks", "volumes"):
        for key, spec in (doc.get(kind) or {}).items():
            if isinstance(spec, dict) and spec.get("name") == f"{project}_{key}":
                del spec["name"]


def _install_init_path() -> None:
    """Wrap DockerSandboxEnvironment.sample_init (once) so that it brings each sample's project
    up from the rewritten config while the switch is on."""
    from inspect_ai.util._sandbox.docker.docker import DockerSandboxEnvironment as Docker

    if getattr(Docker.sample_init, "_quiesce_init_path", False):
        return
    original = Docker.sample_init.__func__

    async def sample_init(cls: Any, task_name: str, config: Any, metadata: dict[str, str]) -> Any:
        if switched_on():
            config = await _rewritten_config(task_name, config, metadata)
        return await original(cls, task_name, config, metadata)

    sample_init._quiesce_init_path = True  # type: ignore[attr-defined]
    Docker.sample_init = classmethod(sample_init)


def _init_user(env: Any) -> str | None:
    """The user a rewritten service ran as, when this sandbox is one; else None."""
    from inspect_ai.util._sandbox.docker.docker import DockerSandboxEnvironment

    try:
        docker_env = env.as_type(DockerSandboxEnvironment)
    except (TypeError, AttributeError):
        return None
    config = getattr(getattr(docker_env, "_project", None), "config", None)
    return _REWRITTEN.get(str(config), {}).get(str(getattr(docker_env, "_service", "")))


async def _guard_init(guard: _Guard, user: str) -> None:
    """The init path: check that PID 1 is the kit's quiesce and keep its key, before the agent
    runs; QuiesceRefused (and remembered) otherwise."""
    state = os.environ.get(STATE_SETTING) or DEFAULT_STATE_DIR
    c = dataclasses.replace(guard.container, binary=INIT_PATH, state_dir=state)
    try:
        await asyncio.to_thread(c.check_way_in)
        key = await asyncio.to_thread(_init_key, c)
        await asyncio.to_thread(_check_state_dir, c)
    except Exception as e:
        guard.failure = (
            f"sandbox {guard.name!r}: quiesce, made its init, cannot be reached, so the agent "
            f"did not run: {_named(e)}"
        )
        raise QuiesceRefused(guard.failure) from None
    bare = user.split(":")[0]
    guard.quiesce = _Quiesce(c, key, "init")
    guard.users = [bare, *[u for u in _users_setting() if u != bare]]


def _init_key(c: Container) -> str:
    """The public key of the quiesce that is PID 1 (its comm says so: no sandbox process can
    rename PID 1), read as root from its state dir, which root alone writes."""
    from .errors import Unreachable

    r = c.exec(["cat", "/proc/1/comm"], user=c.root_user, timeout=30)
    if not r.started or r.returncode != 0:
        raise Unreachable(f"{c.name}: cannot read /proc/1/comm ({r.text})")
    comm = r.stdout.decode("utf-8", "replace").strip()
    if comm != INIT_PATH.rsplit("/", 1)[-1]:
        raise Unreachable(
            f"{c.name}: PID 1 is {comm!r}, not quiesce: something replaced the rewritten "
            "entrypoint (a compose override?)"
        )
    path = f"{c.state_dir}/signing.pub"
    deadline = time.monotonic() + INIT_KEY_TIMEOUT_S
    while True:
        r = c.exec(["cat", path], user=c.root_user, timeout=30)
        if not r.started:
            raise Unreachable(f"{c.name}: no exec can start ({r.text})")
        if r.returncode == 0:
            pem = r.stdout.decode("ascii", "replace")
            load_public_key(pem)
            return pem
        if time.monotonic() > deadline:
            raise Unreachable(
                f"{c.name}: quiesce is PID 1, but its key {path} cannot be read after "
                f"{INIT_KEY_TIMEOUT_S:.0f} s ({r.text}): is {STATE_SETTING} a writable mount?"
            )
        time.sleep(0.1)


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
        _INSTANCES.append(self)

    def enabled(self) -> bool:
        return switched_on()

    async def on_task_start(self, data: TaskStart) -> None:
        # Inspect 0.3.285 emits it before any sample of the task starts (so before any
        # sample_init); a wrapper installed here is in place for all of them.
        _install_init_path()

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
            await _freeze_all(sample.guards)
        except Exception as e:
            sample.failure = _refusal(e)
            raise QuiesceRefused(sample.failure) from None

    async def on_sample_end(self, data: SampleEnd) -> None:
        self._samples.pop(data.sample_id, None)
