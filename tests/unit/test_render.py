"""render.render_dockerfiles (golden files, contract, layer order) and context.write_context (contents, atomicity)."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest

from tests.update_golden import GOLDEN_DIR, REGENERATE, golden_tags, render_tag
from trtllm_entrypoint import contract
from trtllm_entrypoint.errors import Error
from trtllm_images import context, matrix, model_support, render
from trtllm_images.checks import instructions
from trtllm_images.plan import make_build_plan

MATRIX_JSON, MODELS_JSON = model_support.image_data(matrix.load())


@pytest.fixture(scope="module")
def real_matrix():
    return matrix.load()


def rendered(real_matrix, tag, **options):
    return render.render_dockerfiles(make_build_plan(real_matrix.get(tag), out_dir=Path("/nonexistent"), **options))


@pytest.mark.parametrize("tag", golden_tags())
def test_golden_dockerfiles(tag):
    """Every supported tag, byte for byte: a template change that breaks an old tag shows in tests/golden's diff."""
    rendered = render_tag(tag)
    hint = f"if the change is intended, run `{REGENERATE}` and review `git diff tests/golden`"
    golden = {p.name: p.read_bytes() for p in (GOLDEN_DIR / tag).glob("*")} if (GOLDEN_DIR / tag).is_dir() else {}
    assert sorted(golden) == sorted(rendered), f"tests/golden/{tag} holds {sorted(golden)}; {hint}"
    for name, data in rendered.items():
        assert data == golden[name], f"tests/golden/{tag}/{name} differs from the render; {hint}"


def test_golden_directories_are_exactly_the_supported_tags():
    present = sorted(p.name for p in GOLDEN_DIR.iterdir() if p.is_dir())
    assert present == sorted(golden_tags()), f"run `{REGENERATE}` to add missing tags and drop unsupported ones"


def test_server_dockerfile_runtime_contract(real_matrix):
    steps = instructions(rendered(real_matrix, "25.01")["server.Dockerfile"])
    assert steps[0] == ("ARG", "BASE_IMAGE=nvcr.io/nvidia/tritonserver:25.01-trtllm-python-py3")
    assert steps[1] == ("FROM", "${BASE_IMAGE}")
    assert ("ENV", "MATRIX_TAG=25.01 HOME=/tmp") in steps
    assert ("COPY", f"matrix.json {contract.MATRIX_FILE}") in steps
    assert ("COPY", f"models.json {contract.MODELS_FILE}") in steps
    assert ("RUN", f"mkdir -p {contract.DEFAULT_CACHE_DIR} && chmod 1777 {contract.DEFAULT_CACHE_DIR}") in steps
    assert ("USER", "1000") in steps
    assert ("EXPOSE", "8000 8001 8002") in steps
    assert ("STOPSIGNAL", "SIGTERM") in steps
    assert json.loads(dict(steps)["ENTRYPOINT"]) == [
        contract.TINI,
        "-s",
        "--",
        "/opt/nvidia/nvidia_entrypoint.sh",
        "trtllm-entrypoint",
    ]
    assert json.loads(dict(steps)["CMD"]) == ["serve"]
    healthcheck = dict(steps)["HEALTHCHECK"]
    assert "--start-period=2h" in healthcheck and healthcheck.endswith('CMD ["trtllm-entrypoint", "health"]')


def test_builder_dockerfile_builds_engines_and_serves_nothing(real_matrix):
    steps = dict(instructions(rendered(real_matrix, "25.01")["builder.Dockerfile"]))
    assert json.loads(steps["CMD"]) == ["build-engine"]
    assert "EXPOSE" not in steps and "HEALTHCHECK" not in steps


def test_bundled_app_only_where_the_base_image_lacks_it(real_matrix):
    copy = ("COPY", f"backend/app {contract.BUNDLED_APP_DIR}")
    assert copy in instructions(rendered(real_matrix, "24.08")["server.Dockerfile"])
    assert copy not in instructions(rendered(real_matrix, "25.01")["server.Dockerfile"])


def test_layer_order_keeps_the_wheel_last_and_revision_after_everything(real_matrix):
    steps = instructions(rendered(real_matrix, "24.08", revision="c0ffee")["server.Dockerfile"])
    keywords = [k for k, _ in steps]
    position = {args.split()[0]: i for i, (k, args) in enumerate(steps) if k == "COPY"}
    wheel_run = next(i for i, (k, args) in enumerate(steps) if k == "RUN" and "pip install" in args)
    assert (
        keywords.index("LABEL")
        < keywords.index("ENV")
        < position["backend/app"]
        < position["matrix.json"]
        < position["wheels/"]
        < wheel_run
    )
    assert steps[-1] == ("LABEL", 'org.opencontainers.image.revision="c0ffee"')
    assert "revision" not in steps[keywords.index("LABEL")][1]


def test_wheel_install_is_offline_and_classic_builder_compatible(real_matrix):
    for tag in ("24.08", "26.07"):
        for text in rendered(real_matrix, tag).values():
            run = next(args for k, args in instructions(text) if k == "RUN" and "pip" in args)
            assert run.startswith(
                "PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-index --no-deps --no-cache-dir"
            )
            assert "/tmp/wheels/trtllm_entrypoint-*.whl" in run and run.endswith("rm -rf /tmp/wheels")
            assert "--mount" not in text and "--chmod" not in text and "<<" not in text


def test_labels_are_rendered_exactly_as_planned(real_matrix):
    plan = make_build_plan(real_matrix.get("24.08"), out_dir=Path("/nonexistent"), revision="c0ffee")
    texts = render.render_dockerfiles(plan)
    for spec in plan.images:
        label_steps = [args for keyword, args in instructions(texts[spec.dockerfile]) if keyword == "LABEL"]
        rendered = [dict(re.findall(r'(\S+)="([^"]*)"', args)) for args in label_steps]
        assert [list(labels.items()) for labels in rendered] == [
            list(spec.labels.items()),
            list(spec.revision_labels.items()),
        ]


def test_base_image_override_does_not_change_the_text(real_matrix):
    """The override travels as a build arg; the base.name label is expanded by Docker from it."""
    assert rendered(
        real_matrix, "25.01", base_image="mirror.example/nvidia/tritonserver:25.01-trtllm-python-py3"
    ) == rendered(real_matrix, "25.01")
    text = rendered(real_matrix, "25.01")["server.Dockerfile"]
    assert 'org.opencontainers.image.base.name="${BASE_IMAGE}"' in text


def test_every_supported_tag_renders(real_matrix):
    for entry in real_matrix.supported():
        texts = rendered(real_matrix, entry.tag)
        assert set(texts) == {"server.Dockerfile", "builder.Dockerfile"}
        assert all(f"ENV MATRIX_TAG={entry.tag}" in text for text in texts.values())


# --- context.write_context ------------------------------------------------------------------------------------------


@pytest.fixture
def wheel(tmp_path):
    path = tmp_path / "dist" / "trtllm_entrypoint-0.1.0-py3-none-any.whl"
    path.parent.mkdir()
    path.write_bytes(b"PK-not-really")
    return path


@pytest.fixture
def assets(tmp_path):
    root = tmp_path / "assets"
    for sub in ("all_models/inflight_batcher_llm/ensemble", "tools", "examples/llama"):
        (root / sub).mkdir(parents=True)
    (root / "all_models/inflight_batcher_llm/ensemble/config.pbtxt").write_text('name: "ensemble"\n')
    (root / "tools/fill_template.py").write_text("#!/usr/bin/env python3\n")
    (root / "tools/fill_template.py").chmod(0o700)
    (root / "examples/llama/__pycache__").mkdir()
    (root / "examples/llama/__pycache__/x.pyc").write_bytes(b"")
    return root


def fake_vendor(tmp_path: Path) -> Path:
    """What vendor.assemble() writes, in miniature (its own test downloads the real files)."""
    root = tmp_path / "vendor"
    for name in context.VENDOR_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("#")
    for python in ("3.10", "3.12"):  # the OpenAI front's libraries: pure ones, and one compiled set per Python
        (root / "front" / f"py{python}" / "msgspec").mkdir(parents=True, exist_ok=True)
    (root / "front" / "any" / "aiohttp").mkdir(parents=True, exist_ok=True)
    return root


def write(real_matrix, tag, tmp_path, wheel, assets):
    plan = make_build_plan(real_matrix.get(tag), out_dir=tmp_path / "out")
    return plan, context.write_context(
        plan, render.render_dockerfiles(plan), wheel, MATRIX_JSON, assets, MODELS_JSON, fake_vendor(tmp_path)
    )


def test_context_holds_dockerfiles_matrix_wheel_and_assets(real_matrix, tmp_path, wheel, assets):
    plan, ctx = write(real_matrix, "24.08", tmp_path, wheel, assets)
    assert ctx == plan.context_dir
    assert sorted(p.name for p in ctx.iterdir()) == [
        "backend",
        "builder.Dockerfile",
        "matrix.json",
        "models.json",
        "server.Dockerfile",
        "vendor",
        "wheels",
    ]
    assert (ctx / "models.json").read_text() == MODELS_JSON
    assert [p.name for p in (ctx / "wheels").iterdir()] == [wheel.name]
    assert (ctx / "matrix.json").read_text() == MATRIX_JSON
    app = ctx / "backend" / "app"
    assert (app / "all_models/inflight_batcher_llm/ensemble/config.pbtxt").is_file()
    assert not (app / "examples/llama/__pycache__").exists()
    assert stat.S_IMODE((app / "tools/fill_template.py").stat().st_mode) == 0o755
    assert stat.S_IMODE((app / "all_models/inflight_batcher_llm/ensemble/config.pbtxt").stat().st_mode) == 0o644


def test_context_replaces_the_previous_one(real_matrix, tmp_path, wheel):
    plan, ctx = write(real_matrix, "25.01", tmp_path, wheel, None)
    (ctx / "stale").write_text("from an earlier run")
    write(real_matrix, "25.01", tmp_path, wheel, None)
    assert not (ctx / "stale").exists()
    assert sorted(p.name for p in ctx.parent.iterdir()) == ["25.01"]


def test_failed_write_keeps_the_old_context_and_leaves_no_temp_dirs(real_matrix, tmp_path, wheel, monkeypatch):
    plan, ctx = write(real_matrix, "25.01", tmp_path, wheel, None)
    before = {p.relative_to(ctx): p.read_bytes() for p in ctx.rglob("*") if p.is_file()}

    def crash(root):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(context, "_normalise_modes", crash)
    with pytest.raises(OSError):
        write(real_matrix, "25.01", tmp_path, wheel, None)
    assert {p.relative_to(ctx): p.read_bytes() for p in ctx.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in ctx.parent.iterdir()) == ["25.01"]


def test_missing_assets_for_a_tag_without_app_is_an_error_and_writes_nothing(real_matrix, tmp_path, wheel):
    with pytest.raises(Error, match="all_models") as info:
        write(real_matrix, "24.08", tmp_path, wheel, None)
    assert "--backend-dir" in info.value.hint
    assert not (tmp_path / "out").exists()


def test_assets_for_a_tag_with_app_are_refused(real_matrix, tmp_path, wheel, assets):
    with pytest.raises(Error, match="/app"):
        write(real_matrix, "25.01", tmp_path, wheel, assets)


def test_matrix_json_must_contain_the_tag(real_matrix, tmp_path, wheel):
    plan = make_build_plan(real_matrix.get("25.01"), out_dir=tmp_path / "out")
    with pytest.raises(Error, match="no entry for tag 25.01"):
        context.write_context(
            plan,
            render.render_dockerfiles(plan),
            wheel,
            json.dumps([{"tag": "24.08"}]),
            None,
            MODELS_JSON,
            fake_vendor(tmp_path),
        )
    with pytest.raises(Error, match="not a list of entries"):
        context.write_context(
            plan, render.render_dockerfiles(plan), wheel, "{not json", None, MODELS_JSON, fake_vendor(tmp_path)
        )


def test_wheel_must_be_the_entrypoint_wheel(real_matrix, tmp_path):
    other = tmp_path / "something-1.0-py3-none-any.whl"
    other.write_bytes(b"")
    plan = make_build_plan(real_matrix.get("25.01"), out_dir=tmp_path / "out")
    with pytest.raises(Error, match="trtllm_entrypoint"):
        context.write_context(
            plan, render.render_dockerfiles(plan), other, MATRIX_JSON, None, MODELS_JSON, fake_vendor(tmp_path)
        )
