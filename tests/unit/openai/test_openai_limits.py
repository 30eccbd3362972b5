"""What one request may hold of a worker (openai/limits.py): bounded fan-out, generations that end together, bounded
queues and writes that time out."""

from __future__ import annotations

import asyncio
import time

import pytest

from trtllm_entrypoint.openai import limits, rules

pytestmark = pytest.mark.pure


def test_more_generations_than_the_limit_is_refused_naming_the_field():
    limits.check_fanout(16, 16, 256)
    with pytest.raises(rules.Refused) as many_prompts:
        limits.check_fanout(1024, 16, 256)
    assert many_prompts.value.field == "prompt" and "16384" in many_prompts.value.message
    with pytest.raises(rules.Refused) as big_n:
        limits.check_fanout(1, 300, 256)
    assert big_n.value.field == "n"


class Stream:
    """A backend stream stand-in: open until its generator is closed."""

    open: set[int]

    def __init__(self) -> None:
        self.open = set()

    async def tokens(self, index: int, count: int, fail_at: int | None = None, delay: float = 0.01):
        self.open.add(index)
        try:
            for i in range(count):
                if i == fail_at:
                    raise ValueError(f"choice {index} failed")
                await asyncio.sleep(delay)
                yield f"{index}:{i}".encode()
        finally:
            self.open.discard(index)


async def drain(chunks) -> int:
    n = 0
    async for _ in chunks:
        n += 1
    return n


def test_a_failed_choice_ends_its_siblings_before_the_answer():
    streams = Stream()

    async def main() -> None:
        jobs = [drain(streams.tokens(0, 3, fail_at=2)), *(drain(streams.tokens(k, 100_000)) for k in range(1, 8))]
        with pytest.raises(ValueError, match="choice 0"):
            await limits.together(jobs)
        assert streams.open == set(), "siblings still generate after the client got its error"

    asyncio.run(main())


def test_a_cancelled_request_ends_every_generation():
    streams = Stream()

    async def main() -> None:
        task = asyncio.ensure_future(limits.together([drain(streams.tokens(k, 100_000)) for k in range(8)]))
        await asyncio.sleep(0.1)
        assert len(streams.open) == 8
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert streams.open == set()

    asyncio.run(main())


def test_a_client_that_reads_nothing_stops_the_generations_and_holds_a_bounded_queue():
    streams = Stream()
    produced = []

    def producer(k: int):
        async def chunks():
            async for chunk in streams.tokens(k, 100_000, delay=0):
                produced.append(chunk)
                yield chunk

        return chunks

    async def main() -> None:
        chunks = limits.interleave([producer(k) for k in range(8)], size=8)
        assert await chunks.__anext__()  # the client read one chunk, then nothing more
        await asyncio.sleep(0.3)
        assert len(produced) <= 1 + 8 + 8 + 1, f"{len(produced)} chunks made for a client that reads nothing"
        await chunks.aclose()  # the client is gone
        assert streams.open == set()

    asyncio.run(main())


def test_interleaving_passes_every_chunk_and_raises_the_first_failure_after_ending_the_rest():
    streams = Stream()

    async def collect(chunks) -> list[bytes]:
        return [chunk async for chunk in chunks]

    async def main() -> None:
        got = await collect(limits.interleave([lambda k=k: streams.tokens(k, 5) for k in range(3)]))
        assert sorted(got) == sorted(f"{k}:{i}".encode() for k in range(3) for i in range(5))
        failing = [lambda: streams.tokens(0, 10**6), lambda: streams.tokens(1, 5, fail_at=3)]
        with pytest.raises(ValueError, match="choice 1"):
            await collect(limits.interleave(failing))
        assert streams.open == set()

    asyncio.run(main())


def test_a_write_that_makes_no_progress_times_out():
    class NeverDrains:
        async def write(self, data: bytes) -> None:
            await asyncio.sleep(3600)

    class Reset:
        async def write(self, data: bytes) -> None:
            raise ConnectionResetError("Cannot write to closing transport")

    async def main() -> None:
        began = time.monotonic()
        with pytest.raises(limits.ClientGone):
            await limits.write(NeverDrains(), b"x", timeout_s=0.2)
        assert time.monotonic() - began < 2
        with pytest.raises(limits.ClientGone):
            await limits.write(Reset(), b"x")

    asyncio.run(main())


def test_a_sink_writes_what_it_gathered_at_once_and_only_when_asked_or_full():
    class Recorder:
        def __init__(self) -> None:
            self.writes: list[bytes] = []

        async def write(self, data: bytes) -> None:
            self.writes.append(data)

    async def main() -> Recorder:
        response = Recorder()
        sink = limits.Sink(response, None)
        assert not sink.add(b"a") and not sink.add(b"b")
        assert response.writes == []  # gathered, not written
        await sink.flush()
        await sink.flush()  # nothing gathered: no write
        assert sink.add(b"x" * limits.SINK_BYTES)  # full: the caller flushes now
        await sink.flush()
        return response

    assert asyncio.run(main()).writes == [b"ab", b"x" * limits.SINK_BYTES]
