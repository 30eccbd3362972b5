"""A worker's sign of life for the supervisor (launch/supervise.py): its event loop writes one byte every BEAT_S
to the pipe named by contract.FRONT_HEARTBEAT_VARIABLE (openai/server.py reads it). A loop that is stuck (CPU-bound
work, a deadlock, SIGSTOP) stops beating, and the supervisor replaces the worker. When the supervisor is gone (the
pipe is broken), the worker stops itself rather than serve on as an orphan. Standard library only.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable

BEAT_S = 1.0


def heartbeat_fd(value: str | None) -> int | None:
    """The pipe's descriptor from contract.FRONT_HEARTBEAT_VARIABLE's value (None: no supervisor)."""
    return int(value) if value and value.isdigit() else None


def beating(fd: int | None) -> Callable[[object], Awaitable[None]]:
    """For aiohttp's Application.on_startup: beat on `fd` from the serving loop."""

    async def on_startup(_app: object) -> None:
        start(asyncio.get_running_loop(), fd)

    return on_startup


def start(loop: asyncio.AbstractEventLoop, fd: int | None) -> None:
    """Beat on `fd` from `loop` until the pipe breaks (then SIGTERM to this process). None: no supervisor."""
    if fd is None:
        return
    os.set_inheritable(fd, False)  # the worker's own children never hold the supervisor's pipe
    os.set_blocking(fd, False)

    def beat() -> None:
        try:
            os.write(fd, b".")
        except BlockingIOError:  # the supervisor reads later: the beats it has are enough
            pass
        except OSError:  # the supervisor is gone
            os.kill(os.getpid(), signal.SIGTERM)
            return
        loop.call_later(BEAT_S, beat)

    beat()
