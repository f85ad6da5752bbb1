"""`pip install quiesce` without its extras: the `quiesce` command and the kit's import work,
and what needs the Docker SDK or cryptography says in one line which extra to install.

Each case runs in a Python of its own in which `docker` and `cryptography` cannot be imported
(None in sys.modules, as for a distribution that is not installed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from quiesce_harness.extras import MissingExtra, need

from conftest import Marker

BLOCK = "import sys\nfor m in ('docker', 'cryptography'):\n    sys.modules[m] = None\n"


def _run(code: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + code, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_kit_imports_without_its_extras() -> None:
    # What the `quiesce` command (quiesce_harness.launcher) and `import quiesce_harness` load.
    r = _run("import quiesce_harness, quiesce_harness.launcher, quiesce_harness.cli")
    assert r.returncode == 0, r.stderr


def test_a_marker_check_without_cryptography_names_the_extra(
    marker: Marker, tmp_path: Path
) -> None:
    jws, pem = tmp_path / "quiescence.jws", tmp_path / "signing.pub"
    jws.write_text(marker.jws)
    pem.write_bytes(marker.public_pem)
    code = "from quiesce_harness.cli import main\nsys.exit(main(sys.argv[1:]))"
    r = _run(code, "verify", "--marker", str(jws), "--public-key", str(pem))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "pip install 'quiesce[crypto]'" in r.stderr, r.stderr


def test_a_docker_container_without_the_sdk_names_the_extra() -> None:
    code = "from quiesce_harness.cli import main\nsys.exit(main(sys.argv[1:]))"
    r = _run(code, "freeze", "--docker", "no-such-container", "--timeout", "5")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "pip install 'quiesce[docker]'" in r.stderr, r.stderr


def test_an_import_error_inside_an_installed_extra_is_not_called_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A broken install of the package (a dependency of its own gone) is its own error.
    (tmp_path / "qhk_broken_pkg.py").write_text("import qhk_absent_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError) as e:
        need("qhk_broken_pkg", "docker", "this test")
    assert not isinstance(e.value, MissingExtra) and e.value.name == "qhk_absent_dependency"
    with pytest.raises(MissingExtra, match=r"pip install 'quiesce\[docker\]'"):
        need("qhk_absent_package", "docker", "this test")
