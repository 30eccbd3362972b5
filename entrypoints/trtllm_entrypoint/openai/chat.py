"""/v1/chat/completions: the request read and checked into serving's Work (messages rendered by the chat template;
without a limit the answer may take the rest of the context), and the answers' shape (`chat.completion`, and
`chat.completion.chunk` deltas that open with the assistant's role)."""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_entrypoint.openai.chat_template import ChatTemplateError
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
    prompt_tokens,
    refuse_unsupported,
)


def check(request: ChatRequest) -> None:
    text_only = not request.response_format or request.response_format.get("type", "text") == "text"
    refuse_unsupported(
        [
            (bool(request.tools), "tools", "tools"),
            (not text_only, "response_format other than text", "response_format"),
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
        out.append(item)
    return out


def work(served: Served, request: ChatRequest) -> Work:
    """Renders the template and counts the prompt's tokens: call it off the loop."""
    check(request)
    if request.stream_options is not None and not request.stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", "stream_options")
    check_fanout(served, 1, request.n)
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
        prompt = served.template.render(messages)
    except ChatTemplateError as exc:  # the template's own refusal, or no template: the messages cannot be served
        raise ApiError(400, str(exc), "messages") from None
    tokens = prompt_tokens(served, prompt)
    field = "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
    given = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    limit = answer_room(served, tokens, given, field, "messages")  # as OpenAI's chat: up to the end of the context
    s = sampling(request, served.model, limit, logprobs=request.logprobs, max_tokens_field=field)
    choices = [Choice(k, prompt) for k in range(request.n)]
    return Work(s, choices, ChatShape(request.logprobs), request.stream, request.include_usage, tokens)


def _logprobs(pieces: list[tuple[str, float]]) -> ChoiceLogprobs:
    return ChoiceLogprobs([TokenLogprob.of(text, logprob) for text, logprob in pieces])


@dataclass(frozen=True)
class ChatShape:
    logprobs: bool
    prefix: str = "chatcmpl"

    @staticmethod
    def _chunk(head: Head, choices: list[ChatChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(head.id, head.created, head.model, choices, usage)

    def opening(self, head: Head, choices: list[Choice]) -> ChatCompletionChunk:
        return self._chunk(head, [ChatChunkChoice(c.index, Delta(role="assistant", content="")) for c in choices])

    def piece(self, head: Head, choice: Choice, text: str, logprob: float | None) -> ChatCompletionChunk:
        logprobs = _logprobs([(text, logprob)]) if logprob is not None else None
        return self._chunk(head, [ChatChunkChoice(choice.index, Delta(content=text), logprobs)])

    def last(self, head: Head, choice: Choice, reason: FinishReason) -> ChatCompletionChunk:
        return self._chunk(head, [ChatChunkChoice(choice.index, Delta(), None, reason)])

    def usage(self, head: Head, usage: Usage) -> ChatCompletionChunk:
        return self._chunk(head, [], usage)

    def whole(self, head: Head, choices: list[tuple[Choice, FinishReason]], usage: Usage) -> ChatCompletion:
        answers = [
            ChatChoice(
                c.index,
                ChatMessage("assistant", "".join(c.text)),
                _logprobs(c.logprobs) if self.logprobs else None,
                reason,
            )
            for c, reason in choices
        ]
        return ChatCompletion(head.id, head.created, head.model, answers, usage)
