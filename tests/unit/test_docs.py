"""The documentation's promises that can drift: the README's two commands and size, the generated matrix and
environment tables, the module list of docs/architecture.md, and the links between the pages."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from tests import update_golden
from trtllm_entrypoint.config import variables
from trtllm_entrypoint.config.records import DERIVED_FROM, EngineSpec
from trtllm_images import matrix

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
DOCS = sorted((REPO / "docs").glob("*.md"))
PACKAGES = ("trtllm_images", "entrypoints/trtllm_entrypoint")


def first_code_block() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert block and README.index("```") < README.index("\n## "), "the README opens with its commands"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_readme_opens_with_setup_plus_main_job_and_the_test_command():
    setup_and_build, tests = first_code_block()
    assert setup_and_build.startswith("pip install") and "python build.py --tag 25.01" in setup_and_build
    ci_commands = [
        line.strip()
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert ci_commands[-1] == tests, "CI must run exactly the README's test command, last"
    assert f"`{tests} -m pure`" in README, "the README names the fast subset next to the full suite"


def test_readme_fits_on_a_screen():
    assert len(README.splitlines()) <= 250, "move detail into docs/ and link it"


def test_matrix_table_is_the_generated_one():
    text = (REPO / "docs" / "matrix.md").read_text()
    table = text.split("<!-- matrix:start -->\n", 1)[1].split("<!-- matrix:end -->", 1)[0]
    assert table.strip() == matrix.markdown_table(matrix.load()).strip(), (
        "refresh docs/matrix.md's table with `python build.py list --markdown`"
    )


def test_environment_tables_are_the_generated_ones():
    _, tables, _ = update_golden.split_environment_doc(update_golden.ENVIRONMENT_DOC.read_text())
    assert tables == update_golden.environment_tables(), (
        f"refresh docs/environment.md's tables with `{update_golden.REGENERATE}`"
    )


def test_every_variable_the_entrypoint_reads_is_in_the_table():
    package = REPO / "entrypoints" / "trtllm_entrypoint"
    read = {
        name
        for module in ("config/settings.py", "config/image_facts.py", "main.py")
        for name in re.findall(r'"([A-Z][A-Z0-9_]{2,})"', (package / module).read_text())
    }
    base_image_own = {"PATH", "TRITON_SERVER_VERSION"}  # image_facts.py reads what the NGC image sets for itself
    missing = read - base_image_own - set(variables.VARIABLES)
    assert read and not missing, f"not in variables.TABLE: {sorted(missing)}"


def test_architecture_names_every_module_and_only_modules_that_exist():
    """Each module is a `| `path.py` | job |` row or a `- `path.py`: job` item, by its path inside its package."""
    text = (REPO / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"^(?:\| |- )`([\w/]+)\.py`(?: \||:)", text, re.M))
    present = {
        path.relative_to(REPO / package).with_suffix("").as_posix()
        for package in PACKAGES
        for path in (REPO / package).rglob("*.py")
        if not path.stem.startswith("__")
    }
    assert named, (
        "docs/architecture.md lists its modules as `| `name.py` | job |` rows or `- `wing/name.py`: job` items"
    )
    assert not present - named, f"modules docs/architecture.md does not describe: {sorted(present - named)}"
    assert not named - present, f"docs/architecture.md describes modules that do not exist: {sorted(named - present)}"
    folders = {path.parent.relative_to(REPO / p).as_posix() for p in PACKAGES for path in (REPO / p).rglob("*/*.py")}
    rows = set(re.findall(r"^\| `([\w/]+)/` \|", text, re.M))
    assert folders == rows, (
        f"docs/architecture.md's rows of folders differ from the packages' folders: {folders ^ rows}"
    )


@pytest.mark.parametrize("page", [REPO / "README.md", *DOCS], ids=lambda p: p.name)
def test_relative_links_lead_somewhere(page: Path):
    targets = re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", page.read_text())
    missing = [t for t in targets if not (page.parent / t).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"


@pytest.mark.parametrize("page", [REPO / "README.md", *DOCS], ids=lambda p: p.name)
def test_no_page_speaks_of_issue_numbers(page: Path):
    found = re.findall(r"\bissues? #?\d+\b", page.read_text(), re.I)
    assert not found, f"{page.name} refers to {found}: readers cannot resolve them; say the fact instead"


def test_the_cache_page_names_every_build_setting_of_the_key():
    text = (REPO / "docs" / "cache.md").read_text()
    names = [f.metadata.get(DERIVED_FROM, f.name.upper()) for f in dataclasses.fields(EngineSpec)]
    missing = [name for name in names if f"`{name}`" not in text]
    assert not missing, f"docs/cache.md's key table leaves out {missing}"


@pytest.mark.parametrize("page", [REPO / "README.md", *DOCS], ids=lambda p: p.name)
def test_lines_fit_an_editor_and_links_stay_inside_the_repository(page: Path):
    """A reader has this repository, not the checkout's neighbours (../shared is the developers'); a 600-character
    table row shows whole in no editor or diff: long tables become wrapped lists."""
    text = page.read_text()
    long = [number for number, line in enumerate(text.splitlines(), 1) if len(line) > 200]
    assert not long, f"{page.name}: lines over 200 characters: {long}"
    assert "../shared" not in text, f"{page.name} points at ../shared, which users do not have"
    outside = [t for t in re.findall(r"\]\(([^)#:\s]+)", text) if not (page.parent / t).resolve().is_relative_to(REPO)]
    assert not outside, f"{page.name} links outside the repository: {outside}"
