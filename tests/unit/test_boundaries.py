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


# The OpenAI front (openai/) runs in processes of its own, with its libraries on a private path (contract.FRONT_DIR).
FRONT = CONTAINER / "openai"
FRONT_LIBRARIES = {"aiohttp", "msgspec", "jinja2", "tokenizers", "transformers"}
# What the front takes from the rest of the container package: leaves only, which never import the front back.
FRONT_USES = {"contract", "errors", "pbtxt"}
# The one module of the front that the entrypoint imports: standard library only.
FRONT_INTERFACE = "plan"


def test_container_side_imports_only_the_standard_library_at_import_time():
    for path in sorted(CONTAINER.glob("*.py")):
        for module, at_import in imports(path):
            if module in ("trtllm_entrypoint", "__future__") or module in sys.stdlib_module_names:
                continue
            assert module in LAZY_ONLY and not at_import, f"{path.name} imports {module}"


def test_the_front_imports_only_its_libraries_and_the_containers_leaves():
    ours = {"trtllm_entrypoint", "__future__"}
    for path in sorted(FRONT.glob("*.py")):
        libraries = {m for m, _ in imports(path)} - ours - set(sys.stdlib_module_names)
        allowed = set() if path.stem in (FRONT_INTERFACE, "__init__") else FRONT_LIBRARIES
        assert libraries <= allowed, f"openai/{path.name} imports {sorted(libraries - allowed)}"
        assert our_imports(path, "trtllm_entrypoint") <= FRONT_USES | {"openai"}, path.name
    assert our_imports(FRONT / f"{FRONT_INTERFACE}.py", "trtllm_entrypoint") == set()
    for leaf in sorted(FRONT_USES):
        assert our_imports(CONTAINER / f"{leaf}.py", "trtllm_entrypoint") <= FRONT_USES, leaf


def test_the_entrypoint_imports_only_the_fronts_plan():
    for path in sorted(CONTAINER.glob("*.py")):
        assert "openai" not in our_imports(path, "trtllm_entrypoint") or (
            our_imports(path, "trtllm_entrypoint.openai") == {FRONT_INTERFACE}
        ), f"{path.name} imports the OpenAI front beyond openai.{FRONT_INTERFACE}"


def test_the_front_has_no_import_circle():
    graph = {path.stem: runtime_imports(path, "trtllm_entrypoint.openai") - {path.stem} for path in FRONT.glob("*.py")}
    assert import_cycle(graph) is None, f"import circle: {' -> '.join(import_cycle(graph) or [])}"


# The container's modules that hold facts the host needs too; each imports no other module of ours but these.
SHARED_LEAVES = {"contract", "errors", "variables", "versions"}


def our_imports(path: Path, package: str) -> set[str]:
    """The modules of `package` that the file imports (`from package import x` and `from package.x import …`)."""
    return our_imports_of(ast.parse(path.read_text(), str(path)), package)


def our_imports_of(tree: ast.AST, package: str) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == package:
                found |= {alias.name for alias in node.names}
            elif node.module.startswith(package + "."):
                found.add(node.module[len(package) + 1 :].split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {
                alias.name[len(package) + 1 :].split(".")[0]
                for alias in node.names
                if alias.name.startswith(package + ".")
            }
    return found


def test_the_container_never_imports_the_host():
    for path in sorted(CONTAINER.glob("*.py")):
        assert "trtllm_images" not in {m for m, _ in imports(path)}, path.name


def test_the_host_imports_only_the_containers_shared_leaves():
    for path in sorted(HOST.glob("*.py")):
        assert our_imports(path, "trtllm_entrypoint") <= SHARED_LEAVES, path.name
    for leaf in sorted(SHARED_LEAVES):
        assert our_imports(CONTAINER / f"{leaf}.py", "trtllm_entrypoint") <= SHARED_LEAVES, leaf


def runtime_imports(path: Path, package: str) -> set[str]:
    """The modules of `package` the file imports when it runs: `our_imports` less those under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = [
        node for node in ast.walk(tree) if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    ]
    for node in typing_only:
        node.body = []
    return our_imports_of(tree, package)


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return list(error.args[1])
    return None


def test_the_host_package_has_no_import_circle():
    graph = {path.stem: runtime_imports(path, "trtllm_images") - {path.stem} for path in HOST.glob("*.py")}
    assert import_cycle(graph) is None, f"import circle: {' -> '.join(import_cycle(graph) or [])}"


def test_only_the_package_entry_point_imports_main():
    """main.py is the shell: the steps it runs (diagnostics, health, the serve pipeline's modules) never reach back."""
    users = sorted(p.name for p in CONTAINER.glob("*.py") if "main" in our_imports(p, "trtllm_entrypoint"))
    assert users == ["__main__.py"]


def test_the_circle_detector_finds_a_circle_and_ignores_type_only_imports(tmp_path):
    cycle = import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert cycle is not None and set(cycle) == {"a", "b", "c"}
    assert import_cycle({"a": {"b"}, "b": set()}) is None
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nfrom pkg import a\nif TYPE_CHECKING:\n    from pkg.b import B\n"
    )
    assert runtime_imports(module, "pkg") == {"a"}
    assert our_imports(module, "pkg") == {"a", "b"}


def test_only_cli_imports_click():
    users = sorted(p.name for p in HOST.glob("*.py") if "click" in {m for m, _ in imports(p)})
    assert users == ["cli.py"]


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
    "settings.py",
    "environment.py",
    "credentials.py",
    "image_facts.py",
    "main.py",
    "health.py",
    "openai/server.py",
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
        f"{path.relative_to(CONTAINER).as_posix()}:{line}"
        for path in sorted(CONTAINER.rglob("*.py"))
        if path.relative_to(CONTAINER).as_posix() not in ENVIRONMENT_READERS
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
