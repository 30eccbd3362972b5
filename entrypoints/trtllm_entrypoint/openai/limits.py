"""What one request may hold of a worker, and how its generations end together. Standard library only.

- Fan-out: a request runs prompts x n generations, each one backend stream. More than `max_generations`
  (OPENAI_MAX_GENERATIONS, default 256) is a 400 before any stream starts; the backend connection pool is bounded
  too (BACKEND_CONNECTIONS per worker: further streams wait for a connection).
- Together: a request's generations run as one group (`together`). When one fails, or the client leaves, or the
  handler is cancelled, the others are cancelled and awaited, which closes their backend streams: tritonserver stops a
  generate_stream only when its connection closes.
- Backpressure: the chunks of several streamed choices pass through a bounded queue (`interleave`), so a generation
  waits while the client does not read, and its backend stream waits in turn (aiohttp's client stops reading a
  socket whose buffer is full). A write that makes no progress for WRITE_TIMEOUT_S ends the request (`write`).
- Gathering: a streamed answer's events go out through a `Sink`, which writes everything gathered while more events
  were ready in one write: under load the backend's events come in bursts, and one system call (with its timer) per
  token was most of a worker's time. Each event is still its own SSE event; a lone token goes out at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol, TypeVar

from trtllm_entrypoint.openai.rules import Refused

T = TypeVar("T")

DEFAULT_MAX_GENERATIONS = 256
BACKEND_CONNECTIONS = 1024  # per worker
WRITE_TIMEOUT_S = 30.0
RELAY_CHUNKS = 64  # chunks waiting for the client, across a request's choices (each a few hundred bytes)
SINK_BYTES = 64 << 10  # gathered for the client before a write, however many more are ready


class ClientGone(Exception):  # noqa: N818
    """The client read nothing for WRITE_TIMEOUT_S, or closed its connection."""


def check_fanout(prompts: int, n: int, max_generations: int) -> None:
    """Refused (400) when a request would run more than `max_generations` generations."""
    if prompts * n > max_generations:
        field = "n" if prompts == 1 else "prompt"
        raise Refused(
            f"this request asks for {prompts} prompt(s) x n={n} = {prompts * n} generations; this server runs at "
            f"most {max_generations} for one request (OPENAI_MAX_GENERATIONS)",
            field,
        )


async def together(jobs: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """The results of `jobs`, run at once. The first failure (or this coroutine's cancellation) cancels the rest and
    waits until each has ended, then is raised."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        await cancel_all(tasks)


async def cancel_all(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel the tasks not done yet and wait until each has ended (its `finally` blocks run, its connections
    closed); a cancellation of the caller meanwhile still lets them end first."""
    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel()
    while pending:
        try:
            await asyncio.wait(pending)
        except asyncio.CancelledError:
            continue
        else:
            break
    for task in tasks:  # retrieved, so none is logged as "exception never retrieved"
        if task.done() and not task.cancelled():
            task.exception()


class Writer(Protocol):
    async def write(self, data: bytes) -> None: ...  # aiohttp's StreamResponse


async def write(
    response: Writer, data: bytes, timeout_s: float | None = None, transport: asyncio.WriteTransport | None = None
) -> None:
    """Write `data`, waiting while the client's socket is full, at most `timeout_s` (WRITE_TIMEOUT_S): ClientGone
    then, or when the connection is gone. Given the connection's transport, a write it has room for (it cannot wait)
    goes without a timer."""
    try:
        if transport is not None and _has_room(transport, len(data)):
            await response.write(data)
        else:
            await asyncio.wait_for(response.write(data), WRITE_TIMEOUT_S if timeout_s is None else timeout_s)
    except (asyncio.TimeoutError, ConnectionError) as exc:
        raise ClientGone(str(exc) or type(exc).__name__) from None


def _has_room(transport: asyncio.WriteTransport, size: int) -> bool:
    """Whether writing `size` bytes keeps the transport under its high-water mark: asyncio pauses a protocol (and
    aiohttp's write then waits) only above it."""
    high = transport.get_write_buffer_limits()[1]
    return not transport.is_closing() and transport.get_write_buffer_size() + size <= high


class Sink:
    """One streamed answer's way to its client: `add` gathers an event (True once SINK_BYTES are waiting: flush
    now), `flush` writes what was gathered at once. The stream flushes whenever it would wait for the backend."""

    def __init__(self, response: Writer, transport: asyncio.WriteTransport | None) -> None:
        self.response, self.transport = response, transport
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, data: bytes) -> bool:
        self.parts.append(data)
        self.size += len(data)
        return self.size >= SINK_BYTES

    async def flush(self) -> None:
        if not self.parts:
            return
        data = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
        self.parts.clear()
        self.size = 0
        await write(self.response, data, transport=self.transport)


async def interleave(
    producers: Sequence[Callable[[], AsyncGenerator[T, None]]],
    size: int | None = None,
    idle: Callable[[], Awaitable[None]] | None = None,
) -> AsyncGenerator[T, None]:
    """Several producers' items, in the order they come, through a bounded queue: a producer waits while the queue
    is full (so its backend stream waits too). The first producer's exception is raised here; closing this
    generator (or that exception) cancels every producer and waits until each has closed its stream. `idle` is
    awaited whenever no item is ready (a Sink's flush)."""
    queue: asyncio.Queue[object] = asyncio.Queue(RELAY_CHUNKS if size is None else size)
    end = object()

    async def pump(make: Callable[[], AsyncGenerator[T, None]]) -> None:
        try:
            async with contextlib.aclosing(make()) as items:  # closed, with its backend stream, when cancelled
                async for item in items:
                    await queue.put(item)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001  (handed to the reader, which raises it)
            await queue.put(exc)
        else:
            await queue.put(end)

    tasks = [asyncio.ensure_future(pump(make)) for make in producers]
    try:
        ended = 0
        while ended < len(tasks):
            if idle is not None and queue.empty():
                await idle()
            item = await queue.get()
            if item is end:
                ended += 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item  # type: ignore[misc]
    finally:
        await cancel_all(tasks)
