"""What one chat request asks of its answer's structure, decided before anything reaches tritonserver: the tools the
chat template gets, the guide the backend gets (guided.py), and the parser that reads calls back (tools.py); or a
400 naming the field and the way out.

    tools + tool_choice auto (or unset)   template gets the tools; the family's parser reads calls out of the text
    tools + tool_choice none              template gets the tools; the answer is text
    tools + tool_choice required / named  guided decoding where the served model takes a guide: the model can only
                                          write calls (a JSON list of them / the named tool's arguments); elsewhere
                                          as auto, best effort (the model may still answer in text)
    response_format json_object / json_schema / (extensions)   guided decoding, or a 400 where there is none

Which family and whether guided decoding is on are the worker's (`Support`): decided once at start from the
template, TOOL_CALL_PARSER and the entrypoint's word (FrontPlan).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from trtllm_entrypoint.openai import guided, tools
from trtllm_entrypoint.openai.guided import Guide, GuideError

VARIABLE = "TOOL_CALL_PARSER"
PROBE = "trtllm_images_probe_tool"  # a name no template writes by itself


@dataclass(frozen=True)
class Support:
    """What the served model can do with tools and guides (one worker's, for every request)."""

    family: tools.Family | None  # the tool-call parser; None: calls cannot be read back
    no_family: str = ""  # why there is none (said in the 400)
    guided_off: str = ""  # why the served model takes no guide ("" when it does)


def support(
    template: str | None,
    model_type: str | None,
    setting: str,
    renders: Callable[[list[dict[str, Any]]], str] | None,
    guided_off: str,
) -> Support:
    """The worker's Support: TOOL_CALL_PARSER (`auto`: the family the template shows), checked against what the
    template renders when handed a tool (`renders(tools)` renders one user message with them)."""
    if setting != tools.AUTO:
        family = tools.FAMILIES.get(setting)
        if family is None:  # the entrypoint checks the value; a worker started by hand may not have
            return Support(None, f"{VARIABLE}={setting!r} names no parser ({', '.join(tools.FAMILIES)})", guided_off)
    else:
        name = tools.detect(template, model_type)
        if name is None:
            why = "the model's chat template shows no tool-call format this server reads"
            return Support(
                None, f"{why}; set {VARIABLE} to one of {', '.join(tools.FAMILIES)} if the model writes one", guided_off
            )  # noqa: E501
        family = tools.FAMILIES[name]
    if renders is None or not renders_tools(renders):
        return Support(None, f"the model's chat template renders no tools ({VARIABLE}={setting})", guided_off)
    return Support(family, "", guided_off)


def renders_tools(renders: Callable[[list[dict[str, Any]]], str]) -> bool:
    """Whether the template writes a tool it is handed into the prompt (some accept `tools` and ignore it)."""
    probe = {"type": "function", "function": {"name": PROBE, "description": "probe", "parameters": {"type": "object"}}}
    try:
        return PROBE in renders([probe])
    except Exception:  # noqa: BLE001  (a template that fails on tools does not render them)
        return False


Parser = tools.StreamParser | tools.XmlCallParser | tools.NamedCall


@dataclass(frozen=True)
class Structure:
    """One request's plan: what the template gets, what the backend gets, how the answer is read."""

    tools: list[dict[str, Any]] | None  # for the chat template
    guide: Guide | None
    reader: Callable[[], Parser] | None  # a fresh parser per choice; None: the answer is text
    parallel: bool = True  # parallel_tool_calls: false keeps the first call only


def plan(
    support: Support,
    offered: Sequence[Any] | None,
    tool_choice: object,
    response_format: Mapping[str, Any] | None,
    parallel_tool_calls: bool | None = None,
) -> Structure:
    """The request's Structure, or GuideError (a 400 naming the field)."""
    offered = list(offered or [])
    if tool_choice is not None and not offered:
        raise GuideError("tool_choice needs tools", "tool_choice")
    format_guide = guided.from_response_format(response_format)
    _need_guides(support, format_guide)
    if not offered:
        return Structure(None, format_guide, None)
    functions = [guided.function_of(tool, f"tools[{i}]") for i, tool in enumerate(offered)]
    choice = tool_choice if tool_choice is not None else "auto"
    named = guided.chosen_name(choice)
    if choice == "none":
        return Structure(offered, format_guide, None)
    forced = named is not None or choice == "required"
    if forced and not support.guided_off:
        if format_guide is not None:
            raise GuideError(
                "response_format and a required or named tool_choice both constrain the answer: send one",
                "response_format",
            )
        guide = guided.for_tool_choice(offered, choice)
        family = support.family
        if named is not None:
            return Structure(offered, guide, lambda: tools.NamedCall(family, named))
        return Structure(
            offered, guide, lambda: tools.reader(tools.REQUIRED, functions), parallel_tool_calls is not False
        )
    family = support.family
    if family is None:
        raise GuideError(f"tools are not supported for this model: {support.no_family}", "tools")
    if named is not None:  # best effort without guided decoding: only that tool is read back as a call
        functions = [f for f in functions if f["name"] == named]
    return Structure(offered, format_guide, lambda: tools.reader(family, functions), parallel_tool_calls is not False)


def _need_guides(support: Support, guide: Guide | None) -> None:
    if guide is not None and support.guided_off:
        raise GuideError(
            f"response_format needs guided decoding, which this server has not: {support.guided_off}", "response_format"
        )


@dataclass
class Reader:
    """One choice's answer read as it comes: OpenAI's chat deltas for a stream, or the whole message at the end."""

    parser: Parser
    parallel: bool = True
    events: list[tools.Event] | None = None  # kept for a whole answer
    calls: int = 0

    @classmethod
    def of(cls, structure: Structure, whole: bool) -> Reader | None:
        if structure.reader is None:
            return None
        return cls(structure.reader(), structure.parallel, [] if whole else None)

    def feed(self, text: str) -> list[dict[str, Any]]:
        return self._deltas(self.parser.feed(text))

    def finish(self) -> list[dict[str, Any]]:
        return self._deltas(self.parser.finish())

    def _deltas(self, events: list[tools.Event]) -> list[dict[str, Any]]:
        kept = [e for e in events if self.parallel or isinstance(e, tools.Text) or e.index == 0]
        self.calls += sum(isinstance(e, tools.CallStart) for e in kept)
        if self.events is not None:
            self.events.extend(kept)
        return [{"content": e.text} if isinstance(e, tools.Text) else {"tool_calls": [tools.delta(e)]} for e in kept]

    def message(self) -> dict[str, Any]:
        """The whole answer as a chat message (feed and finish first)."""
        parsed = tools.assemble(self.events or [])
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.calls:
            message["tool_calls"] = [call.to_openai() for call in parsed.calls]
        return message

    def finish_reason(self, reason: Literal["stop", "length", "tool_calls"]) -> Literal["stop", "length", "tool_calls"]:
        """`tool_calls` when the model called (and was not cut short), else the text's reason."""
        return "tool_calls" if self.calls and reason != "length" else reason
