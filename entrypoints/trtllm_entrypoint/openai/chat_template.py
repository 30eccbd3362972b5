"""The model's chat template, rendered as transformers renders it (found by chat_templates, the discovery the
entrypoint's preflight shares). Also `python -m trtllm_entrypoint.openai.chat_template --check DIR`, which the
entrypoint runs once with the front's Python and path so that a template that does not compile stops the start with
one line, never a crash loop of workers.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.model.chat_templates import DEFAULT, ChatTemplateError, Found, discover
from trtllm_entrypoint.openai import cpu, sandbox

if TYPE_CHECKING:
    import jinja2

__all__ = ["DEFAULT", "ChatTemplate", "ChatTemplateError", "Found", "discover", "load"]

# A message's reasoning, under the names templates read it by (the first is the standard one).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


# --- rendering (jinja2: the front's processes only) ----------------------------------------------------------------


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """transformers' template environment: the immutable sandbox with trim_blocks and lstrip_blocks, loop controls
    (`{% break %}`, `{% continue %}`), the `{% generation %}` tag (its body, as rendered text), `raise_exception`,
    `strftime_now` (local time, like transformers'), a `tojson` that neither escapes HTML nor forces ASCII and takes
    json.dumps' keyword arguments, and `dict` and `namespace` that refuse private names."""
    import jinja2  # noqa: PLC0415
    import jinja2.ext  # noqa: PLC0415
    import jinja2.nodes  # noqa: PLC0415
    import jinja2.sandbox  # noqa: PLC0415
    import jinja2.utils  # noqa: PLC0415

    class GenerationTag(jinja2.ext.Extension):
        # `{% generation %}...{% endgeneration %}` marks the assistant's part for training masks: serving renders it.
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(
        value: object,
        ensure_ascii: bool = False,
        indent: int | str | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:  # noqa: A002  (the name templates pass it by)
        return datetime.now().strftime(format)

    def refuse_private(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a chat template may not set the private name {name!r}")

    class SafeDict:
        # `dict(...)` without the type itself: no attribute of the class reaches the template.
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args)

    class SafeNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # jinja2's own signature: `self` may be an attribute name
            self, rest = args[0], args[1:]
            values = dict(*rest, **kwargs)
            for name in values:
                refuse_private(name)
            jinja2.utils.Namespace.__init__(self, values)

        def __setitem__(self, name: str, value: Any) -> None:
            refuse_private(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    # The vendored jinja2 (>= 3.1.6), its single operations bounded (sandbox.py).
    extensions = [GenerationTag, jinja2.ext.loopcontrols]
    env: jinja2.Environment = sandbox.environment(trim_blocks=True, lstrip_blocks=True, extensions=extensions)
    env.filters["tojson"] = tojson
    env.globals.update(
        raise_exception=raise_exception, strftime_now=strftime_now, dict=SafeDict(), namespace=SafeNamespace
    )
    return env


def compile_template(source: str) -> jinja2.Template:
    import jinja2  # noqa: PLC0415

    try:
        return environment().from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"does not compile: {exc.message} (line {exc.lineno})") from None
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"does not compile: {exc}") from None


def chat_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages as transformers hands them to the template: keys whose value is null dropped, and a message's
    reasoning under each of its names (`thinking` for gpt-oss' template, `reasoning_content` for most)."""
    out = []
    for message in messages:
        plain = {key: value for key, value in message.items() if value is not None}
        reasoning = next((plain[key] for key in REASONING_FIELDS if key in plain), None)
        if reasoning is not None:
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        out.append(plain)
    return out


class ChatTemplate:
    """A tokenizer's chat templates, compiled once, rendered as transformers' apply_chat_template(tokenize=False)."""

    def __init__(self, found: Found) -> None:
        self.found = found
        self.compiled: dict[str, jinja2.Template] = {}
        for name, source in found.templates.items():
            try:
                self.compiled[source] = compile_template(source)
            except ChatTemplateError as exc:
                label = f"{found.origin}" if len(found.templates) == 1 else f"{found.origin} ({name!r})"
                raise ChatTemplateError(f"the chat template in {label} {exc}") from None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt. `variables`: extra names the template reads (e.g. `enable_thinking`); they win over the
        special tokens, as in transformers. Every failure of the template is a ChatTemplateError."""
        import jinja2  # noqa: PLC0415

        template = self.compiled[self.found.select(tools)]
        names = {**self.found.special_tokens, **(variables or {})}
        context = {
            "messages": chat_messages(messages),
            "tools": None if tools is None else list(tools),
            "documents": None if documents is None else list(documents),
            "add_generation_prompt": add_generation_prompt,
            **names,
        }
        try:  # bounded in time and size: the template comes with the model, untrusted (cpu.py)
            return cpu.bounded(lambda: template.generate(**context), cpu.RENDER_TIMEOUT_S, cpu.MAX_RENDER_CHARS)
        except cpu.RenderTimeout:
            raise ChatTemplateError(
                f"the chat template ran over {cpu.RENDER_TIMEOUT_S:g} s on these messages"
            ) from None
        except (cpu.RenderTooLong, sandbox.TooBig) as exc:
            raise ChatTemplateError(f"the chat template's output is too large: {exc}") from None
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"the chat template refused the messages: {exc}") from None
        except (TypeError, ValueError, LookupError, ArithmeticError, AttributeError) as exc:
            # The template's own code failed on these messages (e.g. `+` on a list of content parts).
            raise ChatTemplateError(
                f"the chat template failed on these messages ({type(exc).__name__}: {exc})"
            ) from None


def load(tokenizer: Path) -> ChatTemplate:
    """A worker's template: found and compiled once (the entrypoint's start check already compiled it)."""
    return ChatTemplate(discover(tokenizer))


# --- the start check -----------------------------------------------------------------------------------------------


def check(tokenizer: Path) -> str:
    """One line: where the templates are and that they compile. Raises UsageError (one line) when they do not."""
    found = discover(tokenizer)
    if not found.templates:
        return f"no chat template in {tokenizer}"
    try:
        ChatTemplate(found)
    except ChatTemplateError as exc:
        raise UsageError(
            str(exc),
            "fix the template (the front renders it as transformers does), or set FRONTEND=triton to serve it "
            "with the image's own frontend",
        ) from None
    return f"chat template {', '.join(sorted(found.templates))} from {found.origin} compiles"


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2 or argv[0] != "--check":
        print(f"usage: python -m {__name__} --check TOKENIZER_DIR", file=sys.stderr)
        return 2
    try:
        print(check(Path(argv[1])))
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    except ImportError as exc:  # jinja2 missing from the front's path: the front could not render either
        print(f"the OpenAI front cannot render chat templates: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
