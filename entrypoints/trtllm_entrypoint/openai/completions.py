"""/v1/completions: the request read and checked into serving's Work, and the answers' shape (`text_completion`
objects, whole and streamed; `echo` puts the prompt first)."""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_entrypoint.openai.protocol import (
    ApiError,
    Completion,
    CompletionChoice,
    CompletionRequest,
    FinishReason,
    Usage,
)
from trtllm_entrypoint.openai.sampling import sampling
from trtllm_entrypoint.openai.serving import Choice, Head, Served, Work, refuse_unsupported


def check(request: CompletionRequest) -> None:
    refuse_unsupported(
        [
            (request.best_of not in (None, 1, request.n), "best_of other than n", "best_of"),
            (bool(request.suffix), "suffix", "suffix"),
            (bool(request.logit_bias), "logit_bias", "logit_bias"),
            (bool(request.logprobs), "completions' logprobs (top alternatives; chat's logprobs serve)", "logprobs"),
        ]
    )


def prompts_of(request: CompletionRequest) -> list[str]:
    prompts = [request.prompt] if isinstance(request.prompt, str) else list(request.prompt)
    if not prompts:
        raise ApiError(400, "prompt is empty", "prompt")
    return prompts


def work(served: Served, request: CompletionRequest) -> Work:
    """n choices per prompt, numbered prompt by prompt."""
    check(request)
    s = sampling(request, served.model, request.max_tokens, logprobs=False)
    n = request.n
    choices = [Choice(p * n + k, prompt) for p, prompt in enumerate(prompts_of(request)) for k in range(n)]
    return Work(s, choices, CompletionShape(request.echo), request.stream, request.include_usage)


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

    def piece(self, head: Head, choice: Choice, text: str, logprob: float | None) -> Completion:
        return self._chunk(head, [CompletionChoice(choice.index, text, None, None)])

    def last(self, head: Head, choice: Choice, reason: FinishReason) -> Completion:
        return self._chunk(head, [CompletionChoice(choice.index, "", None, reason)])

    def usage(self, head: Head, usage: Usage) -> Completion:
        return self._chunk(head, [], usage)

    def whole(self, head: Head, choices: list[tuple[Choice, FinishReason]], usage: Usage) -> Completion:
        def text(c: Choice) -> str:
            return c.prompt + "".join(c.text) if self.echo else "".join(c.text)

        return self._chunk(head, [CompletionChoice(c.index, text(c), None, reason) for c, reason in choices], usage)
