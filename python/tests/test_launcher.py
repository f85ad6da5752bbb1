"""The `quiesce` console script: the packaged binary for this machine, exec'd in its place, or
one line and exit 2 where there is none. The real binaries are run by scripts/release-check."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from quiesce_harness import binary, launcher

X86 = "quiesce-x86_64-unknown-linux-musl"
ARM = "quiesce-aarch64-unknown-linux-musl"

# A stand-in binary: prints its arguments and pid, exits 7. Run through a Python launcher that
# points binary_path at its directory.
FAKE = '#!/bin/sh\necho "$0|$*|$$"\nexit 7\n'
RUN = (
    "import os, pathlib, sys\n"
    "from quiesce_harness import binary, launcher\n"
    "binary.BIN_DIR = pathlib.Path(os.environ['FAKE_BIN_DIR'])\n"
    "print(os.getpid(), flush=True)\n"
    "sys.exit(launcher.main(['quiesce', *sys.argv[1:]]))\n"
)


def on(monkeypatch: pytest.MonkeyPatch, system: str, machine: str) -> None:
    monkeypatch.setattr(platform, "system", lambda: system)
    monkeypatch.setattr(platform, "machine", lambda: machine)


def fake_bin_dir(d: Path, mode: int = 0o755) -> Path:
    for name in (X86, ARM):
        (d / name).write_text(FAKE)
        (d / name).chmod(mode)
    return d


def run_launcher(bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FAKE_BIN_DIR": str(bin_dir)}
    return subprocess.run(
        [sys.executable, "-c", RUN, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(("system", "machine"), [("Darwin", "arm64"), ("Windows", "AMD64")])
def test_another_os_is_refused_in_one_line_naming_binary_path(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], system: str, machine: str
) -> None:
    on(monkeypatch, system, machine)
    assert launcher.main(["quiesce", "--version"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"this is {system} on {machine}" in err
    assert 'binary_path("x86_64") or binary_path("aarch64")' in err


def test_another_linux_machine_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    on(monkeypatch, "Linux", "riscv64")
    assert launcher.main(["quiesce"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "'riscv64'" in err and "x86_64 and aarch64 only" in err and "binary_path(" in err


def test_a_source_checkout_says_to_install_the_wheel(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    on(monkeypatch, "Linux", "x86_64")
    assert not binary.BIN_DIR.exists()
    assert launcher.main(["quiesce", "--version"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "install the wheel" in err


@pytest.mark.parametrize(("machine", "name"), [("x86_64", X86), ("amd64", X86), ("aarch64", ARM)])
def test_the_hosts_binary_is_execd_with_the_same_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, machine: str, name: str
) -> None:
    on(monkeypatch, "Linux", machine)
    monkeypatch.setattr(binary, "BIN_DIR", fake_bin_dir(tmp_path))
    calls: list[tuple[object, list[str]]] = []

    def execv(path: object, args: list[str]) -> None:
        calls.append((path, args))
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", execv)
    with pytest.raises(SystemExit):
        launcher.main(["/venv/bin/quiesce", "freeze", "--wait", "--nonce", "n 1"])
    assert calls == [(tmp_path / name, ["/venv/bin/quiesce", "freeze", "--wait", "--nonce", "n 1"])]


@pytest.mark.skipif(platform.system() != "Linux", reason="execs a Linux binary")
def test_the_binary_replaces_the_launcher_and_its_status_is_the_commands(tmp_path: Path) -> None:
    if binary._TARGETS.get(platform.machine().lower()) is None:
        pytest.fail(f"this test runs on x86_64 or aarch64, not {platform.machine()}")
    r = run_launcher(fake_bin_dir(tmp_path), "verify", "--", "a b")
    assert r.returncode == 7, r.stderr
    launcher_pid, line = r.stdout.splitlines()
    script, args, pid = line.split("|")
    # The same process (execv, not a child) and the arguments as given. (A script's $0 is its
    # path whatever argv[0] was: argv[0] is checked above, through execv's arguments.)
    assert (Path(script).name, args, pid) == (
        X86 if "x86" in platform.machine() else ARM,
        "verify -- a b",
        launcher_pid,
    )


def test_a_binary_that_cannot_run_is_one_line_and_126(tmp_path: Path) -> None:
    r = run_launcher(fake_bin_dir(tmp_path, mode=0o644), "--version")
    assert r.returncode == 126
    assert r.stderr.count("\n") == 1 and "cannot run" in r.stderr and "reinstall" in r.stderr
