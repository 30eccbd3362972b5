"""/v1/completions: the request read and checked into serving's Work, and the answers' shape (`text_completion`
objects, whole and streamed; `echo` puts the prompt first)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trtllm_entrypoint.openai.protocol import (
    ApiError,
    Completion,
    CompletionChoice,
    CompletionRequest,
    FinishReason,
    TokenLogprob,
    Usage,
)
from trtllm_entrypoint.openai.sampling import DEFAULT_MAX_TOKENS, sampling
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


def check(request: CompletionRequest) -> None:
    if request.best_of is not None and request.best_of < request.n:
        raise ApiError(400, f"best_of ({request.best_of}) must be at least n ({request.n})", "best_of")
    if request.stream_options is not None and not request.stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", "stream_options")
    refuse_unsupported(
        [
            (request.best_of not in (None, request.n), "best_of above n", "best_of"),
            (bool(request.suffix), "suffix", "suffix"),
            (bool(request.logit_bias), "logit_bias", "logit_bias"),
            (
                request.logprobs is not None,
                "completions' logprobs, 0 included (top alternatives; chat's logprobs serve)",
                "logprobs",
            ),
        ]
    )


def _ids(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)


def given_ids(request: CompletionRequest) -> list[list[int] | None]:
    """Per prompt (as prompts_of orders them), its token ids where it was given as ids, else None."""
    given = request.prompt
    if isinstance(given, str):
        return [None]
    items: list[object] = [given] if _ids(given) and given else list(given)
    return [list(item) if isinstance(item, list) and _ids(item) and item else None for item in items]


def prompts_of(request: CompletionRequest, decode: Callable[[list[int]], str] | None = None) -> list[str]:
    """The prompts: a string, a list of strings, a list of token ids, or a list of such lists (ids decoded to text
    with the model's tokenizer)."""
    given = request.prompt
    if isinstance(given, str):
        items: list[object] = [given]
    elif _ids(given) and given:
        items = [given]
    else:
        items = list(given)
    if not items:
        raise ApiError(400, "prompt is empty", "prompt")
    prompts = []
    for item in items:
        if isinstance(item, str):
            prompts.append(item)
        elif _ids(item) and item and decode is not None:
            try:
                prompts.append(decode(item))  # type: ignore[arg-type]
            except ValueError as exc:
                raise ApiError(400, f"prompt: {exc}", "prompt") from None
        else:
            raise ApiError(
                400,
                "prompt must be a string, a list of strings, a list of token ids, or a list of such lists",
                "prompt",
            )
    return prompts


def work(served: Served, request: CompletionRequest) -> Work:
    """n choices per prompt, numbered prompt by prompt. Decodes ids and counts tokens: call it off the loop."""
    check(request)
    n = request.n
    if isinstance(request.prompt, list) and not _ids(request.prompt):
        check_fanout(served, len(request.prompt), n)  # before any prompt is decoded or counted
    prompts = prompts_of(request, served.tokenizer.decode_prompt_ids)
    check_fanout(served, len(prompts), n)
    # the engine workflow sends ids as they came (decoded above only to check them and for echo), a text's ids made
    # once here; llmapi the text
    ids: list[list[int] | None] = [None] * len(prompts)
    counts = []
    for k, (prompt, given) in enumerate(zip(prompts, given_ids(request), strict=True)):
        if served.model.workflow != "engine":
            counts.append(prompt_tokens(served, prompt))
            continue
        ids[k], count = (given, len(given)) if given else encoded(served, prompt, served.tokenizer.encode)
        counts.append(count)
    limit = DEFAULT_MAX_TOKENS if request.max_tokens is None else request.max_tokens
    answer_room(served, max(counts), limit, "max_tokens", "prompt")
    s = sampling(request, served.model, request.max_tokens, logprobs=False)
    choices = [
        Choice(p * n + k, prompt, prompt_ids=list(ids[p] or [])) for p, prompt in enumerate(prompts) for k in range(n)
    ]
    return Work(s, choices, CompletionShape(request.echo), request.stream, request.include_usage, sum(counts))


@dataclass(frozen=True)
class CompletionShape:
    echo: bool
    prefix: str = "cmpl"

    @staticmethod
    def _chunk(head: Head, choices: list[CompletionChoice], usage: Usage | None = None) -> Completion:
        return Completion(head.id, head.created, head.model, choices, usage)

    def opening(self, head: Head, choices: list[Choice]) -> Completion | None:
        echoed = [CompletionChoice(c.index, c.prompt, None, None) for c in choices]
        return self._chunk(head, echoed) if self.echo else None

    def piece(self, head: Head, choice: Choice, text: str, logprobs: Sequence[TokenLogprob]) -> Completion:
        return self._chunk(head, [CompletionChoice(choice.index, text, None, None)])

    def last(self, head: Head, choice: Choice, reason: FinishReason) -> Completion:
        return self._chunk(head, [CompletionChoice(choice.index, "", None, reason)])

    def usage(self, head: Head, usage: Usage) -> Completion:
        return self._chunk(head, [], usage)

    def whole(self, head: Head, choices: list[tuple[Choice, FinishReason]], usage: Usage) -> Completion:
        def text(c: Choice) -> str:
            return c.prompt + "".join(c.text) if self.echo else "".join(c.text)

        return self._chunk(head, [CompletionChoice(c.index, text(c), None, reason) for c, reason in choices], usage)
