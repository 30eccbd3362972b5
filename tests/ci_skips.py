"""Under CI=true a skipped test fails the run unless `.ci/run` allows that skip, with its reason.

`.ci/run` exports CI_ALLOWED_SKIPS: one skip per line, `<test node id> | <why it cannot run on CI>`; the node id of
a parametrized test without its `[…]` allows every parameter. A skip that is not listed means a test CI believes it
runs silently did not (a missing tool, a wrong path): the run fails and names it. Loaded by tests/conftest.py.
"""

from __future__ import annotations

import os

import pytest

VARIABLE = "CI_ALLOWED_SKIPS"
_skipped: list[tuple[str, str]] = []


def allowed_skips(text: str) -> dict[str, str]:
    """Node id -> reason, from the variable's lines; a line without a reason is refused."""
    allowed = {}
    for line in filter(None, (raw.strip() for raw in text.splitlines())):
        node, sep, reason = (part.strip() for part in line.partition("|"))
        if not (sep and node and reason):
            raise pytest.UsageError(f"{VARIABLE}: {line!r} is not `<test node id> | <reason>`")
        allowed[node] = reason
    return allowed


def unexpected(skipped: list[tuple[str, str]], allowed: dict[str, str]) -> list[tuple[str, str]]:
    return [(node, why) for node, why in skipped if node not in allowed and node.split("[", 1)[0] not in allowed]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        _skipped.append((report.nodeid, reason))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("CI") != "true":
        return
    found = unexpected(_skipped, allowed_skips(os.environ.get(VARIABLE, "")))
    if not found:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"CI=true: {len(found)} test(s) skipped that .ci/run does not allow ({VARIABLE}):"]
    lines += [f"  {node}: {why}" for node, why in found]
    for line in lines:
        if reporter is not None:
            reporter.write_line(line, red=True)
        else:
            print(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
