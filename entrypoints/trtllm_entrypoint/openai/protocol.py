"""The OpenAI API's wire format as typed msgspec Structs: each endpoint's request and answer (whole and streamed),
usage, the model list and OpenAI's error shape; `decode` reads a request body as its Struct. No I/O here."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1, le=128)]  # OpenAI's bounds of n
Temperature = Annotated[float, msgspec.Meta(ge=0, le=2)]
Probability = Annotated[float, msgspec.Meta(gt=0, le=1)]
Penalty = Annotated[float, msgspec.Meta(ge=-2, le=2)]
Stop = str | list[str] | None
FinishReason = Literal["stop", "length", "tool_calls"]
# OpenAI's roles (`function` is deprecated there, still accepted); any other is a 400 naming the message's role.
Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


# --- requests -----------------------------------------------------------------------------------------------------


class StreamOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    include_usage: bool = False


class SamplingRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What both endpoints take: the model and how to sample. An unknown field is a 400 naming it; the extensions
    (not OpenAI's; vLLM's names) are mapped where the served model declares an input for them (sampling.py)."""

    model: str
    max_tokens: NonNegative | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    top_k: NonNegative | None = None  # extension
    min_tokens: NonNegative | None = None  # extension
    repetition_penalty: Annotated[float, msgspec.Meta(gt=0)] | None = None  # extension
    length_penalty: float | None = None  # extension
    ignore_eos: bool | None = None  # extension
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: int | None = None
    n: Positive = 1
    stop: Stop = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(SamplingRequest, kw_only=True):
    prompt: str | list[Any]  # or a list of strings, token ids, or lists of token ids (completions.prompts_of)
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=5)] | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None
    logit_bias: dict[str, float] | None = None


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class Message(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's calls, for the template to render
    tool_call_id: str | None = None  # a tool message's answer to one call


class ChatRequest(SamplingRequest, kw_only=True):
    messages: Annotated[list[Message], msgspec.Meta(min_length=1)]
    max_completion_tokens: NonNegative | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    tools: list[Any] | None = None  # checked by structured.plan (a 400 names what is wrong)
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    logit_bias: dict[str, float] | None = None


# --- answers ------------------------------------------------------------------------------------------------------


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    logprobs: None  # completions' top alternatives are refused (protocol's checks): always null
    finish_reason: FinishReason | None


class Completion(msgspec.Struct, omit_defaults=True, tag_field="object", tag="text_completion"):
    """A whole completion, and each chunk of a streamed one (OpenAI uses one object for both); `usage` is in the
    whole answer and in a stream's last chunk when asked for."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]  # always empty: the backend returns the chosen token's only


class ChoiceLogprobs(msgspec.Struct):
    content: list[TokenLogprob]


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str  # JSON text


class ToolCall(msgspec.Struct):
    id: str
    function: FunctionCall
    type: str = "function"


class ChatMessage(msgspec.Struct, omit_defaults=True):
    role: str
    content: str | None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(msgspec.Struct):
    index: int
    message: ChatMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: FinishReason


class ChatCompletion(msgspec.Struct, tag_field="object", tag="chat.completion"):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class FunctionDelta(msgspec.Struct, omit_defaults=True):
    arguments: str  # "" in a call's first delta, as OpenAI sends it
    name: str | None = None


class ToolCallDelta(msgspec.Struct, omit_defaults=True):
    """One call's part in a chunk: the first carries its id, type and name; later ones more of its arguments."""

    index: int
    function: FunctionDelta
    id: str | None = None
    type: str | None = None


class Delta(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(msgspec.Struct):
    index: int
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(msgspec.Struct, omit_defaults=True, tag_field="object", tag="chat.completion.chunk"):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None  # only in the last chunk, when asked for


class ModelCard(msgspec.Struct, tag_field="object", tag="model"):
    id: str
    created: int
    owned_by: str
    root: str | None = None  # as vLLM: the base model a card serves
    parent: str | None = None  # as vLLM: the base model of a LoRA adapter (None for the base itself)


class ModelList(msgspec.Struct, tag_field="object", tag="list"):
    data: list[ModelCard]


# --- errors -------------------------------------------------------------------------------------------------------


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(msgspec.Struct):
    error: ErrorDetail


class ApiError(Exception):
    """An answer in OpenAI's error shape, with its HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    @property
    def type(self) -> str:
        if self.status == 401:
            return "authentication_error"
        if self.status == 404:
            return "not_found_error"
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> ErrorResponse:
        return ErrorResponse(ErrorDetail(self.message, self.type, self.param, self.code))


Request = TypeVar("Request", CompletionRequest, ChatRequest)


def decode(raw: bytes, kind: type[Request]) -> Request:
    """The body as `kind`; anything else is a 400 naming what was wrong (never a 500: not UTF-8, nested too deep)."""
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:
        # "Expected `int`, got `str` - at `$.max_tokens`", "Object contains unknown field `x` - at `$.messages[0]`"
        text = str(exc)
        unknown = re.match(r"Object contains unknown field `([^`]*)`", text)
        if unknown:
            where = text.rsplit("`$", 1)[1].rstrip("`").lstrip(".") if "`$" in text else ""
            field = f"{where}.{unknown.group(1)}" if where else unknown.group(1)
            raise ApiError(
                400, f"unknown field `{field}` (see docs/openai.md for the extensions taken)", field
            ) from None
        param = text.rsplit("`$.", 1)[1].rstrip("`").split("[")[0] if "`$." in text else None
        raise ApiError(400, text, param) from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"the body is not JSON: {exc}") from None
    except UnicodeDecodeError:
        raise ApiError(400, "the body is not UTF-8 text") from None
    except RecursionError:
        raise ApiError(400, "the body's JSON is nested too deeply") from None
