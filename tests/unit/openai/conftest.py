"""What the OpenAI front's tests share: one worker built from its plan (server.build) in front of the FAKE
tritonserver (harness/fake_triton.py), served in-process by aiohttp's test server, asked by the official `openai`
client where a client matters. The tokenizer is real (the tiny Llama's, SentencePiece-shaped as Llama 2's: `▁` word
starts, byte fallback); only tritonserver is faked. The engine workflow's front asks the tensorrt_llm model with
token ids: the fake answers a reply's text as the ids that tokenizer makes of it."""

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
tokenizers = pytest.importorskip("tokenizers")

from aiohttp.test_utils import TestServer  # noqa: E402

from trtllm_entrypoint.openai import server  # noqa: E402
from trtllm_entrypoint.openai.plan import FrontPlan  # noqa: E402

# The inputs and outputs of the engine workflow's tensorrt_llm model that the front uses (upstream's names).
ENGINE_CONFIG = """name: "tensorrt_llm"
input [
  { name: "input_ids" }, { name: "input_lengths" }, { name: "request_output_len" }, { name: "streaming" },
  { name: "end_id" }, { name: "pad_id" }, { name: "exclude_input_in_output" }, { name: "temperature" },
  { name: "runtime_top_p" }, { name: "runtime_top_k" }, { name: "random_seed" }, { name: "return_log_probs" }
]
output [ { name: "output_ids" }, { name: "sequence_length" }, { name: "output_log_probs" } ]
"""
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
KEY = "front-test-key-0123456789"


@dataclasses.dataclass
class Kit:
    """A plan for a worker on this test's files; `ask` runs `calls(base_url)` against it and the fake."""

    plan: FrontPlan
    key: str = KEY  # the admin key each worker gets

    @property
    def tokenizer(self) -> tokenizers.Tokenizer:
        return tokenizers.Tokenizer.from_file(str(Path(self.plan.tokenizer) / "tokenizer.json"))

    def encode(self, text: str) -> list[int]:
        """A reply's ids, as the fake sends them."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def prompt_ids(self, text: str) -> list[int]:
        """A prompt's ids, as the front sends them (as the preprocessing model makes them: BOS first)."""
        return list(self.tokenizer.encode(text).ids)

    def chat_ids(self, rendered: str) -> list[int]:
        """A rendered chat's ids, as the front sends them: the template wrote its special tokens, none are added
        (as transformers' apply_chat_template(tokenize=True))."""
        return list(self.tokenizer.encode(rendered, add_special_tokens=False).ids)

    def ask(self, fake: FakeTriton, calls: Callable[[str], Awaitable[Any]], **plan: Any) -> Any:
        if fake.encode is None:
            fake.encode = self.encode

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
    tokenizer = tiny_llama(tmp_path / "tiny", tokenizer="llama2")
    (tokenizer / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    config = tmp_path / "repository" / "tensorrt_llm" / "config.pbtxt"
    config.parent.mkdir(parents=True)
    config.write_text(ENGINE_CONFIG)
    return Kit(
        FrontPlan(
            host="127.0.0.1",
            port=0,
            workers=1,
            triton_url="http://127.0.0.1:1",  # each ask puts the fake's URL here
            served_name="ensemble",
            entry_model="tensorrt_llm",
            workflow="engine",
            config=str(config),
            tokenizer=str(tokenizer),
            add_special_tokens=True,
            skip_special_tokens=True,
            restricted=(),
            max_seq_len=64,
            shutdown_timeout=5.0,
            max_generations=256,
        )
    )
