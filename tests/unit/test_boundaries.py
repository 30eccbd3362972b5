"""The two packages' boundaries: the container side runs on the NGC image's Python with the standard library only."""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

from harness import realtriton

REPO = Path(__file__).resolve().parents[2]
CONTAINER = REPO / "entrypoints" / "trtllm_entrypoint"
HOST = REPO / "trtllm_images"
LAZY_ONLY = {"huggingface_hub", "google", "tritonclient"}  # present in NGC images or optional; never at import time


def imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level module, imported at module level?) for every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], id(node) in top_level))
    return found


# The OpenAI front runs in processes of its own, with its libraries on a private path (contract.FRONT_DIR): every module
# of openai/ but the plan the entrypoint hands it.
FRONT_LIBRARIES = {"aiohttp", "msgspec", "jinja2", "tokenizers", "transformers", "prometheus_client"}
# What the front takes from the rest of the container package: leaves only, which never import the front back.
# and the model's chat templates and special tokens, found as preflight finds them (model.chat_templates reads them
# with model.files' bounds), and the log's format for the drain's lines.
FRONT_USES = {"contract", "errors", "log", "repository.pbtxt", "model.chat_templates", "model.files"}


def container_modules() -> dict[str, Path]:
    """Every module of the container package by its dotted name under the package: `main`, `config.settings` …"""
    return {
        ".".join(path.relative_to(CONTAINER).with_suffix("").parts).removesuffix(".__init__"): path
        for path in sorted(CONTAINER.rglob("*.py"))
    }


def wing(module: str) -> str:
    """The folder a container module lives in; the top level's modules are `base` (the leaves every wing may use)
    or `main` (the shell on top), and openai.plan, standard library only, is a leaf too."""
    if module == "openai.plan":
        return "base"
    if "." in module or module in WINGS or module in FRONT_WINGS:
        return module.split(".")[0]
    return "main" if module in ("main", "__main__") else "base"


# Each wing imports only the wings below it (and itself): every arrow points down.
WINGS = ["base", "storage", "config", "repository", "model", "engine", "launch", "inspection", "main"]
# The front is a program of its own beside the serve pipeline: it reads the filled repository's config and the model's
# tokenizer files (FRONT_USES).
FRONT_WINGS = {"openai": {"base", "repository", "model", "openai"}}


def allowed_wings(own: str) -> set[str]:
    if own in FRONT_WINGS:
        return FRONT_WINGS[own]
    return set(WINGS[: WINGS.index(own) + 1])


def is_front(module: str) -> bool:
    return wing(module) == "openai"


def test_container_side_imports_only_the_standard_library_at_import_time():
    for module, path in container_modules().items():
        if is_front(module):
            assert {m for m, _ in imports(path)} - {"trtllm_entrypoint", "__future__"} - set(
                sys.stdlib_module_names
            ) <= FRONT_LIBRARIES, module
            continue
        for name, at_import in imports(path):
            if name in ("trtllm_entrypoint", "__future__") or name in sys.stdlib_module_names:
                continue
            assert name in LAZY_ONLY and not at_import, f"{module} imports {name}"


def test_every_arrow_between_the_wings_points_down():
    modules = container_modules()
    assert set(WINGS[1:-1]) | set(FRONT_WINGS) == {m.split(".")[0] for m in modules if "." in m}, (
        "a new folder of the container package needs its place in WINGS"
    )
    offenders = [
        f"{module} ({wing(module)}) imports {used} ({wing(used)})"
        for module, path in modules.items()
        for used in our_modules(path, "trtllm_entrypoint", set(modules))
        if wing(used) not in allowed_wings(wing(module))
    ]
    assert offenders == []


def test_the_front_takes_only_leaves_from_the_rest_of_the_package():
    modules = container_modules()
    for module, path in modules.items():
        if is_front(module):
            used = our_modules(path, "trtllm_entrypoint", set(modules))
            assert {m for m in used if not is_front(m)} <= FRONT_USES | {"openai.plan"}, module
    for leaf in sorted(FRONT_USES):
        assert our_modules(modules[leaf], "trtllm_entrypoint", set(modules)) <= FRONT_USES, leaf


def test_the_front_is_imported_only_through_its_plan():
    modules = container_modules()
    for module, path in modules.items():
        if not is_front(module):
            used = our_modules(path, "trtllm_entrypoint", set(modules))
            assert not {m for m in used if is_front(m)}, module


# The container's modules that hold facts the host needs too; each imports no other module of ours but these.
SHARED_LEAVES = {"contract", "errors", "config.variables", "versions"}


def our_modules(path: Path, package: str, known: set[str]) -> set[str]:
    """The modules of `package` (dotted, under it) that the file imports, type-only imports included."""
    return our_modules_of(ast.parse(path.read_text(), str(path)), package, known)


def our_modules_of(tree: ast.AST, package: str, known: set[str]) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module != package and not node.module.startswith(package + "."):
                continue
            base = node.module.removeprefix(package).removeprefix(".")
            for alias in node.names:
                name = f"{base}.{alias.name}" if base else alias.name
                found.add(name if name in known else base)
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix(package + ".") for a in node.names if a.name.startswith(package + ".")}
    return found - {""}


def host_modules() -> dict[str, Path]:
    return {
        ".".join(p.relative_to(HOST).with_suffix("").parts).removesuffix(".__init__"): p for p in HOST.rglob("*.py")
    }


def test_the_container_never_imports_the_host():
    for module, path in container_modules().items():
        assert "trtllm_images" not in {m for m, _ in imports(path)}, module


def test_the_host_imports_only_the_containers_shared_leaves():
    known = set(container_modules())
    for module, path in host_modules().items():
        assert our_modules(path, "trtllm_entrypoint", known) <= SHARED_LEAVES, module
    for leaf in sorted(SHARED_LEAVES):
        assert our_modules(container_modules()[leaf], "trtllm_entrypoint", known) <= SHARED_LEAVES, leaf


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return list(error.args[1])
    return None


def import_graph(modules: dict[str, Path], package: str) -> dict[str, set[str]]:
    """Who imports whom, type-only imports included: a circle drawn only for the type checker is still a circle."""
    return {name: our_modules(path, package, set(modules)) - {name} for name, path in modules.items()}


@pytest.mark.parametrize("package", ["trtllm_entrypoint", "trtllm_images"])
def test_no_import_circle(package):
    graph = import_graph(container_modules() if package == "trtllm_entrypoint" else host_modules(), package)
    assert import_cycle(graph) is None, f"import circle: {' -> '.join(import_cycle(graph) or [])}"


def test_only_the_package_entry_point_imports_main():
    """main.py is the shell: the steps it runs (check, health, the serve pipeline's modules) never reach back."""
    modules = container_modules()
    users = sorted(m for m, p in modules.items() if "main" in our_modules(p, "trtllm_entrypoint", set(modules)))
    assert users == ["__main__"]


def test_the_detectors_find_a_circle_and_resolve_dotted_modules():
    cycle = import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert cycle is not None and set(cycle) == {"a", "b", "c"}
    assert import_cycle({"a": {"b"}, "b": set()}) is None
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nfrom pkg import a\nfrom pkg.w import b\nfrom pkg.w.c import C\n"
        "if TYPE_CHECKING:\n    from pkg.d import D\n"
    )
    assert our_modules_of(tree, "pkg", {"a", "w", "w.b", "w.c", "d"}) == {"a", "w.b", "w.c", "d"}
    assert wing("config.settings") == "config" and wing("contract") == "base" and wing("openai.plan") == "base"
    assert "launch" not in allowed_wings("config") and "config" in allowed_wings("launch")


def test_only_the_command_line_imports_click():
    users = sorted(m for m, p in host_modules().items() if "click" in {m for m, _ in imports(p)})
    assert users == ["cli", "cli_options"]


@pytest.mark.process
def test_container_side_compiles_and_imports_on_python_3_10():
    interpreter = realtriton.find_python("3.10")
    if interpreter is None:
        pytest.skip("no Python 3.10 interpreter on this machine")
    # Every module compiles under 3.10's grammar (in memory) and the orchestrator imports with all it pulls in.
    script = (
        "import pathlib, sys, trtllm_entrypoint.main\n"
        "for f in pathlib.Path(sys.argv[1]).rglob('*.py'): compile(f.read_text(), str(f), 'exec')"
    )
    result = subprocess.run(
        [interpreter, "-B", "-c", script, str(CONTAINER)], cwd=REPO / "entrypoints", capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr + result.stdout


# Only these read the environment: the settings parse it (through environment.py's typed reads, and credentials.py
# masks every URL password it holds), the facts say what the image is, main hands the mapping on, and `health` (the
# image's HEALTHCHECK, a process of its own) falls back to the ports it names without parsing every setting.
# The OpenAI front's server is a program of its own: its plan and the admin key are handed to it in its environment.
ENVIRONMENT_READERS = {
    "config.settings",
    "config.environment",
    "config.credentials",
    "config.image_facts",
    "main",
    "launch.health",
    "openai.server",
}
ENVIRONMENT_NAMES = {"env", "environ", "environment"}
OS_ENVIRONMENT = {"environ", "environb", "getenv", "getenvb"}


def _names_environment(node: ast.expr) -> bool:
    """`env`, `environ`, `self.environ` …: the environment mapping as it is passed around."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name in ENVIRONMENT_NAMES


def environment_reads(source: str) -> list[int]:
    """Line numbers that read the environment: os.environ/os.getenv (also imported by name), and env[...],
    env.get(...)/.keys()/.items(), `... in env` on the mapping handed around."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
            read = node.attr in OS_ENVIRONMENT
        elif isinstance(node, ast.ImportFrom):
            read = node.module == "os" and any(alias.name in OS_ENVIRONMENT for alias in node.names)
        elif isinstance(node, ast.Subscript):
            read = _names_environment(node.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            read = node.func.attr in ("get", "keys", "items", "values") and _names_environment(node.func.value)
        elif isinstance(node, ast.Compare):
            read = any(
                isinstance(op, (ast.In, ast.NotIn)) and _names_environment(right)
                for op, right in zip(node.ops, node.comparators, strict=True)
            )
        else:
            read = False
        if read:
            lines.append(node.lineno)
    return sorted(set(lines))


def test_the_detector_finds_each_way_of_reading_the_environment():
    for sample in [
        "os.environ['A']",
        "os.getenv('A')",
        "from os import environ",
        "from os import getenv as g",
        "environ.get('A')",
        "env['A']",
        "'A' in environ",
        "self.environ.get('A', '')",
        "env.items()",
        "x = os.environ",
    ]:
        assert environment_reads(sample) == [1], sample
    for allowed in [
        "run(argv, env=dict(environ))",
        "exec_argv(argv, {**env, **extra})",
        "settings.http_port",
        "os.path.exists(p)",
        "'a' in names",
        "values.get('A')",
    ]:
        assert environment_reads(allowed) == [], allowed


def test_only_settings_facts_and_main_read_the_environment():
    found = [
        f"{module}:{line}"
        for module, path in container_modules().items()
        if module not in ENVIRONMENT_READERS
        for line in environment_reads(path.read_text())
    ]
    assert found == [], (
        "read environment variables in settings.py (or image_facts.py for what the image is) and pass "
        f"the typed value on: {found}"
    )


def test_benchmarks_and_the_harness_never_import_the_tests_and_the_products_never_import_either():
    """What tests and benchmarks share lives in harness/; the doubles under tests/doubles are reached by path."""
    offenders = [
        f"{path.relative_to(REPO)} imports {name}"
        for folder, forbidden in (
            (REPO / "benchmarks", {"tests"}),
            (REPO / "harness", {"tests", "benchmarks"}),
            (HOST, {"tests", "harness", "benchmarks"}),
            (CONTAINER, {"tests", "harness", "benchmarks"}),
        )
        for path in sorted(folder.rglob("*.py"))
        for name, _ in imports(path)
        if name in forbidden
    ]
    assert offenders == []
