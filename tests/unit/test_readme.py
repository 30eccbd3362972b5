"""The README's promises that can drift: its two commands, the matrix table and the environment table."""

from __future__ import annotations

import re
from pathlib import Path

from tests import update_golden
from trtllm_entrypoint import variables
from trtllm_images import matrix

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


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


def test_matrix_table_is_the_generated_one():
    table = README.split("<!-- matrix:start -->\n", 1)[1].split("<!-- matrix:end -->", 1)[0]
    assert table.strip() == matrix.markdown_table(matrix.load()).strip(), (
        "refresh the README table with `python build.py list --markdown`"
    )


def test_environment_tables_are_the_generated_ones():
    _, tables, _ = update_golden.split_readme(README)
    assert tables == update_golden.environment_tables(), (
        f"refresh the README's tables with `{update_golden.REGENERATE}`"
    )


def test_every_variable_the_entrypoint_reads_is_in_the_table():
    package = REPO / "entrypoints" / "trtllm_entrypoint"
    read = {
        name
        for module in ("settings.py", "facts.py", "main.py")
        for name in re.findall(r'"([A-Z][A-Z0-9_]{2,})"', (package / module).read_text())
    }
    base_image_own = {"PATH", "TRITON_SERVER_VERSION"}  # facts.py reads what the NGC image sets for itself
    missing = read - base_image_own - set(variables.VARIABLES)
    assert read and not missing, f"not in variables.TABLE: {sorted(missing)}"
