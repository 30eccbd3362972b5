"""Honest readiness: the front serves `/v1/*` only once tritonserver reports the served model ready. Until then (and
whenever a later check fails) every such route answers 503 in OpenAI's shape, saying the model is loading, so a
client that waits on `/v1/models` (vLLM's documented way to wait) never gets a first request refused. Standard
library only: the probe is the caller's (a GET of tritonserver's `/v2/models/<name>/ready`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

LOADING_EVERY_S = 0.5  # while the model loads: a client waits at most this long after it is ready
READY_EVERY_S = 5.0  # once ready: notices a model that went away
LOADING_MESSAGE = "the model is loading: try again shortly (GET /health/ready answers 200 once it is ready)"


class Gate:
    """Whether the served model is ready, as the last probe said; `watch` keeps it current."""

    def __init__(self, probe: Callable[[], Awaitable[bool]]) -> None:
        self.probe = probe
        self.ready = False

    async def check(self) -> bool:
        try:
            self.ready = bool(await self.probe())
        except Exception:  # noqa: BLE001  (tritonserver not answering yet is "not ready")
            self.ready = False
        return self.ready

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(READY_EVERY_S if await self.check() else LOADING_EVERY_S)

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """Watch while the block runs (aiohttp's cleanup_ctx)."""
        task = asyncio.ensure_future(self.watch())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
