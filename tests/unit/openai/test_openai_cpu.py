"""A request's CPU work (openai/cpu.py, openai/sandbox.py): off the loop, bounded in time and size, so no template
from a model repository and no long prompt can hold the worker's other streams."""

from __future__ import annotations

import asyncio
import time

import pytest

from trtllm_entrypoint.openai import cpu, sandbox

pytestmark = pytest.mark.pure

NESTED_SILENT = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}never"
NESTED_LOUD = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"


def render(source: str, timeout_s: float = 0.5, max_chars: int = 1 << 20, **context: object) -> str:
    template = sandbox.environment().from_string(source)
    return cpu.bounded(lambda: template.generate(**context), timeout_s, max_chars)


def test_a_template_that_loops_without_end_is_stopped_at_its_deadline():
    began = time.monotonic()
    with pytest.raises(cpu.RenderTimeout):
        render(NESTED_SILENT, timeout_s=0.3)
    assert time.monotonic() - began < 2


def test_a_template_whose_output_has_no_end_is_stopped_at_its_size():
    with pytest.raises(cpu.RenderTooLong):
        render(NESTED_LOUD, timeout_s=30, max_chars=100_000)


@pytest.mark.parametrize(
    "source",
    [
        "{{ 'a' * 10000000000 }}",
        "{{ [1, 2] * 100000000 }}",
        "{{ 10 ** 1000000000 }}",
        "{% set n = 1000000000 %}{{ 7 ** n }}",
        "{{ '%0999999999d' % 1 }}",
        "{{ '%0999999999d' | format(1) }}",
        "{{ '{:>999999999}'.format(1) }}",
        "{{ 'x' | center(1000000000) }}",
        "{{ 'x' | indent(1000000000, true) }}",
    ],
)
def test_single_operations_that_would_allocate_without_bound_are_refused(source):
    began = time.monotonic()
    with pytest.raises(sandbox.TooBig):
        render(source, timeout_s=30)
    assert time.monotonic() - began < 1


def test_ordinary_templates_render_as_before():
    source = "{% for m in messages %}{{ '<|' + m.role + '|>' }}{{ m.content | trim }}{% endfor %}{{ '%d' % 3 }}"
    messages = [{"role": "user", "content": " hi "}]
    assert render(source, messages=messages) == "<|user|>hi3"
    assert render("{{ 'ab' * 3 }}{{ 2 ** 10 }}{{ 'x' | indent(2) }}{{ 'x' | center(5) }}") == "ababab1024x  x  "


def test_the_pool_thread_is_clean_after_a_timeout():
    pool = cpu.Pool(threads=1)

    async def main() -> str:
        with pytest.raises(cpu.RenderTimeout):
            await pool.run(render, NESTED_SILENT, 0.2)
        await asyncio.sleep(0.3)  # no stray exception reaches the thread's next task
        return await pool.run(lambda: sum(range(3_000_000)) and "next task ran")

    try:
        assert asyncio.run(main()) == "next task ran"
    finally:
        pool.close()


def test_the_loop_keeps_serving_while_a_hostile_template_renders():
    pool = cpu.Pool()

    async def main() -> float:
        gaps, last = [], time.monotonic()

        async def ticker() -> None:
            nonlocal last
            while True:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        ticking = asyncio.ensure_future(ticker())
        with pytest.raises(cpu.RenderTimeout):
            await pool.run(render, NESTED_SILENT, 1.5)
        ticking.cancel()
        return max(gaps)

    try:
        assert asyncio.run(main()) < 0.5
    finally:
        pool.close()


def test_counting_a_long_prompt_stops_once_a_prefix_is_over_the_limit():
    seen: list[int] = []

    def count(text: str) -> int:
        seen.append(len(text))
        return len(text.split())

    text = "word " * 3_000_000  # 15 MB
    assert cpu.count_within(count, text, 4096) > 4096
    assert max(seen) < 200_000  # the 15 MB were never tokenized whole
    short = "word " * 100
    assert cpu.count_within(count, short, 4096) == 100
    assert cpu.count_within(count, "w " * 70_000, 100_000) == 70_000  # fits: counted whole
