"""What the OpenAI front's tests share: one worker built from its plan (server.build) in front of the FAKE
tritonserver (harness/fake_triton.py), served in-process by aiohttp's test server, asked by the official `openai`
client where a client matters. The tokenizer is real (the tiny Llama's); only tritonserver is faked."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from harness.fake_triton import FakeTriton
from harness.tiny_checkpoint import tiny_llama

pytest.importorskip("aiohttp")
pytest.importorskip("msgspec")

from aiohttp.test_utils import TestServer  # noqa: E402

from trtllm_entrypoint.openai import server  # noqa: E402
from trtllm_entrypoint.openai.plan import FrontPlan  # noqa: E402

# The inputs and outputs of the engine workflow's ensemble that the front uses (upstream's config.pbtxt names).
ENGINE_CONFIG = """name: "ensemble"
input [
  { name: "text_input" }, { name: "max_tokens" }, { name: "stream" }, { name: "bad_words" }, { name: "stop_words" },
  { name: "temperature" }, { name: "top_p" }, { name: "top_k" }, { name: "random_seed" }, { name: "return_log_probs" }
]
output [ { name: "text_output" }, { name: "output_log_probs" } ]
"""
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
KEY = "front-test-key-0123456789"


@dataclasses.dataclass
class Kit:
    """A plan for a worker on this test's files; `ask` runs `calls(base_url)` against it and the fake."""

    plan: FrontPlan
    key: str = KEY  # the admin key each worker gets

    def ask(self, fake: FakeTriton, calls: Callable[[str], Awaitable[Any]], **plan: Any) -> Any:
        async def run() -> Any:
            async with fake.serve() as url:
                front = server.build(dataclasses.replace(self.plan, **{"triton_url": url, **plan}), self.key)
                app = server.make_app(front)
                async with TestServer(
                    app, host="127.0.0.1", handler_cancellation=server.HANDLER_CANCELLATION
                ) as served:
                    return await calls(str(served.make_url("")).rstrip("/"))

        return asyncio.run(run())


@pytest.fixture
def kit(tmp_path: Path) -> Kit:
    tokenizer = tiny_llama(tmp_path / "tiny")
    (tokenizer / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    config = tmp_path / "repository" / "ensemble" / "config.pbtxt"
    config.parent.mkdir(parents=True)
    config.write_text(ENGINE_CONFIG)
    return Kit(
        FrontPlan(
            host="127.0.0.1",
            port=0,
            workers=1,
            triton_url="http://127.0.0.1:1",  # each ask puts the fake's URL here
            served_name="ensemble",
            entry_model="ensemble",
            workflow="engine",
            config=str(config),
            tokenizer=str(tokenizer),
            restricted=(),
            max_seq_len=64,
            shutdown_timeout=5.0,
            max_generations=256,
        )
    )
