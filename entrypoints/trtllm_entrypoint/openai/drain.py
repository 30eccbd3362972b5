"""The front's drain on SIGTERM, said in the log: one line when it starts (the streams in flight, how long they may
still run), one when it ends (how many finished, how many were cut, after how long).

Streams get the grace (EXIT_TIMEOUT_SECS, as tritonserver's own drain) less CUT_MARGIN_S. One still running then is
cut by the front itself: its handler is cancelled, closes the backend's stream (which ends generation, as a client's
disconnect does) and writes OpenAI's error event, `[DONE]` and the end of the body, so the client reads a finished
answer that says why it stopped, never a broken transfer. aiohttp runs `shutdown` (an on_shutdown handler) after it
stopped accepting connections and before it waits for, and then cancels, the handlers still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

CUT_MARGIN_S = 1.0  # left of the grace to write the cut streams' error events before anything is killed
ERROR_CODE = "server_shutdown"


@dataclass(eq=False)
class Live:
    """One stream in flight: its handler's task, and whether the drain cut it."""

    task: asyncio.Task[Any] | None
    cut: bool = False


@dataclass
class Drain:
    grace_s: float  # how long streams may run once the drain starts (EXIT_TIMEOUT_SECS)
    say: Callable[..., None]  # Log.info: (message, **fields)
    margin_s: float = CUT_MARGIN_S
    live: set[Live] = field(default_factory=set)
    draining: bool = False

    @contextlib.contextmanager
    def stream(self) -> Iterator[Live]:
        """Around one stream's writing: the drain counts it, and may cut it (then `cut` is True and the handler
        sees CancelledError: it writes error_event() and [DONE])."""
        one = Live(asyncio.current_task())
        self.live.add(one)
        try:
            yield one
        finally:
            self.live.discard(one)

    @staticmethod
    def was_cut(one: Live) -> bool:
        """For the handler's `except CancelledError`: a cut of ours (the task carries on to end the stream), or any
        other cancellation (re-raise)."""
        if not one.cut:
            return False
        task = one.task
        if task is not None and hasattr(task, "uncancel"):  # Python 3.11+: the task is no longer being cancelled
            task.uncancel()
        return True

    @property
    def cut_message(self) -> str:
        """The error a cut stream ends with (OpenAI's shape, type server_error, code ERROR_CODE)."""
        return f"the server is shutting down: the answer was cut after the {self.grace_s:g} s drain"

    async def shutdown(self, _app: object = None) -> None:
        """Wait for the streams in flight, up to the grace less the margin; cut the rest; say both ends."""
        started = time.monotonic()
        self.draining = True
        wait_s = max(0.0, self.grace_s - self.margin_s)
        self.say("draining the OpenAI front", streams_in_flight=len(self.live), grace_s=round(wait_s, 1))
        before = len(self.live)
        deadline = started + wait_s
        while self.live and time.monotonic() < deadline:
            await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        cut = list(self.live)
        for one in cut:
            one.cut = True
            if one.task is not None:
                one.task.cancel()
        end = time.monotonic() + self.margin_s
        while self.live and time.monotonic() < end:  # each cut handler writes its error event and [DONE]
            await asyncio.sleep(0.01)
        self.say(
            "drain done",
            finished=before - len(cut),
            cut=len(cut),
            seconds=round(time.monotonic() - started, 1),
        )
