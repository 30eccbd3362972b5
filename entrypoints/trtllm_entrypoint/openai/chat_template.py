"""The model's chat template, found and rendered as transformers' tokenizer finds and renders it.

Discovery (which file, which template text, which special tokens) is standard library only: the entrypoint's
preflight and the front use the same `discover`. Rendering needs jinja2, imported lazily: by the front's processes,
and by `python -m trtllm_entrypoint.openai.chat_template --check DIR`, which the entrypoint runs once with the front's
Python and path (`check_with`) so that a template that does not compile stops the start with one line, never a
crash loop of workers.

Where transformers looks (AutoTokenizer), in order: chat_template.jinja with the named templates of
additional_chat_templates/*.jinja; else tokenizer_config.json's `chat_template` (a string, or a list of
{name, template}). The processor's legacy chat_template.json is read last, when nothing else has a template (vLLM
falls back to the processor's template the same way). Special tokens come from tokenizer_config.json, and from
special_tokens_map.json where the config has no `added_tokens_decoder` (then the map's values win), as transformers
reads them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.model_files import read_bytes, read_json_object

if TYPE_CHECKING:
    import jinja2

TEMPLATE_FILE = "chat_template.jinja"
NAMED_DIR = "additional_chat_templates"
CONFIG_FILE = "tokenizer_config.json"
PROCESSOR_FILE = "chat_template.json"
TOKENS_MAP_FILE = "special_tokens_map.json"
# The tokenizer's named special tokens (transformers' SPECIAL_TOKENS_ATTRIBUTES); other `*_token` keys holding a
# token are the model's own (e.g. image_token) and are passed too.
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
DEFAULT = "default"
TOOL_USE = "tool_use"  # the named template transformers picks when the request has tools
# A message's reasoning, under the names templates read it by (the first is the standard one).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
CHECK_TIMEOUT_S = 120.0


class ChatTemplateError(Exception):
    """The template cannot serve a chat: it does not compile, or it refused (or failed on) these messages."""


@dataclass(frozen=True)
class Found:
    """A tokenizer's chat templates (by name; a single one is `default`), where they came from, and the special
    tokens the templates see."""

    templates: Mapping[str, str]
    origin: str
    special_tokens: Mapping[str, str]

    def select(self, tools: object = None) -> str:
        """The template transformers renders: with several, `tool_use` when tools are given, else `default`."""
        if not self.templates:
            raise ChatTemplateError(
                "this model's tokenizer has no chat_template: use /v1/completions, or serve a model with one"
            )
        if tools is not None and TOOL_USE in self.templates:
            return self.templates[TOOL_USE]
        if DEFAULT in self.templates:
            return self.templates[DEFAULT]
        raise ChatTemplateError(
            f"this model's chat templates ({', '.join(sorted(self.templates))}, in {self.origin}) have no "
            f"`{DEFAULT}` one{' and the request has no tools' if TOOL_USE in self.templates else ''}"
        )


def _text(path: Path) -> str | None:
    data = read_bytes(path)
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not allowed: expected UTF-8 text, found other bytes") from None


def _named_list(path: Path, value: object) -> dict[str, str]:
    """tokenizer_config.json's `chat_template`: a string, or a list of {"name", "template"} objects."""
    if isinstance(value, str):
        return {DEFAULT: value}
    if isinstance(value, list) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str) for t in value
    ):
        return {t["name"]: t["template"] for t in value}
    raise UsageError(
        f'{path} is not allowed: expected "chat_template" to be a string or a list of '
        '{"name": ..., "template": ...} objects'
    )


def _templates(tokenizer: Path, config: Mapping[str, Any]) -> tuple[dict[str, str], str]:
    templates: dict[str, str] = {}
    named = tokenizer / NAMED_DIR
    if named.is_dir():
        for path in sorted(named.glob("*.jinja")):
            templates[path.name.removesuffix(".jinja")] = _text(path) or ""
    own = _text(tokenizer / TEMPLATE_FILE)
    if own is not None:
        templates[DEFAULT] = own
    if templates:
        return templates, str(tokenizer / (TEMPLATE_FILE if own is not None else NAMED_DIR))
    if config.get("chat_template") is not None:
        return _named_list(tokenizer / CONFIG_FILE, config["chat_template"]), str(tokenizer / CONFIG_FILE)
    processor = read_json_object(tokenizer / PROCESSOR_FILE)
    if processor is not None and processor.get("chat_template") is not None:
        return _named_list(tokenizer / PROCESSOR_FILE, processor["chat_template"]), str(tokenizer / PROCESSOR_FILE)
    return {}, ""


def _token(value: object) -> str | None:
    """A token as written: a string, or an AddedToken object ({"content": ..., ...})."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def special_tokens(config: Mapping[str, Any], tokens_map: Mapping[str, Any] | None) -> dict[str, str]:
    """The special tokens a template sees: the named ones, then the model's own `*_token` entries (and the named
    entries of a dict `extra_special_tokens`)."""
    merged = dict(config)
    if tokens_map is not None and "added_tokens_decoder" not in config:
        merged.update(tokens_map)  # the legacy file, read (and winning) only where the config lists no added tokens
    own = merged.get("extra_special_tokens")
    if isinstance(own, dict):  # named extra tokens (transformers 5), which win over a top-level entry
        merged = {**merged, **own}
    out: dict[str, str] = {}
    for name in SPECIAL_TOKENS:
        token = _token(merged.get(name))
        if token is not None:
            out[name] = token
    for name, value in merged.items():
        token = _token(value)
        if name not in out and name.endswith("_token") and token is not None:
            out[name] = token
    return out


def discover(tokenizer: Path) -> Found:
    """The chat templates and special tokens beside a tokenizer, as transformers' AutoTokenizer finds them. Every
    unreadable or malformed file is one UsageError naming it."""
    config = read_json_object(tokenizer / CONFIG_FILE) or {}
    templates, origin = _templates(tokenizer, config)
    return Found(templates, origin, special_tokens(config, read_json_object(tokenizer / TOKENS_MAP_FILE)))


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

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
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
        try:
            return template.render(
                messages=chat_messages(messages),
                tools=None if tools is None else list(tools),
                documents=None if documents is None else list(documents),
                add_generation_prompt=add_generation_prompt,
                **names,
            )
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"the chat template refused the messages: {exc}") from None
        except (TypeError, ValueError, LookupError, ArithmeticError, AttributeError) as exc:
            # The template's own code failed on these messages (e.g. `+` on a list of content parts).
            raise ChatTemplateError(
                f"the chat template failed on these messages ({type(exc).__name__}: {exc})"
            ) from None


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
            "serve a chat template transformers can render (FRONTEND=triton renders with the image's transformers)",
        ) from None
    return f"chat template {', '.join(sorted(found.templates))} from {found.origin} compiles"


def check_with(tokenizer: Path, python: str, env: Mapping[str, str]) -> str:
    """`check`, run by the front's Python with the front's environment (its jinja2, its path): the entrypoint never
    imports jinja2 itself. Returns the check's line; raises UsageError with its one line when it fails."""
    argv = [python, "-m", __name__, "--check", str(tokenizer)]
    try:
        done = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise UsageError(f"checking the chat template in {tokenizer} took over {CHECK_TIMEOUT_S:.0f} s") from None
    lines = (done.stdout + done.stderr).strip().splitlines()
    line = lines[-1] if lines else f"exit status {done.returncode}"
    if done.returncode == 0:
        return line
    if done.returncode == UsageError.exit_code:
        raise UsageError(line)
    raise UsageError(f"the chat template in {tokenizer} could not be checked: {line}")


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
