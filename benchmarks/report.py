"""Pure helpers of the benchmarks: medians, targets, the result table and the JSON document. No I/O here."""

from __future__ import annotations

import operator
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

_OPS = {"<": operator.lt, "<=": operator.le, "==": operator.eq, ">=": operator.ge, ">": operator.gt}


def median(values: Sequence[float]) -> float:
    """The median of at least one value (the middle two averaged for an even count)."""
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


@dataclass(frozen=True)
class Target:
    """`value <op> threshold`, e.g. Target("<", 1.0, "s") for "under one second"."""

    op: str
    threshold: float
    unit: str = ""

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"unknown comparison {self.op!r}; allowed: {', '.join(_OPS)}")

    def met(self, value: float) -> bool:
        return _OPS[self.op](value, self.threshold)

    def describe(self) -> str:
        return f"{self.op} {format_value(self.threshold, self.unit)}"


@dataclass(frozen=True)
class Metric:
    """One row of the result table. `value` None means "not measured" (skipped: `note` says why)."""

    name: str
    value: float | None
    unit: str = ""
    target: Target | None = None
    note: str = ""
    details: dict = field(default_factory=dict)  # samples, breakdowns: JSON only, not in the table

    @property
    def status(self) -> str:
        return evaluate(self.value, self.target)

    def to_json(self) -> dict:
        data = asdict(self)
        data["target"] = self.target.describe() if self.target else None
        data["status"] = self.status
        return data


def evaluate(value: float | None, target: Target | None) -> str:
    """ "pass"/"fail" against the target, "skip" when nothing was measured, "info" when there is no target."""
    if value is None:
        return "skip"
    if target is None:
        return "info"
    return "pass" if target.met(value) else "fail"


def format_value(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "B":
        return format_bytes(value)
    if unit == "s":
        return f"{value:.3f} s"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "ms":
        return f"{value:.2f} ms"
    if float(value).is_integer():
        text = str(int(value))
    else:  # rates such as 1130.4 req/s: whole numbers, not 1.13e+03
        text = f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}".rstrip()


def format_bytes(value: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{int(value)} B"


def table(metrics: Sequence[Metric]) -> str:
    """A fixed-width table: metric | value | target | status, then the notes of rows that have one."""
    rows = [("metric", "value", "target", "status")]
    rows += [
        (m.name, format_value(m.value, m.unit), m.target.describe() if m.target else "-", m.status) for m in metrics
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    notes = [f"  {m.name}: {m.note}" for m in metrics if m.note]
    return "\n".join(lines + (["", "notes:"] + notes if notes else []))


def markdown_table(metrics: Sequence[Metric]) -> str:
    lines = ["| metric | value | target | status |", "|---|---|---|---|"]
    lines += [
        f"| {m.name} | {format_value(m.value, m.unit)} | {m.target.describe() if m.target else '-'} | {m.status} |"
        for m in metrics
    ]
    return "\n".join(lines)


def document(metrics: Sequence[Metric], machine: dict, settings: dict) -> dict:
    """The results JSON: machine, how it was run, every metric, and the overall verdict."""
    failed = [m.name for m in metrics if m.status == "fail"]
    return {
        "machine": machine,
        "settings": settings,
        "metrics": [m.to_json() for m in metrics],
        "failed": failed,
        "ok": not failed,
    }
