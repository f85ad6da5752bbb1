"""Harbor: quiesce switched on from the command line, for a task that does not know about it.

    harbor run -p TASK -a AGENT \\
        --env quiesce_harness.harbor:QuiescedEnvironment \\
        --verifier quiesce_harness.harbor:QuiescedVerifier

(`harbor trials start` takes the same two options; a config names the same classes as
`environment.import_path` and `verifier.import_path`.) The task's image, tests/ and solution/
stay as they are; its task.toml names the agent's user (`[agent] user`), or the run does
(`--environment-kwarg sandbox_user=NAME`). A task that names none (or names root), as
Terminal-Bench's are written, has a root agent: the init then defines the sandbox by lineage
alone (`--sandbox-lineage`), every agent command, and every root command of Harbor's after the
first, runs through `quiesce exec --user root` as the exec's argv (the image's bash only after
the tag), and the marker is checked accepting a root agent (docs/threat-model.md, "Root
agents"). That needs the init path (the sidecar cannot follow a root agent) and
`--environment-kwarg accept_root_agent=true`: what a root agent can still do beside the proof
is accepted by name, never by default (the tests run the image's tools, which a root agent may
have replaced; `environment_mode = "separate"` runs them where it never ran).

QuiescedEnvironment wraps the environment the run would have used (`--environment-kwarg
wraps=daytona`, default docker; every other kwarg goes to it):

- docker and podman: quiesce is the main container's init. The image is not rebuilt: a Compose
  override Harbor merges last mounts the kit's static binary read-only at /quiesce (a mount point
  in /, which nothing in the container can redirect; checked from the engine's record at start),
  puts it in front of the service's own ENTRYPOINT and CMD (read from the merged Compose file
  and the image), and sets no-new-privileges and a pids limit. The signing key is made here, on
  the host, and mounted read-only (root's, 0400): its public half never leaves this process, so
  a marker is checked against a key the sandbox never held.
- any other environment (and docker with `via=sidecar`): `quiesce sidecar`, put in and started
  through the environment's own upload_file and exec, as root, before the agent's first command;
  the public key it prints at its start is kept here.

Agent commands run as the sandbox user: Harbor 0.25.0's Trial sets the environment's
default_user to the agent user of the phase (a step's `[steps.agent] user`, else `[agent]
user`), and an exec that names no user runs as that default; when the task names no agent user
at all, such an exec runs as `sandbox_user` outside a verification (every step's agent too). A
task that names an agent user for some phases but not others is refused at start: the others
would run as root, whom no freeze kills. Commands that name their user (Harbor's and the agents'
`user="root"`) keep it.

QuiescedVerifier is Harbor's Verifier with the freeze first: before anything of the verifier's
enters the sandbox (the reward files' removal, the upload of tests/), the environment is frozen
and the marker checked against the kept key; then, as root, /logs/verifier is emptied of all the
agent left in it (a symlink there would take the tests' root redirect, a FIFO would hang it),
/tests is made anew (root's, so nothing planted there runs with the tests), and the test script
runs behind `quiesce verify`. A freeze covers that one verification: a later step's tests need
a freeze of their own. A freeze that is not quiescent, a marker that fails a check, a directory
that cannot be made root's, or a gate that refuses raises in verify(), which Harbor 0.25.0's
Trial records as the trial's exception_info, with no verifier_result (no reward).

A `[[steps]]` task: Harbor 0.25.0 records such a raise as that step's exception_info (the trial
has none), stops after that step, and derives the trial's reward from the steps' results. With
`multi_step_reward_strategy = "final"` that is the last step's verifier_result, which is none
then: no reward. "mean" (the default) averages only the steps that have a reward, so a refused
step would drop out of it: a `[[steps]]` task without "final" is refused at start, naming it.

Services the tests need (`--environment-kwarg hand_over_services=true`): a Terminal-Bench task's
tests often query a service the agent left running (an HTTP server on :8080), which the freeze
kills like every other sandbox process. With the kwarg, the gate is `quiesce verify --hand-over`:
once every check passed, it starts each service the signed marker records as having listened on
a TCP port again, from its recorded executable, argv, cwd and environment, as an unprivileged
user of its own (quiesce's default, 65530, or `service_user=`), waits until each port listens
again, runs the tests, then kills every process of that user. `services=` declares start
commands instead (or services the marker does not record); `ports=8080,5000` brings back only
the services on those ports. The service user must not be able
to write, or own, anything the tests trust: /tests, /logs/verifier and the agent's working
directory are passed as `--protect`, and a service user that could write there (or a service
that does not come back) fails the trial (HandOverRefused) with quiesce verify's reason, before
the tests run. The tests run as root then: /logs/verifier is left 0755 (not 0777) and /tests
0700, so that the service can neither write a reward nor read what the tests expect. Off by
default: with it off, a task that needs the agent's service scores 0.

`environment_mode = "separate"`: Harbor 0.25.0 collects the artifacts from the agent's
environment, stops it, and runs the verifier in a fresh environment that no sandbox process
ever ran in; nothing of the verifier's enters the agent's environment, so a survivor there can
only do what the agent itself could have done before it ended. The freeze adds no protection to
the score there; QuiescedVerifier still freezes and gates the verifier's environment when it is
a QuiescedEnvironment (proving it empty of sandbox processes), and needs nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.environments.base import BaseEnvironment
from harbor.verifier.verifier import Verifier

from .binary import binary_path
from .container import SAFE_ENV, SAFE_PATH, Container, safe_env, sandbox_user_args
from .errors import InstallFailed, MarkerInvalid, QuiesceError, Unreachable
from .extras import need
from .freeze import freeze
from .marker import verify_marker
from .result import FreezeResult
from .sidecar import DEFAULT_INSTALL_PATH, start_sidecar
from .verifier import ACCEPT_ENV, GATE_EXIT_CODES, HAND_OVER_EXIT, HandOver

# Where the init path mounts the binary in the main container: a read-only file bind mount whose
# one directory is `/`. Every exec of the orchestrator's runs this path as root, so nothing in
# the container may redirect it: the file is a mount point (rename, unlink: EBUSY), `/` cannot
# be renamed, and a mount over it needs CAP_SYS_ADMIN, which Docker's and Podman's default set
# lacks. Under /run a root agent (or one that may write /run) renames the directory and plants
# its own file there (docs/threat-model.md, "The way in"). Container.check_way_in() checks it.
INIT_BINARY = "/quiesce"
# The key directory: read by the init alone, at its start, so its parent may be any of the kit's.
INIT_KEY_DIR = "/run/quiesce-harbor-key"
# Where the gate finds the marker's public key with a root agent: copied in after the freeze.
GATE_KEY = "/run/quiesce-harbor-gate.pub"
ENV_FLAG = "--env quiesce_harness.harbor:QuiescedEnvironment"
VERIFIER_FLAG = "--verifier quiesce_harness.harbor:QuiescedVerifier"
# Harbor 0.25.0's EnvironmentPaths.tests_dir: where its Verifier uploads tests/.
TESTS_DIR = PurePosixPath("/tests")
# Its EnvironmentPaths.verifier_dir: where the tests' output and the reward go.
VERIFIER_DIR = PurePosixPath("/logs/verifier")
# What `quiesce verify --hand-over` writes before it exits 20, and the record it leaves in the
# state dir when the services came back.
HAND_OVER_FAILED = "quiesce verify: hand-over check failed:"
HAND_OVER_RECORD = "handover.json"
# Where it writes what the services it started printed (their stdout and stderr).
HAND_OVER_LOG = "services.log"
_WAYS = ("init", "sidecar")
_INIT_ENGINES = ("docker", "podman")
# The argv an exec runs instead of the image's `bash -c COMMAND` (the command string it replaces,
# and the argv): set by QuiescedEnvironment.exec around one exec, read where the init path
# builds `docker compose exec`, so that quiesce's argv, not the image's bash, is what the engine
# starts (_ComposeInit._run_docker_compose_command).
_INSTEAD: contextvars.ContextVar[tuple[str, list[str]] | None] = contextvars.ContextVar(
    "quiesce_harbor_instead", default=None
)


class QuiesceNotOn(QuiesceError):
    """Half the switch is on: the environment or the verifier is not quiesce's."""


class GateRefused(QuiesceError):
    """`quiesce verify` refused to run the tests; nothing was scored."""


class HandOverRefused(GateRefused):
    """`quiesce verify --hand-over` could not give the agent's services to the tests (one did
    not come back, or the service user could write a protected path): the tests did not run."""


@dataclass
class _Guard:
    """What the environment keeps outside the sandbox: how quiesce got in and its key."""

    way: str
    users: tuple[str, ...]
    public_key: str | None = None
    container: Container | None = None
    frozen: FreezeResult | None = None
    key_dir: Path | None = None
    gate: str | None = None  # the nonce the verifier's default-user execs are gated with
    freeze_timeout: float = 30.0
    arch: str | None = None
    pids_limit: int | None = 4096
    override: Path | None = None
    loop: asyncio.AbstractEventLoop | None = None
    default_to_sandbox: bool = False  # the task names no agent user: sandbox_user does
    started: bool = False
    gated: list[str] = field(default_factory=list)
    install_path: str = DEFAULT_INSTALL_PATH
    accept_setuid: bool = False
    accept_root: bool = False  # a root agent's trial may be scored (accept_root_agent=true)
    notes: list[str] = field(default_factory=list)
    # The PATH an exec of the image gets, read before the agent ran: the gated tests get it back.
    image_path: str | None = None
    # The image's LD_LIBRARY_PATH as read at start (empty when unset): the tests get it back.
    image_libs: str = ""
    # A command ran as a sandbox user: from then on the image's PATH may lead to its files.
    agent_ran: bool = False
    # hand_over_services=true: the services the agent left run again, as a user of their own,
    # while the tests run (`quiesce verify --hand-over`).
    hand_over: bool = False
    services: dict[int, str] = field(default_factory=dict)  # declared: port -> sh -c command
    ports: tuple[int, ...] = ()  # only the services on these ports come back (none: all)
    service_user: int | None = None
    service_wait: int | None = None
    # Where Harbor runs the agent's commands (the task's workdir, else the image's WORKDIR),
    # read at start when the services are handed over: protected from the service user.
    workdir: str | None = None

    def hand_over_args(self) -> list[str]:
        """`quiesce verify`'s hand-over options; none when the services are not handed over."""
        if not self.hand_over:
            return []
        protect = [str(TESTS_DIR), str(VERIFIER_DIR)]
        if self.workdir and self.workdir != "/" and self.workdir not in protect:
            protect.append(self.workdir)
        # The tests (made root's 0700 after Harbor's upload) hold the expected answers: a
        # service the tests query must not read them.
        return HandOver(
            protect=protect,
            hide=[str(TESTS_DIR)],
            services=self.services,
            ports=self.ports,
            service_user=self.service_user,
            service_wait=self.service_wait,
        ).args()

    @property
    def lineage(self) -> bool:
        """No agent user: the agent is root, and the sandbox is what its launches tagged."""
        return not self.users

    def init_args(self) -> list[str]:
        """What defines the sandbox, as the init and `quiesce verify` take it."""
        return ["--sandbox-lineage"] if self.lineage else sandbox_user_args(self.users)


def _task_config(environment_dir: Path) -> Any:
    """task.toml read as Harbor reads it; None when there is none beside the environment
    directory."""
    from harbor.models.task.config import TaskConfig

    # The agent's environment is TASK/environment; a separate verifier's is TASK/tests or a
    # step's tests directory below TASK: the nearest task.toml above it is the task's.
    for d in list(environment_dir.resolve().parents)[:4]:
        try:
            text = (d / "task.toml").read_text()
        except OSError:
            continue
        return TaskConfig.model_validate_toml(text)
    return None


def _agent_phases(cfg: Any) -> list[tuple[str, str | None]]:
    """Each agent phase and the user Harbor 0.25.0 runs it as: a step's `[steps.agent] user`,
    else `[agent] user`; None is the image's user."""
    if cfg is None:
        return []
    top = None if cfg.agent.user is None else str(cfg.agent.user)
    if not cfg.steps:
        return [("[agent]", top)]
    return [
        (f"step {s.name!r}", top if s.agent.user is None else str(s.agent.user)) for s in cfg.steps
    ]


def _task_users(environment_dir: Path) -> list[str]:
    """The agent users task.toml names ([agent] user, and each step's)."""
    cfg = _task_config(environment_dir)
    found: list[str] = []
    for _, user in _agent_phases(cfg):
        if user is not None and user not in found:
            found.append(user)
    return found


def _check_task(environment_dir: Path) -> None:
    """Refuse, before the agent runs, a task whose phases the freeze cannot all cover."""
    from harbor.models.task.config import MultiStepRewardStrategy

    cfg = _task_config(environment_dir)
    phases = _agent_phases(cfg)
    unnamed = [name for name, user in phases if user is None]
    if unnamed and len(unnamed) < len(phases):
        # Such a phase runs as the image's user (root), whom no freeze kills.
        raise InstallFailed(
            f"{', '.join(unnamed)} of {environment_dir.parent.name} names no agent user and "
            "would run as root: set `[agent] user` in task.toml (or each step's "
            "`[steps.agent] user`)"
        )
    if (
        cfg is not None
        and cfg.steps
        and (cfg.multi_step_reward_strategy is not MultiStepRewardStrategy.FINAL)
    ):
        # Harbor 0.25.0 records a step's verifier exception in that step alone, and "mean"
        # averages only the steps that have a reward: a refused freeze would drop out.
        raise InstallFailed(
            f"{environment_dir.parent.name} has [[steps]] scored by the mean of the steps "
            "that have a reward, so a refused freeze drops out of it: set "
            '`multi_step_reward_strategy = "final"` in task.toml'
        )


def _sandbox_users(environment_dir: Path, sandbox_user: object) -> tuple[str, ...]:
    """The agent's users; none: the agent is root (no user named anywhere, or root named)."""
    users = _task_users(environment_dir)
    if sandbox_user is not None:
        given = str(sandbox_user)
        if users and users != [given]:
            raise InstallFailed(
                f"sandbox_user={given!r} was given, but task.toml's [agent] user is "
                f"{users}: drop the kwarg or make them the same"
            )
        users = users or [given]
    root = [u for u in users if u in ("root", "0")]
    if root and len(root) < len(users):
        raise InstallFailed(
            f"the agent runs as {users}, root among them: one freeze covers either the agent's "
            "users or a root agent's launches, not both: run every phase as one of them"
        )
    return () if root else tuple(users)


def _parse_services(value: object) -> dict[int, str]:
    """`services=` as given: "PORT=COMMAND" entries separated by `;`, or (from the command
    line's JSON, for a command that holds a `;`) an object of port to command."""
    if value is None or value == "":
        return {}
    pairs: list[tuple[str, object]] = []
    if isinstance(value, dict):
        pairs = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, str):
        for entry in value.split(";"):
            if not entry.strip():
                continue
            left, sep, command = entry.partition("=")
            if not sep:
                raise InstallFailed(
                    f"services={value!r}: {entry.strip()!r} is not PORT=COMMAND (entries are "
                    'separated by ";"; a command that holds one goes in a JSON object: '
                    'services=\'{"8080": "cmd; cmd"}\')'
                )
            pairs.append((left, command))
    else:
        raise InstallFailed(
            f"services={value!r}: give PORT=COMMAND entries separated by ';', or a JSON object "
            "of port to command"
        )
    out: dict[int, str] = {}
    for given, start in pairs:
        text = given.strip()
        port = int(text) if text.isdigit() else 0
        if not 1 <= port <= 65535:
            raise InstallFailed(f"services=: {text!r} is not a TCP port (1-65535)")
        if not isinstance(start, str) or not start.strip():
            raise InstallFailed(f"services=: port {port} has no command to start it with")
        if port in out:
            raise InstallFailed(f"services=: port {port} is declared twice")
        out[port] = start.strip()
    return out


def _parse_ports(value: object) -> tuple[int, ...]:
    """`ports=` as given: a port, "PORT,PORT", or (from the command line's JSON) a list."""
    if value is None or value == "":
        return ()
    items: list[object]
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, list):
        items = list(value)
    else:
        items = [value]
    out: list[int] = []
    for v in items:
        port = v if isinstance(v, int) and not isinstance(v, bool) else None
        if isinstance(v, str) and v.isdigit():
            port = int(v)
        if port is None or not 1 <= port <= 65535:
            raise InstallFailed(
                f"ports={value!r}: {v!r} is not a TCP port (1-65535); give PORT,PORT or a JSON list"
            )
        if port not in out:
            out.append(port)
    return tuple(out)


def _hand_over_settings(
    hand_over: object,
    services: object,
    service_user: object,
    service_wait: object,
    ports: object = None,
) -> tuple[bool, dict[int, str], int | None, int | None, tuple[int, ...]]:
    """The hand-over kwargs checked: (on, declared services, service UID, wait seconds, the
    ports whose services come back)."""
    if not isinstance(hand_over, bool):
        raise InstallFailed(f"hand_over_services={hand_over!r}: pass true or false")
    declared = _parse_services(services)
    named = _parse_ports(ports)
    given = [
        name
        for name, v in (
            ("services", declared or None),
            ("ports", named or None),
            ("service_user", service_user),
            ("service_wait", service_wait),
        )
        if v is not None
    ]
    if given and not hand_over:
        raise InstallFailed(
            f"{', '.join(given)} given, but the agent's services are not handed over to the "
            "tests: add --environment-kwarg hand_over_services=true"
        )

    def whole(name: str, v: object, low: int) -> int | None:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise InstallFailed(f"{name}={v!r}: pass a whole number of at least {low}")
        return v

    uid = whole("service_user", service_user, 1)
    wait = whole("service_wait", service_wait, 1)
    return hand_over, declared, uid, wait, named


def _variant(wraps: str, via: str | None) -> type[QuiescedEnvironment]:
    """The class that wraps `wraps`: QuiescedEnvironment over Harbor's class for it."""
    from harbor.environments.factory import _load_environment_class
    from harbor.models.environment_type import EnvironmentType

    try:
        inner = _load_environment_class(EnvironmentType(wraps))
    except ValueError:
        raise InstallFailed(
            f"wraps={wraps!r} is not a Harbor environment type: pass one of "
            f"{', '.join(t.value for t in EnvironmentType)}"
        ) from None
    way = via or ("init" if wraps in _INIT_ENGINES else "sidecar")
    if way not in _WAYS:
        raise InstallFailed(f"via={via!r}: pass via=init or via=sidecar")
    if way == "init" and wraps not in _INIT_ENGINES:
        raise InstallFailed(
            f"via=init needs a Compose environment (docker, podman), not {wraps}: drop via= "
            "(the sidecar goes in through the environment's exec)"
        )
    bases: tuple[type, ...] = (
        (_ComposeInit, QuiescedEnvironment, inner)
        if way == "init"
        else (QuiescedEnvironment, inner)
    )
    return type(f"Quiesced{inner.__name__}", bases, {"_quiesce_way": way})


class QuiescedEnvironment(BaseEnvironment):  # type: ignore[misc]
    """Harbor's environment `wraps` (default docker), with quiesce in it before the agent.

    Kwargs of its own (`--environment-kwarg K=V`): wraps, via (init or sidecar), sandbox_user,
    arch (the sandbox's, to check or where it has no uname), pids_limit (init path; default
    4096, 0 for the engine's), freeze_timeout (seconds), install_path (sidecar path: where the
    binary goes; a writable, exec-able mount on a read-only root), accept_privilege_escalation
    (true: score a sandbox that ran without no-new-privileges, which the sidecar path cannot
    set; refused otherwise), accept_root_agent (true: score a task that names no agent user,
    whose agent is root; refused otherwise), hand_over_services (true: the services the agent
    left listening run again, as an unprivileged user, while the tests run; default false),
    services (with it: start commands by port, "PORT=COMMAND;PORT=COMMAND" or a JSON object),
    service_user (the UID and GID they run as; default quiesce's, 65530), service_wait (seconds
    they may take to listen; default 30), ports (only the services on these ports come back,
    "PORT,PORT" or a JSON list; default every one the marker records). Every other kwarg goes
    to `wraps`.
    """

    _quiesce_way = "sidecar"

    def __new__(cls, *args: Any, **kwargs: Any) -> QuiescedEnvironment:
        if cls is QuiescedEnvironment:
            cls = _variant(str(kwargs.get("wraps", "docker")), kwargs.get("via"))
        obj: QuiescedEnvironment = object.__new__(cls)
        return obj

    def __init__(
        self,
        *args: Any,
        wraps: str = "docker",
        via: str | None = None,
        sandbox_user: str | int | None = None,
        arch: str | None = None,
        pids_limit: int | None = 4096,
        freeze_timeout: float = 30.0,
        install_path: str = DEFAULT_INSTALL_PATH,
        accept_privilege_escalation: bool = False,
        accept_root_agent: bool = False,
        hand_over_services: bool = False,
        services: str | dict[str, str] | None = None,
        service_user: int | None = None,
        service_wait: int | None = None,
        ports: str | int | list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        del wraps, via  # chose the class in __new__
        env_dir = Path(kwargs.get("environment_dir", args[0] if args else "."))
        # Raised at start, so that Harbor records it as this trial's, not the job's.
        self._refusal: InstallFailed | None = None
        users: tuple[str, ...] = ()
        hand_over: tuple[bool, dict[int, str], int | None, int | None, tuple[int, ...]] = (
            False,
            {},
            None,
            None,
            (),
        )
        try:
            _check_task(env_dir)
            users = _sandbox_users(env_dir, sandbox_user)
            hand_over = _hand_over_settings(
                hand_over_services, services, service_user, service_wait, ports
            )
        except InstallFailed as e:
            self._refusal = e
        self._guard = _Guard(
            way=self._quiesce_way,
            users=users,
            freeze_timeout=float(freeze_timeout),
            arch=arch,
            pids_limit=int(pids_limit) if pids_limit else None,
            default_to_sandbox=not _task_users(env_dir),
            install_path=install_path,
            accept_setuid=accept_privilege_escalation is True,
            accept_root=accept_root_agent is True,
        )
        g = self._guard
        g.hand_over, g.services, g.service_user, g.service_wait, g.ports = hand_over
        super().__init__(*args, **kwargs)

    # --- Harbor's calls -----------------------------------------------------------------------

    async def start(self, force_build: bool) -> None:
        if self._refusal is not None:
            raise self._refusal
        if self._guard.lineage and self._guard.way == "sidecar":
            raise InstallFailed(
                f"{self.session_id}: the task names no agent user, so its agent is root, and only "
                "the init path follows a root agent (a sidecar cannot): set `[agent] user` in "
                "task.toml, or run with the docker or podman environment without via=sidecar"
            )
        if self._guard.lineage and not self._guard.accept_root:
            # As `verify --accept-root-agent`: what a root agent can still do beside the proof
            # (replace the image's tools, which the tests run as root after the freeze, in
            # the same container) is accepted by name, never by default.
            raise InstallFailed(
                f"{self.session_id}: the task names no agent user, so its agent is root, which can "
                "replace the image's tools that the tests then run as root in the same container "
                "(docs/threat-model.md, Root agents): set `[agent] user` in task.toml, or accept "
                "it with --environment-kwarg accept_root_agent=true (and run the tests where the "
                'agent never ran: environment_mode = "separate")'
            )
        self._guard.loop = asyncio.get_running_loop()
        await super().start(force_build)
        if self._guard.way == "sidecar":
            await self._start_sidecar()
        else:
            await self._check_init()
        # Before the agent's first command, so nothing of the agent's is on the way to bash.
        r = await super().exec('printf "%s\\n%s" "$PATH" "${LD_LIBRARY_PATH-}"', user="root")
        path, _, libs = (r.stdout or "").partition("\n")
        if int(r.return_code) == 0 and path.strip():
            self._guard.image_path = path.strip()
            self._guard.image_libs = libs.strip()
        else:
            self.logger.warning(
                f"{self.session_id}: could not read the image's PATH (exit {r.return_code}): "
                f"the tests behind the gate run with {SAFE_PATH}"
            )
        if self._guard.hand_over:
            await self._read_workdir()
        self._guard.started = True

    async def stop(self, delete: bool) -> None:
        try:
            await super().stop(delete)
        finally:
            if self._guard.key_dir is not None:
                shutil.rmtree(self._guard.key_dir, ignore_errors=True)
                self._guard.key_dir = None

    def _resolve_user(self, user: str | int | None) -> str | int | None:
        # Harbor 0.25.0: an exec that names no user runs as default_user, which the Trial sets
        # to the phase's agent user; with none named anywhere, as the sandbox user outside a
        # verification (from a freeze to the end of its verify(): a multi-step task's later
        # agents too); inside one, the verifier's commands keep the image's user. Harbor's own
        # steps before the agent (start, the environment's checks) keep the image's user.
        resolved: str | int | None = super()._resolve_user(user)
        g = self._guard
        if resolved is None and g.default_to_sandbox and g.users and g.started and g.frozen is None:
            return g.users[0]
        return resolved

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> Any:
        g = self._guard
        who = self._resolve_user(user)
        instead: list[str] | None = None
        if g.lineage and g.started and g.frozen is None and g.gate is None and self._as_root(user):
            # A root agent's command: a sandbox launch, tagged before it runs. Every root exec
            # between the start and the freeze, whoever it names: an agent may name its user
            # (Terminus-2 passes environment.default_user, "root" under `[agent] user =
            # "root"`), and a root command of Harbor's tagged too is only killed at the freeze.
            g.agent_ran = True
            instead = self._launched(command)
        elif g.lineage and g.agent_ran and (g.gate is None or user is not None):
            # Harbor's own root commands once a root agent ran: the image's bash and tools may
            # be the agent's now, so they run tagged too. What a replaced tool leaves behind is
            # the sandbox's: the freeze kills it before the marker, and the gate's live probe
            # refuses one started after the freeze.
            instead = self._launched(command)
            env = safe_env(env, keep_path=True)
        elif g.started and who is not None and str(who) not in ("root", "0"):
            g.agent_ran = True
        elif g.agent_ran:
            # Once the agent ran, the image's PATH may lead to its files (ENV
            # PATH=/app/.venv/bin:$PATH), and its BASH_ENV or LD_PRELOAD may name one: a root
            # command of Harbor's (its `bash -c` included) runs with the kit's SAFE_ENV, so
            # that no root process of the agent's making outlives the freeze. A PATH Harbor
            # names is the task's, and stays.
            env = safe_env(env, keep_path=True)
        if g.gate is None or user is not None:
            return await self._exec_argv(command, instead, cwd, env, timeout_sec, user)
        argv, env = self._gated(command, env)
        command = "exec " + shlex.join(argv)
        r = await self._exec_argv(command, argv, cwd, env, timeout_sec, user)
        try:
            _check_gate(int(r.return_code), (r.stdout or "") + (r.stderr or ""))
        except HandOverRefused as e:
            said = await self._services_output()
            if not said:
                raise
            raise HandOverRefused(f"{e} (the services printed: {said})") from None
        self._guard.gated.append(command)
        if g.hand_over:
            await self._note_hand_over()
        return r

    @staticmethod
    def _as_root(user: str | int | None) -> bool:
        """Whether an exec naming `user` runs as a lineage trial's root: none named (the
        phase's default user, which is root there), or root by name or UID (the default
        user named, as Terminus-2 does)."""
        return user is None or str(user) in ("root", "0")

    async def _exec_argv(
        self,
        command: str,
        instead: list[str] | None,
        cwd: str | None,
        env: dict[str, str] | None,
        timeout_sec: int | None,
        user: str | int | None,
    ) -> Any:
        """Harbor's exec of `command`; with `instead`, the init path runs that argv in place of
        the image's `bash -c` (the sidecar path, whose engine's exec the kit does not build,
        runs `exec ARGV` through that bash)."""
        if instead is None:
            return await super().exec(command, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)
        text = "exec " + shlex.join(instead)
        token = _INSTEAD.set((text, instead))
        try:
            return await super().exec(text, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)
        finally:
            _INSTEAD.reset(token)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        self._refuse_tests_unfrozen(target_path)
        await super().upload_file(source_path, target_path)
        await self._hide_tests(target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        self._refuse_tests_unfrozen(target_dir)
        await super().upload_dir(source_dir, target_dir)
        await self._hide_tests(target_dir)

    # --- the freeze and the gate --------------------------------------------------------------

    def _refuse_tests_unfrozen(self, target: str) -> None:
        p = PurePosixPath(target)
        if self._guard.frozen is None and (p == TESTS_DIR or TESTS_DIR in p.parents):
            # Harbor's own Verifier uploads the tests with the sandbox still running: a
            # survivor that reads them writes what they expect.
            raise QuiesceNotOn(
                f"the tests are being uploaded to {target} before any freeze: the verifier is "
                f"not quiesce's; pass {VERIFIER_FLAG}"
            )

    async def quiesce_freeze(self) -> FreezeResult:
        """Freeze the sandbox and check the marker against the key kept at start; raise
        FreezeFailed / Unreachable / MarkerInvalid otherwise."""
        g = self._guard
        box = g.container
        if box is None or g.public_key is None:
            raise Unreachable(
                f"{self.session_id}: quiesce was never started in this environment "
                "(its start failed or did not run): score nothing"
            )
        g.loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        r = await asyncio.to_thread(freeze, box, None, g.freeze_timeout)
        if r.marker is None:
            raise Unreachable(f"{self.session_id}: the freeze returned no marker: score nothing")
        key, marker, accept, root = g.public_key, r.marker, g.accept_setuid, g.lineage
        try:
            await asyncio.to_thread(
                lambda: verify_marker(
                    marker,
                    key,
                    nonce=r.nonce,
                    container=box,
                    accept_privilege_escalation=accept,
                    accept_root_agent=root,
                )
            )
        except MarkerInvalid as e:
            if e.check != "setuid":
                raise
            # The sidecar path cannot set no-new-privileges on a container it did not start.
            raise MarkerInvalid(
                "setuid",
                "the sandbox ran without no-new-privileges, so a setuid binary could make a "
                "sandbox process root: start it with no-new-privileges (the init path does), "
                "or accept the risk with --environment-kwarg accept_privilege_escalation=true",
            ) from None
        if g.lineage:
            await self._pin_key()
        g.frozen = r
        note = (
            f"quiesce: freeze {r.freeze_id} quiescent in {time.monotonic() - t0:.2f} s "
            f"(killed {r.killed}; the init's phases {r.phases_ms})"
        )
        g.notes.append(note)
        self.logger.info(note)
        return r

    async def _pin_key(self) -> None:
        """The key kept at start, copied in for the gate's `quiesce verify`: a root agent could
        rewrite the state dir's signing.pub and marker, and nothing of the agent's is alive now
        (the freeze proved it) to rewrite this copy."""
        key = self._guard.public_key or ""
        with tempfile.TemporaryDirectory() as d:
            f = Path(d) / "gate.pub"
            f.write_text(key)
            await self.upload_file(f, GATE_KEY)

    async def fresh_verifier_dirs(self, *, tests: bool = True) -> None:
        """After the freeze, as root: /logs/verifier emptied of all the agent left there, and
        (with `tests`) /tests made anew, root's, before Harbor writes either."""
        # The agent could write both (Harbor leaves /logs/verifier 0777 for it): a symlink
        # there is followed by the root redirect of the tests' output, a FIFO hangs it, and a
        # file planted in /tests (a conftest.py) runs as root with the tests.
        logs = shlex.quote(str(VERIFIER_DIR))
        parent = shlex.quote(str(VERIFIER_DIR.parent))
        steps = [
            # Its parent is root's: no one else can swap the directory under the commands.
            f"[ -d {parent} ] && [ ! -L {parent} ] && [ -O {parent} ]",
            # A bind mount on Docker: emptied, not replaced, as Harbor's own reset does.
            f"if [ -L {logs} ] || {{ [ -e {logs} ] && [ ! -d {logs} ]; }}; "
            f"then rm -f -- {logs}; fi",
            f"mkdir -p -- {logs}",
            f"find {logs} -mindepth 1 -maxdepth 1 -exec rm -rf -- {{}} +",
            f'[ -z "$(find {logs} -mindepth 1 -maxdepth 1)" ]',
            f"chown 0:0 {logs}",
            # The mode Harbor gives it: the tests may run as a verifier user of the task's. With
            # the services handed over, the tests run as root, and the service user must not
            # write there (quiesce verify's --protect refuses a writable path).
            f"chmod {'0755' if self._guard.hand_over else '0777'} {logs}",
        ]
        if tests:
            t = shlex.quote(str(TESTS_DIR))
            # Handed-over services run beside the tests: they must not read what the tests
            # expect (a service could serve it back), so the tests are root's alone then.
            mode = "0700" if self._guard.hand_over else "0755"
            steps += [
                f"if [ -L {t} ] || {{ [ -e {t} ] && [ ! -d {t} ]; }}; then rm -f -- {t}; fi",
                # A directory is removed and made anew; a mount point (a read-only root's
                # volume) cannot be removed (EBUSY): it is left emptied, and checked so.
                f"{{ rm -rf -- {t} 2>/dev/null; mkdir -p -- {t}; }}",
                f'[ -d {t} ] && [ ! -L {t} ] && [ -z "$(find {t} -mindepth 1 -maxdepth 1)" ]',
                f"chown 0:0 {t}",
                f"chmod {mode} {t}",
            ]
        # The image's PATH may lead to the agent's files (ENV PATH=/app/.venv/bin:$PATH): bash
        # and these tools are found through the kit's fixed one.
        # Each step names itself when it fails: a test of the shell's says nothing of its own.
        script = "\n".join(
            f"{{ {step}\n}} || {{ echo {shlex.quote('failed: ' + step)} >&2; exit 1; }}"
            for step in steps
        )
        r = await self.exec(script, user="root", env=dict(SAFE_ENV))
        if int(r.return_code) != 0:
            said = ((r.stdout or "") + (r.stderr or "")).strip()[-300:]
            raise QuiesceNotOn(
                f"{self.session_id}: cannot make {VERIFIER_DIR} and {TESTS_DIR} root's and "
                f"empty before the tests (exit {r.return_code}: {said or 'no output'}): "
                f"{VERIFIER_DIR.parent} and / must be root's"
            )

    def end_verification(self) -> None:
        """The freeze covered one verification: the next upload of tests needs a new one."""
        self._guard.frozen = None

    @contextlib.contextmanager
    def verifier_gate(self, nonce: str) -> Iterator[list[str]]:
        """While open, an exec that names no user runs behind `quiesce verify --nonce`; the
        list yielded names each command that did, once the gate let it through."""
        self._guard.gate = nonce
        self._guard.gated = []
        try:
            yield self._guard.gated
        finally:
            self._guard.gate = None

    async def _read_workdir(self) -> None:
        """The directory the agent's commands run in (Harbor's exec cwd: the task's workdir,
        else the image's WORKDIR), read before the agent's first command."""
        r = await super().exec("pwd -P", user="root", env=dict(SAFE_ENV))
        found = (r.stdout or "").strip()
        if int(r.return_code) == 0 and found.startswith("/") and "\n" not in found:
            self._guard.workdir = found
        else:
            self.logger.warning(
                f"{self.session_id}: could not read the agent's working directory (exit "
                f"{r.return_code}): the hand-over protects {TESTS_DIR} and {VERIFIER_DIR} only"
            )

    async def _hide_tests(self, target: str) -> None:
        """After an upload into /tests with the services handed over: /tests root's alone
        again, whatever mode the upload gave it."""
        p = PurePosixPath(target)
        if not self._guard.hand_over or not (p == TESTS_DIR or TESTS_DIR in p.parents):
            return
        t = shlex.quote(str(TESTS_DIR))
        # Every file too, not the directory alone: verify --hide judges each file by its own
        # mode (a hard link elsewhere would reach it whatever the directory's).
        r = await self.exec(
            f"chown -R 0:0 {t} && chmod -R go-rwx {t}", user="root", env=dict(SAFE_ENV)
        )
        if int(r.return_code) != 0:
            said = ((r.stdout or "") + (r.stderr or "")).strip()[-300:]
            raise HandOverRefused(
                f"{self.session_id}: cannot make {TESTS_DIR} root's alone before the services are "
                f"handed over (exit {r.return_code}: {said or 'no output'})"
            )

    async def _services_output(self) -> str:
        """The last lines the handed-over services printed (the agent's code: its own words),
        for a refusal's message; empty when there are none."""
        box = self._guard.container
        if box is None:
            return ""
        path = shlex.quote(f"{box.state_dir.rstrip('/')}/{HAND_OVER_LOG}")
        r = await self.exec(f"tail -n 5 -- {path}", user="root", env=dict(SAFE_ENV))
        if int(r.return_code) != 0:
            return ""
        return " | ".join(x.strip() for x in (r.stdout or "").splitlines() if x.strip())[-400:]

    async def _note_hand_over(self) -> None:
        """What quiesce verify handed over, from its record in the state dir, in the trial's
        log beside the freeze's note."""
        box = self._guard.container
        if box is None:
            return
        path = shlex.quote(f"{box.state_dir.rstrip('/')}/{HAND_OVER_RECORD}")
        r = await self.exec(f"cat -- {path}", user="root", env=dict(SAFE_ENV))
        try:
            record = json.loads(r.stdout or "") if int(r.return_code) == 0 else None
        except ValueError:
            record = None
        if not isinstance(record, dict):
            self.logger.warning(f"{self.session_id}: no {HAND_OVER_RECORD} to read after the tests")
            return
        note = f"quiesce: hand-over {_hand_over_summary(record)}"
        self._guard.notes.append(note)
        self.logger.info(note)
        if not record.get("services"):
            # Not a refusal: a task may need no service. But a task that does scores 0 now.
            self.logger.warning(
                f"{self.session_id}: hand_over_services=true, but the marker records no process "
                "that listened on TCP and none was declared: the tests ran with no service"
            )

    def _launched(self, command: str) -> list[str]:
        """`command` as a root agent's launch: through `quiesce exec --user root`, which tags
        it (and all it starts) as the sandbox's before it runs, or does not run it. The argv
        the engine starts: quiesce first, the image's bash only after the tag."""
        box = self._guard.container
        if box is None:
            raise Unreachable(f"{self.session_id}: quiesce is not running: the agent cannot start")
        return box.quiesce(
            "exec", "--sandbox-lineage", "--user", "root", "--", "bash", "-c", command
        )

    def _gated(self, command: str, env: dict[str, str] | None) -> tuple[list[str], dict[str, str]]:
        g = self._guard
        box = g.container
        if box is None or g.gate is None:  # verifier_gate opens only after a freeze
            raise Unreachable(f"{self.session_id}: no freeze to gate the verifier with")
        opts = ["--nonce", g.gate, *sandbox_user_args(g.users)]
        if g.lineage:
            opts += [
                "--require-sandbox",
                "lineage",
                "--accept-root-agent",
                "--public-key",
                GATE_KEY,
            ]
        if g.hand_over:
            who = self._resolve_user(None)
            if who is not None and str(who) not in ("root", "0"):
                # Only root can start the services as their own user, and only tests that run
                # as root can keep the service user out of /logs/verifier.
                raise HandOverRefused(
                    f"{self.session_id}: the tests run as {who!r} ([verifier] user), and the "
                    "services can be handed over only to tests that run as root: drop "
                    "hand_over_services=true or the task's verifier user"
                )
            opts += g.hand_over_args()
        # The subshell keeps the script's own exit (Harbor 0.25.0 ignores it and reads the
        # reward file) apart from the gate's codes: only quiesce verify exits non-zero here.
        # Harbor's bash, quiesce and the bash after `--` are found through the kit's fixed
        # PATH (the image's may lead to the agent's files); the tests then get back the PATH
        # they would have had: Harbor's env's, else the image's as read at start. What that
        # PATH finds is the task's.
        # So does the image's LD_LIBRARY_PATH (a CUDA image's libraries): like PATH, what it
        # leads to is the task's, and the tests run it anyway; BASH_ENV, ENV, LD_PRELOAD and
        # LD_AUDIT stay off (the tests' own bash would source the file first).
        task_path = (env or {}).get("PATH") or g.image_path or SAFE_PATH
        libs = (env or {}).get("LD_LIBRARY_PATH") or g.image_libs
        back = f"PATH={shlex.quote(task_path)}; export PATH\n"
        if libs:
            back += f"LD_LIBRARY_PATH={shlex.quote(libs)}; export LD_LIBRARY_PATH\n"
        inner = f"{back}(\n{command}\n); exit 0"
        argv = box.quiesce("verify", *opts, "--", "/bin/bash", "-c", inner)
        accept = "1" if g.accept_setuid else "0"
        return argv, {**safe_env(env), ACCEPT_ENV: accept}

    # --- the sidecar path ---------------------------------------------------------------------

    def _as_container(self) -> Container:
        loop = self._guard.loop
        parent: Any = super()

        async def run(
            argv: Sequence[str],
            *,
            user: str | None = None,
            stdin: bytes | None = None,
            env: dict[str, str] | None = None,
        ) -> tuple[int, bytes, bytes]:
            if stdin is not None:
                raise ValueError("Harbor's exec takes no stdin: the kit uploads files instead")
            # The kit's user None is the sandbox's own default (root), not the agent's.
            r = await parent.exec(shlex.join(argv), env=env, user=user or "0")
            return int(r.return_code), (r.stdout or "").encode(), (r.stderr or "").encode()

        async def upload(local: str, remote: str) -> None:
            await parent.upload_file(local, remote)

        return Container.from_exec(run, upload, name=self.session_id, loop=loop)

    async def _start_sidecar(self) -> None:
        g = self._guard
        box = self._as_container()

        def go() -> Any:
            return start_sidecar(
                box, g.users, arch=g.arch, install_path=g.install_path, timeout=120
            )

        sc = await asyncio.to_thread(go)
        g.container, g.public_key = sc.container, sc.public_key

    async def _check_init(self) -> None:
        raise InstallFailed(f"{type(self).__name__}: no init path here: pass via=sidecar")


class _ComposeInit:
    """The init path: Harbor's Docker (or Podman) environment, with quiesce as the main
    container's init through a Compose override merged after every file of Harbor's."""

    _guard: _Guard
    session_id: str
    logger: Any

    @property
    def _docker_compose_paths(self) -> list[Path]:
        paths: list[Path] = list(super()._docker_compose_paths)  # type: ignore[misc]
        if self._guard.override is not None:
            paths.append(self._guard.override)
        return paths

    async def _run_docker_compose_command(self, command: list[str], *a: Any, **k: Any) -> Any:
        if command[:1] == ["exec"]:
            command = _with_argv(command, _INSTEAD.get())
        # Harbor 0.25.0's DockerEnvironment.start builds or pulls the image, then runs `up`
        # once: the override is written just before it, from the merged file and the image.
        if command[:1] != ["up"]:
            return await super()._run_docker_compose_command(command, *a, **k)  # type: ignore[misc]
        if self._guard.override is None:
            await self._write_override()
        try:
            return await super()._run_docker_compose_command(command, *a, **k)  # type: ignore[misc]
        except RuntimeError as e:
            # The init refuses to start with one line naming the fix: that line, not Compose's.
            logs = await super()._run_docker_compose_command(  # type: ignore[misc]
                ["logs", "--no-color", "--tail", "5", "main"], check=False
            )
            said = (logs.stdout or "").strip() or "(no log)"
            raise InstallFailed(
                f"{self.session_id}: the main container did not start under quiesce: {said}"
            ) from e

    async def _engine(self, *args: str) -> bytes:
        argv = type(self).runtime().engine_cmd(*args)  # type: ignore[attr-defined]
        p = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await asyncio.wait_for(p.communicate(), 120)
        except asyncio.TimeoutError:
            p.kill()
            raise Unreachable(f"{' '.join(argv)}: no answer in 120 s") from None
        if p.returncode != 0:
            raise Unreachable(f"{' '.join(argv)}: {err.decode(errors='replace').strip()}")
        return out

    async def _merged_main(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="quiesce-harbor-") as d:
            out = Path(d) / "config.json"
            await super()._run_docker_compose_command(  # type: ignore[misc]
                ["config", "--format", "json", "--output", str(out)]
            )
            cfg = json.loads(out.read_text())
        main = cfg.get("services", {}).get("main")
        if not isinstance(main, dict):
            raise InstallFailed(f"{self.session_id}: the merged Compose file has no main service")
        return main

    async def _main_image(self, main: dict[str, Any]) -> str:
        """The image `up` runs as the main container: the one the Compose files name, else the
        one Compose built and named itself (a task with a Dockerfile only, or --force-build:
        Harbor 0.25.0's build file gives `build:` and no `image:`)."""
        image = main.get("image")
        if isinstance(image, str) and image:
            return image
        if not main.get("build"):
            raise InstallFailed(
                f"{self.session_id}: the main service names no image and builds none: give it "
                "an image (task.toml's docker_image) or a Dockerfile"
            )
        from harbor.environments.docker.docker import _sanitize_docker_compose_project_name

        # Compose names it PROJECT-main (Compose 1 named it PROJECT_main): the name its own
        # `config --images main` gives (among main's dependencies' images), not a guess.
        r = await super()._run_docker_compose_command(  # type: ignore[misc]
            ["config", "--images", "main"]
        )
        project = _sanitize_docker_compose_project_name(self.session_id)
        return _built_image_name(str(r.stdout or ""), project, self.session_id)

    async def _write_override(self) -> None:
        g = self._guard
        # The key made below and the check of the init (_check_init) need both extras.
        need("cryptography", "crypto", "the Harbor switch")
        need("docker", "docker", "the Harbor switch")
        main = await self._merged_main()
        image = await self._main_image(main)
        info = json.loads(await self._engine("image", "inspect", image))[0]
        cfg = info.get("Config") or {}
        arch = str(info.get("Architecture") or "")
        try:
            binary = binary_path(g.arch or arch)
        except (OSError, ValueError) as e:
            raise InstallFailed(f"{self.session_id}: {e}") from None
        if g.arch is not None and _alias(g.arch) != _alias(arch):
            raise InstallFailed(
                f"arch={g.arch!r} was given, but the image {image} is {arch!r}: drop arch= or "
                "give the image's"
            )
        entry, cmd = _entry_and_cmd(main, cfg)
        if not entry and not cmd:
            raise InstallFailed(
                f"{image}: neither the image nor the Compose files give a command to run "
                "under quiesce: give the main service a command"
            )
        g.key_dir, g.public_key = _make_key()
        volumes: list[dict[str, Any]] = [
            {"type": "bind", "source": str(binary), "target": INIT_BINARY, "read_only": True},
        ]
        init = [INIT_BINARY, *g.init_args()]
        if g.lineage:
            # A root agent reads any key file the container holds: the init's own ephemeral key
            # instead, its public half read once the init is up, before the agent's first
            # command (_check_init), and kept here.
            (g.key_dir / "signing.key").unlink()
            g.public_key = None
        else:
            volumes.append(
                {
                    "type": "bind",
                    "source": str(g.key_dir),
                    "target": INIT_KEY_DIR,
                    "read_only": True,
                }
            )
            init += ["--signing-key", f"{INIT_KEY_DIR}/signing.key"]
        init += ["--", *entry]
        svc: dict[str, Any] = {
            "entrypoint": init,
            "volumes": volumes,
            # quiesce verify refuses a marker signed without it (docs/marker.md, check 18).
            "security_opt": ["no-new-privileges:true"],
        }
        if cmd:
            svc["command"] = cmd
        if g.pids_limit:
            svc["pids_limit"] = g.pids_limit
        path = g.key_dir / "compose-quiesce.json"
        path.write_text(json.dumps({"services": {"main": svc}}, indent=2))
        self.logger.info(f"quiesce: the main service runs {init + cmd}")
        g.override = path

    async def _check_init(self) -> None:
        """The init answers: its state dir's public key is the one made here."""
        from harbor.environments.docker.docker import _sanitize_docker_compose_project_name

        g = self._guard
        box = Container.compose(
            "main",
            project=_sanitize_docker_compose_project_name(self.session_id),
            binary=INIT_BINARY,
        )
        want = g.public_key
        deadline = time.monotonic() + 30

        path = f"{box.state_dir}/signing.pub"

        def read_key() -> str | None:
            # Through the engine's archive API: no exec, and no cat needed in the image.
            return _read_through_engine(box, path)

        have = None
        while time.monotonic() < deadline:
            have = await asyncio.to_thread(read_key)
            if have is None:
                # The archive API does not reach into a tmpfs (a read-only root's /run): the
                # image's cat then, as root, before the agent's first command, so nothing of
                # the agent's is on its way.
                r = await self.exec(  # type: ignore[attr-defined]
                    f"cat -- {shlex.quote(path)}", user="root", env=dict(SAFE_ENV)
                )
                if int(r.return_code) == 0 and (r.stdout or "").startswith("-----BEGIN"):
                    have = r.stdout
            if have is not None:
                break
            await asyncio.sleep(0.2)
        if g.lineage and want is None and have is not None:
            # The init's ephemeral key, read before the agent's first command and kept.
            g.public_key = want = have
        if have is None or want is None or have.strip() != want.strip():
            logs = await self._engine("logs", "--tail", "5", box._docker_id())
            raise InstallFailed(
                f"{self.session_id}: quiesce is not the main container's init with this "
                f"trial's key ({logs.decode(errors='replace').strip() or 'no log'})"
            )
        # The way in as the engine made it: a Compose file of the task's that mounts over it
        # (or a Harbor that merges files otherwise) fails the trial here, before the agent.
        await asyncio.to_thread(box.check_way_in)
        g.container = box


def _with_argv(command: list[str], instead: tuple[str, list[str]] | None) -> list[str]:
    """`docker compose exec ... main bash -c TEXT` with `bash -c TEXT` replaced by the argv the
    kit meant to run, so that nothing of the image runs before it; unchanged without one.
    Harbor 0.25.0's DockerEnvironment._compose_exec ends its argv with the service and the
    platform's shell wrapper: a Harbor that builds it otherwise runs nothing (QuiesceNotOn)."""
    if instead is None:
        return command
    text, argv = instead
    if command[-3:] != ["bash", "-c", text] or command[-4:-3] != ["main"]:
        raise QuiesceNotOn(
            "this Harbor's exec does not end with `main bash -c COMMAND`, so quiesce's argv "
            "cannot be put in place of the image's bash: pin harbor==0.25.0 or update quiesce"
        )
    return [*command[:-3], *argv]


def _read_through_engine(box: Container, path: str) -> str | None:
    """A small file of the container, read with Docker's archive API; None while it is not
    there (or not a file)."""
    import io
    import tarfile

    import docker as docker_sdk

    try:
        stream, _ = box._docker().api.get_archive(box._docker_id(), path)
        data = b"".join(stream)
    except docker_sdk.errors.NotFound:
        return None
    except docker_sdk.errors.DockerException as e:
        raise Unreachable(f"{box.name}: cannot read {path}: {e}") from None
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.next()
        f = tar.extractfile(member) if member is not None and member.isfile() else None
        return f.read(64 * 1024).decode(errors="replace") if f is not None else None


def _built_image_name(output: str, project: str, session: str) -> str:
    """The name Compose gave main's built image: the one of its default names that
    `docker compose config --images main` lists (with main's dependencies' images, and any
    warning Compose printed, which has blanks in it)."""
    listed = {line.strip() for line in output.splitlines()}
    names = [n for n in (f"{project}-main", f"{project}_main") if n in listed]
    if len(names) != 1:
        raise InstallFailed(
            f"{session}: Compose lists not exactly one of {project}-main, {project}_main "
            f"as the main service's built image ({output.strip()[-300:] or 'no output'}): "
            "give the main service an image (task.toml's docker_image, or image: in the "
            "task's docker-compose.yaml)"
        )
    return names[0]


def _alias(arch: str) -> str:
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch.lower(), arch.lower())


def _entry_and_cmd(main: dict[str, Any], image: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The main service's ENTRYPOINT and CMD as the engine would run them: the Compose file's
    where it sets them, else the image's (whose CMD Compose drops when it sets an entrypoint)."""

    def argv(v: object, what: str) -> list[str]:
        if v is None:
            return []
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            return list(v)
        raise InstallFailed(f"the main service's {what} is {v!r}, not a list of strings")

    # `docker compose config` writes an entrypoint or command no file set as null (or leaves
    # it out): the image's then.
    if main.get("entrypoint"):
        entry = argv(main["entrypoint"], "entrypoint")
        cmd = argv(main.get("command"), "command")
    else:
        entry = argv(image.get("Entrypoint"), "image's Entrypoint")
        cmd = argv(main.get("command") or image.get("Cmd"), "command")
    return entry, cmd


def _make_key() -> tuple[Path, str]:
    """A fresh Ed25519 key in a root-only directory of its own; its public PEM."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    d = Path(tempfile.mkdtemp(prefix="quiesce-harbor-key-"))
    d.chmod(0o700)
    f = d / "signing.key"
    fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as out:
        out.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    pub = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return d, pub.decode()


class QuiescedVerifier(Verifier):  # type: ignore[misc]
    """Harbor's Verifier, run only after a quiescent freeze and behind `quiesce verify`."""

    async def verify(self) -> Any:
        env = self.environment
        if not isinstance(env, QuiescedEnvironment):
            raise QuiesceNotOn(
                f"the environment is {type(env).__name__}, not quiesce's: pass {ENV_FLAG}"
            )
        try:
            r = await env.quiesce_freeze()
            if r.nonce is None:
                raise Unreachable("the freeze carries no nonce: score nothing")
            await env.fresh_verifier_dirs(tests=not self._skip_tests_upload)
            with env.verifier_gate(r.nonce) as gated:
                result = await super().verify()
        finally:
            # A later step's agent runs after this: its tests need a freeze of their own.
            env.end_verification()
        if not gated:
            # Harbor 0.25.0's Verifier runs the test script with an exec that names no user; a
            # Harbor that names one would run it past the gate: score nothing then.
            raise GateRefused(
                "the verifier ran no command behind quiesce verify (this Harbor runs its tests "
                "as a named user): score nothing; pin harbor==0.25.0 or update quiesce"
            )
        return result


def _hand_over_summary(record: dict[str, Any]) -> str:
    """One line of handover.json: its state, the user, the time until every port listened, the
    Landlock domain that confined them, and each service's ports and argv (declared ones
    marked)."""
    parts = []
    for s in record.get("services") or []:
        if not isinstance(s, dict):
            continue
        argv = s.get("argv")
        text = shlex.join(str(a) for a in argv) if isinstance(argv, list) else str(argv)
        mark = " (declared)" if s.get("declared") else ""
        parts.append(f"port(s) {s.get('ports')}: {text[:160]!r}{mark}")
    head = (
        f"{record.get('state', '?')}: {len(parts)} service(s) as "
        f"{record.get('user', '?')}:{record.get('group', '?')}"
    )
    if record.get("ready_ms") is not None:
        head += f", listening in {record['ready_ms']} ms"
    if record.get("stopped") is not None:
        head += f", {record['stopped']} process(es) stopped after the tests"
    domain = record.get("domain")
    if isinstance(domain, dict):
        abi, ports = domain.get("abi"), domain.get("connect_tcp")
        head += f", confined (Landlock ABI {abi}: TCP ports {ports})"
    if record.get("reason"):
        head += f" ({record['reason']})"
    return head + ("; " + "; ".join(parts) if parts else "")


def _check_gate(rc: int, output: str) -> None:
    """Raise GateRefused unless the gated exec ran the tests (exit 0); HandOverRefused, with
    quiesce verify's reason, when the services could not be handed over."""
    if rc == 0:
        return
    if rc == HAND_OVER_EXIT:
        said = [
            line.split(HAND_OVER_FAILED, 1)[1].strip()
            for line in output.splitlines()
            if HAND_OVER_FAILED in line
        ]
        reason = "; ".join(said) if said else (output.strip()[-300:] or "no reason given")
        if said and all(x.startswith("the services' end") for x in said):
            # The tests ran, but a service may have outlived them: their verdict is not kept.
            raise HandOverRefused(
                "quiesce verify could not end the services it handed over to the tests, so "
                f"what the tests wrote is not scored: {reason}"
            )
        raise HandOverRefused(
            "quiesce verify could not hand the agent's services over to the tests, which did "
            f"not run: {reason}"
        )
    why = GATE_EXIT_CODES.get(rc, f"exit {rc}")
    raise GateRefused(f"quiesce verify refused to score ({why}): {output.strip()[-300:]}")
