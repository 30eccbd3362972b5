"""The OpenAI front's Prometheus metrics, served at `/metrics` on the front's own port.

Names, label names and buckets are vLLM's where the meaning is the same (vllm/v1/metrics/loggers.py: `vllm:` prefix,
`model_name` label, `finished_reason` on the success counter), so dashboards and alerts written for vLLM read them
unchanged; docs/openai.md lists each one with what it measures here. One label more, `lora_name`: the adapter a
request named (empty for the base model).

The front runs as several processes sharing one port, and a scrape reaches one of them: every process writes its
values into files of one directory (prometheus_client's multiprocess mode, PROMETHEUS_MULTIPROC_DIR, which the
supervisor creates fresh and private for each start), and whichever process answers the scrape sums them all.
prometheus_client reads that variable when it is first imported: the front's processes get it in their environment,
and server.py hands the same directory here. Without it (one process, tests) the values stay in memory.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PREFIX = "vllm:"
LABELS = ("model_name", "lora_name")
# vLLM's buckets (vllm/v1/metrics/loggers.py): the same le= values keep histogram_quantile() comparable.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0)  # fmt: skip
# vLLM's FinishReason values: OpenAI's two, and `abort` for a request that ended otherwise (the client left, the
# backend failed).
FINISH_REASONS = ("stop", "length", "abort")


def buckets_1_2_5(largest: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, … up to `largest` (vLLM's token-count buckets, up to the model's context)."""
    out: list[int] = []
    scale = 1
    while True:
        for step in (1, 2, 5):
            value = step * scale
            if value > largest:
                return tuple(out)
            out.append(value)
        scale *= 10


class Metrics:
    """Every family the front reports, and the scrape's text. One per process."""

    def __init__(self, max_model_len: int, multiproc_dir: str | None = None) -> None:
        # Imported here: the multiprocess switch is read at prometheus_client's first import.
        import prometheus_client as prom  # noqa: PLC0415

        self._prom = prom
        self.multiproc_dir = multiproc_dir or None
        # Families live in a registry of their own; in multiprocess mode a scrape reads the files instead.
        self.registry = prom.CollectorRegistry()
        labels = list(LABELS)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return prom.Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=self.registry)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
            return prom.Counter(PREFIX + name, doc, labels + list(extra), registry=self.registry)

        def gauge(name: str, doc: str) -> Any:
            # livesum: the sum over the processes that are alive (a dead worker's requests are not running).
            return prom.Gauge(PREFIX + name, doc, labels, multiprocess_mode="livesum", registry=self.registry)

        tokens = buckets_1_2_5(max(1, max_model_len))
        self.ttft = histogram(
            "time_to_first_token_seconds", "Time from a request's arrival to its first token.", TTFT_BUCKETS
        )
        self.itl = histogram("inter_token_latency_seconds", "Time between two tokens of the same answer.", ITL_BUCKETS)
        self.e2e = histogram(
            "e2e_request_latency_seconds", "Time from a request's arrival to its last byte.", E2E_BUCKETS
        )
        self.prompt_len = histogram("request_prompt_tokens", "Prompt tokens per request.", tokens)
        self.generation_len = histogram("request_generation_tokens", "Generated tokens per request.", tokens)
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of the requests, as `usage` reports them.")
        self.generation_tokens = counter(
            "generation_tokens", "Generated tokens of the requests, as `usage` reports them."
        )
        self.success = counter(
            "request_success", "Finished answers (one per choice) by their finish reason.", ("finished_reason",)
        )
        self.running = gauge("num_requests_running", "Requests whose first token has come and that are not done.")
        self.waiting = gauge("num_requests_waiting", "Requests sent to the model that have no token yet.")
        self._series: dict[tuple[str, str], Series] = {}

    @property
    def content_type(self) -> str:
        return str(self._prom.CONTENT_TYPE_LATEST)

    def exposition(self) -> bytes:
        """The scrape's text: every process's values summed in multiprocess mode, else this process's."""
        if self.multiproc_dir is None:
            return bytes(self._prom.generate_latest(self.registry))
        from prometheus_client import multiprocess  # noqa: PLC0415

        registry = self._prom.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=self.multiproc_dir)  # type: ignore[no-untyped-call]
        return bytes(self._prom.generate_latest(registry))

    def request(
        self, model_name: str, lora_name: str = "", clock: Callable[[], float] = time.monotonic
    ) -> RequestMetrics:
        """A request that has arrived (and counts as waiting until its first token)."""
        labels = (model_name, lora_name)
        series = self._series.get(labels)
        if series is None:  # labels() costs a lookup under a lock: once per model and adapter, not per token
            series = self._series[labels] = Series(self, labels)
        return RequestMetrics(series, clock)


class Tally:
    """A histogram child's observations gathered here and added to it in one go (`flush`): in multiprocess mode each
    observation is two writes to a shared file, each with a getpid() system call, which per token was a tenth of a
    worker's time. Flushed every FLUSH observations and at each request's end, so a scrape misses none of an ended
    request's. Reads the child's bucket values as prometheus_client 0.26 lays them out (vendored and pinned; a test
    checks the exposition equals observe()'s)."""

    FLUSH = 64

    def __init__(self, child: Any) -> None:
        self.child = child
        self.bounds: list[float] = list(child._upper_bounds)  # ends with +Inf
        self.counts = [0] * len(self.bounds)
        self.total = 0.0
        self.pending = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.pending += 1
        if self.pending >= self.FLUSH:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        for i, count in enumerate(self.counts):
            if count:
                self.child._buckets[i].inc(count)
                self.counts[i] = 0
        self.child._sum.inc(self.total)
        self.total, self.pending = 0.0, 0


class Series:
    """Every family's child for one served model and adapter."""

    def __init__(self, m: Metrics, labels: tuple[str, str]) -> None:
        self.ttft, self.e2e = m.ttft.labels(*labels), m.e2e.labels(*labels)
        self.itl = Tally(m.itl.labels(*labels))
        self.prompt_len, self.generation_len = m.prompt_len.labels(*labels), m.generation_len.labels(*labels)
        self.prompt_tokens, self.generation_tokens = (
            m.prompt_tokens.labels(*labels),
            m.generation_tokens.labels(*labels),
        )
        self.running, self.waiting = m.running.labels(*labels), m.waiting.labels(*labels)
        self.success = {reason: m.success.labels(*labels, reason) for reason in FINISH_REASONS}


@dataclass
class RequestMetrics:
    """One request's measurements from its arrival to its end; `finish` exactly once (also on errors)."""

    series: Series
    clock: Callable[[], float]
    started: float = 0.0
    first: bool = True
    done: bool = False
    last_token: dict[int, float] = field(default_factory=dict)  # choice index -> when its last token came

    def __post_init__(self) -> None:
        self.started = self.clock()
        self.series.waiting.inc()

    def token(self, choice: int = 0) -> None:
        """A token of one choice has come from the model."""
        now = self.clock()
        s = self.series
        if self.first:
            self.first = False
            s.ttft.observe(now - self.started)
            s.waiting.dec()
            s.running.inc()
        previous = self.last_token.get(choice)
        if previous is not None:
            s.itl.observe(now - previous)
        self.last_token[choice] = now

    def finish(self, reasons: list[str], prompt_tokens: int, generation_tokens: int) -> None:
        """The request is over: one finish reason per choice (`abort` for those that did not end normally), and
        the token counts its `usage` reports (or would have reported)."""
        if self.done:
            return
        self.done = True
        s = self.series
        s.itl.flush()
        s.e2e.observe(self.clock() - self.started)
        (s.waiting if self.first else s.running).dec()
        s.prompt_tokens.inc(prompt_tokens)
        s.generation_tokens.inc(generation_tokens)
        s.prompt_len.observe(prompt_tokens)
        s.generation_len.observe(generation_tokens)
        for reason in reasons:
            s.success.get(reason, s.success["abort"]).inc()
