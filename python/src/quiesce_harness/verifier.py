"""run_verifier(): start the verifier only behind `quiesce verify`'s gate."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from .container import Container
from .errors import Unreachable

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
}


def run_verifier(
    container: Container,
    cmd: str | Sequence[str],
    nonce: str | None = None,
    *,
    sandbox_user: str | None = None,
    max_age_s: int | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run `quiesce verify [--nonce N] -- cmd` in the container and return what it did.

    A string cmd runs through `sh -c`. The verifier runs only when every check passes;
    otherwise the exit code is one of GATE_EXIT_CODES and nothing was scored. Raises
    Unreachable when no exec could start.
    """
    argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    if not argv:
        raise ValueError("run_verifier: empty command")
    opts: list[str] = []
    if nonce is not None:
        opts += ["--nonce", nonce]
    if sandbox_user is not None:
        opts += ["--sandbox-user", sandbox_user]
    if max_age_s is not None:
        opts += ["--max-age", str(max_age_s)]
    full = container.quiesce("verify", *opts, "--", *argv)
    r = container.exec(full, timeout=timeout if timeout is not None else 3600.0)
    if not r.started:
        raise Unreachable(f"{container.name}: the verifier's exec could not start ({r.text})")
    return subprocess.CompletedProcess(full, r.returncode, r.stdout, r.stderr)
