"""The JSON build report, `<out>/reports/<tag>.json`: what was built, how long each phase took, what was verified.

A report is written whether the build succeeded or not, so a failed CI job still leaves the evidence behind.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trtllm_images.atomic import write_atomic

REPORT_VERSION = 1


class BuildRecord:
    """Collects the facts of one tag's build as it runs; `to_dict` is the report."""

    def __init__(self, tag: str, clock=time.monotonic):
        self.tag = tag
        self.base_image: str | None = None
        self.images: list[dict] = []
        self.durations: dict[str, float] = {}
        self.verifications: list[dict] = []
        self.findings: list[dict] = []
        self.pushed: list[str] = []
        self.error: dict | None = None
        self._clock = clock

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a phase; a phase that raises still records how long it ran."""
        start = self._clock()
        try:
            yield
        finally:
            self.durations[name] = round(self._clock() - start, 3)

    def add_image(self, kind: str, ref: str, image_id: str) -> None:
        self.images.append({"kind": kind, "ref": ref, "id": image_id})

    def add_findings(self, findings) -> None:
        self.findings.extend(_finding_dict(f) for f in findings)

    def add_verification(self, verification) -> None:
        self.verifications.append(verification.to_dict())

    def fail(self, message: str, hint: str) -> None:
        self.error = {"message": message, "hint": hint}

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def warning_count(self) -> int:
        """Every warning the build printed: the static checks' and the verification's."""
        checks = sum(1 for finding in self.findings if finding.get("level") == "warning")
        return checks + sum(len(v["warnings"]) for v in self.verifications)

    def to_dict(self) -> dict:
        return {
            "report_version": REPORT_VERSION,
            "tag": self.tag,
            "ok": self.ok,
            "error": self.error,
            "base_image": self.base_image,
            "images": self.images,
            "pushed": self.pushed,
            "durations_s": self.durations,
            "verification": {
                "ok": all(v["ok"] for v in self.verifications) if self.verifications else None,
                "images": self.verifications,
            },
            "findings": self.findings,
        }


def report_path(out_dir: Path, tag: str) -> Path:
    return Path(out_dir) / "reports" / f"{tag}.json"


def write_report(out_dir: Path, record: BuildRecord) -> Path:
    """Write the report atomically: readers see the previous report or the new one, never half of one."""
    text = json.dumps(record.to_dict(), indent=2, default=str) + "\n"
    return write_atomic(report_path(out_dir, record.tag), text.encode("utf-8"))


def _finding_dict(finding) -> dict:
    is_record = dataclasses.is_dataclass(finding) and not isinstance(finding, type)
    return dataclasses.asdict(finding) if is_record else dict(vars(finding))
