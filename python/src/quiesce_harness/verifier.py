"""run_verifier(): start the verifier only behind `quiesce verify`'s gate."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .container import Container, sandbox_user_args
from .errors import MarkerInvalid, Unreachable
from .marker import verify_marker

# Set in the verifier's exec so that the container's environment (an image's ENV) cannot accept
# what the caller did not: `quiesce verify` reads this variable as --accept-privilege-escalation.
ACCEPT_ENV = "QUIESCE_ACCEPT_PRIVILEGE_ESCALATION"

# `quiesce verify`'s own refusals (docs/marker.md); any other code is the verifier's.
GATE_EXIT_CODES = {
    10: "no marker",
    11: "malformed marker",
    12: "bad key, alg or signature",
    13: "claims (iss, result, survivors, sandbox users, nonce)",
    14: "marker too old or from the future",
    15: "marker from another container",
    16: "a sandbox process is alive (live probe)",
    17: "unsafe state directory",
    18: "marker from a configuration the policy refuses (setuid binaries could make a sandbox "
    "process root: no no-new-privileges; or, with --require-lineage, no lineage)",
    19: "attestation missing, not this marker's, or the attested trees changed",
    20: "hand-over check failed (with --hand-over: a service did not start again or listen in "
    "time, the service user could write a --protect path, or the kernel cannot hold the "
    "services' Landlock domain)",
}
# `quiesce verify --hand-over`'s refusal: the agent's services could not be handed over.
HAND_OVER_EXIT = 20


@dataclass(frozen=True)
class HandOver:
    """`quiesce verify --hand-over` (docs/marker.md, "The hand-over"): once every check passed,
    the services the signed marker records as having listened are started again as a user of
    their own, waited for until they listen, and killed when the verifier ends.

    protect: paths the service user must not be able to write (the tests, the reward's
    directory, the workspace); hide: paths it must not be able to read (the tests' expected
    answers); verify refuses (exit 20) rather than start a service that could. services: start
    commands by port (`sh -c`, from `/` with a plain PATH), for what the marker does not
    record or should not start as recorded; ports: only the services on these ports come back
    (none: every recorded one). service_user: the UID and GID they run as (quiesce's default,
    65530); service_wait: seconds each may take to listen (default 30).
    """

    protect: Sequence[str] = ()
    hide: Sequence[str] = ()
    services: Mapping[int, str] = field(default_factory=dict)
    ports: Sequence[int] = ()
    service_user: int | None = None
    service_wait: int | None = None

    def __post_init__(self) -> None:
        for what, paths in (("protect", self.protect), ("hide", self.hide)):
            if isinstance(paths, str):
                raise ValueError(f"HandOver {what}={paths!r}: give a list of paths")
            for path in paths:
                if not path.startswith("/"):
                    raise ValueError(f"HandOver {what}: {path!r} is not an absolute path")
        for port in [*self.ports, *self.services]:
            if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise ValueError(f"HandOver: {port!r} is not a TCP port (1-65535)")
        for port, command in self.services.items():
            if not command.strip():
                raise ValueError(f"HandOver services: port {port} has no command to start it with")
        for what, v in (("service_user", self.service_user), ("service_wait", self.service_wait)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"HandOver {what}={v!r}: give a whole number of at least 1")

    def args(self) -> list[str]:
        """`quiesce verify`'s options for this hand-over."""
        args = ["--hand-over"]
        if self.service_user is not None:
            args += ["--service-user", str(self.service_user)]
        if self.service_wait is not None:
            args += ["--service-wait", str(self.service_wait)]
        for path in self.protect:
            args += ["--protect", path]
        for path in self.hide:
            args += ["--hide", path]
        for port in sorted(set(self.ports)):
            args += ["--port", str(port)]
        for port, command in sorted(self.services.items()):
            args += ["--service", f"{port}={command.strip()}"]
        return args


def run_verifier(
    container: Container,
    cmd: str | Sequence[str],
    nonce: str | None = None,
    *,
    sandbox_user: str | None = None,
    max_age_s: int | None = None,
    timeout: float | None = None,
    accept_privilege_escalation: bool = False,
    hand_over: HandOver | None = None,
    public_key: str | bytes | None = None,
    marker: str | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run `quiesce verify [--nonce N] -- cmd` in the container and return what it did.

    A string cmd runs through `/bin/sh -c`. The verifier runs only when every check passes;
    otherwise the exit code is one of GATE_EXIT_CODES and nothing was scored. Raises
    Unreachable when no exec could start.

    A marker signed where a setuid binary could make a sandbox process root (the container
    ran without no-new-privileges: its `setuid` claim is true, or absent) is refused with
    code 18 unless `accept_privilege_escalation`, which passes --accept-privilege-escalation.
    Without it, the exec sets QUIESCE_ACCEPT_PRIVILEGE_ESCALATION=0 on Docker, Compose and
    Podman, and through a from_exec function that takes `env=`, so that the container's
    environment cannot accept it either (`kubectl exec`, and an exec function without `env`,
    set no environment: there the container's own is read).

    `hand_over` gives the services the agent left running back to the verifier, confined (see
    HandOver); exit 20 (HAND_OVER_EXIT) then says verify refused to, and why, on stderr.

    quiesce itself runs from its absolute path (Container.binary_path(), never looked up
    through the image's PATH), but `cmd` is the task's: it runs with the container's own
    environment, PATH included, as the task chose. A bare command name is looked up there, and
    an image whose PATH starts with a directory the sandbox user can write (a workspace venv)
    runs the sandbox user's file of that name as the verifier: give an absolute command, or
    an image whose PATH holds root's directories only.

    `public_key` (the init's key as kept outside the container: one you made and mounted, or
    the `signing.pub` read before the agent's first command) with `marker` (what freeze()
    returned): the marker is checked here first, with verify_marker against that key, the
    nonce and the container's identity, and MarkerInvalid is raised before anything runs in
    the container. `quiesce verify` inside checks the marker against the state dir's key, which
    a root process of the container (a root agent, a setuid helper) could rewrite; checked
    outside first, a replaced gate gains nothing: it can only refuse what was proven.
    """
    # The kit's own shell by its path: the image's PATH (which the task's cmd keeps) may lead
    # to a `sh` the sandbox user wrote.
    argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    if not argv:
        raise ValueError("run_verifier: empty command")
    if (public_key is not None or marker is not None) and nonce is None:
        # Without a nonce a marker of an earlier freeze (this container's, genuine) passes.
        raise MarkerInvalid(
            "nonce", "run_verifier was given a marker or key but no nonce: pass freeze()'s"
        )
    if public_key is not None:
        if not marker:
            raise MarkerInvalid(
                "format", "run_verifier was given a public key but no marker: pass freeze()'s"
            )
        verify_marker(
            marker,
            public_key,
            nonce=nonce,
            max_age_s=max_age_s,
            container=container,
            accept_privilege_escalation=accept_privilege_escalation,
        )
    opts: list[str] = []
    if nonce is not None:
        opts += ["--nonce", nonce]
    if sandbox_user is not None:
        opts += sandbox_user_args(sandbox_user)
    if max_age_s is not None:
        opts += ["--max-age", str(max_age_s)]
    if hand_over is not None:
        opts += hand_over.args()
    env: dict[str, str] | None = None
    if accept_privilege_escalation:
        opts.append("--accept-privilege-escalation")
    elif container.sets_env:
        env = {ACCEPT_ENV: "0"}
    full = container.quiesce("verify", *opts, "--", *argv)
    r = container.exec(
        full, timeout=timeout if timeout is not None else 3600.0, env=env, image_path=True
    )
    if not r.started:
        raise Unreachable(f"{container.name}: the verifier's exec could not start ({r.text})")
    return subprocess.CompletedProcess(full, r.returncode, r.stdout, r.stderr)
