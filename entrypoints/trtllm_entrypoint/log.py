"""One line per event on stderr, as text or JSON, with secrets masked before anything is written."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

from trtllm_entrypoint.errors import UsageError

MASK = "***"


class Log:
    def __init__(self, fmt: str = "text", stream: IO[str] | None = None, secrets: tuple[str, ...] = ()):
        self.fmt = fmt
        self.stream = stream if stream is not None else sys.stderr
        self.secrets = tuple(s for s in secrets if s)

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
        self.stream.write(self.redact(line) + "\n")
        self.stream.flush()

    def info(self, message: str, **fields: object) -> None:
        self.event("info", message, **fields)

    def warn(self, message: str, **fields: object) -> None:
        self.event("warning", message, **fields)

    def error(self, message: str, **fields: object) -> None:
        self.event("error", message, **fields)

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
