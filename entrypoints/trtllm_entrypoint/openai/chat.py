"""/v1/chat/completions: the request read and checked into serving's Work (messages rendered by the chat template;
without a limit the answer may take the rest of the context), and the answers' shape (`chat.completion`, and
`chat.completion.chunk` deltas that open with the assistant's role). Tools and response_format: structured.py
decides what the template, the backend and the answer's reader get."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from trtllm_entrypoint.openai.chat_template import ChatTemplateError
from trtllm_entrypoint.openai.guided import GUIDE_INPUTS, GuideError
from trtllm_entrypoint.openai.protocol import (
    ApiError,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatMessage,
    ChatRequest,
    ChoiceLogprobs,
    Delta,
    FinishReason,
    TokenLogprob,
    ToolCall,
    Usage,
)
from trtllm_entrypoint.openai.sampling import sampling
from trtllm_entrypoint.openai.serving import (
    Choice,
    Head,
    Served,
    Work,
    answer_room,
    check_fanout,
    encoded,
    prompt_tokens,
    refuse_unsupported,
)
from trtllm_entrypoint.openai.structured import Reader, Structure, plan


def check(request: ChatRequest) -> None:
    refuse_unsupported(
        [
            (bool(request.logit_bias), "logit_bias", "logit_bias"),
            (bool(request.top_logprobs), "top_logprobs > 0 (the backend returns the chosen token's)", "top_logprobs"),
        ]
    )


def messages_of(request: ChatRequest) -> list[dict[str, object]]:
    """The messages as chat templates read them: content parts joined into one text."""
    out = []
    for message in request.messages:
        content = message.content
        if isinstance(content, list):
            if any(part.type != "text" for part in content):
                raise ApiError(400, "only text content parts are supported", "messages")
            content = "".join(part.text or "" for part in content)
        item: dict[str, object] = {"role": message.role, "content": content or ""}
        if message.name:
            item["name"] = message.name
        if message.tool_calls:
            item["tool_calls"] = [_call_for_template(call) for call in message.tool_calls]
        if message.tool_call_id:
            item["tool_call_id"] = message.tool_call_id
        out.append(item)
    return out


def _call_for_template(call: dict[str, Any]) -> dict[str, Any]:
    """An assistant's call as templates read it: OpenAI sends the arguments as JSON text, templates write them with
    `tojson` and expect an object (transformers' documented shape; vLLM converts them too)."""
    function = call.get("function")
    if isinstance(function, dict) and isinstance(function.get("arguments"), str):
        try:
            arguments = json.loads(function["arguments"])
        except ValueError:
            raise ApiError(400, "a tool call's arguments are not JSON", "messages") from None
        return {**call, "function": {**function, "arguments": arguments}}
    return call


def structure(served: Served, request: ChatRequest) -> Structure:
    """What the request asks of the answer's structure, or a 400 naming the field."""
    try:
        found = plan(served.support, request.tools, request.tool_choice, request.response_format,
                     request.parallel_tool_calls)  # fmt: skip
    except GuideError as exc:
        raise ApiError(400, exc.message, exc.param) from None
    if found.guide is not None and not served.model.inputs >= GUIDE_INPUTS:  # templates set by hand (TEMPLATES_DIR)
        raise ApiError(400, f"model {served.model.name} declares no guided decoding inputs", found.guide.param)
    return found


def work(served: Served, request: ChatRequest) -> Work:
    """Renders the template and counts the prompt's tokens: call it off the loop."""
    check(request)
    if request.stream_options is not None and not request.stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", "stream_options")
    check_fanout(served, 1, request.n)
    wanted = structure(served, request)
    messages = messages_of(request)
    forged = served.special.find(messages, "messages") or served.special.find(request.tools, "tools")
    if forged is not None:
        where, token = forged
        raise ApiError(
            400,
            f"{where} holds {token!r}, one of the model's special tokens: they come only from the chat template",
            where.split("[")[0],
        )
    try:
        prompt = served.template.render(messages, tools=wanted.tools)
    except ChatTemplateError as exc:  # the template's own refusal, or no template: the messages cannot be served
        raise ApiError(400, str(exc), "messages") from None
    prompt, ids, tokens = _prompt(served, prompt)
    field = "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
    given = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    limit = answer_room(served, tokens, given, field, "messages")  # as OpenAI's chat: up to the end of the context
    s = sampling(request, served.model, limit, logprobs=request.logprobs, max_tokens_field=field)
    if wanted.guide is not None:
        s = s.with_inputs(wanted.guide.inputs(), wanted.guide.param)
    choices = [Choice(k, prompt, prompt_ids=list(ids)) for k in range(request.n)]
    return Work(s, choices, ChatShape(request.logprobs, wanted), request.stream, request.include_usage, tokens)


def _prompt(served: Served, rendered: str) -> tuple[str, list[int], int]:
    """The rendered chat as the model gets it, its ids where the front sends ids, and its tokens (counted as
    serving.prompt_tokens counts). The template wrote the special tokens it wants: the engine workflow's ids add
    none (as transformers' apply_chat_template(tokenize=True) and vLLM); the llmapi model's LLM API adds BOS to the
    text it encodes, so it gets the text without the template's."""
    tokenizer = served.tokenizer
    if served.model.workflow != "engine":
        text = tokenizer.chat_text(rendered)
        return text, [], prompt_tokens(served, text)
    ids, tokens = encoded(served, rendered, tokenizer.encode_chat)
    return rendered, ids, tokens


def _delta(deltas: list[dict[str, Any]]) -> Delta | None:
    """A reader's deltas for one piece as one Delta (None: nothing to send yet)."""
    if not deltas:
        return None
    text = "".join(d.get("content", "") for d in deltas)
    calls = [call for d in deltas for call in d.get("tool_calls", ())]
    return msgspec.convert({"content": text or None, "tool_calls": calls or None}, Delta)


@dataclass(frozen=True)
class ChatShape:
    logprobs: bool
    structure: Structure = field(default_factory=lambda: Structure(None, None, None))
    prefix: str = "chatcmpl"
    readers: dict[int, Reader] = field(default_factory=dict)  # per choice, where the answer is read for calls

    def _reader(self, choice: Choice, whole: bool) -> Reader | None:
        if choice.index not in self.readers:
            reader = Reader.of(self.structure, whole)
            if reader is None:
                return None
            self.readers[choice.index] = reader
        return self.readers[choice.index]

    @staticmethod
    def _chunk(head: Head, choices: list[ChatChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(head.id, head.created, head.model, choices, usage)

    def opening(self, head: Head, choices: list[Choice]) -> ChatCompletionChunk:
        return self._chunk(head, [ChatChunkChoice(c.index, Delta(role="assistant", content="")) for c in choices])

    def piece(
        self, head: Head, choice: Choice, text: str, logprobs: Sequence[TokenLogprob]
    ) -> ChatCompletionChunk | None:
        reader = self._reader(choice, whole=False)
        delta = Delta(content=text) if reader is None else _delta(reader.feed(text))
        if delta is None:  # text held by the reader: its tokens' entries still go
            if not logprobs:
                return None
            delta = Delta()
        return self._chunk(
            head, [ChatChunkChoice(choice.index, delta, ChoiceLogprobs(list(logprobs)) if logprobs else None)]
        )

    def last(self, head: Head, choice: Choice, reason: FinishReason) -> ChatCompletionChunk:
        reader = self._reader(choice, whole=False)
        if reader is None:
            return self._chunk(head, [ChatChunkChoice(choice.index, Delta(), None, reason)])
        delta = _delta(reader.finish()) or Delta()
        return self._chunk(head, [ChatChunkChoice(choice.index, delta, None, reader.finish_reason(reason))])

    def usage(self, head: Head, usage: Usage) -> ChatCompletionChunk:
        return self._chunk(head, [], usage)

    def whole(self, head: Head, choices: list[tuple[Choice, FinishReason]], usage: Usage) -> ChatCompletion:
        answers = []
        for c, reason in choices:
            message, reason = self._message(c, reason)
            answers.append(ChatChoice(c.index, message, ChoiceLogprobs(c.logprobs) if self.logprobs else None, reason))
        return ChatCompletion(head.id, head.created, head.model, answers, usage)

    def _message(self, choice: Choice, reason: FinishReason) -> tuple[ChatMessage, FinishReason]:
        text = "".join(choice.text)
        reader = self._reader(choice, whole=True)
        if reader is None:
            return ChatMessage("assistant", text), reason
        reader.feed(text)
        reader.finish()
        message = reader.message()
        calls = msgspec.convert(message.get("tool_calls"), list[ToolCall] | None)
        return ChatMessage("assistant", message["content"], calls), reader.finish_reason(reason)
