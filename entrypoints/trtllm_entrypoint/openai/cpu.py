"""A request's CPU work, off the event loop and bounded, so that no request makes another client's stream wait.

- Rendering a chat template and tokenizing run on a small pool of threads, never on the loop. Hugging Face
  tokenizers' `encode_batch` releases the GIL while it works (`encode` does not: 2 MB held the loop 5 s here), so
  the loop keeps streaming meanwhile; a template's Python code shares the GIL with the loop in the interpreter's
  usual slices.
- A render stops at RENDER_TIMEOUT_S (an exception raised in its thread) and once its output passes max_chars: a
  template from the model repository with nested loops can no longer hold a worker for good. Single operations that
  would allocate without bound are refused by the sandbox itself (openai/sandbox.py).
- Counting a long prompt's tokens stops as soon as a prefix holds more than the limit: the work is bounded by the
  model's context, not by the 16 MiB a body may have.
Standard library only.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

THREADS = 2  # per worker: CPU work queues here rather than multiplying
RENDER_TIMEOUT_S = 2.0
MAX_RENDER_CHARS = 32 << 20  # twice the largest body: a template adds little to the messages it renders
# Tokenizers see text in pieces of this many characters at first, doubling while the prefix still fits.
FIRST_WINDOW = 1 << 16


class RenderTimeout(BaseException):  # noqa: N818  (a BaseException: template code cannot swallow it)
    """Raised in a render's thread when its time is up."""


class RenderTooLong(Exception):  # noqa: N818
    def __init__(self, limit: int) -> None:
        super().__init__(f"the chat template's output passed {limit} characters")
        self.limit = limit


class Pool:
    """The worker's threads for CPU work."""

    def __init__(self, threads: int = THREADS) -> None:
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix="front-cpu")

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise `exc` in thread `thread_id` at its next bytecode (None: clear one not yet raised)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc else None)


def bounded(chunks: Callable[[], Iterable[str]], timeout_s: float, max_chars: int) -> str:
    """The text of `chunks()` (a template's generate()), stopped with RenderTimeout after `timeout_s` and with
    RenderTooLong once it passes `max_chars`. Call it in a pool thread, never on the loop."""
    me = threading.get_ident()
    lock = threading.Lock()
    running = [True]

    def interrupt() -> None:
        with lock:
            if running[0]:
                _raise_in(me, RenderTimeout)

    timer = threading.Timer(timeout_s, interrupt)
    timer.daemon = True
    parts: list[str] = []
    size = 0
    try:
        timer.start()
        for chunk in chunks():
            size += len(chunk)
            if size > max_chars:
                raise RenderTooLong(max_chars)
            parts.append(chunk)
    finally:
        with lock:
            running[0] = False
            timer.cancel()
            _raise_in(me, None)  # one that was set but not raised yet must not hit this thread's next task
    return "".join(parts)


def count_within(count: Callable[[str], int], text: str, limit: int) -> int:
    """`count(text)`, or, once a prefix of the text (cut at a space, so its tokens are the text's own) already has
    more than `limit` tokens, that prefix's count: the text is too long then, and the rest is never tokenized."""
    window = FIRST_WINDOW
    while window < len(text):
        cut = text.rfind(" ", window // 2, window)
        prefix = text[: cut if cut > 0 else window]
        tokens = count(prefix)
        if tokens > limit:
            return tokens
        window *= 2
    return count(text)
