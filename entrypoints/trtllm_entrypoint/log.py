"""One line per event on stderr, as text or JSON, with secrets masked before anything is written.

Routine starts stay short: detail (full tables, full command lines) goes to `debug`, shown with LOG_LEVEL=debug.
Long steps log a heartbeat every `progress_s` seconds, so a log that watches a build never goes quiet.

Masking covers the secrets we know (tokens, admin keys) and the userinfo of any URL (`scheme://user:pass@host`), in
our lines and, through `capture_stderr`, in every line a library writes to this process's stderr (the hub client's
retries, warnings, logging): with LOG_FORMAT=json each of those becomes one JSON object too. Values are masked before
they are encoded, and control characters in them are escaped, so a value from outside cannot forge a line.
"""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import IO

from trtllm_entrypoint.errors import UsageError

MASK = "***"
DEFAULT_PROGRESS_S = 10.0
# The userinfo of a URL, up to the last '@' before the host: `http://user:p@ss@host/` -> `http://***@host/`.
URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s]*@")
# Characters that would end or rewrite a line (ANSI escapes included) when a value from outside is logged.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def mask_urls(text: str) -> str:
    return URL_USERINFO.sub(rf"\1{MASK}@", text)


def _escaped(match: re.Match[str]) -> str:
    char = match[0]
    return _ESCAPES.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def escape(text: str) -> str:
    """`text` on one line: control characters as escapes (`\\n`, `\\x1b`), so it cannot start a forged line."""
    return CONTROL.sub(_escaped, text)


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
        self.stream = stream if stream is not None else raw_stderr()
        self.secrets = tuple(s for s in secrets if s)
        self.verbose = level == "debug"
        self.progress_s = progress_s
        self._write = threading.Lock()  # heartbeats log from their own thread

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, MASK)
            # As JSON (or a repr) writes it, should a secret with '"' or '\\' reach an encoded line some other way.
            escaped = json.dumps(secret)[1:-1]
            if escaped != secret:
                text = text.replace(escaped, MASK)
        return mask_urls(text)

    def _value(self, value: object) -> object:
        """A field masked before it is encoded; numbers and booleans stay as they are in JSON."""
        if value is None or isinstance(value, (bool, int, float)):
            return value
        return self.redact(str(value))

    def event(self, level: str, message: str, **fields: object) -> None:
        message = self.redact(message)
        values = {key: self._value(value) for key, value in fields.items()}
        if self.fmt == "json":
            record = {"ts": round(time.time(), 3), "level": level, "msg": message, **values}
            line = json.dumps(record, default=str, sort_keys=False)
        else:
            extra = " ".join(f"{k}={escape(str(v))}" for k, v in values.items())
            line = f"[trtllm-entrypoint] {level}: {escape(message)}" + (f" {extra}" if extra else "")
        self.write_line(line)

    def write_line(self, line: str) -> None:
        """One finished line (masked once more: a secret may have been split across fields)."""
        with self._write:
            self.stream.write(self.redact(line) + "\n")
            self.stream.flush()

    def fatal(self, message: str, hint: str) -> None:
        """The one error the boundary reports: `error:` and `hint:` lines, or one JSON object."""
        if self.fmt == "json":
            self.event("error", message, **({"hint": hint} if hint else {}))
            return
        self.write_line(f"error: {escape(self.redact(message))}")
        if hint:
            self.write_line(f"hint: {escape(self.redact(hint))}")

    def library_line(self, line: str, level: str | None = None) -> None:
        """A line some library wrote to stderr: masked, and in JSON mode one object of its own (at the level of the
        logging record it came from, if any)."""
        if self.fmt == "json":
            guessed = "warning" if "warning" in line.lower() else "info"
            self.event(level or guessed, line.rstrip("\r"), source="stderr")
        else:
            self.write_line(self.redact(line))

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


class StderrLines(io.TextIOBase):
    """What `sys.stderr` is while the entrypoint runs: each line written to it goes out through `log`
    (`Log.library_line`). The server it execs writes to the descriptor itself, so its lines are not covered."""

    def __init__(self, raw: IO[str], log: Log):
        self.raw = raw
        self.log = log
        self._pending = ""
        self._lock = threading.RLock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        level = _record_level(sys._getframe(1))
        with self._lock:
            self._pending += text
            *lines, self._pending = self._pending.split("\n")
            for line in lines:
                self.log.library_line(line, level)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._pending:  # before an exec or exit: a line without its newline still goes out
                pending, self._pending = self._pending, ""
                self.log.library_line(pending)
        self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def isatty(self) -> bool:
        return False


_LEVELS = {"DEBUG": "debug", "WARNING": "warning", "ERROR": "error", "CRITICAL": "error"}


def _record_level(frame: FrameType | None) -> str | None:
    """The level of the logging record a handler is writing, when the write comes from one (its `emit`)."""
    for _ in range(4):
        if frame is None:
            return None
        record = frame.f_locals.get("record") if frame.f_code.co_name == "emit" else None
        if isinstance(record, logging.LogRecord):
            return _LEVELS.get(record.levelname, "info")
        frame = frame.f_back
    return None


def raw_stderr() -> IO[str]:
    """The stream under `StderrLines`, where the entrypoint's own lines go."""
    return sys.stderr.raw if isinstance(sys.stderr, StderrLines) else sys.stderr


def capture_stderr(log: Log) -> StderrLines:
    """Route every later write to `sys.stderr` (logging handlers, warnings, print) through `log`; called again with
    a new log (once the settings are parsed), it switches to that one."""
    if isinstance(sys.stderr, StderrLines):
        sys.stderr.flush()
        sys.stderr.log = log
        return sys.stderr
    raw = sys.stderr
    sys.stderr = lines = StderrLines(raw, log)
    # Warnings and logging's last resort look sys.stderr up at each write; a handler made before holds the old stream.
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if isinstance(handler, logging.StreamHandler) and handler.stream is raw:
                handler.setStream(lines)
    return lines


def retarget_stderr(log: Log) -> None:
    """Once the settings are parsed: a captured stderr goes through `log` (its format and secrets) from now on."""
    if isinstance(sys.stderr, StderrLines):
        capture_stderr(log)


def release_stderr() -> None:
    if isinstance(sys.stderr, StderrLines):
        sys.stderr.flush()
        sys.stderr = sys.stderr.raw
