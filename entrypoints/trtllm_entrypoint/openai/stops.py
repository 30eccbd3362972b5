"""Stop sequences in streamed text: the front cuts the answer exactly where the first one starts."""

from __future__ import annotations

from collections.abc import Sequence


class StopScanner:
    """Finds the first stop sequence in streamed text, holding back only a tail that could start one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self.held = ""

    def feed(self, piece: str) -> tuple[str, bool]:
        """(text that may be shown now, whether a stop sequence ended the text)."""
        if not self.stops:
            return piece, False
        text = self.held + piece
        hits = [i for i in (text.find(stop) for stop in self.stops) if i >= 0]
        if hits:
            self.held = ""
            return text[: min(hits)], True
        keep = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(text)), keep, -1):
                if text.endswith(stop[:size]):
                    keep = size
                    break
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held
