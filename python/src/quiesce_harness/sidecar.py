"""start_sidecar(): quiesce beside a container's own PID 1, put there and started by the kit.

    from quiesce_harness import Container, freeze, run_verifier, start_sidecar, verify_marker

    box = Container.from_exec(my_exec)          # or Container.docker(...), .podman(...), ...
    sc = start_sidecar(box, "agent")            # before the agent starts
    ...                                         # the agent works (launched through
                                                #   `sc.binary exec --user agent -- ...`)
    r = freeze(sc.container)                    # raises FreezeFailed / Unreachable
    verify_marker(r.marker, sc.public_key, nonce=r.nonce, container=sc.container)
    run_verifier(sc.container, ["./run-tests.sh"], nonce=r.nonce)

`sc.container` is the container given, pointed at the sidecar: its binary path in the sandbox,
its state dir and its pid. freeze(), run_verifier() and verify_marker() take it as they take
any Container, so a harness that already calls them changes only which Container it passes.
`sc.public_key` is the key the sidecar printed when it started, before the agent ran: check
the marker against it, never against a `signing.pub` read back from the sandbox later.

The binary goes to `install_path`, by default /run/quiesce-bin/quiesce: a directory of the
kit's own (no file of the image is replaced), root's and 0755 (nothing in it is secret, and
only root may write there), usually on the container's writable layer. Every directory from
it up to / must be root's and writable by root alone, else the sandbox user could swap the
binary between its copy and its run: such a path is refused (InstallFailed). The path is
resolved once (`pwd -P` of its directory), checked, and from then on only the resolved one is
used (the copy, its run, the sidecar's start, `sc.binary` and `sc.container`'s binary), so a
link on the way that the sandbox user planted and re-points later redirects nothing; the state
dir likewise. A copy that is already there with the same sha256, root's and no link, is
kept. The copy goes in through the container's own (Docker's archive API, which reaches no
tmpfs: there the start is refused, naming a volume; `podman cp`, a from_exec upload_fn),
else through an exec of `sh -c 'cat > PATH'` with the file on stdin; it is checked (sha256,
or the size where the image has no sha256sum) and run once with --version before the sidecar
starts. The sandbox needs /bin/sh, mkdir, stat, chmod, chown and mv for that (Debian's and
BusyBox's do), found through the fixed PATH the install script sets (SAFE_PATH), never the
image's: every exec the kit makes here has an absolute argv[0] and runs nothing of a directory
the sandbox user owns.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .binary import binary_path
from .container import (
    DEFAULT_STATE_DIR,
    SAFE_PATH,
    Container,
    ExecResult,
    sandbox_user_args,
    user_list,
)
from .errors import InstallFailed, MarkerInvalid, SidecarRefused, Unreachable
from .marker import load_public_key

DEFAULT_INSTALL_PATH = "/run/quiesce-bin/quiesce"
_WRITABLE_FIX = (
    "the kit's execs must run as root there, and on a read-only root file system "
    "install_path= must name a writable, exec-able mount"
)
# What `uname -m` says, as the packaged binaries are named.
_ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
# ELF e_machine of each.
_ELF_MACHINE = {62: "x86_64", 183: "aarch64"}

# Run as root with the install path, then "check" or "place" (or a state dir, then "where").
# check: refuse the directory unless it (made where missing, and only under a safe one) and
# every directory above it (links resolved) are root's and writable by root alone; print
# `writable yes` where this user can write in it, `dir REAL` (links resolved: the kit uses no
# other from then on) and, for a file already there that is no link and root's alone to write,
# `have SUM`. place: move the uploaded `.NAME.new` into place as a copy root makes (root's,
# 0755), print `have SUM` and `ran CODE` of its --version. where: the same check of the path's
# deepest existing directory, making nothing; print `dir REAL`. SUM is `sha256:HEX`, or
# `size:N` where there is no sha256sum.
_SCRIPT = (
    f"PATH={SAFE_PATH}; export PATH\n"
    + r"""
umask 022
f=$1
d=${f%/*}
[ -n "$d" ] || d=/
sum() {
    if command -v sha256sum >/dev/null 2>&1; then
        s=$(sha256sum "$1") || exit 3
        set -- $s
        echo "have sha256:$1"
    else
        s=$(wc -c < "$1") || exit 3
        set -- $s
        echo "have size:$1"
    fi
}
safe() {  # $1 and every directory above it: root's, writable by root alone
    a=$1
    while :; do
        s=$(stat -c '%u %a' "$a") || exit 3
        set -- $s
        case $2 in
        *[2367]? | *[2367]) echo "unsafe $a mode $2"; exit 4 ;;
        esac
        [ "$1" = 0 ] || { echo "unsafe $a owner $1"; exit 4; }
        [ "$a" = / ] && break
        a=${a%/*}
        [ -n "$a" ] || a=/
    done
}
case $2 in
check)
    e=$d
    while [ ! -e "$e" ]; do e=${e%/*}; [ -n "$e" ] || e=/; done
    safe "$(cd "$e" && pwd -P)"
    mkdir -p "$d" || exit 3
    real=$(cd "$d" && pwd -P) || exit 3
    safe "$real"
    # From here on only the resolved path: no link of the given one is followed again.
    f=${real%/}/${f##*/}
    p=${real%/}/.${f##*/}.probe
    if (: > "$p") 2>/dev/null; then rm -f "$p"; echo "writable yes"; fi
    echo "dir $real"
    # A file there counts only when it is no link and root's alone to write; else it is
    # replaced by a copy of root's.
    if [ -f "$f" ] && [ ! -L "$f" ]; then
        s=$(stat -c '%u %a' "$f") || exit 3
        set -- $s
        case $1:$2 in
        0:*[2367]? | 0:*[2367]) ;;
        0:*) sum "$f" ;;
        esac
    fi
    ;;
place)
    t=$d/.${f##*/}.new
    n=$d/.${f##*/}.$$
    # The upload may be another user's (podman cp gives it the container's user), who can keep
    # it open for writing through any chown or move: root copies it into a fresh inode of its
    # own, which no descriptor opened before reaches, and checks and runs that copy alone.
    rm -f "$n" && (umask 077 && set -C && cat "$t" > "$n") && rm -f "$t" \
        && chmod 0755 "$n" && mv -f "$n" "$f" || { rm -f "$n"; exit 3; }
    sum "$f"
    "$f" --version >/dev/null
    echo "ran $?"
    ;;
where)
    # $1 itself, made by no one here: its deepest existing directory, resolved and checked as
    # above, and the rest of the path below it, which only root can make there.
    e=$f
    while [ ! -e "$e" ]; do e=${e%/*}; [ -n "$e" ] || e=/; done
    real=$(cd "$e" && pwd -P) || exit 3
    safe "$real"
    rest=${f#"$e"}
    rest=${rest#/}
    if [ -n "$rest" ]; then echo "dir ${real%/}/$rest"; else echo "dir $real"; fi
    ;;
esac
"""
)


@dataclass(frozen=True)
class Sidecar:
    """A running quiesce sidecar, as its start line described it.

    `container` is the container it runs in, pointed at it (binary, state dir, pid): pass it
    to freeze(), run_verifier() and verify_marker(). `public_key` is the PEM key its markers
    are signed with, as printed at its start. `started` is False when one was already running
    (a second start_sidecar changes nothing and returns the running one). `line` is the JSON
    line it printed, as printed.
    """

    container: Container
    public_key: str
    pid: int
    start_time: int
    state_dir: str
    version: str
    started: bool
    binary: str
    sandbox_uids: tuple[int, ...]
    lineage: bool
    line: str


def start_sidecar(
    container: Container,
    sandbox_user: str | Sequence[str],
    *,
    state_dir: str = DEFAULT_STATE_DIR,
    binary: str | Path | None = None,
    arch: str | None = None,
    install_path: str = DEFAULT_INSTALL_PATH,
    timeout: float = 60.0,
    extra_args: Sequence[str] = (),
    user: str | None = None,
) -> Sidecar:
    """Put quiesce into the sandbox and start it as a sidecar for `sandbox_user`; return it.

    `sandbox_user` is one user (a name or a UID) or a sequence of them: the sidecar guards the
    processes of every one (ValueError for an empty sequence).

    `binary` is the local quiesce binary to put in (default: the kit's packaged one for the
    sandbox's architecture, which `uname -m` names there, or `arch`). `extra_args` go to
    `quiesce sidecar` after the kit's (--signing-key F, --freeze-timeout S, ...). Every exec
    runs as `user`, root by default ("0"; kubectl's pod user): the sidecar must be started by
    root, and refuses otherwise. `timeout` bounds the whole start.

    Raises InstallFailed when the binary could not be put in or run (the message names the
    fix: another install_path where the directory is unsafe or on a noexec mount, arch= where
    the sandbox has no uname, binary= where the kit has no build for it), SidecarRefused with
    the sidecar's own line when it refused to start, and Unreachable when the sandbox could
    not be reached.
    """
    users = user_list(sandbox_user)
    if not users:
        raise ValueError("start_sidecar: no sandbox user given: name at least one")
    deadline = time.monotonic() + timeout
    as_user = container.root_user if user is None else user
    # Both paths as resolved and checked: a link on the way to either (one the sandbox user
    # planted in /tmp) is never followed again, so re-pointing it later redirects nothing.
    path = _install(container, binary, arch, install_path, as_user, deadline)
    state = _state_dir(container, state_dir, as_user, deadline)
    argv = [
        path,
        "sidecar",
        *sandbox_user_args(users),
        "--state-dir",
        state,
        *extra_args,
    ]
    r = container.exec(argv, user=as_user, timeout=_left(deadline, "the sidecar's start"))
    if not r.started:
        raise Unreachable(f"{container.name}: the sidecar's exec could not start ({r.text})")
    sc = _sidecar(container, path, r)
    _check_guards(sc, users)
    return sc


def _check_guards(sc: Sidecar, sandbox_user: str | Sequence[str]) -> None:
    """A sidecar already running answers a second start with its own line: one started for
    other users guards their processes, not these. Users given all as UIDs are compared here
    (in any order, as the sidecar compares them); a name only the sidecar can resolve, and it
    refuses a second start whose users resolve otherwise."""
    users = user_list(sandbox_user)
    if all(u.isdigit() for u in users) and set(sc.sandbox_uids) != {int(u) for u in users}:
        raise SidecarRefused(
            f"a sidecar (pid {sc.pid}) already runs in {sc.state_dir} for sandbox UIDs "
            f"{list(sc.sandbox_uids)}, not {','.join(users)}: stop it (kill -TERM {sc.pid} in "
            "the sandbox) or start this one for the same users",
            2,
        )


def _install(
    container: Container,
    binary: str | Path | None,
    arch: str | None,
    install_path: str,
    user: str | None,
    deadline: float,
) -> str:
    """quiesce at install_path in the sandbox, checked, and shown to run there; its path with
    every link resolved, the only one the kit runs from then on."""
    if not install_path.startswith("/") or install_path.endswith("/"):
        raise InstallFailed(f"install_path {install_path!r}: give an absolute path to a file")
    want_arch = _sandbox_arch(container, arch, user, deadline)
    local = _local_binary(binary, want_arch)
    data = _read_local(local)
    _check_elf(local, data, want_arch)
    want = f"sha256:{hashlib.sha256(data).hexdigest()}"
    real_dir, have, writable = _check_dir(container, install_path, user, deadline)
    path = posixpath.join(real_dir, posixpath.basename(install_path))
    mount = _mount_of(container, real_dir, user, deadline)
    _check_noexec(container, path, mount)
    if have not in (want, f"size:{len(data)}"):
        # None there, or another build (replaced: a running sidecar keeps its own file).
        if not writable:
            raise InstallFailed(
                f"{container.name}: cannot write in {posixpath.dirname(install_path)}: "
                f"{_WRITABLE_FIX}"
            )
        _check_reachable(container, path, mount)
        _place(container, local, path, want, len(data), user, deadline)
    _check_exec(container, path, user, deadline)
    return path


def _state_dir(container: Container, state_dir: str, user: str | None, deadline: float) -> str:
    """The sidecar's state dir with every link resolved, it (where it is already there) and
    every directory above it root's and writable by root alone (the install's own check):
    else the sandbox user could move it away, or re-point a link on its way, and answer in
    quiesce's place. The sidecar makes what is missing."""
    if not state_dir.startswith("/"):
        raise InstallFailed(f"state_dir {state_dir!r}: give an absolute path")
    r = _script(container, state_dir.rstrip("/") or "/", "where", user, deadline)
    said = _lines(r)
    if "unsafe" in said:
        raise InstallFailed(
            f"{container.name}: quiesce's state dir {state_dir} is not safe: {said['unsafe']} "
            "(it and every directory above it must be root's and writable by root alone, or "
            "the sandbox user could move it away): pass another state_dir="
        )
    if r.returncode != 0 or "dir" not in said:
        raise InstallFailed(
            f"{container.name}: cannot check the state dir {state_dir} "
            f"({r.text or f'exit {r.returncode}'}): {_WRITABLE_FIX}"
        )
    return said["dir"]


def _left(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise Unreachable(f"start_sidecar: no time left for {what}: give a larger timeout")
    return left


def _ran(container: Container, r: ExecResult, what: str) -> ExecResult:
    if not r.started:
        raise Unreachable(f"{container.name}: no exec can start for {what} ({r.text})")
    return r


def _sandbox_arch(container: Container, arch: str | None, user: str | None, deadline: float) -> str:
    """The sandbox's architecture as the binaries name it: `uname -m` there, checked against
    `arch` when both say."""
    given = None
    if arch is not None:
        given = _ARCHES.get(arch.lower())
        if given is None:
            raise InstallFailed(f"arch {arch!r}: quiesce is built for x86_64 and aarch64 only")
    r = _ran(
        container,
        container.exec(["uname", "-m"], user=user, timeout=_left(deadline, "uname -m")),
        "uname -m",
    )
    if r.returncode != 0:
        if given is not None:
            return given
        raise InstallFailed(
            f"{container.name}: cannot read the sandbox's architecture with uname -m "
            f"({r.text or f'exit {r.returncode}'}): pass arch="
        )
    said = r.stdout.decode("ascii", "replace").strip()
    found = _ARCHES.get(said.lower())
    if found is None:
        raise InstallFailed(
            f"{container.name}: the sandbox is {said!r}; quiesce is built for x86_64 and "
            "aarch64 only"
        )
    if given is not None and given != found:
        raise InstallFailed(
            f"{container.name}: arch={arch!r} was given, but the sandbox is {said!r}: "
            "drop arch= or give the sandbox's"
        )
    return found


def _local_binary(binary: str | Path | None, arch: str) -> Path:
    if binary is not None:
        return Path(binary)
    try:
        return binary_path(arch)
    except (OSError, ValueError) as e:
        raise InstallFailed(f"no packaged quiesce for {arch}: {e}; or pass binary=") from None


def _read_local(local: Path) -> bytes:
    try:
        return local.read_bytes()
    except OSError as e:
        raise InstallFailed(f"cannot read the quiesce binary {local}: {e}") from None


def _check_elf(local: Path, data: bytes, arch: str) -> None:
    """A binary for another machine would fail in the sandbox with a less clear message."""
    if data[:4] != b"\x7fELF" or len(data) < 20:
        raise InstallFailed(f"{local} is not an ELF executable: pass the quiesce binary")
    machine = _ELF_MACHINE.get(int.from_bytes(data[18:20], "little"))
    if machine != arch:
        raise InstallFailed(
            f"{local} is built for {machine or 'another machine'}, the sandbox is {arch}: "
            f"pass the {arch} build"
        )


def _script(
    container: Container, path: str, step: str, user: str | None, deadline: float
) -> ExecResult:
    argv = ["/bin/sh", "-c", _SCRIPT, "quiesce-install", path, step]
    r = container.exec(argv, user=user, timeout=_left(deadline, f"the install's {step}"))
    _ran(container, r, f"the install's {step}")
    if r.returncode == 127 and b"sh" in r.stderr:
        raise InstallFailed(
            f"{container.name}: the sandbox has no /bin/sh to install quiesce with: put quiesce "
            "in the image, or run the sidecar from a path the image has"
        )
    return r


def _lines(r: ExecResult) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in r.stdout.decode("utf-8", "replace").splitlines():
        key, _, rest = line.partition(" ")
        out[key] = rest
    return out


def _check_dir(
    container: Container, path: str, user: str | None, deadline: float
) -> tuple[str, str | None, bool]:
    """The install directory, made where missing and checked: its real path, what is there,
    and whether this user can write in it."""
    r = _script(container, path, "check", user, deadline)
    said = _lines(r)
    if "unsafe" in said:
        raise InstallFailed(
            f"{container.name}: {posixpath.dirname(path)} is not safe for quiesce: "
            f"{said['unsafe']} (every directory up to / must be root's and writable by root "
            "alone, or the sandbox user could swap the binary): pass another install_path"
        )
    if r.returncode != 0 or "dir" not in said:
        raise InstallFailed(
            f"{container.name}: cannot make {posixpath.dirname(path)} "
            f"({r.text or f'exit {r.returncode}'}): {_WRITABLE_FIX}"
        )
    return said["dir"], said.get("have"), "writable" in said


def _place(
    container: Container,
    local: Path,
    path: str,
    want: str,
    size: int,
    user: str | None,
    deadline: float,
) -> None:
    d, name = posixpath.split(path)
    container.upload(local, f"{d}/.{name}.new", timeout=_left(deadline, "the copy"))
    r = _script(container, path, "place", user, deadline)
    said = _lines(r)
    if r.returncode != 0 or "have" not in said:
        raise InstallFailed(
            f"{container.name}: cannot put quiesce at {path} ({r.text or f'exit {r.returncode}'})"
        )
    if said["have"] not in (want, f"size:{size}"):
        raise InstallFailed(
            f"{container.name}: the copy at {path} is not the binary given ({said['have']}, "
            f"want {want}): the copy was cut short or changed; start again"
        )


def _mount_options(mountinfo: str, path: str) -> tuple[str, set[str], str] | None:
    """The mount point holding `path`, its per-mount options and its file system type, from
    /proc/self/mountinfo."""
    best: tuple[str, set[str], str] | None = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        # The optional fields end at "-"; the file system type follows it.
        sep = fields.index("-", 6) if "-" in fields[6:-1] else -1
        fstype = fields[sep + 1] if sep > 0 else ""
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, set(fields[5].split(",")), fstype)
    return best


_NOEXEC_FIX = (
    "pass install_path= on an exec-able mount (a --tmpfs mount is noexec unless given "
    "exec: `--tmpfs /run:exec`; on Docker a named volume, `-v quiesce-bin:/opt/quiesce-bin`)"
)


def _mount_of(
    container: Container, real_dir: str, user: str | None, deadline: float
) -> tuple[str, set[str], str] | None:
    """The mount that holds the install directory (None where mountinfo cannot be read)."""
    r = container.exec(
        ["cat", "/proc/self/mountinfo"], user=user, timeout=_left(deadline, "the mounts")
    )
    if not r.started or r.returncode != 0:
        return None
    return _mount_options(r.stdout.decode("utf-8", "replace"), real_dir)


def _check_noexec(container: Container, path: str, mount: tuple[str, set[str], str] | None) -> None:
    if mount is not None and "noexec" in mount[1]:
        raise InstallFailed(
            f"{container.name}: {path} is on {mount[0]}, mounted noexec: {_NOEXEC_FIX}"
        )


def _check_reachable(
    container: Container, path: str, mount: tuple[str, set[str], str] | None
) -> None:
    """Docker's archive API (the copy's way in for Docker and Compose) writes the container's
    own layer and its volumes, never a tmpfs mounted in it: a copy there would fail with the
    engine's bare 404, or land under the tmpfs, where nothing runs it."""
    if container.engine not in ("docker", "compose") or mount is None or mount[2] != "tmpfs":
        return
    raise InstallFailed(
        f"{container.name}: {path} is on {mount[0]}, a tmpfs, which Docker's archive API "
        "cannot copy into: pass install_path= on a named volume mounted in the container "
        "(`-v quiesce-bin:/opt/quiesce-bin`, install_path='/opt/quiesce-bin/quiesce'), or put "
        "quiesce in the image"
    )


def _check_exec(container: Container, path: str, user: str | None, deadline: float) -> None:
    """quiesce runs from `path`: its --version answers."""
    v = _ran(
        container,
        container.exec([path, "--version"], user=user, timeout=_left(deadline, "--version")),
        f"{path} --version",
    )
    if v.returncode != 0 or not v.stdout.startswith(b"quiesce "):
        denied = "permission denied" in v.text.lower()
        raise InstallFailed(
            f"{container.name}: {path} does not run ({v.text or f'exit {v.returncode}'})"
            + (f": {_NOEXEC_FIX}" if denied else "")
        )


def _sidecar(container: Container, path: str, r: ExecResult) -> Sidecar:
    out = r.stdout.decode("utf-8", "replace").strip()
    err = r.stderr.decode("utf-8", "replace").strip()
    if r.returncode != 0:
        raise SidecarRefused(err or out or "(it said nothing)", r.returncode)
    lines = out.splitlines()
    if len(lines) != 1:
        raise Unreachable(
            f"{container.name}: quiesce sidecar printed {len(lines)} lines, not one: {out[:200]!r}"
        )
    v = _start_line(lines[0])
    sc = Sidecar(
        container=replace(container, binary=path, state_dir=v["state_dir"], sidecar_pid=v["pid"]),
        public_key=v["public_key"],
        pid=v["pid"],
        start_time=v["start_time"],
        state_dir=v["state_dir"],
        version=v["version"],
        started=v["started"],
        binary=path,
        sandbox_uids=tuple(v["sandbox_uids"]),
        lineage=v["lineage"],
        line=lines[0],
    )
    return sc


def _start_line(line: str) -> dict[str, Any]:
    """The sidecar's start line, each field of the type it must have."""

    def bad(why: str) -> Unreachable:
        return Unreachable(f"quiesce sidecar's start line {why}: {line[:200]!r}")

    try:
        v = json.loads(line)
    except ValueError:
        raise bad("is not JSON") from None
    if not isinstance(v, dict) or v.get("sidecar") != "quiesce":
        raise bad("is not a quiesce sidecar's")
    for key, types in (
        ("pid", int),
        ("start_time", int),
        ("state_dir", str),
        ("version", str),
        ("public_key", str),
        ("started", bool),
        ("lineage", bool),
        ("sandbox_uids", list),
    ):
        value = v.get(key)
        if not isinstance(value, types) or (types is int and isinstance(value, bool)):
            raise bad(f"has no {key} of type {types.__name__}")
    if v["pid"] <= 1:
        raise bad(f"names pid {v['pid']}")
    if not all(isinstance(u, int) and not isinstance(u, bool) for u in v["sandbox_uids"]):
        raise bad("has sandbox_uids that are not all integers")
    try:
        load_public_key(v["public_key"])
    except MarkerInvalid as e:
        raise bad(f"carries no Ed25519 key ({e.reason})") from None
    return v
