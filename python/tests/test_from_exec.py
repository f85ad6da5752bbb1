"""Container.from_exec: a sandbox reached only through the caller's functions, sync or async
(no engine: the functions here answer as a sandbox would; the real ones are in test_sidecar)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from quiesce_harness import Container, SidecarRefused, Unreachable, freeze, run_verifier
from quiesce_harness.sidecar import Sidecar, _check_elf, _check_guards, _mount_options, _start_line

Call = tuple[list[str], str | None, bytes | None]


class Sandbox:
    """Records each exec and answers: `cat F` from files, `quiesce freeze` with a status."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.files: dict[str, bytes] = {"/etc/hostname": b"box\n"}

    def answer(
        self, argv: Sequence[str], user: str | None, stdin: bytes | None
    ) -> tuple[int, bytes, bytes]:
        argv = list(argv)
        if argv[:2] == ["/bin/sh", "-c"] and argv[2].startswith("PATH="):
            argv = argv[4:]  # the kit's bare command, run with its fixed PATH
        elif argv[:2] == ["/bin/sh", "-c"] and argv[2].startswith("kill "):
            argv = ["kill", "-s", *argv[4:]]  # the shell's builtin kill
        if argv[:2] == ["/bin/sh", "-c"] and argv[3] == "quiesce-resolve":
            return 0, b"path /usr/sbin/quiesce\n", b""
        self.calls.append((argv, user, stdin))
        if argv[0] == "cat":
            if argv[1] in self.files:
                return 0, self.files[argv[1]], b""
            return 1, b"", f"cat: {argv[1]}: No such file or directory".encode()
        if len(argv) > 1 and argv[1] == "freeze":
            nonce = argv[argv.index("--nonce") + 1]
            st = {"state": "quiescent", "id": "f1", "nonce": nonce, "killed": 3, "marker": None}
            return 0, json.dumps(st).encode(), b""
        if argv[0] == "missing":
            return 126, b"", b'OCI runtime exec failed: exec: "missing": executable file not found'
        if argv[0] == "refused":
            return 126, b"", b"OCI runtime exec failed: read init-p: connection reset by peer"
        return 0, b"", b""

    def sync(
        self, argv: Sequence[str], *, user: str | None = None, stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        return self.answer(argv, user, stdin)

    async def async_(
        self, argv: Sequence[str], *, user: str | None = None, stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        await asyncio.sleep(0)
        return self.answer(argv, user, stdin)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_every_method_through_the_callers_exec(kind: str) -> None:
    s = Sandbox()
    c = Container.from_exec(s.sync if kind == "sync" else s.async_, name="b1")
    r = c.exec(["true"], user="agent")
    assert (r.returncode, r.started) == (0, True) and s.calls[-1][1] == "agent"
    assert c.read_file("/etc/hostname") == b"box\n"
    with pytest.raises(Unreachable, match="cannot read /nope"):
        c.read_file("/nope")
    # The engine's answers are read as for Docker: missing, and not started.
    assert c.exec(["missing"]).returncode == 127
    assert not c.exec(["refused"]).started
    got = freeze(c, nonce="n-1")
    assert (got.state, got.nonce, got.killed) == ("quiescent", "n-1", 3)
    assert s.calls[-1][0][:2] == ["/usr/sbin/quiesce", "freeze"]
    with pytest.raises(Unreachable, match="no engine record"):
        c.inspect()
    assert c.is_running()
    # No env= in the function: run_verifier sets none (as with kubectl).
    done = run_verifier(c, ["true"], nonce="n-1")
    assert done.returncode == 0 and s.calls[-1][0][:2] == ["/usr/sbin/quiesce", "verify"]


def test_run_verifier_refuses_a_marker_without_its_nonce_before_any_exec() -> None:
    # Without the nonce the replay check is skipped: a genuine marker of an earlier freeze of
    # this container would pass the kept key.
    from quiesce_harness.errors import MarkerInvalid

    s = Sandbox()
    c = Container.from_exec(s.sync, binary="/sbin/quiesce")
    for given in ({"marker": "m"}, {"public_key": "k", "marker": "m"}, {"public_key": "k"}):
        with pytest.raises(MarkerInvalid) as e:
            run_verifier(c, ["true"], **given)  # type: ignore[arg-type]
        assert e.value.check == "nonce", e.value
    assert s.calls == []


def test_an_exec_function_that_takes_env_gets_run_verifiers() -> None:
    seen: list[Mapping[str, str] | None] = []

    def ex(
        argv: Sequence[str],
        *,
        user: str | None = None,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
    ) -> tuple[int, bytes, bytes]:
        seen.append(env)
        return 0, b"", b""

    c = Container.from_exec(ex, state_dir="/run/q2", binary="/sbin/quiesce")
    run_verifier(c, ["true"])
    assert seen == [{"QUIESCE_ACCEPT_PRIVILEGE_ESCALATION": "0"}]
    # A state dir other than the default is named to the client.
    assert c.quiesce("verify", "--", "x") == [
        "/sbin/quiesce",
        "verify",
        "--state-dir",
        "/run/q2",
        "--",
        "x",
    ]
    with pytest.raises(ValueError, match="takes no env"):
        Container.from_exec(Sandbox().sync).exec(["true"], env={"A": "1"})


def test_an_async_exec_from_inside_a_running_loop() -> None:
    # Called from async code without to_thread: the private loop runs it, this loop waits.
    s = Sandbox()
    c = Container.from_exec(s.async_)

    async def main() -> bytes:
        return c.read_file("/etc/hostname")

    assert asyncio.run(main()) == b"box\n"


def test_an_exec_bound_to_the_callers_loop() -> None:
    s = Sandbox()
    loop_threads: list[int] = []

    async def ex(
        argv: Sequence[str], *, user: str | None = None, stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        loop_threads.append(threading.get_ident())
        return s.answer(argv, user, stdin)

    async def main() -> None:
        c = Container.from_exec(ex, loop=asyncio.get_running_loop())
        # Through to_thread, the exec runs on this very loop...
        assert await asyncio.to_thread(c.read_file, "/etc/hostname") == b"box\n"
        assert loop_threads == [threading.get_ident()]
        # ...and called on the loop itself, it would wait for itself: refused, saying how.
        with pytest.raises(RuntimeError, match=r"asyncio\.to_thread"):
            c.read_file("/etc/hostname")

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_exec_that_never_answers_is_bounded(kind: str) -> None:
    def slow(
        argv: Sequence[str], *, user: str | None = None, stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        time.sleep(5)
        return 0, b"", b""

    async def slow_async(
        argv: Sequence[str], *, user: str | None = None, stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        await asyncio.sleep(5)
        return 0, b"", b""

    c = Container.from_exec(slow if kind == "sync" else slow_async)
    t = time.monotonic()
    with pytest.raises(Unreachable, match="no answer"):
        c.exec(["true"], timeout=0.2)
    assert time.monotonic() - t < 2.5


def test_what_the_functions_raise_or_return_wrongly() -> None:
    def broken(
        argv: Sequence[str], *, user: str | None = None, stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        raise ConnectionError("provider gone")

    with pytest.raises(Unreachable, match="ConnectionError: provider gone"):
        Container.from_exec(broken).exec(["true"])

    def wrong(
        argv: Sequence[str], *, user: str | None = None, stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        return "ok"  # type: ignore[return-value]

    with pytest.raises(TypeError, match=r"return \(exit_code, stdout_bytes, stderr_bytes\)"):
        Container.from_exec(wrong).exec(["true"])


def test_signal_and_upload(tmp_path: Path) -> None:
    s = Sandbox()
    kills: list[str] = []
    uploads: list[tuple[str, str]] = []

    async def kill(sig: str) -> None:
        kills.append(sig)

    c = Container.from_exec(s.sync, lambda a, b: uploads.append((a, b)), kill)
    c.signal()
    assert kills == ["USR1"]
    f = tmp_path / "f"
    f.write_bytes(b"data")
    c.upload(f, "/run/x")
    assert uploads == [(str(f), "/run/x")]
    # Without kill_fn, PID 1 is signalled through an exec of kill; without upload_fn, the file
    # goes through `sh -c 'cat > PATH'` on stdin, both as root.
    bare = Container.from_exec(s.sync)
    bare.signal("TERM")
    assert s.calls[-1][:2] == (["kill", "-s", "TERM", "1"], "0")
    bare.upload(f, "/run/y")
    assert s.calls[-1] == (["sh", "-c", 'cat > "$1"', "sh", "/run/y"], "0", b"data")
    # Beside a sidecar, the signal is the sidecar's, never PID 1's (nor kill_fn's).
    from dataclasses import replace

    replace(c, sidecar_pid=77).signal()
    assert kills == ["USR1"] and s.calls[-1][0] == ["kill", "-s", "USR1", "77"]

    # No exec can start and no kill_fn: Unreachable, naming the fix.
    def refused(
        argv: Sequence[str], *, user: str | None = None, stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        return 126, b"", b"OCI runtime exec failed: read init-p"

    refusing = Container.from_exec(refused)
    with pytest.raises(Unreachable, match="kill_fn"):
        refusing.signal()


KEY = (
    "-----BEGIN PUBLIC KEY-----\n"
    "MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n"
    "-----END PUBLIC KEY-----\n"
)


def test_the_start_line_is_read_strictly() -> None:
    good = {
        "sidecar": "quiesce", "version": "0.1.0", "pid": 12, "start_time": 4567,
        "state_dir": "/run/quiesce", "public_key": KEY, "sandbox_uids": [4242],
        "lineage": True, "started": True,
    }  # fmt: skip
    assert _start_line(json.dumps(good))["pid"] == 12
    for change, why in (
        ({"sidecar": "other"}, "not a quiesce sidecar"),
        ({"pid": "12"}, "no pid"),
        ({"pid": 1}, "names pid 1"),
        ({"started": 1}, "no started"),
        ({"sandbox_uids": ["x"]}, "not all integers"),
        ({"public_key": KEY.replace("MCow", "MCox")}, "no Ed25519 key"),
    ):
        with pytest.raises(Unreachable, match=why):
            _start_line(json.dumps({**good, **change}))
    with pytest.raises(Unreachable, match="not JSON"):
        _start_line("quiesce: refused")


def test_a_running_sidecar_for_another_uid_is_refused() -> None:
    sc = Sidecar(
        container=Container.from_exec(Sandbox().sync), public_key=KEY, pid=12, start_time=4567,
        state_dir="/run/quiesce", version="0.1.0", started=False, binary="/q",
        sandbox_uids=(4242,), lineage=True, line="{}",
    )  # fmt: skip
    _check_guards(sc, "4242")
    _check_guards(sc, "agent")  # a name: the sidecar compares it, not the kit
    with pytest.raises(SidecarRefused, match=r"for sandbox UIDs \[4242\], not 4243"):
        _check_guards(sc, "4243")
    # Several users: every UID given, in any order, and no other.
    two = replace(sc, sandbox_uids=(4242, 4243))
    _check_guards(two, ["4243", "4242"])
    _check_guards(two, ("4242", "agent"))
    for fewer_or_more in (["4242"], "4242", ["4242", "4243", "4244"]):
        with pytest.raises(SidecarRefused, match=r"for sandbox UIDs \[4242, 4243\], not 4242"):
            _check_guards(two, fewer_or_more)


def test_the_install_checks(tmp_path: Path) -> None:
    info = (
        "22 1 0:21 / / rw,relatime - overlay overlay rw\n"
        "23 22 0:22 / /run rw,nosuid,nodev,noexec - tmpfs tmpfs rw\n"
        "24 22 0:23 / /run/quiesce\\040bin rw - tmpfs tmpfs rw\n"
    )
    assert _mount_options(info, "/run/quiesce-bin") == (
        "/run",
        {"rw", "nosuid", "nodev", "noexec"},
        "tmpfs",
    )
    assert _mount_options(info, "/run/quiesce bin/x") == ("/run/quiesce bin", {"rw"}, "tmpfs")
    assert _mount_options(info, "/usr/local") == ("/", {"rw", "relatime"}, "overlay")
    # Optional fields before the separator (shared:N, master:N) are not the type.
    vol = "25 22 254:0 /v/_data /opt/q rw,relatime master:1 - ext4 /dev/vda rw\n"
    assert _mount_options(info + vol, "/opt/q/quiesce") == ("/opt/q", {"rw", "relatime"}, "ext4")
    f = tmp_path / "q"
    f.write_bytes(b"\x7fELF" + bytes(14) + (183).to_bytes(2, "little"))
    from quiesce_harness import InstallFailed

    with pytest.raises(InstallFailed, match="built for aarch64, the sandbox is x86_64"):
        _check_elf(f, f.read_bytes(), "x86_64")
    with pytest.raises(InstallFailed, match="not an ELF"):
        _check_elf(f, b"#!/bin/sh\n", "x86_64")


def test_a_freeze_exec_killed_before_it_answered_is_asked_again() -> None:
    # As a runtime answers an exec it could not finish joining to a busy container: SIGKILLed,
    # nothing printed. Asked again within the deadline; twice at most.
    s = Sandbox()
    killed = [2]

    def ex(
        argv: Sequence[str], *, user: str | None = None, stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        if killed[0] > 0 and "freeze" in argv:
            killed[0] -= 1
            s.calls.append((list(argv), user, stdin))
            return 137, b"", b""
        return s.answer(argv, user, stdin)

    r = freeze(Container.from_exec(ex), nonce="n-k")
    assert r.state == "quiescent" and len(s.calls) == 3
    killed[0] = 3
    with pytest.raises(Unreachable, match="exited 137"):
        freeze(Container.from_exec(ex), nonce="n-k")
