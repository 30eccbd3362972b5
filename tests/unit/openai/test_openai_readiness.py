"""The readiness gate of the OpenAI front (openai/readiness.py)."""

from __future__ import annotations

import asyncio

import pytest

from trtllm_entrypoint.openai import readiness

pytestmark = pytest.mark.pure


def test_the_gate_opens_once_the_model_is_ready_and_closes_when_it_goes():
    answers = iter([ConnectionRefusedError("Cannot connect to host 127.0.0.1:8000"), False, True, True, False])

    async def probe() -> bool:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def main() -> list[bool]:
        gate = readiness.Gate(probe)
        return [gate.ready] + [await gate.check() for _ in range(5)]

    assert asyncio.run(main()) == [False, False, False, True, True, False]


def test_watching_keeps_the_gate_current(monkeypatch):
    monkeypatch.setattr(readiness, "LOADING_EVERY_S", 0.01)
    calls = []

    async def probe() -> bool:
        calls.append(1)
        return len(calls) >= 3  # ready at the third probe

    async def main() -> bool:
        gate = readiness.Gate(probe)
        async with gate.watching():
            for _ in range(500):
                if gate.ready:
                    break
                await asyncio.sleep(0.01)
        return gate.ready

    assert asyncio.run(main()) and len(calls) >= 3
