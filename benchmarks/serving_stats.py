"""Pure statistics of the serving benchmark: percentiles, unary and streaming summaries. No I/O, no timing here."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between the closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not between 0 and 100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class UnaryRun:
    """Closed-loop load: `concurrency` clients each sending the next request when the last one is answered."""

    concurrency: int
    seconds: float  # wall time of the measured window
    latencies_s: tuple[float, ...]  # one per request completed in the window
    errors: int = 0

    @property
    def throughput(self) -> float:
        return len(self.latencies_s) / self.seconds

    def p(self, q: float) -> float:
        return percentile(self.latencies_s, q)


def token_gaps(arrivals: Sequence[Sequence[float]]) -> list[float]:
    """Inter-token latencies: the gaps between successive responses of each stream (a stream of n tokens has
    n - 1 gaps; its first token counts for the time to first token instead)."""
    return [later - earlier for stream in arrivals for earlier, later in zip(stream, stream[1:], strict=False)]


@dataclass(frozen=True)
class StreamRun:
    """Streaming load: for each request, when it was sent and when each of its token responses arrived."""

    concurrency: int
    seconds: float
    sent_s: tuple[float, ...]
    arrivals_s: tuple[tuple[float, ...], ...]  # per request, per token (same clock as sent_s)
    errors: int = 0

    @property
    def ttft_s(self) -> list[float]:
        return [tokens[0] - sent for sent, tokens in zip(self.sent_s, self.arrivals_s, strict=True) if tokens]

    @property
    def itl_s(self) -> list[float]:
        return token_gaps(self.arrivals_s)

    @property
    def tokens_per_s(self) -> float:
        return sum(len(tokens) for tokens in self.arrivals_s) / self.seconds


def per_token_overhead_s(itl_p50_s: float, token_delay_s: float) -> float:
    """What the pipeline adds to each streamed token: the median inter-token latency beyond the engine's own delay
    per token (each token passes postprocessing, the ensemble scheduler and gRPC on its way out)."""
    return itl_p50_s - token_delay_s
