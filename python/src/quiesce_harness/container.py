"""Where the init runs, how to exec in it, and how to signal it through the engine.

Docker and Compose containers are reached through the Docker SDK (Compose's containers are
Docker containers carrying the project and service labels); Podman and Kubernetes through their
command-line clients; any other sandbox through the caller's own exec function
(`Container.from_exec`). An exec that the engine could not start (the sandbox holds the pids
limit) is reported as `started=False`, so that freeze() can fall back to the engine's signal.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .errors import Unreachable
from .extras import need
from .provider import SandboxExec, SandboxKill, SandboxUpload, settle

if TYPE_CHECKING:
    import docker as docker_sdk


def _sdk() -> None:
    """The Docker SDK is there, which a container reached through the Docker engine needs."""
    need("docker", "docker", "a container reached through the Docker engine")


Engine = Literal["docker", "podman", "compose", "kubectl", "exec"]
# The state dir the init and its clients use when given none; a Container with another one
# names it to the client (`--state-dir`), which then needs no locator to find it.
DEFAULT_STATE_DIR = "/run/quiesce"
# The PATH every exec the kit makes for itself runs with: an image's own PATH may put a
# directory the sandbox user owns first (ENV PATH=/app/.venv/bin:$PATH), and a name looked up
# there as root would run the sandbox user's code as root. Not /usr/local/*: Dockerfiles hand
# those to the non-root user (so `pip install` works) often enough; only the quiesce binary is
# looked up there (_RESOLVE), and used only when it and every directory above it are root's.
SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# The environment every root exec of the kit's runs with, over the image's (which every exec
# inherits): its PATH, and nothing a file the agent may write is read through before the
# command runs. An image's ENV BASH_ENV=/app/.bashenv (ENV for a POSIX sh) makes every
# non-interactive bash source that file first, as root; LD_PRELOAD, LD_AUDIT and
# LD_LIBRARY_PATH load the libraries they name into every dynamic program. Empty values turn
# each off (bash sources no empty BASH_ENV; ld.so loads nothing from an empty list).
SAFE_ENV: Mapping[str, str] = {
    "PATH": SAFE_PATH,
    "BASH_ENV": "",
    "ENV": "",
    "LD_PRELOAD": "",
    "LD_AUDIT": "",
    "LD_LIBRARY_PATH": "",
}


def safe_env(env: Mapping[str, str] | None, *, keep_path: bool = False) -> dict[str, str]:
    """`env` with SAFE_ENV over it; with keep_path, a PATH `env` names stays (the caller's
    own, not the image's)."""
    out = {**(env or {}), **SAFE_ENV}
    if keep_path and env and "PATH" in env:
        out["PATH"] = env["PATH"]
    return out


# Where a relative `binary` (the default "quiesce") is looked for: Docker's default PATH.
_BINARY_DIRS = "/usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin"
_LOOKED_IN = ":".join(_BINARY_DIRS.split())
# A bare command of the kit's runs through this: an absolute argv[0] that sets the fixed PATH
# before the name is looked up, and then is replaced by the command (one process, as before).
_SAFE_SH = ("/bin/sh", "-c", f'PATH={SAFE_PATH}; export PATH; exec "$@"', "sh")

# What engines print when the runtime could not start the exec'd process at all (fork failed
# under the container's pids limit, or the runtime's own init could not be cloned into it).
_NOT_STARTED = (
    "oci runtime exec failed",
    "resource temporarily unavailable",
    "fork/exec",
    "cannot allocate memory",
    "read init-p",
    "exec failed: unable to start container process",
    "runc run failed",
    "crun:",
)
_NOT_FOUND = ("executable file not found", "no such file or directory")
# What a shell says when it cannot fork (the sandbox holds the pids limit).
_NO_FORK = ("cannot fork", "resource temporarily unavailable", "can't fork")


def sandbox_user_args(users: str | Sequence[str]) -> list[str]:
    """`--sandbox-user U` for each of `users` (one name or UID, or a sequence of them), as
    quiesce's init, sidecar and verify take them."""
    return [a for u in user_list(users) for a in ("--sandbox-user", u)]


def user_list(users: str | Sequence[str]) -> list[str]:
    """One user, or a sequence of them, as a list (a str is one name, not its letters)."""
    return [users] if isinstance(users, str) else list(users)


@dataclass(frozen=True)
class ExecResult:
    """One exec in the container; `started` is False when the engine could not start it."""

    returncode: int
    stdout: bytes
    stderr: bytes
    started: bool = True

    @property
    def text(self) -> str:
        return (self.stdout + self.stderr).decode("utf-8", "replace").strip()


def _classify(rc: int, out: bytes, err: bytes) -> ExecResult:
    """Tell an exec that never started from a command that ran and failed.

    Engines answer 126 (Docker, Podman; 125 for Podman's own errors) with the runtime's message
    when the process could not be created, and 126/127 when the executable is missing. quiesce
    itself exits 0, 1 or 2, and its output (which names the sandbox's processes, so the sandbox
    chooses part of it) is never read for these messages unless the code is the engine's.
    """
    # Podman also answers 255 when the OCI runtime fails to start the exec under a held pids
    # limit ("read init-p: connection reset by peer"); quiesce never exits 255.
    if rc not in (125, 126, 127, 255):
        return ExecResult(rc, out, err, started=True)
    msg = (out + err).decode("utf-8", "replace").lower()
    if any(s in msg for s in _NOT_FOUND) and "exec" in msg:
        return ExecResult(127, out, err, started=True)
    if rc != 127 and any(s in msg for s in _NOT_STARTED):
        return ExecResult(rc, out, err, started=False)
    return ExecResult(rc, out, err, started=True)


@dataclass(frozen=True)
class Container:
    """The container whose init (or sidecar) is quiesce. Make one with
    Container.docker/podman/compose/kubectl, or Container.from_exec for any other sandbox.

    `binary` is quiesce's path inside the container: `quiesce` when it is in the image, and
    `/quiesce` where the binary is bound there read-only (`-v HOST_BINARY:/quiesce:ro`, beside
    an engine's injected init too: not the engine's `/sbin/docker-init` or `/run/podman-init`,
    whose directory a root or setuid process in the container can rename and replace);
    check_way_in() checks that from the engine's record.
    A relative one is looked for once in Docker's default PATH (_BINARY_DIRS), never the
    image's PATH, and used only where the file and every directory above it are root's and
    writable by root alone (binary_path()); the kit's other execs run with SAFE_PATH (exec()).
    `freeze_signal` must be the init's `--freeze-signal` (USR1 unless changed). `sidecar_pid`
    is the pid, in the container, of a quiesce sidecar (start_sidecar sets it): PID 1 is then
    someone else's process, and signal() reaches the sidecar instead.
    """

    engine: Engine
    name: str
    binary: str = "quiesce"
    state_dir: str = "/run/quiesce"
    freeze_signal: str = "USR1"
    namespace: str | None = None
    container: str | None = None
    project: str | None = None
    files: tuple[str, ...] = ()
    cli: str = ""
    sidecar_pid: int | None = None
    _client: Any = field(default=None, repr=False, compare=False)
    _exec_fn: SandboxExec | None = field(default=None, repr=False, compare=False)
    _upload_fn: SandboxUpload | None = field(default=None, repr=False, compare=False)
    _kill_fn: SandboxKill | None = field(default=None, repr=False, compare=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False, compare=False)
    # A relative `binary`, resolved once (binary, absolute path): see binary_path().
    _resolved: list[tuple[str, str]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    # --- constructors -------------------------------------------------------------------------

    @classmethod
    def docker(
        cls,
        name_or_id: str,
        *,
        binary: str = "quiesce",
        state_dir: str = "/run/quiesce",
        freeze_signal: str = "USR1",
        client: docker_sdk.DockerClient | None = None,
    ) -> Container:
        """A Docker container by name or id; `client` defaults to docker.from_env()."""
        return cls("docker", name_or_id, binary, state_dir, freeze_signal, _client=client)

    @classmethod
    def podman(
        cls,
        name: str,
        *,
        binary: str = "quiesce",
        state_dir: str = "/run/quiesce",
        freeze_signal: str = "USR1",
        podman: str = "podman",
    ) -> Container:
        """A Podman container, through the `podman` client (rootless: run as that user)."""
        return cls("podman", name, binary, state_dir, freeze_signal, cli=podman)

    @classmethod
    def compose(
        cls,
        service: str,
        project: str | None = None,
        files: Sequence[str] = (),
        *,
        binary: str = "quiesce",
        state_dir: str = "/run/quiesce",
        freeze_signal: str = "USR1",
        client: docker_sdk.DockerClient | None = None,
    ) -> Container:
        """A Compose service's container (its first replica).

        With `project`, the container is found by Compose's labels through the Docker API (no
        compose client needed); without it, `docker compose [-f FILE]... ps -q SERVICE` names it.
        """
        return cls(
            "compose",
            service,
            binary,
            state_dir,
            freeze_signal,
            project=project,
            files=tuple(files),
            _client=client,
        )

    @classmethod
    def kubectl(
        cls,
        pod: str,
        namespace: str | None = None,
        container: str | None = None,
        *,
        binary: str = "quiesce",
        state_dir: str = "/run/quiesce",
        kubectl: str = "kubectl",
    ) -> Container:
        """A pod's container, through `kubectl exec`.

        Kubernetes has no API that signals a container's process: when no exec can start (the
        agent holds the pod's pids limit) there is no way in, and freeze() raises Unreachable.
        Keep root's execs possible by capping the sandbox user's processes below the pod's
        limit (RLIMIT_NPROC counts per UID: `ulimit -u` in the agent's launcher, or
        `prlimit --nproc`), or end the pod, and score nothing.
        """
        return cls(
            "kubectl",
            pod,
            binary,
            state_dir,
            "USR1",
            namespace=namespace,
            container=container,
            cli=kubectl,
        )

    @classmethod
    def from_exec(
        cls,
        exec_fn: SandboxExec,
        upload_fn: SandboxUpload | None = None,
        kill_fn: SandboxKill | None = None,
        *,
        name: str = "sandbox",
        binary: str = "quiesce",
        state_dir: str = DEFAULT_STATE_DIR,
        freeze_signal: str = "USR1",
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Container:
        """A sandbox the kit has no client for, reached through the caller's functions.

        `exec_fn(argv, *, user=None, stdin=None)` runs argv in the sandbox (as `user`, else the
        sandbox's default user; `stdin` bytes on its standard input) and returns
        `(exit_code, stdout, stderr)`, or an awaitable of it. It may also take `env=` (a mapping
        set over the sandbox's environment); run_verifier then sets what it sets on Docker.
        `upload_fn(local_path, remote_path)` copies a file in; without it a file goes in through
        an exec of `sh -c 'cat > PATH'` with the file on stdin. `kill_fn(signal_name)` (e.g.
        "USR1") signals the sandbox's PID 1 from outside, where the provider can: the way in
        when no exec can start. All three may be sync or async.

        An awaitable runs to completion on `loop` when given (a loop running in another thread,
        e.g. the harness's own, captured with asyncio.get_running_loop() when its coroutines
        are bound to it; then call the kit's functions through asyncio.to_thread), else on a
        private loop of the kit's in a thread of its own, the same loop for every call, whether
        or not a loop runs in the calling thread. A call made from inside a running loop blocks
        that loop until it returns: call the kit through asyncio.to_thread from async code.
        Each call is bounded by the exec's timeout; a sync function runs in a worker thread so
        that its budget holds too. An exception raised by any of them is Unreachable.

        The engine's record (inspect()) does not exist here: identity() is read through execs
        (cat and stat in the sandbox), and is_running() is assumed true until an exec says
        otherwise.
        """
        return cls(
            "exec",
            name,
            binary,
            state_dir,
            freeze_signal,
            _exec_fn=exec_fn,
            _upload_fn=upload_fn,
            _kill_fn=kill_fn,
            _loop=loop,
        )

    # --- engine access ------------------------------------------------------------------------

    def _docker(self) -> docker_sdk.DockerClient:
        if self._client is None:
            _sdk()
            import docker as docker_sdk

            try:
                object.__setattr__(self, "_client", docker_sdk.from_env(timeout=300))
            except docker_sdk.errors.DockerException as e:
                raise Unreachable(f"no Docker engine answers: {e}") from None
        client: docker_sdk.DockerClient = self._client
        return client

    def _docker_id(self) -> str:
        """The Docker container's id (a compose service resolved to its container)."""
        _sdk()
        import docker as docker_sdk

        if self.engine == "docker":
            return self.name
        if self.project is not None:
            try:
                found = self._docker().containers.list(
                    all=True,
                    filters={
                        "label": [
                            f"com.docker.compose.project={self.project}",
                            f"com.docker.compose.service={self.name}",
                        ]
                    },
                )
            except docker_sdk.errors.DockerException as e:
                raise Unreachable(f"compose service {self.name}: {e}") from None
            if not found:
                raise Unreachable(
                    f"compose project {self.project} has no container for service {self.name}"
                )
            found.sort(key=lambda c: str(c.labels.get("com.docker.compose.container-number", "")))
            return str(found[0].id)
        argv = ["docker", "compose"]
        for f in self.files:
            argv += ["-f", f]
        argv += ["ps", "-q", self.name]
        try:
            p = subprocess.run(argv, capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise Unreachable(f"docker compose ps {self.name}: {e}") from None
        ids = p.stdout.decode().split()
        if p.returncode != 0 or not ids:
            raise Unreachable(
                f"docker compose ps {self.name}: no container "
                f"({p.stderr.decode(errors='replace').strip() or 'none running'})"
            )
        return ids[0]

    def _cli_exec_argv(
        self,
        argv: Sequence[str],
        user: str | None,
        env: Mapping[str, str] | None = None,
        *,
        interactive: bool = False,
    ) -> list[str]:
        if self.engine == "podman":
            opts = ["-i"] if interactive else []
            opts += ["-u", user] if user else []
            for k, v in (env or {}).items():
                opts += ["-e", f"{k}={v}"]
            return [self.cli, "exec", *opts, self.name, *argv]
        if user:
            raise ValueError("kubectl exec cannot choose the user: run `quiesce exec --user`")
        if env:
            raise ValueError("kubectl exec cannot set the environment: the pod's own is read")
        out = [self.cli, "exec", *(["-i"] if interactive else [])]
        if self.namespace:
            out += ["-n", self.namespace]
        out.append(self.name)
        if self.container:
            out += ["-c", self.container]
        return [*out, "--", *argv]

    def exec(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
        image_path: bool = False,
    ) -> ExecResult:
        """Run argv in the container; Unreachable when the container is gone or stopped.

        `env` is set in the exec's environment, over the container's (not with kubectl, nor
        with a from_exec function that takes no `env`). Nothing is looked up through the
        image's PATH: the environment is SAFE_ENV's where it can be set (PATH, and no BASH_ENV,
        ENV or LD_* of the image's), and a bare argv[0] runs through `/bin/sh`, which sets
        SAFE_PATH before it looks the name up.
        `image_path=True` leaves both as given (argv[0] must then be absolute): the
        verifier's command, the task's own, keeps the image's PATH.
        """
        return self._exec(
            self._argv(argv, image_path), user, timeout, self._env(env, image_path), None
        )

    def exec_with_stdin(
        self, argv: Sequence[str], stdin: bytes, *, user: str | None = None, timeout: float = 60.0
    ) -> ExecResult:
        """exec() with `stdin` fed to the command: Podman, kubectl and from_exec sandboxes
        (Docker's SDK exec takes none; its containers take files through upload())."""
        return self._exec(self._argv(argv, False), user, timeout, self._env(None, False), stdin)

    def _argv(self, argv: Sequence[str], image_path: bool) -> list[str]:
        if argv and not argv[0].startswith("/"):
            if image_path:
                raise ValueError(
                    f"{argv[0]!r}: an exec with the image's PATH needs an absolute argv[0]"
                )
            return [*_SAFE_SH, *argv]
        return list(argv)

    def _env(self, env: Mapping[str, str] | None, image_path: bool) -> Mapping[str, str] | None:
        if image_path or not self.sets_env:
            return env
        return safe_env(env)

    def _exec(
        self,
        argv: Sequence[str],
        user: str | None,
        timeout: float,
        env: Mapping[str, str] | None,
        stdin: bytes | None,
    ) -> ExecResult:
        if self.engine == "exec":
            return self._fn_exec(argv, user, timeout, env, stdin)
        if self.engine in ("docker", "compose"):
            if stdin is not None:
                raise ValueError("docker exec through the SDK takes no stdin: use upload()")
            return self._sdk_exec(argv, user, timeout, env)
        try:
            p = subprocess.run(
                self._cli_exec_argv(argv, user, env, interactive=stdin is not None),
                capture_output=True,
                timeout=timeout,
                check=False,
                input=stdin,
            )
        except FileNotFoundError:
            raise Unreachable(f"{self.cli}: not installed on this machine") from None
        except subprocess.TimeoutExpired:
            raise Unreachable(
                f"{self.engine} exec in {self.name}: no answer in {timeout:g} s"
            ) from None
        r = _classify(p.returncode, p.stdout, p.stderr)
        if not r.started and not self.is_running():
            raise Unreachable(f"{self.engine} container {self.name} is not running")
        gone = b"no such container" in p.stderr.lower()
        if self.engine == "podman" and p.returncode == 125 and gone:
            raise Unreachable(f"podman container {self.name} does not exist")
        return r

    def _sdk_exec(
        self,
        argv: Sequence[str],
        user: str | None,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        del timeout  # see below
        _sdk()
        import docker as docker_sdk
        import requests

        cid = self._docker_id()
        api = self._docker().api
        try:
            e = api.exec_create(
                cid,
                list(argv),
                user=user or "",
                stdout=True,
                stderr=True,
                environment=dict(env) if env else None,
            )
            # The client's own timeout bounds each read (the kit's client: 300 s); `quiesce
            # freeze --timeout` bounds the wait inside.
            out, err = api.exec_start(e["Id"], demux=True)
            rc = api.exec_inspect(e["Id"]).get("ExitCode")
        except docker_sdk.errors.NotFound:
            raise Unreachable(f"docker container {cid} does not exist") from None
        except docker_sdk.errors.APIError as e:
            text = str(e)
            if e.status_code == 409:
                raise Unreachable(f"docker container {cid} is not running: {text}") from None
            return _classify(126, b"", text.encode())
        except (requests.exceptions.RequestException, OSError) as e:
            raise Unreachable(f"docker exec in {cid}: the engine did not answer: {e}") from None
        return _classify(126 if rc is None else int(rc), out or b"", err or b"")

    def _fn_exec(
        self,
        argv: Sequence[str],
        user: str | None,
        timeout: float,
        env: Mapping[str, str] | None,
        stdin: bytes | None,
    ) -> ExecResult:
        fn = self._exec_fn
        if fn is None:
            raise ValueError("Container.from_exec needs an exec function")
        kwargs: dict[str, Any] = {"user": user, "stdin": stdin}
        if env:
            if not _takes_env(fn):
                raise ValueError(
                    f"{self.name}: the exec function takes no env=: "
                    "add an `env` keyword to it to set the environment"
                )
            kwargs["env"] = dict(env)
        what = f"exec of {argv[0] if argv else '?'} in {self.name}"
        got = settle(what, lambda: fn(list(argv), **kwargs), timeout, self._loop)
        rc, out, err = _exec_triple(what, got)
        return _classify(rc, out, err)

    def upload(
        self, local_path: str | os.PathLike[str], remote_path: str, *, timeout: float = 120.0
    ) -> None:
        """Copy a local file into the container at remote_path (created or replaced, as root).

        Docker and Compose: the engine's archive API; Podman: `podman cp`; kubectl and a
        from_exec sandbox without upload_fn: an exec of `sh -c 'cat > PATH'` with the file on
        stdin (the image needs sh and cat); a from_exec sandbox's upload_fn otherwise.
        Unreachable when the copy could not be made.
        """
        local = Path(local_path)
        if self.engine == "exec" and self._upload_fn is not None:
            up = self._upload_fn
            settle(
                f"upload of {local} to {self.name}:{remote_path}",
                lambda: up(str(local), remote_path),
                timeout,
                self._loop,
            )
            return
        if self.engine in ("docker", "compose"):
            self._sdk_upload(local, remote_path)
            return
        if self.engine == "podman":
            try:
                p = subprocess.run(
                    [self.cli, "cp", str(local), f"{self.name}:{remote_path}"],
                    capture_output=True,
                    timeout=timeout,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                raise Unreachable(f"podman cp {local} {self.name}:{remote_path}: {e}") from None
            if p.returncode != 0:
                err = p.stderr.decode(errors="replace").strip()
                raise Unreachable(f"podman cp {local} {self.name}:{remote_path}: {err}")
            return
        try:
            data = local.read_bytes()
        except OSError as e:
            raise Unreachable(f"cannot read {local} to copy it in: {e}") from None
        r = self.exec_with_stdin(
            ["sh", "-c", 'cat > "$1"', "sh", remote_path],
            data,
            user=self.root_user,
            timeout=timeout,
        )
        if not r.started or r.returncode != 0:
            raise Unreachable(
                f"{self.name}: could not write {remote_path} through `sh -c 'cat > PATH'` "
                f"({r.text or f'exit {r.returncode}'}); an image without sh and cat needs "
                "upload_fn"
            )

    def _sdk_upload(self, local: Path, remote_path: str) -> None:
        import io
        import posixpath
        import tarfile

        _sdk()
        import docker as docker_sdk
        import requests

        try:
            data = local.read_bytes()
            st = local.stat()
        except OSError as e:
            raise Unreachable(f"cannot read {local} to copy it in: {e}") from None
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(posixpath.basename(remote_path))
            info.size = len(data)
            info.mode = st.st_mode & 0o777
            tar.addfile(info, io.BytesIO(data))
        cid = self._docker_id()
        try:
            ok = self._docker().api.put_archive(cid, posixpath.dirname(remote_path), buf.getvalue())
        except docker_sdk.errors.DockerException as e:
            raise Unreachable(f"docker cp to {cid}:{remote_path}: {e}") from None
        except (requests.exceptions.RequestException, OSError) as e:
            raise Unreachable(f"docker cp to {cid}: the engine did not answer: {e}") from None
        if not ok:
            raise Unreachable(f"docker cp to {cid}:{remote_path}: the engine refused the archive")

    def signal(self, sig: str | None = None) -> None:
        """Send sig (default: the freeze signal) to the container's PID 1 through the engine.

        Needs no process in the container, so it works where no exec can start. A from_exec
        sandbox is signalled through its kill_fn; without one, through an exec of `kill -s SIG
        1` (which, like every exec, cannot start where the sandbox holds the pids limit). Where
        quiesce is a sidecar, PID 1 is not quiesce: the signal goes to the sidecar's pid
        through an exec of `kill`, never to PID 1 (whose default action for USR1 may be to end
        the container).
        """
        sig = sig or self.freeze_signal
        if self.sidecar_pid is not None:
            self._exec_kill(sig, self.sidecar_pid, "the sidecar")
            return
        if self.engine == "exec":
            if self._kill_fn is not None:
                kill = self._kill_fn
                settle(f"kill -s {sig} of {self.name}'s PID 1", lambda: kill(sig), 60.0, self._loop)
                return
            self._exec_kill(sig, 1, "PID 1")
            return
        if self.engine in ("docker", "compose"):
            _sdk()
            import docker as docker_sdk

            cid = self._docker_id()
            try:
                self._docker().api.kill(cid, signal=f"SIG{sig}" if sig.isalpha() else sig)
            except docker_sdk.errors.DockerException as e:
                raise Unreachable(f"docker kill -s {sig} {cid}: {e}") from None
            return
        if self.engine == "kubectl":
            raise Unreachable(
                f"pod {self.name}: Kubernetes has no API that signals a container's process, "
                "and no exec can start: cap the sandbox user's processes (RLIMIT_NPROC) below "
                "the pod's pids limit so that root's execs still start, or delete the pod and "
                "score nothing"
            )
        try:
            p = subprocess.run(
                [self.cli, "kill", "-s", sig, self.name],
                capture_output=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise Unreachable(f"podman kill -s {sig} {self.name}: {e}") from None
        if p.returncode != 0:
            raise Unreachable(
                f"podman kill -s {sig} {self.name}: {p.stderr.decode(errors='replace').strip()}"
            )

    def _exec_kill(self, sig: str, pid: int, whom: str) -> None:
        """`kill -s SIG PID` through an exec as root; Unreachable when it did not happen."""
        # The shell's builtin: /bin/kill is missing from slim images (procps).
        argv = ["/bin/sh", "-c", 'kill -s "$1" "$2"', "sh", sig, str(pid)]
        r = self.exec(argv, user=self.root_user, timeout=60)
        if not r.started:
            raise Unreachable(
                f"{self.name}: no exec can start to signal {whom} ({r.text}): the sandbox may "
                "hold the pids limit; cap the sandbox user's processes (RLIMIT_NPROC) below it "
                "so that root's execs still start"
                + ("" if self.sidecar_pid is not None else ", or give from_exec a kill_fn")
            )
        if r.returncode != 0:
            raise Unreachable(f"{self.name}: kill -s {sig} {pid} ({whom}): {r.text}")

    def inspect(self) -> dict[str, Any]:
        """The engine's record of the container (Docker, Compose, Podman)."""
        if self.engine in ("docker", "compose"):
            _sdk()
            import docker as docker_sdk

            try:
                info: dict[str, Any] = self._docker().api.inspect_container(self._docker_id())
            except docker_sdk.errors.DockerException as e:
                raise Unreachable(f"docker inspect {self.name}: {e}") from None
            return info
        if self.engine == "podman":
            import json

            p = subprocess.run(
                [self.cli, "inspect", "--type", "container", self.name],
                capture_output=True,
                timeout=60,
                check=False,
            )
            if p.returncode != 0:
                err = p.stderr.decode(errors="replace").strip()
                raise Unreachable(f"podman inspect {self.name}: {err}")
            data = json.loads(p.stdout)
            return dict(data[0])
        if self.engine == "exec":
            raise Unreachable(
                f"{self.name}: a from_exec sandbox has no engine record; identity() is read "
                "through execs"
            )
        raise Unreachable("kubectl: the kit reads no pod record; use the exec path")

    def is_running(self) -> bool:
        """Whether the engine says the container runs (kubectl and from_exec: assumed true)."""
        if self.engine in ("kubectl", "exec"):
            return True
        try:
            return bool(self.inspect().get("State", {}).get("Running"))
        except Unreachable:
            return False

    @property
    def root_user(self) -> str | None:
        """The exec user that is root: "0", or None with kubectl (which cannot choose one; the
        pod's own user is used, and quiesce refuses there if it is not root)."""
        return None if self.engine == "kubectl" else "0"

    @property
    def sets_env(self) -> bool:
        """Whether exec() can set the environment here (not kubectl, nor an exec function
        without an `env` keyword)."""
        if self.engine == "exec":
            return self._exec_fn is not None and _takes_env(self._exec_fn)
        return self.engine != "kubectl"

    def quiesce(self, *args: str) -> list[str]:
        """The command line of a quiesce subcommand in this container, its binary absolute.

        A state dir other than the default is named to the subcommands that take one
        (freeze, verify), so that they reach it without the init's locator.
        """
        binary = self.binary_path()
        if self.state_dir != DEFAULT_STATE_DIR and args and args[0] in ("freeze", "verify"):
            return [binary, args[0], "--state-dir", self.state_dir, *args[1:]]
        return [binary, *args]

    def binary_path(self) -> str:
        """quiesce's absolute path in the container: `binary` when absolute; a relative one is
        looked for in _BINARY_DIRS (never the image's PATH) once, and kept only where the file
        and every directory above it (links resolved) are root's and writable by root alone,
        so that the sandbox user can neither have put it there nor replace it later.
        Unreachable, naming binary=, otherwise."""
        found = self.find_binary()
        if isinstance(found, ExecResult):
            raise Unreachable(
                f"{self.name}: no exec can start to find {self.binary!r} ({found.text})"
            )
        return found

    def find_binary(self) -> str | ExecResult:
        """binary_path(), or the exec that could not start to look it up (the sandbox holds
        the pids limit: freeze() then signals the init and asks again)."""
        if self.binary.startswith("/"):
            return self.binary
        for name, path in self._resolved:
            if name == self.binary:
                return path
        r = self.exec(
            ["/bin/sh", "-c", _RESOLVE, "quiesce-resolve", self.binary], user=self.root_user
        )
        if not r.started:
            return r
        if r.returncode not in (0, 4, 5, 127) and any(s in r.text.lower() for s in _NO_FORK):
            # The shell could not fork under the pids limit: no answer yet, as for an exec
            # the engine could not start.
            return ExecResult(r.returncode, r.stdout, r.stderr, started=False)
        path = self._resolved_path(self.binary, r)
        self._resolved.append((self.binary, path))
        return path

    def _resolved_path(self, name: str, r: ExecResult) -> str:
        fix = f"pass binary= as quiesce's absolute path in the container (binary={name!r})"
        said = dict(
            line.partition(" ")[::2] for line in r.stdout.decode("utf-8", "replace").splitlines()
        )
        if "unsafe" in said:
            raise Unreachable(
                f"{self.name}: {name!r} found in {_LOOKED_IN} is not safe to run as root: "
                f"{said['unsafe']} (the sandbox user could replace it): {fix}"
            )
        path = said.get("path", "")
        if r.returncode == 127:
            raise Unreachable(f"{self.name}: no /bin/sh to look {name!r} up with: {fix}")
        if r.returncode == 5:
            raise Unreachable(f"{self.name}: {name!r} not found in {_LOOKED_IN}: {fix}")
        if r.returncode != 0 or not path.startswith("/"):
            raise Unreachable(
                f"{self.name}: cannot look {name!r} up in {_LOOKED_IN} "
                f"({r.text or f'exit {r.returncode}'}): {fix}"
            )
        return path

    def check_way_in(self) -> None:
        """Refuse, naming the fix, a `binary` that a process in the container could redirect.

        The orchestrator's every exec of `binary` (the freeze client, `quiesce verify`, `quiesce
        exec`) runs as root: whoever can rename a directory on its path, or replace the file,
        runs its own code there, untagged. Only a read-only file bind mount at a path whose one
        directory is `/` is fixed: the file is a mount point (rename and unlink give EBUSY),
        `/` cannot be renamed, and mounting over it needs CAP_SYS_ADMIN, which the engines'
        default capability set lacks. Read from the engine's record (Docker, Compose, Podman):
        nothing the container says is believed. A container run privileged, or given
        SYS_ADMIN, SYS_PTRACE or SYS_MODULE (or ALL), is refused too: with those root in it
        mounts over the path, traces PID 1 or loads a module. InstallFailed otherwise; for
        kubectl and from_exec sandboxes, whose mounts the kit cannot read, InstallFailed too.
        """
        from pathlib import PurePosixPath

        from .errors import InstallFailed

        fix = (
            "mount the binary read-only at a path in / (e.g. -v /usr/local/bin/quiesce:"
            "/quiesce:ro, beside the engine's --init if it injects it) and pass binary='/quiesce'"
        )
        if self.engine in ("kubectl", "exec"):
            raise InstallFailed(
                f"{self.name}: the kit cannot read a {self.engine} sandbox's mounts, so it cannot "
                f"tell whether {self.binary!r} is a path the sandbox could redirect: {fix}"
            )
        path = PurePosixPath(self.binary)
        if not path.is_absolute() or str(path.parent) != "/" or path.name in ("", ".", ".."):
            where = "looked up by name" if not path.is_absolute() else f"under {path.parent}"
            raise InstallFailed(
                f"{self.name}: quiesce is reached at {self.binary!r} ({where}), through a "
                "directory a root (or setuid) process in the container can rename and replace: "
                + fix
            )
        info = self.inspect()
        mounts = [m for m in info.get("Mounts") or [] if isinstance(m, dict)]
        found = [m for m in mounts if m.get("Destination") == self.binary]
        if not found:
            raise InstallFailed(
                f"{self.name}: {self.binary} is a file of the image, not a mount, which root in "
                f"the container can replace: {fix}"
            )
        m = found[-1]
        if m.get("Type") != "bind" or m.get("RW") is not False:
            raise InstallFailed(
                f"{self.name}: {self.binary} is a {'writable ' if m.get('RW') else ''}"
                f"{m.get('Type') or '?'} mount, not a read-only bind mount of the binary: {fix}"
            )
        host = info.get("HostConfig") or {}
        added = {str(c).upper().removeprefix("CAP_") for c in host.get("CapAdd") or []}
        given = sorted(added & _WAY_IN_CAPS)
        if host.get("Privileged") or given:
            raise InstallFailed(
                f"{self.name}: the container runs "
                + ("privileged" if host.get("Privileged") else "with " + ", ".join(given))
                + f", with which root in it can mount over {self.binary} (SYS_ADMIN), trace PID "
                "1 (SYS_PTRACE) or load a module (SYS_MODULE): drop --privileged and those "
                "--cap-add (compose: privileged, cap_add)"
            )

    def read_file(self, path: str, *, timeout: float = 30.0) -> bytes:
        """A file's content through `cat` in the container; Unreachable when it cannot be read."""
        r = self.exec(["cat", path], timeout=timeout)
        if not r.started:
            raise Unreachable(f"{self.name}: no exec can start ({r.text})")
        if r.returncode != 0:
            raise Unreachable(f"{self.name}: cannot read {path}: {r.text}")
        return r.stdout

    def identity(self) -> dict[str, object]:
        """boot_id, pid_ns, hostname and init_start of the container, as a marker names them.

        Read on the host from the engine's pid of the init when this machine runs the engine
        (nothing the sandbox can touch), else from inside the container.
        """
        host = self._host_identity()
        return host if host is not None else self._exec_identity()

    def _host_identity(self) -> dict[str, object] | None:
        if self.engine in ("kubectl", "exec"):
            return None
        try:
            info = self.inspect()
        except Unreachable:
            return None
        pid = int(info.get("State", {}).get("Pid") or 0)
        cid = str(info.get("Id", ""))
        if pid <= 0 or not cid:
            return None
        try:
            # The pid is this machine's only if that process is in the container's cgroup.
            with open(f"/proc/{pid}/cgroup") as f:
                if cid not in f.read():
                    return None
            pid_ns = os.stat(f"/proc/{pid}/ns/pid").st_ino
            with open(f"/proc/{pid}/stat") as f:
                start = int(f.read().rsplit(")", 1)[1].split()[19])
            with open("/proc/sys/kernel/random/boot_id") as f:
                boot_id = f.read().strip()
        except (OSError, ValueError, IndexError):
            return None
        return {
            "boot_id": boot_id,
            "pid_ns": pid_ns,
            "hostname": str(info.get("Config", {}).get("Hostname", "")),
            "init_start": start,
        }

    def _exec_identity(self) -> dict[str, object]:
        def read(argv: list[str]) -> str:
            r = self.exec(argv, timeout=30)
            if not r.started or r.returncode != 0:
                raise Unreachable(f"{self.name}: cannot read the container's identity: {r.text}")
            return r.stdout.decode().strip()

        boot_id, hostname = read(
            ["cat", "/proc/sys/kernel/random/boot_id", "/proc/sys/kernel/hostname"]
        ).splitlines()[:2]
        start = int(read(["cat", "/proc/1/stat"]).rsplit(")", 1)[1].split()[19])
        pid_ns = int(read(["stat", "-L", "-c", "%i", "/proc/1/ns/pid"]))
        return {"boot_id": boot_id, "pid_ns": pid_ns, "hostname": hostname, "init_start": start}


ExecFn = Callable[[Sequence[str]], ExecResult]

# Capabilities that let root in the container redirect or reach past a read-only bind mount in
# /: a mount over it (SYS_ADMIN), a tracer of the init (SYS_PTRACE), the kernel itself
# (SYS_MODULE); check_way_in refuses a container given any (or ALL, or --privileged).
_WAY_IN_CAPS = frozenset({"ALL", "SYS_ADMIN", "SYS_PTRACE", "SYS_MODULE"})

# Run as root with a command name: print `path REAL` (its real path, the first executable of
# that name in _BINARY_DIRS) when it and every directory above it are root's and writable by
# root alone, else `unsafe WHAT`; nothing (exit 5) when there is none. The tools it runs
# (readlink, stat) are found through SAFE_PATH alone.
_RESOLVE = f"""
PATH={SAFE_PATH}; export PATH
p=
for d in {_BINARY_DIRS}; do
    if [ -f "$d/$1" ] && [ -x "$d/$1" ]; then p=$d/$1; break; fi
done
[ -n "$p" ] || exit 5
r=$(readlink -f -- "$p") || exit 3
[ -f "$r" ] || exit 5
a=$r
while :; do
    s=$(stat -c '%u %a' -- "$a") || exit 3
    set -- $s
    case $2 in
    *[2367]? | *[2367]) echo "unsafe $a mode $2"; exit 4 ;;
    esac
    [ "$1" = 0 ] || {{ echo "unsafe $a owner $1"; exit 4; }}
    [ "$a" = / ] && break
    a=${{a%/*}}
    [ -n "$a" ] || a=/
done
echo "path $r"
"""


def _takes_env(fn: Callable[..., object]) -> bool:
    """Whether an exec function names an `env` keyword (the kit then passes the environment)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    p = params.get("env")
    return p is not None and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)


def _exec_triple(what: str, got: object) -> tuple[int, bytes, bytes]:
    """(exit code, stdout, stderr) from what an exec function returned; str is taken as UTF-8."""
    if not (isinstance(got, (tuple, list)) and len(got) == 3):
        raise TypeError(
            f"{what}: the exec function returned {type(got).__name__}; "
            "return (exit_code, stdout_bytes, stderr_bytes)"
        )
    rc, out, err = got
    if not isinstance(rc, int) or isinstance(rc, bool):
        raise TypeError(f"{what}: the exec function's exit code is {rc!r}, not an int")
    parts = []
    for v, name in ((out, "stdout"), (err, "stderr")):
        if isinstance(v, str):
            v = v.encode()
        if v is None:
            v = b""
        if not isinstance(v, (bytes, bytearray)):
            raise TypeError(f"{what}: the exec function's {name} is {type(v).__name__}, not bytes")
        parts.append(bytes(v))
    return rc, parts[0], parts[1]
