"""The front's template engine (openai/sandbox.py): the vendored jinja2 (vendor.lock.json), never older than 3.1.6,
whatever jinja2 the base image carries."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.unit.test_supervise import PLAN
from trtllm_entrypoint import contract
from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.launch import supervise
from trtllm_entrypoint.openai import sandbox
from trtllm_images.sources import vendor

ENTRYPOINTS = Path(sandbox.__file__).parents[2]


@pytest.mark.pure
@pytest.mark.parametrize("found", ["3.1.5", "3.1.4", "2.11.3", "3.0.0", ""])
def test_an_older_jinja2_is_refused_before_any_template_is_rendered(monkeypatch, found):
    old = types.ModuleType("jinja2")
    old.__version__ = found  # type: ignore[attr-defined]
    old.__file__ = "/usr/lib/python3/dist-packages/jinja2/__init__.py"
    monkeypatch.setitem(sys.modules, "jinja2", old)
    monkeypatch.setitem(sys.modules, "jinja2.sandbox", types.ModuleType("jinja2.sandbox"))
    with pytest.raises(UsageError, match=r"jinja2 >= 3\.1\.6.*dist-packages"):
        sandbox.jinja2()


@pytest.mark.pure
@pytest.mark.parametrize("text,expected", [("3.1.6", (3, 1, 6)), ("3.2.0rc1", (3, 2, 0)), ("4", (4,)), ("x", ())])
def test_versions_compare_by_their_release_numbers(text, expected):
    assert sandbox.version_of(text) == expected


@pytest.fixture(scope="session")
def front_kit(tmp_path_factory):
    """The images' vendor/front directory, assembled from vendor.lock.json (downloaded once into the user cache)."""
    return vendor.assemble(tmp_path_factory.mktemp("vendor"), log=lambda message: None) / "front"


RENDER = """
import jinja2, markupsafe
from trtllm_entrypoint.openai.chat_template import DEFAULT, ChatTemplate, Found
print(jinja2.__version__, jinja2.__file__, markupsafe.__file__)
found = Found({DEFAULT: "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"}, "test", {})
print(ChatTemplate(found).render([{"role": "user", "content": "hi"}], add_generation_prompt=False))
"""


@pytest.mark.process
def test_the_front_renders_with_the_vendored_jinja2_whatever_the_base_image_carries(tmp_path, front_kit, monkeypatch):
    base = tmp_path / "base-site-packages"  # the base image's own, older jinja2
    (base / "jinja2").mkdir(parents=True)
    (base / "jinja2" / "__init__.py").write_text("__version__ = '3.1.4'\nraise ImportError('the base image jinja2')\n")
    monkeypatch.setattr(contract, "FRONT_DIR", str(front_kit))
    env = supervise.front_environ({**os.environ, "PYTHONPATH": f"{ENTRYPOINTS}{os.pathsep}{base}"}, "k", PLAN)
    done = subprocess.run([sys.executable, "-c", RENDER], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    version, jinja_file, markupsafe_file = done.stdout.splitlines()[0].split()
    assert sandbox.version_of(version) >= sandbox.MIN_JINJA2
    assert jinja_file.startswith(str(front_kit)) and markupsafe_file.startswith(str(front_kit))
    assert done.stdout.splitlines()[1] == "<user>hi"
