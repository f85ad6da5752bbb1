"""The way in, on the real engine: which path to quiesce a process in the container can redirect.

Every exec of the orchestrator's (the freeze client, `quiesce verify`, a tagged launch) runs its
path as root. Under /run (the Harbor switch's layout before) a root exec, or a sandbox user
who may write /run, renames the directory above the read-only mount and plants a file of its
own there; a read-only file bind mount at a path in / is a mount point that nothing without
CAP_SYS_ADMIN can rename, unlink or mount over. Container.check_way_in() refuses the first and
takes the second. And a root agent's tagged launch must start with quiesce's argv: through the
image's `bash -c`, a bash the agent rewrote runs first, untagged, and its daemon outlives a
quiescent freeze.
"""

from __future__ import annotations

import contextlib
import shlex
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import docker
import docker.errors
import pytest
from docker.models.containers import Container as DockerContainer

from quiesce_harness import Container, freeze
from quiesce_harness.errors import InstallFailed

import support

OLD = "/run/quiesce-harbor/quiesce"
FIXED = "/quiesce"
FORGED = "#!/bin/sh\necho forged\n"
# rename, unlink and a bind mount over /quiesce, and a rename of /, from a root exec with
# Docker's default capabilities; each errno. (SYS_mount by the architecture's number.)
PROBE = (
    "my ($s, $d, $t) = (q{/evil}, q{/quiesce}, q{});"
    "my $nr = `uname -m` =~ /aarch64/ ? 40 : 165;"
    'print rename(q{/quiesce}, q{/q2}) ? "rename ok\n" : "rename: $!\n";'
    'print unlink(q{/quiesce}) ? "unlink ok\n" : "unlink: $!\n";'
    'print rename(q{/}, q{/r2}) ? "rename / ok\n" : "rename /: $!\n";'
    'print syscall($nr, $s, $d, $t, 4096, 0) == 0 ? "mount ok\n" : "mount: $!\n";'
)
PLANT = (
    "mv /run/quiesce-harbor /run/.real && mkdir /run/quiesce-harbor && "
    f"printf '%s' '{FORGED}' > {OLD} && chmod 755 {OLD}"
)


@contextlib.contextmanager
def mounted(
    client: docker.DockerClient,
    command: list[str],
    entrypoint: list[str] | None = None,
    **run: Any,
) -> Iterator[DockerContainer]:
    """debian:bookworm-slim with the binary read-only at the old path and at /, and a file of
    its own writable at /quiesce-rw; `run` to the engine; removed on exit."""
    bin_ = str(support.need_binary())
    rw = tempfile.NamedTemporaryFile(prefix="qhk-wayin-")  # noqa: SIM115 (closed below)
    ctr = support.run_container(
        client,
        "debian:bookworm-slim",
        command,
        kind="wayin-",
        volumes=[f"{bin_}:{OLD}:ro", f"{bin_}:{FIXED}:ro", f"{rw.name}:/quiesce-rw:rw"],
        entrypoint=entrypoint,
        **run,
    )
    try:
        yield ctr
    finally:
        with contextlib.suppress(docker.errors.DockerException):
            ctr.remove(force=True)
        rw.close()


def run(ctr: DockerContainer, argv: list[str], user: str = "0") -> tuple[int, str]:
    rc, out = ctr.exec_run(argv, user=user)
    assert isinstance(out, bytes)
    return int(rc or 0), out.decode(errors="replace")


def sh(ctr: DockerContainer, script: str, user: str = "0") -> tuple[int, str]:
    return run(ctr, ["/bin/sh", "-c", script], user)


def test_a_root_exec_redirects_a_path_under_run_and_cannot_touch_a_mount_in_root(
    client: docker.DockerClient,
) -> None:
    with mounted(client, ["sleep", "infinity"]) as ctr:
        box = Container.docker(str(ctr.id), binary=FIXED, client=client)
        box.check_way_in()
        rc, out = sh(ctr, PLANT)
        assert rc == 0, out
        rc, out = run(ctr, [OLD, "--version"])
        assert out.strip() == "forged", out
        for binary, said in (
            (OLD, "under /run/quiesce-harbor"),
            ("/sbin/docker-init", "under /sbin"),
            ("quiesce", "looked up by name"),
            ("/quiesce-rw", "writable bind mount"),
            ("/bin", "not a mount"),
        ):
            with pytest.raises(InstallFailed, match=said) as e:
                Container.docker(str(ctr.id), binary=binary, client=client).check_way_in()
            assert "-v /usr/local/bin/quiesce:/quiesce:ro" in str(e.value)
        # The fixed path: a mount point (EBUSY), in / (which cannot be renamed), and no mount
        # over it without CAP_SYS_ADMIN (each call's errno as the kernel gave it).
        rc, out = sh(ctr, f"echo x > /evil && perl -e {shlex.quote(PROBE)}")
        assert out.splitlines() == [
            "rename: Device or resource busy",
            "unlink: Device or resource busy",
            "rename /: Device or resource busy",
            "mount: Operation not permitted",
        ], out
        rc, out = run(ctr, [FIXED, "--version"])
        assert rc == 0 and out.startswith("quiesce"), out


@pytest.mark.parametrize("cap", ["SYS_ADMIN", "CAP_SYS_PTRACE"])
def test_a_container_whose_root_may_mount_over_the_path_or_trace_the_init_is_refused(
    client: docker.DockerClient, cap: str
) -> None:
    # (--privileged is refused by the same check; this engine, itself in a container, cannot
    # start a privileged one.)
    with mounted(client, ["sleep", "infinity"], cap_add=[cap]) as ctr:
        with pytest.raises(InstallFailed, match=f"with {cap.removeprefix('CAP_')}") as e:
            Container.docker(str(ctr.id), binary=FIXED, client=client).check_way_in()
        assert "--cap-add" in str(e.value)
        if cap == "SYS_ADMIN":
            # What it refuses: a root exec's mount over /quiesce; the next exec of the path
            # runs its file.
            plant = f"printf '%s' '{FORGED}' > /evil && chmod 755 /evil"
            rc, out = sh(ctr, f"{plant} && mount --bind /evil {FIXED}")
            assert rc == 0, out
            assert run(ctr, [FIXED, "--version"])[1].strip() == "forged"


def test_a_sandbox_user_who_may_write_run_redirects_a_path_under_run_not_one_in_root(
    client: docker.DockerClient,
) -> None:
    # OpenShift-style: /run 0775 root:root, the agent a UID the image does not know, which
    # Docker puts in group 0 (as the Harbor switch's sandbox_user=4242).
    with mounted(client, ["sleep", "infinity"]) as ctr:
        rc, out = sh(ctr, "chmod 0775 /run")
        assert rc == 0, out
        rc, out = sh(ctr, "id -g", user="4242")
        assert out.strip() == "0", out
        rc, out = sh(ctr, PLANT, user="4242")
        assert rc == 0, out
        rc, out = run(ctr, [OLD, "--version"])
        assert out.strip() == "forged", out
        rc, out = sh(ctr, f"mv {FIXED} /q2 || rm -f {FIXED} || echo x > {FIXED}", user="4242")
        assert rc != 0, out
        rc, out = run(ctr, [FIXED, "--version"])
        assert rc == 0 and out.startswith("quiesce"), out


# A root agent's first launch rewrites the image's bash: the real one moved aside, a wrapper in
# its place that leaves a root daemon and then runs it.
WRAP = (
    "mv /bin/bash /bin/bash.real && printf '%s' "
    '\'#!/bin/bash.real\nsetsid /bin/sh -c "while :; do sleep 0.05; done" qhk-wrapped-daemon '
    '</dev/null >/dev/null 2>&1 &\nexec /bin/bash.real "$@"\n\' > /bin/bash && chmod 755 /bin/bash'
)
LAUNCH = [FIXED, "exec", "--sandbox-lineage", "--user", "root", "--"]


def daemons(client: docker.DockerClient, ctr: DockerContainer) -> int:
    """Live processes of the wrapper's daemon, by `docker top` (no exec)."""
    top = client.api.top(str(ctr.id), ps_args="-o pid,stat,args")
    return sum(
        1
        for p in top["Processes"] or []
        if "qhk-wrapped-daemon" in p[-1] and not p[1].startswith("Z")
    )


@pytest.mark.parametrize("form", ["argv", "bash -c"])
def test_a_rewritten_bash_runs_before_the_tag_only_through_the_images_bash(
    client: docker.DockerClient, form: str
) -> None:
    # The Harbor switch's layout with a root agent: the init defines the sandbox by lineage.
    with mounted(
        client,
        ["sleep", "infinity"],
        entrypoint=[FIXED, "--sandbox-lineage", "--"],
    ) as ctr:
        support.until(
            lambda: run(ctr, ["test", "-e", "/run/quiesce/sandbox.json"])[0] == 0,
            15,
            "the init never published sandbox.json",
        )
        rc, out = run(ctr, [*LAUNCH, "bash", "-c", WRAP])
        assert rc == 0, out
        cmd = "echo second command"
        if form == "argv":
            # The switch's launch now: quiesce is what the engine starts.
            argv = [*LAUNCH, "bash", "-c", cmd]
        else:
            # Before: the launch handed to Harbor as a string for the image's `bash -c`.
            argv = ["bash", "-c", "exec " + " ".join(LAUNCH) + f" bash -c '{cmd}'"]
        rc, out = run(ctr, argv)
        assert rc == 0, out
        support.until(lambda: daemons(client, ctr) >= 1, 10, "the wrapper left no daemon")
        r = freeze(Container.docker(str(ctr.id), binary=FIXED, client=client), "wayin", 30)
        assert r.quiescent, r
        time.sleep(0.2)
        if form == "argv":
            # Tagged with the launch: the freeze killed it before it signed.
            assert daemons(client, ctr) == 0, "the daemon outlived a quiescent freeze"
            assert r.killed >= 1, r
        else:
            # What the switch did before: the first bash untagged root, its daemon alive
            # beside a genuine marker (the one the tagged bash left was killed).
            assert daemons(client, ctr) == 1


def test_run_verifier_checks_the_marker_against_the_kept_key_before_anything_runs(
    client: docker.DockerClient,
) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from quiesce_harness import run_verifier
    from quiesce_harness.errors import MarkerInvalid

    with support.box(client) as b:
        c = Container.docker(b.id, client=client)
        # Read before the agent's first command, and kept outside.
        kept = c.read_file("/run/quiesce/signing.pub").decode()
        r = freeze(c, "kept-1", 30)
        assert r.quiescent and r.marker, r
        other = (
            Ed25519PrivateKey.generate()
            .public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        # The key a rewritten state dir would hold: refused here, and nothing ran inside.
        with pytest.raises(MarkerInvalid) as e:
            run_verifier(c, "touch /tmp/ran", r.nonce, public_key=other, marker=r.marker)
        assert e.value.check == "key", e.value
        with pytest.raises(MarkerInvalid):
            run_verifier(c, "touch /tmp/ran", r.nonce, public_key=kept)
        assert c.exec(["test", "-e", "/tmp/ran"]).returncode == 1
        done = run_verifier(c, "touch /tmp/ran", r.nonce, public_key=kept, marker=r.marker)
        assert done.returncode == 0, done
        assert c.exec(["test", "-e", "/tmp/ran"]).returncode == 0


# The engine's own mount of an injected init, and what a sandbox user with a setuid-root helper
# (no no-new-privileges: setuid binaries work) makes of it: a "docker-init" whose verify runs
# the tests without a check.
FAKE_VERIFY = (
    '#!/bin/sh\nwhile [ "$#" -gt 0 ] && [ "$1" != -- ]; do shift; done; shift; exec "$@"\n'
)
# /sbin is a link to usr/sbin in the image (a directory of a lower overlay layer does not
# rename: EXDEV); the link in / does.
SWAP_SBIN = "/usr/local/bin/rootbash -p -c " + shlex.quote(
    "mv /sbin /sbin.link && mkdir /sbin && "
    f"printf %s {shlex.quote(FAKE_VERIFY)} > /sbin/docker-init && chmod 755 /sbin/docker-init"
)


def test_an_injected_init_is_reached_through_the_second_mount_not_the_engines_path(
    client: docker.DockerClient,
) -> None:
    # As `docker run --init` with quiesce as the daemon's init-path mounts and starts it (at
    # /sbin/docker-init, `PATH -- CMD`, configured by the environment), plus the recipe's second
    # read-only bind of the same file at /quiesce; Docker's default: no no-new-privileges.
    bin_ = str(support.need_binary())
    ctr = support.run_container(
        client,
        "debian:bookworm-slim",
        ["--", "sleep", "infinity"],
        kind="wayin-init-",
        no_new_privileges=False,
        entrypoint=["/sbin/docker-init"],
        environment={"QUIESCE_SANDBOX_USER": "4242"},
        volumes=[f"{bin_}:/sbin/docker-init:ro", f"{bin_}:{FIXED}:ro"],
    )
    try:
        support.until(
            lambda: run(ctr, ["test", "-e", "/run/quiesce/sandbox.json"])[0] == 0,
            15,
            "the init never published sandbox.json",
        )
        rc, out = sh(
            ctr, "cp /bin/bash /usr/local/bin/rootbash && chmod 4755 /usr/local/bin/rootbash"
        )
        assert rc == 0, out
        rc, out = sh(ctr, SWAP_SBIN, user="4242")
        assert rc == 0, out
        r = freeze(Container.docker(str(ctr.id), binary=FIXED, client=client), "inj-1", 30)
        assert r.quiescent, r
        tests = ["verify", "--nonce", "inj-1", "--", "echo", "scored"]
        # The engine's path leads to the agent's file: the tests ran with no check.
        rc, out = run(ctr, ["/sbin/docker-init", *tests])
        assert (rc, out.strip()) == (0, "scored"), out
        # The second mount: the real gate, which refuses a marker signed where setuid worked.
        rc, out = run(ctr, [FIXED, *tests])
        assert rc == 18 and "scored" not in out, out
    finally:
        with contextlib.suppress(docker.errors.DockerException):
            ctr.remove(force=True)


# An image's environment that leads every root exec to the agent's files, as a workspace venv
# does (PATH) and as a shell startup file there would (BASH_ENV, which every non-interactive
# bash sources first): each runs as root would leave /tmp/ran-ROOT-<what>.
AGENTS_ENV = {
    "PATH": "/workspace/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "BASH_ENV": "/workspace/.bashenv",
}
AGENTS_FILES = (
    "mkdir -p /workspace/bin && "
    "echo 'touch /tmp/ran-$(id -u)-bashenv' > /workspace/.bashenv && "
    "printf '#!/bin/sh\\ntouch /tmp/ran-$(/usr/bin/id -u)-sh\\nexec /bin/sh \"$@\"\\n' "
    "> /workspace/bin/sh && chmod 755 /workspace/bin/sh"
)


def test_the_kit_s_root_execs_run_nothing_the_image_s_environment_leads_to(
    client: docker.DockerClient,
) -> None:
    from quiesce_harness import run_verifier

    with support.box(client, environment=AGENTS_ENV) as b:
        rc, out = sh(b.ctr, AGENTS_FILES, user="agent")
        assert rc == 0, out
        # The control: an exec that inherits the image's environment sources the agent's file.
        rc, out = run(b.ctr, ["/bin/bash", "-c", "true"])
        assert rc == 0 and run(b.ctr, ["ls", "/tmp"])[1].split() == ["ran-0-bashenv"], out
        run(b.ctr, ["rm", "-f", "/tmp/ran-0-bashenv"])
        c = Container.docker(b.id, client=client)
        # The kit's execs: a bash of its own, a bare name, the freeze client and the gate.
        assert c.exec(["/bin/bash", "-c", "true"]).returncode == 0
        assert c.exec(["bash", "-c", "true"]).returncode == 0
        r = freeze(c, "env-1", 30)
        assert r.quiescent, r
        done = run_verifier(c, "/bin/echo scored", r.nonce)
        assert (done.returncode, done.stdout.strip()) == (0, b"scored"), done
        assert run(b.ctr, ["ls", "/tmp"])[1].split() == [], "a root exec read the agent's file"
