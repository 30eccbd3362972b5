"""One line per event on stderr, as text or JSON, with secrets masked before anything is written.

Routine starts stay short: detail (full tables, full command lines) goes to `debug`, shown with LOG_LEVEL=debug.
Long steps log a heartbeat every `progress_s` seconds, so a log that watches a build never goes quiet.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO

from trtllm_entrypoint.errors import UsageError

MASK = "***"
DEFAULT_PROGRESS_S = 10.0


class Log:
    def __init__(
        self,
        fmt: str = "text",
        stream: IO[str] | None = None,
        secrets: tuple[str, ...] = (),
        *,
        level: str = "info",
        progress_s: float = DEFAULT_PROGRESS_S,
    ):
        self.fmt = fmt
        self.stream = stream if stream is not None else sys.stderr
        self.secrets = tuple(s for s in secrets if s)
        self.verbose = level == "debug"
        self.progress_s = progress_s
        self._write = threading.Lock()  # heartbeats log from their own thread

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, MASK)
        return text

    def event(self, level: str, message: str, **fields: object) -> None:
        if self.fmt == "json":
            record = {"ts": round(time.time(), 3), "level": level, "msg": message, **fields}
            line = json.dumps(record, default=str, sort_keys=False)
        else:
            extra = " ".join(f"{k}={v}" for k, v in fields.items())
            line = f"[trtllm-entrypoint] {level}: {message}" + (f" {extra}" if extra else "")
        with self._write:
            self.stream.write(self.redact(line) + "\n")
            self.stream.flush()

    def debug(self, message: str, **fields: object) -> None:
        if self.verbose:
            self.event("debug", message, **fields)

    def info(self, message: str, **fields: object) -> None:
        self.event("info", message, **fields)

    def warn(self, message: str, **fields: object) -> None:
        self.event("warning", message, **fields)

    def error(self, message: str, **fields: object) -> None:
        self.event("error", message, **fields)

    @contextmanager
    def heartbeat(
        self, message: str, fields: Callable[[float], dict[str, object]] | None = None, **static: object
    ) -> Iterator[None]:
        """Logs `message` every `progress_s` seconds while the body runs, with the elapsed seconds, `static` and
        `fields(elapsed)` (e.g. bytes done so far); the thread stops with the body."""
        stop = threading.Event()
        started = time.monotonic()

        def beat() -> None:
            while not stop.wait(self.progress_s):
                elapsed = time.monotonic() - started
                try:
                    live = fields(elapsed) if fields is not None else {}
                except Exception:  # noqa: BLE001  (a progress figure must never break the step it reports on)
                    live = {}
                self.info(message, **static, elapsed_s=round(elapsed), **live)

        thread = threading.Thread(target=beat, name="trtllm-entrypoint-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    @contextmanager
    def phase(self, name: str, **fields: object) -> Iterator[dict[str, object]]:
        """Logs `phase done` with its duration; the body may add fields (e.g. cache=hit) to the yielded dict."""
        extra: dict[str, object] = {}
        start = time.monotonic()
        try:
            yield extra
        except UsageError:
            raise  # bad input is reported as exactly one line, by main
        except BaseException:
            self.event("error", "phase failed", phase=name, seconds=round(time.monotonic() - start, 3), **fields)
            raise
        self.info("phase done", phase=name, seconds=round(time.monotonic() - start, 3), **fields, **extra)
