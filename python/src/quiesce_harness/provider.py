"""The caller's functions behind a Container.from_exec sandbox, and how one call of them is run.

Each may be sync or async (return an awaitable). settle() runs one call to completion within a
budget: a sync function in a worker thread, an awaitable on the caller's loop when given one (a
loop running in another thread), else on the kit's private loop, which runs in a thread of its
own for the life of the process and is shared by every call (so state an exec function keeps
bound to a loop, a client session say, stays on one loop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar, cast

from .errors import Unreachable

ExecOutcome = tuple[int, bytes, bytes]
T = TypeVar("T")


class SandboxExec(Protocol):
    """Runs argv in the sandbox; returns (exit_code, stdout, stderr), or an awaitable of it."""

    def __call__(
        self, argv: Sequence[str], /, *, user: str | None = None, stdin: bytes | None = None
    ) -> ExecOutcome | Awaitable[ExecOutcome]: ...


class SandboxUpload(Protocol):
    """Copies the local file at local_path into the sandbox at remote_path."""

    def __call__(self, local_path: str, remote_path: str, /) -> object: ...


class SandboxKill(Protocol):
    """Sends the named signal ("USR1", "TERM") to the sandbox's PID 1 from outside."""

    def __call__(self, signal_name: str, /) -> object: ...


class _PrivateLoop:
    """An event loop in a daemon thread of its own, started at its first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                t = threading.Thread(
                    target=loop.run_forever, name="quiesce-harness-loop", daemon=True
                )
                t.start()
                self._loop = loop
            return self._loop


_PRIVATE = _PrivateLoop()


async def _wait_for(aw: Awaitable[T]) -> T:
    return await aw


def _on_loop(what: str, aw: Awaitable[T], loop: asyncio.AbstractEventLoop, budget: float) -> T:
    fut = asyncio.run_coroutine_threadsafe(_wait_for(aw), loop)
    try:
        return fut.result(timeout=budget)
    except concurrent.futures.TimeoutError:
        fut.cancel()
        raise Unreachable(f"{what}: no answer in {budget:g} s") from None


def settle(
    what: str,
    call: Callable[[], T | Awaitable[T]],
    budget: float,
    loop: asyncio.AbstractEventLoop | None = None,
) -> T:
    """Run `call` (sync, or returning an awaitable) to completion within `budget` seconds.

    An exception it raises becomes Unreachable naming `what`; so does running out of budget
    (a sync call still running then is left to finish in its thread: nothing waits for it).
    """
    try:
        here = asyncio.get_running_loop()
    except RuntimeError:
        here = None
    if loop is not None and loop is here:
        raise RuntimeError(
            f"{what}: called on the event loop the exec function is bound to, which would wait "
            "for itself: call the kit through `await asyncio.to_thread(...)`"
        )
    target = loop if loop is not None else _PRIVATE.get()
    box: dict[str, object] = {}
    done = threading.Event()

    def run() -> None:
        try:
            got = call()
            box["value"] = _on_loop(what, got, target, budget) if inspect.isawaitable(got) else got
        except BaseException as e:  # handed to the waiting thread, which raises it
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name="quiesce-harness-call", daemon=True).start()
    if not done.wait(budget + 1.0):
        raise Unreachable(f"{what}: no answer in {budget:g} s")
    err = box.get("error")
    if isinstance(err, Unreachable):
        raise err
    if isinstance(err, TypeError):
        raise err
    if isinstance(err, BaseException):
        raise Unreachable(f"{what}: {type(err).__name__}: {err}") from err
    return cast(T, box["value"])
