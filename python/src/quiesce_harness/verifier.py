"""run_verifier(): start the verifier only behind `quiesce verify`'s gate."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from .container import Container, sandbox_user_args
from .errors import Unreachable

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
    "time, or the service user could write a --protect path)",
}
# `quiesce verify --hand-over`'s refusal: the agent's services could not be handed over.
HAND_OVER_EXIT = 20


def run_verifier(
    container: Container,
    cmd: str | Sequence[str],
    nonce: str | None = None,
    *,
    sandbox_user: str | None = None,
    max_age_s: int | None = None,
    timeout: float | None = None,
    accept_privilege_escalation: bool = False,
) -> subprocess.CompletedProcess[bytes]:
    """Run `quiesce verify [--nonce N] -- cmd` in the container and return what it did.

    A string cmd runs through `sh -c`. The verifier runs only when every check passes;
    otherwise the exit code is one of GATE_EXIT_CODES and nothing was scored. Raises
    Unreachable when no exec could start.

    A marker signed where a setuid binary could make a sandbox process root (the container
    ran without no-new-privileges: its `setuid` claim is true, or absent) is refused with
    code 18 unless `accept_privilege_escalation`, which passes --accept-privilege-escalation.
    Without it, the exec sets QUIESCE_ACCEPT_PRIVILEGE_ESCALATION=0 on Docker, Compose and
    Podman, and through a from_exec function that takes `env=`, so that the container's
    environment cannot accept it either (`kubectl exec`, and an exec function without `env`,
    set no environment: there the container's own is read).

    quiesce itself runs from its absolute path (Container.binary_path(), never looked up
    through the image's PATH), but `cmd` is the task's: it runs with the container's own
    environment, PATH included, as the task chose. A bare command name is looked up there, and
    an image whose PATH starts with a directory the sandbox user can write (a workspace venv)
    runs the sandbox user's file of that name as the verifier: give an absolute command, or
    an image whose PATH holds root's directories only.
    """
    argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    if not argv:
        raise ValueError("run_verifier: empty command")
    opts: list[str] = []
    if nonce is not None:
        opts += ["--nonce", nonce]
    if sandbox_user is not None:
        opts += sandbox_user_args(sandbox_user)
    if max_age_s is not None:
        opts += ["--max-age", str(max_age_s)]
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
