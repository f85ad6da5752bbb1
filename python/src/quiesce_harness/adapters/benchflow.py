"""BenchFlow: rollout planes that start quiesce before the agent and freeze through it.

    from benchflow.rollout import RolloutConfig
    from quiesce_harness.adapters.benchflow import QuiescePlanes

    config = RolloutConfig(..., sandbox_user="agent", planes=QuiescePlanes())

The task's image is left as it is. When BenchFlow has made the sandbox user (its
`setup_sandbox_user` plane, before the agent's first command), the planes put quiesce in:
where PID 1 is already quiesce (the image's ENTRYPOINT) they use it; otherwise they start it as a
sidecar (start_sidecar, with the kit's packaged binary) for that user. Either way they keep,
outside the sandbox, the public key its markers must be signed with and the user's UID.

Where BenchFlow kills the sandbox user's processes (`quiesce_agent`, `harden_before_verify`)
they freeze first and check the marker against the key kept at the start (signature, nonce,
container, the user's UID among the frozen ones, no-new-privileges); the rest of BenchFlow's
hardening then runs as before, and BenchFlow's verifier runs only behind `quiesce verify`'s gate
(that marker, and a live probe: no sandbox process alive as the scoring starts). Anything
else raises a QuiesceError, which BenchFlow 0.7.11 records as the verifier's error (`verifier
crashed: ...`) and keeps no reward: a freeze that is not quiescent, a marker that fails a
check, a sandbox process alive at the gate, a sandbox quiesce could not get into (no root exec,
no upload, an architecture with no build, a read-only file system), or a sandbox no quiesce
was started in before the agent because the agent ran as root (RolloutConfig.sandbox_user
unset; or BenchFlow's setup_sandbox_user called with guard_daemon=False, its sign of an agent
it runs as root: 0.7.11's oracle, whose solve.sh runs as root even with sandbox_user set).
A sandbox process found alive by the gate's second probe, when BenchFlow's verifier has
finished, drops the reward in the same way.
When quiesce cannot get in, the `setup_sandbox_user` plane itself raises: the rollout ends
before the agent runs.

What BenchFlow 0.7.11 offers and these planes rely on (benchflow/rollout/__init__.py,
rollout_planes.py, rollout/_setup.py, sandbox/lockdown.py, sandbox/docker.py):
- `RolloutConfig.planes` replaces DefaultRolloutPlanes; `sandbox_user` defaults to "agent"
  ("none"/"null" make it None: the agent runs as root).
- `Rollout.install_agent` calls `planes.setup_sandbox_user(env, user, ...)` (useradd, owner of
  the workspace): the first plane given the user once the sandbox is up, awaited after the
  agent's install (as root) and before the credentials, skills, path lockdown and the agent's
  start (ACP connect). BenchFlow ignores that useradd's result: a user it could not make is
  refused here (`id -u` finds none).
- The oracle agent goes through that plane with guard_daemon=False, and then `Rollout.run()`
  calls `_run_oracle(..., sandbox_user=None)`: solve.sh runs as root although sandbox_user is
  "agent". A root agent's processes are the verifier's kind, so these planes start nothing
  there and refuse at the verify step: a whole-rollout run with the oracle keeps no reward.
- `_verify_rollout` awaits `planes.harden_before_verify(env, task, sandbox_user, workspace=)`
  inside the try that turns any exception into `verifier_error` with rewards None; then, in
  the same try, `planes.verifier(task=, rollout_paths=, sandbox=env).verify()`.
- `capture_terminal_workspace` (a rubric review, or a separate verifier) awaits
  `planes.quiesce_agent(env, user)` before it copies the workspace out, and records an error
  there as the rollout's export error ("prevents final rubric scoring").
- A separate verifier sandbox is hardened with `sandbox_user=None` and no agent process: here
  it is refused, as a rollout without a sandbox user is (not supported yet).
- DockerSandbox is a Compose project named by `session_id`; its `exec` takes one shell string,
  mixes stderr into stdout and takes no stdin, so quiesce is reached through the Docker API on
  the project's `main` service instead (exec as root, archive upload), as Container.compose does.
- The `benchflow.agents` entry-point group registers agents (install and launch commands) when
  BenchFlow's agent registry is imported; it has no rollout hook. The only way for it to change
  a rollout without user code would be to patch BenchFlow at import time, for every run on the
  machine and with no switch: not done. The switch is `planes=QuiescePlanes()`.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchflow.rollout_planes import DefaultRolloutPlanes

from ..container import DEFAULT_STATE_DIR, Container
from ..errors import MarkerInvalid, QuiesceError, SidecarRefused, Unreachable
from ..freeze import freeze
from ..marker import load_public_key, verify_marker
from ..result import FreezeResult
from ..sidecar import DEFAULT_INSTALL_PATH, start_sidecar
from ..verifier import GATE_EXIT_CODES, run_verifier

_ROOT_AGENT = (
    "the agent runs as root: BenchFlow called setup_sandbox_user with guard_daemon=False, "
    "which it does for an agent it runs as root whatever sandbox_user says (0.7.11: the "
    "oracle's solve.sh), so no quiesce was started"
)
# quiesce verify's --max-age when none is given (docs/marker.md).
_DEFAULT_MAX_AGE_S = 600
_NO_USER_FIX = (
    "set RolloutConfig.sandbox_user to the non-root user the agent runs as (no freeze can "
    "tell a root agent's processes from the verifier's)"
)


def docker_sandbox_container(
    env: Any, *, binary: str = "quiesce", state_dir: str = DEFAULT_STATE_DIR
) -> Container:
    """The `main` service of a BenchFlow DockerSandbox, found by its Compose project's labels."""
    from benchflow.sandbox.docker import DockerSandbox, _sanitize_docker_compose_project_name

    if not isinstance(env, DockerSandbox):
        raise Unreachable(
            f"{type(env).__name__}: the kit reaches BenchFlow's DockerSandbox only; "
            "pass container_for= to QuiescePlanes for other sandboxes"
        )
    project = _sanitize_docker_compose_project_name(env.session_id)
    return Container.compose("main", project=project, binary=binary, state_dir=state_dir)


@dataclass(frozen=True)
class Guard:
    """quiesce in one sandbox, as found or started before the agent ran.

    `container` is pointed at it (PID 1, or the sidecar); `public_key` is the PEM key its
    markers must be signed with, read when it was found or printed when it started; `uid` is
    the sandbox user's; `sidecar` says which of the two it is.
    """

    container: Container
    public_key: str
    sandbox_user: str
    uid: int
    sidecar: bool


class QuiescePlanes(DefaultRolloutPlanes):  # type: ignore[misc]
    """BenchFlow's default planes, with quiesce started before the agent and a freeze where
    BenchFlow kills the sandbox user's processes.

    `binary` is quiesce's path in an image that runs it as PID 1 (PID 1 is taken for quiesce
    when /proc/1/comm names it, and then its state dir's signing.pub is the key kept, read as
    root before the agent runs); `local_binary` the binary
    put into a sandbox whose PID 1 is another process (default: the kit's packaged build for
    the sandbox's architecture, or `arch` where it has no uname); `install_path` and
    `state_dir` where it goes there (a read-only root file system needs a writable, exec-able
    mount owned by root for both). `timeout` bounds each freeze, `start_timeout` the start.
    `accept_privilege_escalation` accepts markers of a container run without
    no-new-privileges. `container_for(env)` reaches a sandbox other than DockerSandbox.
    `results` and `guards` list every freeze's result and every sandbox's Guard, in order.
    """

    def __init__(
        self,
        *,
        binary: str = "quiesce",
        local_binary: str | Path | None = None,
        arch: str | None = None,
        install_path: str = DEFAULT_INSTALL_PATH,
        state_dir: str = DEFAULT_STATE_DIR,
        timeout: float = 30.0,
        start_timeout: float = 60.0,
        accept_privilege_escalation: bool = False,
        container_for: Callable[[Any], Container] | None = None,
        on_result: Callable[[FreezeResult], None] | None = None,
    ) -> None:
        super().__init__()
        self.binary = binary
        self.local_binary = local_binary
        self.arch = arch
        self.install_path = install_path
        self.state_dir = state_dir
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.accept_privilege_escalation = accept_privilege_escalation
        self.container_for = container_for or (
            lambda env: docker_sandbox_container(env, binary=binary, state_dir=state_dir)
        )
        self.on_result = on_result
        self.results: list[FreezeResult] = []
        self.guards: list[Guard] = []
        # One planes object may serve many rollouts at once: a guard per sandbox object.
        self._guards: weakref.WeakKeyDictionary[Any, Guard] = weakref.WeakKeyDictionary()
        self._failures: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._frozen: weakref.WeakKeyDictionary[Any, tuple[Guard, FreezeResult]] = (
            weakref.WeakKeyDictionary()
        )

    # --- before the agent ------------------------------------------------------------------

    async def setup_sandbox_user(
        self,
        env: Any,
        sandbox_user: str,
        *,
        workspace: str,
        timeout_sec: int = 120,
        guard_daemon: bool = True,
    ) -> str:
        cwd: str = await super().setup_sandbox_user(
            env,
            sandbox_user,
            workspace=workspace,
            timeout_sec=timeout_sec,
            guard_daemon=guard_daemon,
        )
        if not guard_daemon:
            # BenchFlow's word that nothing will run as the sandbox user: 0.7.11 passes it for
            # the oracle, whose solve.sh then runs as root (_run_oracle(..., sandbox_user=None)).
            self._failures[env] = f"{_ROOT_AGENT}: {_NO_USER_FIX}"
            return cwd
        await self.start(env, sandbox_user)
        return cwd

    async def start(self, env: Any, sandbox_user: str) -> Guard:
        """quiesce for `sandbox_user` in this sandbox: PID 1 when it is quiesce, else a
        sidecar started now. Raises (and remembers, so that the verify step raises too) a
        QuiesceError naming the fix when it cannot get in: the rollout stops before the agent."""
        try:
            g = await asyncio.to_thread(self._start, env, sandbox_user)
        except QuiesceError as e:
            self._failures[env] = f"quiesce could not get into the sandbox: {e}"
            raise
        self._guards[env] = g
        self.guards.append(g)
        return g

    def _start(self, env: Any, sandbox_user: str) -> Guard:
        c = self.container_for(env)
        uid = _uid(c, sandbox_user)
        if _pid1_is_quiesce(c, self.binary):
            # Looked up now, before the agent runs, through the fixed PATH (never the image's,
            # which may start with a directory the agent owns), and kept absolute.
            c = replace(c, binary=c.binary_path())
            return Guard(c, _init_key(c), sandbox_user, uid, sidecar=False)
        try:
            sc = start_sidecar(
                c,
                sandbox_user,
                state_dir=self.state_dir,
                binary=self.local_binary,
                arch=self.arch,
                install_path=self.install_path,
                timeout=self.start_timeout,
            )
        except SidecarRefused as e:
            if "already PID 1" not in e.line:
                raise
            raise SidecarRefused(
                f"{e.line} (through QuiescePlanes: pass binary= as PID 1's path in the image)",
                e.returncode,
            ) from None
        if uid not in sc.sandbox_uids:
            raise SidecarRefused(
                f"the sidecar guards UIDs {list(sc.sandbox_uids)}, not {sandbox_user} "
                f"({uid}): stop it (kill -TERM {sc.pid} in the sandbox)",
                2,
            )
        return Guard(sc.container, sc.public_key, sandbox_user, uid, sidecar=True)

    # --- where BenchFlow kills -------------------------------------------------------------

    def guard(self, env: Any, sandbox_user: str | None) -> Guard:
        """The guard started in this sandbox before the agent, for this user; or the refusal."""
        failed = self._failures.get(env)
        if failed is not None:
            raise Unreachable(failed)
        if not sandbox_user:
            raise Unreachable(f"no sandbox user: {_NO_USER_FIX}")
        g = self._guards.get(env)
        if g is None:
            raise Unreachable(
                f"no quiesce was started in this sandbox before the agent for {sandbox_user!r}: "
                "give QuiescePlanes to the rollout as RolloutConfig(planes=...), whose "
                "setup_sandbox_user starts it"
            )
        if g.sandbox_user != sandbox_user:
            raise Unreachable(
                f"quiesce guards {g.sandbox_user!r} here, but BenchFlow's sandbox user is "
                f"{sandbox_user!r}: give the rollout one sandbox_user"
            )
        return g

    async def freeze(self, env: Any, sandbox_user: str | None) -> FreezeResult:
        """Freeze the sandbox through its guard; return the result only when its marker passes
        every check against the key kept at the start. Raises a QuiesceError otherwise."""
        g = self.guard(env, sandbox_user)
        self._frozen.pop(env, None)
        r = await asyncio.to_thread(self._freeze_checked, g)
        self._frozen[env] = (g, r)
        self.results.append(r)
        if self.on_result is not None:
            self.on_result(r)
        return r

    def _freeze_checked(self, g: Guard) -> FreezeResult:
        r = freeze(g.container, None, self.timeout)
        if r.marker is None:
            raise MarkerInvalid("format", "the freeze returned no marker of its own")
        try:
            claims = verify_marker(
                r.marker,
                g.public_key,
                nonce=r.nonce,
                container=g.container,
                accept_privilege_escalation=self.accept_privilege_escalation,
            )
        except MarkerInvalid as e:
            if e.check != "setuid":
                raise
            # BenchFlow's own compose files set no security_opt: the task's must.
            raise MarkerInvalid(
                e.check,
                f"{e.reason} (in a BenchFlow task: `security_opt: [no-new-privileges]` under "
                "services.main in environment/docker-compose.yaml, or "
                "QuiescePlanes(accept_privilege_escalation=True))",
            ) from None
        uids = claims.get("sandbox_uids")
        if not isinstance(uids, list) or g.uid not in uids:
            raise MarkerInvalid(
                "claims",
                f"the freeze covered UIDs {uids}, not {g.sandbox_user} ({g.uid}): start quiesce "
                f"for the rollout's sandbox_user (--sandbox-user {g.sandbox_user})",
            )
        return r

    def probe(self, env: Any, *, max_age_s: int | None = None, when: str = "") -> None:
        """`quiesce verify --nonce N -- QUIESCE --version` in the sandbox (QUIESCE: the absolute
        path of the quiesce that froze it; nothing of the image's PATH runs): the last freeze's
        marker passes quiesce's own checks and no sandbox process is alive now. Raises
        MarkerInvalid naming what failed, Unreachable when the sandbox was not frozen or cannot
        be reached. `max_age_s` is the marker's age allowed (quiesce verify's --max-age, 600 s
        unless given); `when` is said in the error."""
        frozen = self._frozen.get(env)
        if frozen is None:
            raise Unreachable("the verifier of a sandbox these planes did not freeze: no score")
        g, r = frozen
        cp = run_verifier(
            g.container,
            [g.container.binary_path(), "--version"],
            nonce=r.nonce,
            max_age_s=max_age_s,
            timeout=60.0,
            accept_privilege_escalation=self.accept_privilege_escalation,
        )
        if cp.returncode != 0:
            said = (cp.stderr or cp.stdout).decode("utf-8", "replace").strip()[:300]
            what = GATE_EXIT_CODES.get(cp.returncode, "the gate itself failed")
            raise MarkerInvalid(
                "gate", f"quiesce verify{when} exited {cp.returncode} ({what}): {said}"
            )

    def verifier(self, *args: Any, **kwargs: Any) -> Any:
        # BenchFlow 0.7.11 calls it as (task=, rollout_paths=, sandbox=env) and awaits
        # verify() (twice at most) right after harden_before_verify.
        env = kwargs["sandbox"] if "sandbox" in kwargs else args[2]
        return _GatedVerifier(super().verifier(*args, **kwargs), self, env)

    async def quiesce_agent(self, env: Any, sandbox_user: str) -> None:
        await self.freeze(env, sandbox_user)
        await super().quiesce_agent(env, sandbox_user)

    async def harden_before_verify(self, *args: Any, **kwargs: Any) -> None:
        # BenchFlow 0.7.11 calls it as (env, task, sandbox_user, workspace=...).
        env = args[0] if args else kwargs["env"]
        user = args[2] if len(args) > 2 else kwargs.get("sandbox_user")
        await self.freeze(env, user)
        await super().harden_before_verify(*args, **kwargs)


class _GatedVerifier:
    """BenchFlow's Verifier, whose every verify() passes QuiescePlanes.probe before and after
    it: a sandbox process started after the freeze (a root process of the image acting for the
    agent) is found alive before the scoring starts, or, started once the gate had passed
    (BenchFlow uploads the tests and runs test.sh in execs of their own), alive when it ends;
    either way verify() raises and the reward is dropped. One started and gone within the
    scoring is not seen: the probes are two observations, not a watch."""

    def __init__(self, inner: Any, planes: QuiescePlanes, env: Any) -> None:
        self._inner = inner
        self._planes = planes
        self._env = env

    async def verify(self) -> Any:
        await asyncio.to_thread(self._planes.probe, self._env, when=" before the scoring")
        t0 = time.monotonic()
        result = await self._inner.verify()
        # The first probe checked the marker's age; this one allows the scoring's time on top,
        # so that a long test.sh does not drop an honest reward as "too old".
        age = _DEFAULT_MAX_AGE_S + math.ceil(time.monotonic() - t0)
        await asyncio.to_thread(
            self._planes.probe, self._env, max_age_s=age, when=" after the scoring"
        )
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _uid(c: Container, user: str) -> int:
    """The sandbox user's UID, as root reads it in the sandbox (`id -u`)."""
    r = c.exec(["id", "-u", user], user=c.root_user, timeout=30)
    if not r.started:
        raise Unreachable(f"{c.name}: no exec can start ({r.text})")
    said = r.stdout.decode("ascii", "replace").strip()
    if r.returncode != 0 or not said.isdigit():
        raise SidecarRefused(
            f"{c.name}: no user {user!r} in the sandbox ({r.text or f'exit {r.returncode}'}): "
            "BenchFlow's setup_sandbox_user could not make it (the image needs useradd)",
            2,
        )
    if said == "0":
        raise SidecarRefused(f"{c.name}: {user!r} is root: {_NO_USER_FIX}", 2)
    return int(said)


def _pid1_is_quiesce(c: Container, binary: str) -> bool:
    """Whether PID 1 runs `binary` (the image's quiesce init), by its name in /proc/1/comm
    (its /proc/1/exe is not readable: the init is not dumpable).

    Only picks which quiesce to use: a PID 1 wrongly taken for quiesce answers no freeze, or
    none signed with the key read here, so the trial fails; it never runs unguarded. One not
    taken for it (an init under another name) makes the sidecar refuse, naming the fix."""
    r = c.exec(["cat", "/proc/1/comm"], user=c.root_user, timeout=30)
    if not r.started:
        raise Unreachable(f"{c.name}: no exec can start ({r.text})")
    if r.returncode != 0:
        return False
    # The kernel keeps 15 bytes of the name.
    name = binary.rsplit("/", 1)[-1][:15]
    return r.stdout.decode("utf-8", "replace").strip() == name


def _init_key(c: Container) -> str:
    """The public key of the quiesce that is PID 1, read before the agent runs."""
    path = f"{c.state_dir}/signing.pub"
    r = c.exec(["cat", path], user=c.root_user, timeout=30)
    if not r.started:
        raise Unreachable(f"{c.name}: no exec can start ({r.text})")
    if r.returncode != 0:
        raise Unreachable(
            f"{c.name}: PID 1 is quiesce, but its key {path} cannot be read ({r.text}): "
            "pass state_dir= as the init's --state-dir"
        )
    pem = r.stdout.decode("ascii", "replace")
    load_public_key(pem)
    return pem
