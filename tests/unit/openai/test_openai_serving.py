"""Answering (openai/serving.py with completions.py and chat.py) through a whole worker in front of the FAKE
tritonserver, asked by the official `openai` client: streamed and whole answers, n > 1, stop sequences, usage,
echo, log-probabilities, the backend's errors, and a client that leaves mid-stream. The engine workflow's front
streams token ids from the tensorrt_llm model and decodes them with the model's (SentencePiece) tokenizer: the
texts below are what that tokenizer decodes, spaces included."""

from __future__ import annotations

import asyncio

import pytest

from harness.fake_triton import FakeTriton, Reply, words
from harness.tiny_checkpoint import PROMPT

openai = pytest.importorskip("openai")
aiohttp = pytest.importorskip("aiohttp")

# The official client asks the platform for its headers once (`uname -p`): a program, so this layer.
pytestmark = pytest.mark.process

MESSAGES = [{"role": "user", "content": PROMPT}]


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


def prompt_tokens(kit, text: str) -> int:
    return len(kit.prompt_ids(text))


def first_tokens(kit, text: str, count: int) -> str:
    """What the tokenizer decodes of a reply's first `count` tokens (the fake sends the reply's ids)."""
    return kit.tokenizer.decode(kit.encode(text)[:count])


def test_a_completion_streams_one_chunk_per_token_then_its_finish_reason_and_usage(kit):
    fake = FakeTriton(lambda body: words("The capital of France is Paris."))

    async def calls(url):
        async with client(url) as api:
            stream = await api.completions.create(
                model="ensemble", prompt=PROMPT, max_tokens=3, stream=True, stream_options={"include_usage": True}
            )
            chunks = [chunk async for chunk in stream]
            whole = await api.completions.create(model="ensemble", prompt=PROMPT, max_tokens=3)
            short = await api.completions.create(model="ensemble", prompt=PROMPT, max_tokens=9)
            return chunks, whole, short

    chunks, whole, short = kit.ask(fake, calls)
    assert [c.choices[0].text for c in chunks[:-2]] == ["The", " capital", " of"]  # each word with its space
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-2].choices[0].text == ""
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3
    assert all(c.usage is None for c in chunks[:-1]) and len({c.id for c in chunks}) == 1
    assert chunks[0].id.startswith("cmpl-") and chunks[0].object == "text_completion"
    assert whole.choices[0].text == "The capital of" and whole.choices[0].finish_reason == "length"
    assert (
        whole.usage.prompt_tokens == prompt_tokens(kit, PROMPT)
        and whole.usage.total_tokens == 3 + whole.usage.prompt_tokens
    )
    assert short.choices[0].text == "The capital of France is Paris." and short.choices[0].finish_reason == "stop"
    body = fake.seen[0].body
    assert fake.seen[0].model == "tensorrt_llm"  # straight to the engine: no Python pre/postprocessing
    assert body["input_ids"] == kit.prompt_ids(PROMPT) and body["input_lengths"] == len(body["input_ids"])
    assert (body["request_output_len"], body["streaming"], body["end_id"], body["pad_id"]) == (3, True, 2, 2)
    assert body["exclude_input_in_output"] is True and "stop_words_list" not in body  # stops are the front's


def test_n_choices_stream_interleaved_each_from_its_own_seed(kit):
    def by_seed(body):
        seed = body["random_seed"]
        return Reply(pieces=[f"{seed} is {seed}"], delay_s=0.005 * (seed % 3))

    fake = FakeTriton(by_seed)

    async def calls(url):
        async with client(url) as api:
            stream = await api.completions.create(model="ensemble", prompt="x", max_tokens=3, n=3, seed=10, stream=True)
            chunks = [chunk async for chunk in stream]
            whole = await api.completions.create(model="ensemble", prompt=["a", "b"], max_tokens=2, n=2, seed=1)
            return chunks, whole

    chunks, whole = kit.ask(fake, calls)
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    for chunk in chunks:
        (choice,) = chunk.choices  # one choice per chunk, as each comes
        texts[choice.index] = texts.get(choice.index, "") + choice.text
        if choice.finish_reason:
            reasons[choice.index] = choice.finish_reason
    assert texts == {k: first_tokens(kit, f"{10 + k} is {10 + k}", 3) for k in range(3)}
    assert len(set(texts.values())) == 3
    assert reasons == {0: "length", 1: "length", 2: "length"}
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]  # prompt by prompt, n each
    prompts_asked = [kit.tokenizer.decode(seen.body["input_ids"]) for seen in fake.seen[3:]]
    assert sorted(prompts_asked) == ["a", "a", "b", "b"]
    # the seed plus the index
    assert [c.text for c in whole.choices] == [first_tokens(kit, f"{1 + k} is {1 + k}", 2) for k in range(4)]
    assert whole.usage.completion_tokens == 8
    assert whole.usage.prompt_tokens == prompt_tokens(kit, "a") + prompt_tokens(kit, "b")  # each prompt once


def test_a_stop_sequence_cuts_the_text_exactly_even_across_pieces_and_ends_the_backend_stream(kit):
    fake = FakeTriton(lambda body: Reply(pieces=["Hel", "lo E", "ND more", *[" x"] * 50], delay_s=0.002))

    async def calls(url):
        async with client(url) as api:
            whole = await api.completions.create(model="ensemble", prompt="p", max_tokens=60, stop=["END", "zz"])
            await asyncio.wait_for(fake.client_closed.wait(), 10)
            stream = await api.completions.create(model="ensemble", prompt="p", max_tokens=60, stop="END", stream=True)
            chunks = [chunk async for chunk in stream]
            return whole, chunks

    whole, chunks = kit.ask(fake, calls)
    assert whole.choices[0].text == "Hello " and whole.choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].text for c in chunks) == "Hello "
    assert chunks[-1].choices[0].finish_reason == "stop"
    reply = len(kit.encode("Hello END more" + " x" * 50))
    assert fake.seen[0].closed_by_client and fake.seen[0].sent < reply  # the front left: generation ends


def test_a_held_back_tail_that_was_no_stop_is_still_sent(kit):
    fake = FakeTriton(lambda body: Reply(pieces=["abc", "EN"]))

    async def calls(url):
        async with client(url) as api:
            return await api.completions.create(model="ensemble", prompt="p", max_tokens=20, stop="END")

    answer = kit.ask(fake, calls)
    assert answer.choices[0].text == "abcEN" and answer.choices[0].finish_reason == "stop"


def test_echo_puts_the_prompt_first(kit):
    fake = FakeTriton(lambda body: words("The capital"))

    async def calls(url):
        async with client(url) as api:
            whole = await api.completions.create(model="ensemble", prompt="P:", max_tokens=2, echo=True)
            stream = await api.completions.create(model="ensemble", prompt="P:", max_tokens=2, echo=True, stream=True)
            return whole, [chunk async for chunk in stream]

    whole, chunks = kit.ask(fake, calls)
    assert whole.choices[0].text == "P:The capital"
    assert [c.choices[0].text for c in chunks] == ["P:", "The", " capital", ""]


def test_chat_streams_the_role_first_and_each_tokens_logprob(kit):
    fake = FakeTriton(lambda body: Reply(pieces=["The", " capital"], logprobs=[-0.25, -1.5]))

    async def calls(url):
        async with client(url) as api:
            stream = await api.chat.completions.create(
                model="ensemble", messages=MESSAGES, max_tokens=2, logprobs=True, stream=True
            )
            chunks = [chunk async for chunk in stream]
            whole = await api.chat.completions.create(model="ensemble", messages=MESSAGES, max_tokens=2, logprobs=True)
            plain = await api.chat.completions.create(model="ensemble", messages=MESSAGES, max_tokens=2)
            return chunks, whole, plain

    chunks, whole, plain = kit.ask(fake, calls)
    first, *pieces, last = chunks
    assert (first.choices[0].delta.role, first.choices[0].delta.content) == ("assistant", "")
    assert [(p.choices[0].delta.content, p.choices[0].logprobs.content[0].logprob) for p in pieces] == [
        ("The", -0.25),
        (" capital", -1.5),
    ]
    assert last.choices[0].finish_reason == "length" and last.choices[0].delta.content is None
    assert first.object == "chat.completion.chunk" and first.id.startswith("chatcmpl-")
    message = whole.choices[0]
    assert message.message.content == "The capital" and message.message.role == "assistant"
    assert [(t.token, t.logprob, t.bytes) for t in message.logprobs.content] == [
        (" The", -0.25, list(b" The")),  # the token's own text: `▁The`, whose space the decoder strips at the start
        (" capital", -1.5, list(b" capital")),
    ]
    assert plain.choices[0].logprobs is None and whole.object == "chat.completion"
    assert fake.seen[0].body["input_ids"] == kit.chat_ids(f"user: {PROMPT}\nassistant:")  # the template's
    assert fake.seen[0].body["return_log_probs"] is True and "return_log_probs" not in fake.seen[2].body


def test_a_chat_without_a_limit_asks_for_the_rest_of_the_context(kit):
    fake = FakeTriton(lambda body: words("The capital of"))

    async def calls(url):
        async with client(url) as api:
            answer = await api.chat.completions.create(model="ensemble", messages=MESSAGES)
            with pytest.raises(openai.BadRequestError) as full:
                await api.chat.completions.create(model="ensemble", messages=[{"role": "user", "content": "is " * 80}])
            return answer, full.value

    answer, full = kit.ask(fake, calls, max_seq_len=40)
    prompt = len(kit.chat_ids(f"user: {PROMPT}\nassistant:"))
    assert fake.seen[0].body["request_output_len"] == 40 - prompt
    assert answer.usage.prompt_tokens == prompt and answer.choices[0].finish_reason == "stop"
    assert full.response.json()["error"]["param"] == "messages" and len(fake.seen) == 1


def test_the_backends_errors_answer_in_openais_shape_whole_and_mid_stream(kit):
    replies = {
        "refused": Reply(status=400, error="bad input"),
        "broken": Reply(status=500, error="engine failed"),
        "midway": Reply(pieces=["a", "b"], error="out of memory"),
    }
    fake = FakeTriton(lambda body: replies[kit.tokenizer.decode(body["input_ids"])])

    async def calls(url):
        errors = {}
        async with client(url) as api:
            for prompt in replies:
                with pytest.raises(openai.APIStatusError) as raised:
                    await api.completions.create(model="ensemble", prompt=prompt, max_tokens=4)
                errors[prompt] = (raised.value.status_code, raised.value.response.json()["error"])
            stream = await api.completions.create(model="ensemble", prompt="midway", max_tokens=4, stream=True)
            got = []
            with pytest.raises(openai.APIError) as streamed:
                async for chunk in stream:
                    got.append(chunk.choices[0].text)
        async with aiohttp.ClientSession() as session:
            body = {"model": "ensemble", "prompt": "midway", "max_tokens": 4, "stream": True}
            async with session.post(f"{url}/v1/completions", json=body) as reply:
                raw = (reply.status, await reply.text())
        return errors, got, streamed.value, raw

    errors, got, streamed, (status, raw) = kit.ask(fake, calls)
    assert errors["refused"][0] == 400 and errors["refused"][1]["message"].startswith(
        "the model refused the request: bad input (ref "
    )
    assert errors["broken"][0] == 502 and errors["broken"][1]["code"] == "backend_error"
    assert errors["midway"][0] == 400 and "out of memory" in errors["midway"][1]["message"]
    assert all(e["type"] in ("invalid_request_error", "server_error") for _, e in errors.values())
    assert "".join(got) == "ab" and "out of memory" in streamed.message
    # The status was sent already: the error is an event of the stream, which still ends with [DONE].
    assert status == 200 and '"code":"backend_error"' in raw and raw.rstrip().endswith("data: [DONE]")


def test_a_client_that_leaves_mid_stream_ends_every_backend_stream(kit):
    fake = FakeTriton(lambda body: Reply(pieces=["x"] * 400, delay_s=0.005))

    async def calls(url):
        async with aiohttp.ClientSession() as session:
            for n in (1, 2):
                body = {"model": "ensemble", "prompt": "p", "max_tokens": 400, "n": n, "seed": 1, "stream": True}
                async with session.post(f"{url}/v1/completions", json=body) as reply:
                    await reply.content.readline()  # the first event: generation has started
                    reply.close()  # the client leaves
                while sum(seen.closed_by_client for seen in fake.seen) < len(fake.seen):
                    fake.client_closed.clear()
                    await asyncio.wait_for(fake.client_closed.wait(), 10)

    kit.ask(fake, calls, max_seq_len=1024)
    assert len(fake.seen) == 3 and all(seen.closed_by_client and seen.sent < 400 for seen in fake.seen)


@pytest.mark.parametrize(
    "text",
    [
        "Le café est très bon, et l'été arrive à Noël.",
        "Emoji: 😀 👍🏽 👩\u200d👩\u200d👧 ❤️ done",
        "中文: 你好，世界。日本語: こんにちは",
        "  two leading spaces,  double  spaces   here",
    ],
)
def test_answers_are_the_tokenizers_decoding_of_the_ids_whole_and_streamed(kit, text):
    """Words keep their spaces, a character of several byte tokens comes whole in one chunk (never `�`), and the
    concatenated chunks equal the whole answer, which equals the tokenizer's decoding of the ids as a whole."""
    fake = FakeTriton(lambda body: Reply(pieces=[text]))
    ids = kit.encode(text)

    async def calls(url):
        async with client(url) as api:
            whole = await api.completions.create(model="ensemble", prompt="p", max_tokens=len(ids))
            stream = await api.completions.create(model="ensemble", prompt="p", max_tokens=len(ids), stream=True)
            chunks = [c.choices[0].text for c in [chunk async for chunk in stream] if c.choices]
            chat = await api.chat.completions.create(model="ensemble", messages=MESSAGES, max_tokens=len(ids))
            return whole, chunks, chat

    whole, chunks, chat = kit.ask(fake, calls, max_seq_len=256)
    decoded = kit.tokenizer.decode(ids)
    assert whole.choices[0].text == "".join(chunks) == chat.choices[0].message.content == decoded
    assert not any("\ufffd" in chunk for chunk in chunks), chunks
    assert whole.usage.completion_tokens == len(ids)


def test_a_stop_string_with_spaces_matches_the_decoded_text_and_is_cut_exactly(kit):
    fake = FakeTriton(lambda body: words("The capital of France is Paris."))

    async def calls(url):
        async with client(url) as api:
            whole = await api.completions.create(model="ensemble", prompt="p", max_tokens=20, stop=[" of France"])
            stream = await api.completions.create(
                model="ensemble", prompt="p", max_tokens=20, stop="France is", stream=True
            )
            return whole, [c.choices[0].text for c in [chunk async for chunk in stream] if c.choices]

    whole, chunks = kit.ask(fake, calls)
    assert whole.choices[0].text == "The capital" and whole.choices[0].finish_reason == "stop"
    assert "".join(chunks) == "The capital of "


def test_characters_of_a_byte_token_run_stream_as_they_complete_and_a_stop_inside_it_ends_the_backend(kit):
    """CJK and emoji outside a byte-fallback vocabulary come as one long run of `<0xXX>` tokens: each character is
    sent once its last byte comes, so a stop string inside the run is seen in time and generation ends there."""
    text = "你好世界，" * 20 + "😀" * 10
    fake = FakeTriton(lambda body: Reply(pieces=[text], delay_s=0.001))
    reply = len(kit.encode(text))

    async def calls(url):
        async with client(url) as api:
            stream = await api.completions.create(model="ensemble", prompt="p", max_tokens=reply, stream=True)
            chunks = [c.choices[0].text async for c in stream if c.choices]
            stopped = await api.completions.create(model="ensemble", prompt="p", max_tokens=reply, stop="界")
            await asyncio.wait_for(fake.client_closed.wait(), 10)
            return chunks, stopped

    chunks, stopped = kit.ask(fake, calls, max_seq_len=1024)
    assert "".join(chunks) == kit.tokenizer.decode(kit.encode(text)) and chunks[:3] == ["你", "好", "世"], chunks[:5]
    assert stopped.choices[0].text == "你好世" and stopped.choices[0].finish_reason == "stop"
    assert fake.seen[1].closed_by_client and fake.seen[1].sent < reply  # the front left as soon as it saw the stop


def test_chat_logprobs_are_one_entry_per_generated_token_whole_and_streamed(kit):
    """One entry per generated id, with the token's own text and bytes, whatever the text pieces: tokens whose text
    is held (the bytes of a character, a possible stop) and steps of several ids keep their entries, whole and
    streamed, and the entries' bytes add up to the tokens'."""
    text = "The capital 你好 😀 ok"
    ids = kit.encode(text)
    steps = [ids[:3], ids[3:4], ids[4:9], *([i] for i in ids[9:])]
    logprobs = [-(k + 1) / 8 for k in range(len(ids))]
    fake = FakeTriton(lambda body: Reply(ids=steps, logprobs=logprobs))

    async def calls(url):
        async with client(url) as api:
            ask = {"model": "ensemble", "messages": MESSAGES, "max_tokens": len(ids), "logprobs": True}
            whole = await api.chat.completions.create(**ask)
            stream = await api.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
            return whole, [chunk async for chunk in stream]

    whole, chunks = kit.ask(fake, calls, max_seq_len=256)
    entries = whole.choices[0].logprobs.content
    assert len(entries) == whole.usage.completion_tokens == len(ids)
    assert [t.logprob for t in entries] == logprobs
    assert [t.token for t in entries[:2]] == [" The", " capital"]  # SentencePiece's word-start mark as a space
    assert b"".join(bytes(t.bytes) for t in entries).decode() == " " + text
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob, t.bytes) for t in streamed] == [(t.token, t.logprob, t.bytes) for t in entries]
    assert chunks[-1].usage.completion_tokens == len(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
