"""Answering one request of either endpoint: each choice generated from its own backend stream (stop sequences cut
exactly), then one whole answer or a stream of chunks as they come (several choices interleaved), with finish
reasons and usage. What differs between the endpoints is only their Shape (completions.py, chat.py). Every request is
measured from its arrival to its end (metrics.py), whatever way it ends."""

from __future__ import annotations

import contextlib
import functools
import secrets
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from trtllm_entrypoint.openai import engine, limits, logprobs, rules, special_tokens
from trtllm_entrypoint.openai.backend import Backend
from trtllm_entrypoint.openai.chat_template import ChatTemplate
from trtllm_entrypoint.openai.cpu import Pool, count_within
from trtllm_entrypoint.openai.detokenize import CumulativeText, IncrementalDetokenizer
from trtllm_entrypoint.openai.metrics import Metrics, RequestMetrics
from trtllm_entrypoint.openai.protocol import ApiError, FinishReason, TokenLogprob, Usage
from trtllm_entrypoint.openai.sampling import Model, Sampling, backend_body
from trtllm_entrypoint.openai.stops import StopScanner
from trtllm_entrypoint.openai.structured import Support
from trtllm_entrypoint.openai.tokenizer import Tokenizer

Idle = Callable[[], Awaitable[None]]  # what a stream awaits before it waits for the backend


@dataclass(frozen=True)
class Served:
    """What every request of this worker shares: the model as served, its tokenizer and template, the backend that
    generates."""

    model: Model
    backend: Backend
    template: ChatTemplate
    tokenizer: Tokenizer
    max_seq_len: int  # the served model's (MAX_SEQ_LEN, or the engine's own): a chat answer's default room
    metrics: Metrics
    adapters: Mapping[str, int] = field(default_factory=dict)  # LoRA adapters: name -> task id
    special: special_tokens.Guard = field(default_factory=lambda: special_tokens.Guard(()))
    max_generations: int = limits.DEFAULT_MAX_GENERATIONS  # OPENAI_MAX_GENERATIONS
    cpu: Pool = field(default_factory=Pool)  # rendering and tokenizing, off the event loop
    support: Support = Support(None, "no tool-call parser was set up for this worker", "")  # tools and guides

    def target(self, name: str) -> Target | None:
        """The model a request's `model` names: the base, one of its adapters, or None (unknown)."""
        if name == self.model.name:
            return Target(name)
        task_id = self.adapters.get(name)
        return Target(name, name, task_id) if task_id is not None else None

    @property
    def count_tokens(self) -> Callable[[str], int]:
        return self.tokenizer.count


@dataclass(frozen=True)
class Target:
    """What a request asked for: the base model (lora_name empty) or one of its LoRA adapters, with its task id."""

    name: str  # as the client sent it; the answer's `model`
    lora_name: str = ""
    task_id: int | None = None


@dataclass
class Choice:
    """One generated answer as it streams: what was shown, how many tokens came, whether a stop sequence ended it."""

    index: int
    prompt: str
    prompt_ids: list[int] = field(default_factory=list)  # the prompt as the model gets it (the engine workflow's)
    text: list[str] = field(default_factory=list)
    tokens: int = 0
    stopped: bool = False
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per generated token, where asked for
    done: bool = False  # its generation ended by itself (not cut by the client leaving or an error)
    ended: bool = False  # the model wrote one of its end ids (the engine workflow's)

    def finish_reason(self, max_tokens: int) -> FinishReason:
        return "length" if not self.stopped and self.tokens >= max_tokens else "stop"


@dataclass(frozen=True)
class Head:
    """What every chunk of one answer repeats."""

    id: str
    created: int
    model: str


class Shape(Protocol):
    """How one endpoint's answers look: the whole answer and each chunk of a streamed one."""

    @property
    def prefix(self) -> str: ...  # of the answer's id

    def opening(self, head: Head, choices: list[Choice]) -> msgspec.Struct | None: ...

    def piece(
        self, head: Head, choice: Choice, text: str, logprobs: Sequence[TokenLogprob]
    ) -> msgspec.Struct | None: ...

    def last(self, head: Head, choice: Choice, reason: FinishReason) -> msgspec.Struct: ...

    def usage(self, head: Head, usage: Usage) -> msgspec.Struct: ...

    def whole(self, head: Head, choices: list[tuple[Choice, FinishReason]], usage: Usage) -> msgspec.Struct: ...


@dataclass(frozen=True)
class Work:
    """One request, read and checked by its endpoint: how to generate, one Choice per answer, how answers look."""

    sampling: Sampling
    choices: list[Choice]
    shape: Shape
    stream: bool
    include_usage: bool
    prompt_tokens: int = 0  # counted with the request's checks, off the loop
    target: Target | None = None  # set by the server once the model is known; None: the base
    measure: RequestMetrics | None = None  # this request's metrics, from its arrival


def refuse_unsupported(checks: Iterable[tuple[bool, str, str]]) -> None:
    """(whether it was asked for, what is not supported, the param) for each thing the front does not do."""
    for asked, message, param in checks:
        if asked:
            raise ApiError(400, f"{message} is not supported (see docs/openai.md)", param)


@dataclass(frozen=True)
class Decoding:
    """How one choice's backend events become its text: `push` the text an event makes final, `finish` the rest."""

    push: Callable[[dict[str, Any]], str]
    finish: Callable[[], str]


def _request(served: Served, s: Sampling, choice: Choice) -> tuple[dict[str, object], Decoding]:
    """The backend request of one choice and its decoding: the engine workflow streams token ids from the
    tensorrt_llm model (decoded here, exactly: detokenize.py), the llmapi model the whole text so far."""
    if served.model.workflow == "engine":
        tokenizer = served.tokenizer
        if not choice.prompt_ids:
            choice.prompt_ids = tokenizer.encode(choice.prompt)
        body = engine.ids_body(
            served.model.inputs,
            backend_body(served.model, "", s, choice.index),
            choice.prompt_ids,
            end_id=tokenizer.end_id,
            pad_id=tokenizer.pad_id,
        )
        detokenizer = IncrementalDetokenizer(tokenizer.codec)
        # The model's other end ids (generation_config.json's: Llama 3's <|eot_id|>, Gemma's <end_of_turn>) end the
        # choice here, not as the model's optional stop_words_list: one way for every tensorrt_llm model whatever it
        # declares, the cut stop strings get (generate() leaves the stream, which ends the generation in Triton);
        # it costs the few steps made before the closed stream reaches the engine.
        ends = tokenizer.end_ids

        def ids(event: dict[str, Any]) -> str:
            new = engine.output_ids(event)
            kept = len(new)
            if not ends.isdisjoint(new):  # the end id was generated: counted, never shown
                kept = next(k for k, i in enumerate(new) if i in ends) + 1
                choice.ended = True
            choice.tokens += kept
            if s.logprobs:
                choice.logprobs += logprobs.entries(new, engine.output_logprobs(event), tokenizer.token_bytes)[:kept]
            return detokenizer.push(new[: kept - 1] if choice.ended else new)

        return body, Decoding(ids, detokenizer.finish)
    cumulative = CumulativeText(served.tokenizer.codec.cleanup)

    def text(event: dict[str, Any]) -> str:
        choice.tokens += 1
        value = event.get("text_output", "")
        return cumulative.push(value if isinstance(value, str) else str(value))

    return backend_body(served.model, choice.prompt, s, choice.index), Decoding(text, cumulative.finish)


def refused(exc: rules.Refused) -> ApiError:
    return ApiError(400, exc.message, exc.field)


def encoded(served: Served, text: str, encode: Callable[[str], list[int]]) -> tuple[list[int], int]:
    """`text`'s ids as the engine workflow sends them, made once with the request's checks (off the loop), and how
    many; for a text far over the context, a prefix's ids and a count that stopped early (cpu.count_within), which
    answer_room refuses."""
    ids: list[int] = []

    def count(part: str) -> int:
        ids[:] = encode(part)
        return len(ids)

    return ids, count_within(count, text, served.max_seq_len)


def prompt_tokens(served: Served, prompt: str) -> int:
    """The prompt's tokens; for a prompt far over the context, a count over it that stopped early (cpu.count_within).
    Call it off the loop (the server runs each request's checks on served.cpu)."""
    return count_within(served.count_tokens, prompt, served.max_seq_len)


def answer_room(served: Served, tokens: int, max_tokens: int | None, field: str, prompt_field: str) -> int:
    """`max_tokens`, or all the room left when None; a 400 naming both numbers when it is more than the room left."""
    try:
        return rules.check_room(tokens, max_tokens, served.max_seq_len, field, prompt_field)
    except rules.Refused as exc:
        raise refused(exc) from None


def check_fanout(served: Served, prompts: int, n: int) -> None:
    try:
        limits.check_fanout(prompts, n, served.max_generations)
    except rules.Refused as exc:
        raise refused(exc) from None


async def generate(
    served: Served, s: Sampling, choice: Choice, measure: RequestMetrics | None = None, idle: Idle | None = None
) -> AsyncGenerator[tuple[str, Sequence[TokenLogprob]], None]:
    """One choice's text as it comes: exact (the tokenizer's decoding of all ids at once, sent as it becomes
    final), stop sequences cut, held back while they may be starting; with the logprobs entries of the tokens
    each event brought, whether or not their text is sent yet (as vLLM streams them). `idle`: awaited before waiting
    for the backend (the stream's Sink writes what it gathered)."""
    scanner = StopScanner(s.stops)
    body, decoding = _request(served, s, choice)
    logged = 0  # choice.logprobs sent so far
    try:
        async with contextlib.aclosing(served.backend.events(body, idle)) as events:
            async for event in events:
                piece = decoding.push(event)
                if measure is not None:
                    measure.token(choice.index)
                shown, stopped = scanner.feed(piece)
                entries = choice.logprobs[logged:] if s.logprobs else ()
                if shown or entries:
                    logged = len(choice.logprobs)
                    choice.text.append(shown)
                    yield shown, entries
                if stopped:
                    choice.stopped = choice.done = True
                    return  # leaving the block closes the connection: Triton stops generating
                if choice.ended:
                    break  # the same, then the text held back is sent
    except ApiError as exc:  # a refusal of a request with a guide names the field that asked for it
        if exc.code == "backend_error" and exc.param is None:
            exc.param = s.inputs_param
        raise
    choice.done = True
    shown, stopped = scanner.feed(decoding.finish())
    choice.stopped = stopped or choice.ended
    rest = shown if stopped else shown + scanner.flush()
    if rest:
        choice.text.append(rest)
        yield rest, ()


def _head(served: Served, work: Work) -> Head:
    name = work.target.name if work.target is not None else served.model.name
    return Head(f"{work.shape.prefix}-{secrets.token_hex(12)}", int(time.time()), name)


def _usage(served: Served, work: Work) -> Usage:
    return Usage.of(work.prompt_tokens, sum(c.tokens for c in work.choices))


def _finish(served: Served, work: Work, usage: Usage | None = None) -> None:
    """The request's end for its metrics: each choice's finish reason (`abort` where it did not end by itself) and
    the tokens its `usage` reports."""
    if work.measure is None or work.measure.done:
        return
    usage = usage or _usage(served, work)
    reasons = [c.finish_reason(work.sampling.max_tokens) if c.done else "abort" for c in work.choices]
    work.measure.finish(reasons, usage.prompt_tokens, usage.completion_tokens)


async def whole(served: Served, work: Work) -> msgspec.Struct:
    """The whole answer, once every choice has ended."""
    head = _head(served, work)

    async def drain(choice: Choice) -> None:
        async for _ in generate(served, work.sampling, choice, work.measure):
            pass

    usage = None
    try:
        await limits.together([drain(choice) for choice in work.choices])  # one fails or the client leaves: all end
        usage = _usage(served, work)
    finally:
        _finish(served, work, usage)
    reasons = [(c, c.finish_reason(work.sampling.max_tokens)) for c in work.choices]
    return work.shape.whole(head, reasons, usage)


async def stream(served: Served, work: Work, idle: Idle | None = None) -> AsyncGenerator[msgspec.Struct, None]:
    """The answer's chunks as they come; closing it early (the client left) closes every backend stream. `idle` is
    awaited whenever no chunk is ready yet."""
    head = _head(served, work)
    try:
        opening = work.shape.opening(head, work.choices)
        if opening is not None:
            yield opening
        if len(work.choices) == 1:
            chunks = _chunks_of(served, work, head, work.choices[0], idle)
        else:
            chunks = _interleaved(served, work, head, idle)
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                yield chunk
        usage = _usage(served, work)
        _finish(served, work, usage)
        if work.include_usage:
            yield work.shape.usage(head, usage)
    finally:
        _finish(served, work)  # the client left or the model failed: once only (RequestMetrics.finish)


async def _chunks_of(
    served: Served, work: Work, head: Head, choice: Choice, idle: Idle | None = None
) -> AsyncGenerator[msgspec.Struct, None]:
    async with contextlib.aclosing(generate(served, work.sampling, choice, work.measure, idle)) as pieces:
        async for text, entries in pieces:
            chunk = work.shape.piece(head, choice, text, entries)
            if chunk is not None:  # None: held (what may be a tool call is read before it is sent)
                yield chunk
    yield work.shape.last(head, choice, choice.finish_reason(work.sampling.max_tokens))


async def _interleaved(
    served: Served, work: Work, head: Head, idle: Idle | None = None
) -> AsyncGenerator[msgspec.Struct, None]:
    """Several choices streamed at once, each chunk as it comes, through a bounded queue (limits.interleave): a
    client that does not read holds its generations back; closing this ends them all."""
    makers = [functools.partial(_chunks_of, served, work, head, choice) for choice in work.choices]
    async with contextlib.aclosing(limits.interleave(makers, idle=idle)) as chunks:
        async for chunk in chunks:
            yield chunk
