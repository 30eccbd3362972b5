"""Do this image's NVIDIA programs take the flags our plans pass them? Asked of each program's own `--help`.

The flags come from the plans themselves (engine_build's and launch's argv builders, run with settings that switch
every optional flag on), never from a second list. `trtllm-entrypoint flags` prints the result as JSON; build.py's
image verification runs it in every image it builds and fails naming the program, the flag and the tag.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_entrypoint import contract
from trtllm_entrypoint.engine import build as engine_build
from trtllm_entrypoint.launch import argv as launch
from trtllm_entrypoint.model.support import Converter, ModelTable

if TYPE_CHECKING:
    from trtllm_entrypoint.config.image_facts import ImageFacts
    from trtllm_entrypoint.config.settings import Settings

HELP_TIMEOUT_S = 300  # importing tensorrt_llm on a cold page cache is slow
PARALLEL_HELPS = 4
_FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9_-]*")
_PLACEHOLDER = Path("/plan")  # paths in the sample plans; only the flags are looked at


@dataclass(frozen=True)
class ProgramUse:
    program: str  # how reports name it: trtllm-build, tritonserver, or the script's examples path
    help_argv: tuple[str, ...]  # prints the program's help
    flags: tuple[str, ...]  # what our plans pass it, sorted


@dataclass(frozen=True)
class ProgramCheck:
    use: ProgramUse
    missing: tuple[str, ...]  # flags of use.flags that its --help does not list
    error: str | None = None  # the program is not in the image: the plans that run it would fail
    unverified: str | None = None  # it is there but printed no help (some import a GPU library even for --help)

    def to_dict(self) -> dict[str, Any]:
        return {
            "program": self.use.program,
            "help": list(self.use.help_argv),
            "flags": list(self.use.flags),
            "missing": list(self.missing),
            "error": self.error,
            "unverified": self.unverified,
        }


def flags_in(argv: Sequence[str]) -> set[str]:
    """The long options of a command line, without their values (`--x=1` and `--x 1` both give `--x`)."""
    return {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}


def accepted_flags(help_text: str) -> set[str]:
    """Every long option a --help text names (argparse's and tritonserver's formats alike)."""
    return set(_FLAG.findall(help_text))


def _converters(facts: ImageFacts, table: ModelTable) -> dict[str, set[str]]:
    """Converter folder -> the model-specific arguments any model of this image passes to it (flags and values
    mixed: only the flags are looked at)."""
    folders: dict[str, set[str]] = {}
    for record in table.models:
        engine = record["engine"]
        if engine is None or facts.tag not in engine["tags"]:
            continue
        converter = Converter.for_record(record, facts)
        folders.setdefault(converter.folder, set()).update(converter.args)
    return folders


def planned_uses(facts: ImageFacts, table: ModelTable, settings: Settings) -> list[ProgramUse]:
    """Each program our plans run in this image, with every flag they may pass it (all options switched on)."""
    full = dataclasses.replace(
        settings, workflow="engine", enable_kv_cache_reuse=True, tp_size=2, pp_size=1, frontend="triton", triton_args=()
    )
    uses = [
        ProgramUse(
            "tritonserver",
            (contract.TRITONSERVER, "--help"),
            tuple(sorted(flags_in(launch.tritonserver_argv(full, _PLACEHOLDER, world_size=2, uid=1000)))),
        )
    ]
    if "engine" not in facts.workflows or "engine_build" not in facts.features:
        return uses
    spec = full.engine_spec
    dtype = engine_build.checkpoint_dtype(facts, spec.dtype)
    build = engine_build.trtllm_build_argv(facts, spec, dtype, _PLACEHOLDER, _PLACEHOLDER)
    uses.append(ProgramUse("trtllm-build", ("trtllm-build", "--help"), tuple(sorted(flags_in(build)))))
    for folder, args in sorted(_converters(facts, table).items()):
        converter = Converter(folder, tuple(args))
        convert = engine_build.build_commands(facts, spec, _PLACEHOLDER, _PLACEHOLDER, _PLACEHOLDER, converter)[0]
        script = converter.script(facts.app_dir)
        uses.append(
            ProgramUse(
                str(script.relative_to(facts.app_dir)),
                ("python3", str(script), "--help"),
                tuple(sorted(flags_in(convert.argv))),
            )
        )
    # Quantizing replaces the model's converter by quantize.py, whatever the model.
    quantize = engine_build.build_commands(
        facts,
        dataclasses.replace(spec, quantization="fp8"),
        _PLACEHOLDER,
        _PLACEHOLDER,
        _PLACEHOLDER,
        Converter("", ()),
    )[0]
    script = Path(quantize.argv[1])
    uses.append(
        ProgramUse(
            str(script.relative_to(facts.app_dir)),
            ("python3", str(script), "--help"),
            tuple(sorted(flags_in(quantize.argv))),
        )
    )
    return uses


class NotInImage(Exception):
    """The program (or script) the plans would run does not exist."""


def run_help(argv: Sequence[str]) -> str:
    """The output of `argv` (a --help command), whatever its exit code: tritonserver's --help exits 1."""
    script = argv[1] if argv[0] == "python3" else None
    if script is not None and not Path(script).is_file():
        raise NotInImage(f"{script} does not exist")
    try:
        proc = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=HELP_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        raise NotInImage(f"{argv[0]} is not installed") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {argv[0]}: {exc}"
    return proc.stdout + proc.stderr


def check(uses: Sequence[ProgramUse], get_help: Callable[[Sequence[str]], str] = run_help) -> list[ProgramCheck]:
    """Every use compared with its program's help. A program that is missing is an error; one whose help names no
    flag at all is reported as unverified (never as a pass)."""

    def one(use: ProgramUse) -> ProgramCheck:
        try:
            text = get_help(use.help_argv)
        except NotInImage as exc:
            return ProgramCheck(use, (), error=str(exc))
        accepted = accepted_flags(text)
        if not accepted:
            return ProgramCheck(
                use, (), unverified=f"`{' '.join(use.help_argv)}` listed no flags: {text.strip()[-300:]}"
            )
        return ProgramCheck(use, tuple(flag for flag in use.flags if flag not in accepted))

    with ThreadPoolExecutor(max_workers=PARALLEL_HELPS) as pool:
        return list(pool.map(one, uses))


def report(facts: ImageFacts, checks: Sequence[ProgramCheck]) -> dict[str, Any]:
    return {"tag": facts.tag, "tensorrt_llm": facts.tensorrt_llm, "programs": [c.to_dict() for c in checks]}
