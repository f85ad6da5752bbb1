"""`python -m quiesce_harness verify` over files the harness kept: what it prints and exits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quiesce_harness.cli import main

from conftest import Marker


def _kept(tmp_path: Path, m: Marker) -> tuple[str, str]:
    jws, pem = tmp_path / "quiescence.jws", tmp_path / "signing.pub"
    jws.write_text(m.jws)
    pem.write_bytes(m.public_pem)
    return str(jws), str(pem)


def test_a_kept_marker_and_key_verify(
    marker: Marker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jws, pem = _kept(tmp_path, marker)
    argv = ["verify", "--marker", jws, "--public-key", pem, "--nonce", marker.nonce]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] is True and out["nonce"] == marker.nonce


def test_another_nonce_is_refused_with_its_check(
    marker: Marker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jws, pem = _kept(tmp_path, marker)
    assert main(["verify", "--marker", jws, "--public-key", pem, "--nonce", "other"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] is False and out["check"] == "nonce"


@pytest.mark.parametrize("missing", ["--marker", "--public-key"])
def test_neither_a_file_nor_a_container_is_a_usage_error(
    marker: Marker, tmp_path: Path, capsys: pytest.CaptureFixture[str], missing: str
) -> None:
    jws, pem = _kept(tmp_path, marker)
    argv = ["verify", *(["--public-key", pem] if missing == "--marker" else ["--marker", jws])]
    assert main(argv) == 2
    assert f"give {missing} FILE or a container" in capsys.readouterr().err
