"""binary_path: which packaged binary each architecture name gets, and its two refusals."""

from __future__ import annotations

import platform
import re
from pathlib import Path

import pytest

import quiesce_harness
from quiesce_harness import binary

from support import REPO

X86 = "quiesce-x86_64-unknown-linux-musl"
ARM = "quiesce-aarch64-unknown-linux-musl"


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An install's bin/ with both binaries (empty files: only the names are looked at)."""
    for name in (X86, ARM):
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setattr(binary, "BIN_DIR", tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("arch", "name"),
    [
        ("x86_64", X86),
        ("amd64", X86),
        ("AMD64", X86),
        ("aarch64", ARM),
        ("arm64", ARM),
        ("ARM64", ARM),
    ],
)
def test_each_name_of_an_architecture_gets_its_binary(bin_dir: Path, arch: str, name: str) -> None:
    assert quiesce_harness.binary_path(arch) == bin_dir / name


@pytest.mark.parametrize(("machine", "name"), [("x86_64", X86), ("aarch64", ARM), ("arm64", ARM)])
def test_none_is_the_hosts_machine(
    bin_dir: Path, monkeypatch: pytest.MonkeyPatch, machine: str, name: str
) -> None:
    monkeypatch.setattr(platform, "machine", lambda: machine)
    assert quiesce_harness.binary_path() == bin_dir / name


@pytest.mark.parametrize("arch", ["riscv64", "i686", "armv7l", "", "x86-64"])
def test_another_architecture_is_refused_naming_the_two(bin_dir: Path, arch: str) -> None:
    with pytest.raises(ValueError, match=r"x86_64 \(amd64\) and aarch64 \(arm64\)") as e:
        quiesce_harness.binary_path(arch)
    assert repr(arch) in str(e.value)


def test_an_unknown_host_machine_is_refused(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "ppc64le")
    with pytest.raises(ValueError, match="this host's machine 'ppc64le'"):
        quiesce_harness.binary_path()


def test_a_source_checkout_has_no_binaries_and_says_to_install_the_wheel() -> None:
    # The dev install python/test runs from is python/src: no bin/ beside the package.
    assert not binary.BIN_DIR.exists()
    for arch in ("x86_64", "arm64", None):
        with pytest.raises(FileNotFoundError, match=r"install the wheel .* dist/") as e:
            quiesce_harness.binary_path(arch)
        assert "\n" not in str(e.value)


def test_a_bin_dir_with_one_binary_serves_only_that_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / X86).write_bytes(b"")
    monkeypatch.setattr(binary, "BIN_DIR", tmp_path)
    assert quiesce_harness.binary_path("amd64") == tmp_path / X86
    with pytest.raises(FileNotFoundError, match=ARM):
        quiesce_harness.binary_path("aarch64")


def test_the_kit_carries_the_release_version() -> None:
    # scripts/release refuses to build a wheel whose kit says another version than the binary.
    cargo = (REPO / "Cargo.toml").read_text()
    m = re.search(r'^version = "([^"]+)"$', cargo, re.MULTILINE)
    assert m is not None, "Cargo.toml has no version line"
    assert quiesce_harness.__version__ == m.group(1)
