"""cli: list/render/check over every tag, exit codes and messages for bad input, and the build flow against a fake
Docker client (no daemon). Real-Docker builds are the e2e suite's job."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from docker.errors import ImageNotFound

from tests.archive_server import ArchiveServer, tarball
from trtllm_entrypoint.errors import Error
from trtllm_images import builder, capabilities, model_support, pipeline, wheel
from trtllm_images import cli as cli_mod
from trtllm_images import matrix as matrix_mod
from trtllm_images.sources import backend_assets, upstream

REPO = Path(__file__).resolve().parents[2]
MATRIX = matrix_mod.load(matrix_mod.DEFAULT_PATH)
SUPPORTED = [entry.tag for entry in MATRIX.supported()]
UNSUPPORTED = [entry.tag for entry in MATRIX.entries if not entry.supported]
IN_IMAGE_TAG = next(entry.tag for entry in MATRIX.supported() if entry.backend.in_image)
needs_hadolint = pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint is not on PATH")


def run(*args: str):
    return CliRunner().invoke(cli_mod.cli, list(args), prog_name="build.py")


def matrix_variant(tmp_path: Path, tag: str, old: str, new: str) -> Path:
    """A copy of matrix.yaml with one line of one entry changed."""
    text = matrix_mod.DEFAULT_PATH.read_text(encoding="utf-8")
    start = text.index(f'- tag: "{tag}"')
    end = text.find("\n  - tag:", start)
    block = text[start:end]
    assert old in block, f"{old!r} not in the {tag} entry"
    path = tmp_path / "matrix.yaml"
    path.write_text(text[:start] + block.replace(old, new, 1) + text[end:], encoding="utf-8")
    return path


# --- list ---------------------------------------------------------------------------------------------------------


def test_list_shows_every_tag_with_uncertain_marks():
    result = run("list")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[:7] == ["TAG", "STATUS", "TRITON", "TRT-LLM", "TENSORRT", "PYTHON", "WORKFLOWS"]
    for entry in MATRIX.entries:
        row = next(line for line in lines if line.startswith(entry.tag + " "))
        assert entry.status in row
        if "tensorrt_llm" in entry.uncertain and entry.tensorrt_llm:
            assert f"{entry.tensorrt_llm}?" in row


def test_list_supported_hides_unsupported_tags():
    result = run("list", "--supported")
    assert result.exit_code == 0
    tags = [line.split()[0] for line in result.stdout.splitlines()[1:] if line[:1].isdigit()]
    assert tags == SUPPORTED


def test_list_json_is_the_matrix_json_the_images_carry():
    result = run("list", "--json")
    assert result.exit_code == 0
    assert result.stdout == matrix_mod.image_matrix_json(MATRIX, capabilities.load_capabilities())
    entries = json.loads(result.stdout)
    assert [{k: v for k, v in e.items() if k != "capabilities"} for e in entries] == [
        e.to_dict() for e in MATRIX.entries
    ]
    by_tag = {e["tag"]: e["capabilities"] for e in entries}
    assert (by_tag["25.05"]["examples_layout"], by_tag["25.06"]["examples_layout"]) == ("flat", "models")
    assert "--max_output_len" in by_tag["24.05"]["flags"]["trtllm-build"]
    assert "--max_seq_len" in by_tag["24.08"]["flags"]["trtllm-build"]
    supported = json.loads(run("list", "--json", "--supported").stdout)
    assert [entry["tag"] for entry in supported] == SUPPORTED


def test_models_names_the_tags_and_workflows_that_serve_a_model():
    result = run("models", "Phi3ForCausalLM")
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if line[:1].isdigit()}
    assert rows["24.05"] == ["0.9.0", "-", "-"]
    assert rows["24.06"] == ["0.10.0", "examples/phi", "-"]
    assert rows["25.06"] == ["0.20.0", "examples/models/core/phi", "-"]
    record = json.loads(run("models", "qwen3", "--json").stdout)
    assert record["engine"]["tags"][0] == "25.09" and record["llmapi"]["tags"][0] == "25.06"
    assert "engine" in record["uncertain"]


def test_models_json_is_the_list_the_images_carry():
    result = run("models", "--json")
    assert result.exit_code == 0
    assert result.stdout == model_support.models_json(
        model_support.load_models(), MATRIX, capabilities.load_capabilities()
    )
    assert json.loads(result.stdout)["tags"] == SUPPORTED


def test_models_unknown_name_is_a_usage_error_listing_the_known_ones():
    result = run("models", "NoSuchForCausalLM")
    assert result.exit_code == 2
    assert "NoSuchForCausalLM" in result.output and "llama" in result.output


def test_list_markdown_is_the_readme_table():
    result = run("list", "--markdown")
    assert result.exit_code == 0
    assert result.stdout == matrix_mod.markdown_table(MATRIX)


def test_list_json_and_markdown_exclude_each_other():
    result = run("list", "--json", "--markdown")
    assert result.exit_code == 2
    assert "error: --json and --markdown exclude each other" in result.stderr


# --- render -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tag", SUPPORTED)
def test_render_prints_both_dockerfiles_of_every_supported_tag(tag):
    result = run("render", "--tag", tag, "--print")
    assert result.exit_code == 0, result.output
    assert f"# ===== {tag} server.Dockerfile =====" in result.stdout
    assert f"# ===== {tag} builder.Dockerfile =====" in result.stdout
    assert f"ARG BASE_IMAGE=nvcr.io/nvidia/tritonserver:{tag}-trtllm-python-py3" in result.stdout


def test_render_accepts_base_image_and_uses_the_registry_in_refs():
    result = run(
        "render",
        "--tag",
        IN_IMAGE_TAG,
        "--print",
        "--base-image",
        "mirror.example/triton:1",
        "--registry",
        "ghcr.io/me",
    )
    assert result.exit_code == 0, result.output
    assert "# ghcr.io/me/trtllm-serve:" in result.stdout


def test_render_of_a_tag_without_app_with_require_pinned_refuses_an_unpinned_source_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    entry = next(e for e in MATRIX.supported() if not e.backend.in_image)
    unpinned = upstream.Lock(tuple(upstream.new_pin(a.repo, a.ref, a.members) for a in backend_assets.archives(entry)))
    monkeypatch.setattr(upstream, "load_lock", lambda: unpinned)
    result = run("render", "--tag", entry.tag, "--require-pinned", "--out", str(tmp_path / "out"))
    assert result.exit_code == 1
    error, hint = result.stderr.splitlines()[-2:]
    assert error.startswith("error: ") and f"{entry.backend.repo}@{entry.backend.ref} is not pinned" in error
    assert "python build.py upstream lock --from-git DIR" in hint
    assert not (tmp_path / "out" / "context").exists() and not (tmp_path / "xdg" / "trtllm-images" / "backend").exists()


def test_upstream_lock_records_digests_and_fetch_prints_the_verified_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(backend_assets, "lock_paths", lambda matrix: {})  # the matrix's sources are on GitHub
    crd = tarball("kserve-0.20.0", {"config/crd/full/a.yaml": b"kind: CustomResourceDefinition\n"}, commit="c" * 40)
    lock_path = tmp_path / "upstream.lock.json"
    with ArchiveServer() as server:
        server.served["/kserve.tar.gz"] = crd
        pin = upstream.new_pin("kserve/kserve", "v0.20.0", ["config/crd/full"])
        pin = dataclasses.replace(pin, url=server.url("/kserve.tar.gz"), layout={"config/crd/full": "kserve/crd"})
        upstream.write_lock(upstream.Lock((pin,), lock_path))
        result = run("upstream", "fetch", "--lock", str(lock_path))
        assert result.exit_code == 0, result.output
        assert "trust on first use: kserve/kserve@v0.20.0 is not pinned" in result.stderr
        result = run("upstream", "lock", "--lock", str(lock_path))
        assert result.exit_code == 0, result.output
        assert "1 sources, 0 without a digest" in result.stdout
        recorded = upstream.load_lock(lock_path).pins[0]
        assert recorded.commit == "c" * 40 and recorded.digest and recorded.digest.startswith("tree1:")
        result = run("upstream", "fetch", "--lock", str(lock_path))
    assert result.exit_code == 0, result.output
    layout = Path(result.stdout.strip())
    assert layout.is_relative_to(tmp_path / "xdg" / "trtllm-images")
    assert (layout / "kserve/crd/a.yaml").read_bytes() == b"kind: CustomResourceDefinition\n"


def test_render_out_writes_build_contexts_with_one_wheel_build(tmp_path, monkeypatch):
    builds = []
    real_build = wheel.build_wheel
    monkeypatch.setattr(wheel, "build_wheel", lambda **kw: builds.append(kw) or real_build(**kw))
    pipeline.entrypoint_wheel.cache_clear()
    tags = [entry.tag for entry in MATRIX.supported() if entry.backend.in_image][:3]
    result = run("render", "--out", str(tmp_path), *[arg for tag in tags for arg in ("--tag", tag)])
    assert result.exit_code == 0, result.output
    assert len(builds) == 1
    for tag in tags:
        ctx = tmp_path / "context" / tag
        assert {p.name for p in ctx.iterdir()} >= {"server.Dockerfile", "builder.Dockerfile", "matrix.json", "wheels"}
        assert len(list((ctx / "wheels").glob("trtllm_entrypoint-*.whl"))) == 1
        assert str(ctx) in result.stdout


def test_render_needs_out_or_print():
    for args in ((), ("--print", "--out", "x")):
        result = run("render", "--tag", IN_IMAGE_TAG, *args)
        assert result.exit_code == 2
        assert "give exactly one of --out DIR or --print" in result.stderr


# --- check --------------------------------------------------------------------------------------------------------


@pytest.mark.process
@needs_hadolint
def test_check_all_passes_on_the_repository():
    result = run("check", "--all")
    assert result.exit_code == 0, result.output
    assert f"{len(SUPPORTED)} tag(s) checked: 0 error(s)" in result.stdout


@pytest.mark.process
@needs_hadolint
def test_check_fails_with_each_finding_and_its_hint(tmp_path):
    entry = MATRIX.get(IN_IMAGE_TAG)
    bad = matrix_variant(tmp_path, entry.tag, f'python: "{entry.python}"', 'python: "3.11.4"')
    result = run("check", "--tag", entry.tag, "--matrix", str(bad))
    assert result.exit_code == 1
    line = next(line for line in result.stdout.splitlines() if "python-version" in line)
    assert line.startswith("error") and entry.tag in line and "3.11.4" in line
    assert "hint: TensorRT-LLM wheels are for Python 3.10" in result.stdout
    assert "error: 1 check(s) failed" in result.stderr


# --- bad input ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [(), ("render", "--print"), ("check",)])
def test_unknown_tag_exits_2_listing_known_tags(command):
    result = run(*command, "--tag", "99.01")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: unknown tag '99.01'; known tags: ")
    assert SUPPORTED[0] in result.stderr and SUPPORTED[-1] in result.stderr


@pytest.mark.parametrize("tag", UNSUPPORTED)
def test_unsupported_tag_exits_2_with_the_reason(tag):
    result = run("--tag", tag)
    assert result.exit_code == 2
    assert f"error: tag {tag} is not supported: {MATRIX.get(tag).note}" in result.stderr


def test_base_image_with_two_tags_exits_2():
    result = run("--tag", SUPPORTED[0], "--tag", SUPPORTED[1], "--base-image", "x:1")
    assert result.exit_code == 2
    assert "error: --base-image applies to a single tag, got 2 tags" in result.stderr


def test_malformed_matrix_exits_2_naming_the_file(tmp_path):
    bad = tmp_path / "matrix.yaml"
    bad.write_text('entries:\n  - tag: "25.01"\n    status: [unclosed\n', encoding="utf-8")
    result = run("list", "--matrix", str(bad))
    assert result.exit_code == 2
    assert f"error: {bad}: YAML syntax error" in result.stderr
    assert result.stderr.count("\nhint: ") == 1


def test_a_binary_matrix_file_is_one_line_not_a_traceback(tmp_path):
    binary = tmp_path / "matrix.bin"
    binary.write_bytes(b"\x00\xff\xfe\x00")
    result = run("list", "--matrix", str(binary))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.splitlines()[0] == f"error: matrix file {binary} is not UTF-8 text (byte 1)"


def test_an_unwritable_out_is_one_line_not_a_traceback(tmp_path):
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "out"
    result = run("render", "--tag", "25.01", "--out", str(out))  # its templates ship in the image: nothing to fetch
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert result.stderr.splitlines()[0].startswith("error: ") and "Not a directory" in result.stderr
    assert "--out" in result.stderr.splitlines()[-1]


@pytest.mark.parametrize(
    "args, message",
    [
        (("--tag", "25.01", "--all"), "--tag and --all exclude each other"),
        (("--push",), "--push needs --registry"),
        (("--out", "x"), "no tag selected"),
        (("--tag", "25.01", "list"), "options before `list` apply only to builds: --tag"),
        (("--tag", "25.01", "--registry", "Not A Registry"), "--registry 'Not A Registry'"),
    ],
)
def test_bad_build_options_exit_2(args, message):
    result = run(*args)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {message}")


def test_click_usage_errors_exit_2():
    result = run("--tag")
    assert result.exit_code == 2
    assert "requires an argument" in result.stderr


@pytest.mark.process
def test_main_prints_one_error_line_and_a_hint():
    proc = subprocess.run(
        [sys.executable, str(REPO / "build.py"), "--tag", "99.01"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert [line.split(":")[0] for line in lines] == ["error", "hint"]


# --- build, with a fake Docker client -----------------------------------------------------------------------------


def probe_of(entry, **changes) -> dict:
    probe = {
        "tag": entry.tag,
        "tensorrt_llm": entry.tensorrt_llm,
        "tensorrt": entry.tensorrt,
        "triton": entry.triton,
        "python": entry.python,
        "app_dir": "/app",
        "fill_template": True,
        "huggingface_hub": "0.27.1",
        "templates": {"inflight_batcher_llm": True, "llmapi": True},
        "programs": {
            "tritonserver": "/opt/tritonserver/bin/tritonserver",
            "trtllm-build": "/usr/bin/trtllm-build",
            "mpirun": "/usr/bin/mpirun",
        },
        "openai_frontend": entry.openai_frontend,
    }
    probe.update(changes)
    return probe


class FakeDocker:
    """docker.DockerClient as builder and verify use it: records builds, pushes and probe runs."""

    def __init__(self, probe: dict, local=()):
        self.api = self
        self.containers = self
        self.probe = probe
        self.flags = {
            "tag": probe["tag"],
            "programs": [
                {
                    "program": "trtllm-build",
                    "help": ["trtllm-build", "--help"],
                    "flags": ["--max_seq_len"],
                    "missing": [],
                    "error": None,
                }
            ],
        }
        self.images = set(local)
        self.labels: dict[str, str] = {}  # what every image carries (a stand-in's base passes its own on)
        self.builds, self.pulls, self.pushes, self.probed = [], [], [], []

    # low-level API
    def build(self, **kwargs):
        self.builds.append(kwargs)
        self.images.add(kwargs["tag"])
        return iter([{"stream": f"Step 1/1 : FROM {kwargs['buildargs']['BASE_IMAGE']}\n"}])

    def inspect_image(self, ref):
        if ref not in self.images:
            raise ImageNotFound(ref)
        return {"Id": f"sha256:{abs(hash(ref)):x}", "Config": {"Labels": self.labels}}

    def pull(self, ref, **kwargs):
        self.pulls.append(ref)
        return iter([{"status": "Pull complete", "id": "l1"}])

    def push(self, repository, tag, **kwargs):
        self.pushes.append(f"{repository}:{tag}")
        return iter([{"status": "Pushed", "id": "l1"}])

    def remove_image(self, ref, noprune=False):
        self.images.remove(ref)

    # containers: `trtllm-entrypoint probe` answers self.probe, `trtllm-entrypoint flags` self.flags
    def create(self, image, **kwargs):
        if kwargs["command"] == ["flags"]:
            return FakeProbeContainer(json.dumps(self.flags).encode())
        self.probed.append(image)
        return FakeProbeContainer(json.dumps(self.probe).encode())


class FakeProbeContainer:
    def __init__(self, stdout: bytes):
        self.stdout = stdout

    def start(self):
        pass

    def wait(self, timeout):
        return {"StatusCode": 0}

    def logs(self, stdout, stderr):
        return self.stdout if stdout else b""

    def remove(self, force):
        pass


@pytest.fixture
def entry():
    return MATRIX.get(IN_IMAGE_TAG)


@pytest.fixture
def fake_docker(monkeypatch, entry):
    fake = FakeDocker(probe_of(entry), local=[entry.base_image])
    monkeypatch.setattr(builder, "docker_client", lambda: fake)
    return fake


def read_report(out: Path, tag: str) -> dict:
    return json.loads((out / "reports" / f"{tag}.json").read_text(encoding="utf-8"))


@pytest.mark.process
@needs_hadolint
def test_build_builds_verifies_and_reports(tmp_path, entry, fake_docker):
    result = run("--tag", entry.tag, "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert [b["dockerfile"] for b in fake_docker.builds] == ["server.Dockerfile", "builder.Dockerfile"]
    assert all(b["path"] == str(tmp_path / "context" / entry.tag) for b in fake_docker.builds)
    assert all(b["buildargs"] == {"BASE_IMAGE": entry.base_image} for b in fake_docker.builds)
    refs = [b["tag"] for b in fake_docker.builds]
    assert fake_docker.probed == refs and fake_docker.pulls == [] and fake_docker.pushes == []
    # Per tag: which one of how many, each phase announced and closed with its elapsed time, streamed lines timed.
    assert re.search(
        rf"^\[{entry.tag} server \d+s\] Step 1/1 : FROM {re.escape(entry.base_image)}$", result.stderr, re.M
    )
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"[{entry.tag}] tag 1 of 1: {refs[0]}, {refs[1]}")
    for phase in (
        "checks",
        "context",
        "base image",
        "build server",
        "build builder",
        "verify server",
        "verify builder",
    ):
        start = lines.index(f"[{entry.tag}] {phase} ...")
        assert any(re.fullmatch(rf"\[{entry.tag}\] {phase} done in \d+\.\ds", line) for line in lines[start:]), phase
    report = read_report(tmp_path, entry.tag)
    assert report["ok"] is True and report["verification"]["ok"] is True
    assert [(i["kind"], i["ref"]) for i in report["images"]] == [("server", refs[0]), ("builder", refs[1])]
    assert set(report["durations_s"]) >= {"checks", "context", "build server", "verify builder"}
    summary = result.stdout.splitlines()
    assert summary[0].split() == ["TAG", "RESULT", "IMAGES", "WARNINGS", "SECONDS"]
    assert summary[1].split()[:2] == [entry.tag, "ok"]
    printed = sum(1 for line in lines if re.match(rf"\[{entry.tag}[^\]]*\] warning: ", line))
    assert printed and re.split(r"\s{2,}", summary[1])[3] == str(printed), "WARNINGS counts every warning printed"


@pytest.mark.process
@needs_hadolint
def test_build_with_base_image_pulls_it_and_passes_it_as_build_arg(tmp_path, entry, fake_docker):
    result = run("--tag", entry.tag, "--out", str(tmp_path), "--base-image", "mirror.example/triton:25")
    assert result.exit_code == 0, result.output
    assert fake_docker.pulls == ["mirror.example/triton:25"]
    assert {b["buildargs"]["BASE_IMAGE"] for b in fake_docker.builds} == {"mirror.example/triton:25"}
    assert read_report(tmp_path, entry.tag)["base_image"] == "mirror.example/triton:25"


@pytest.mark.process
@needs_hadolint
def test_build_fails_listing_each_verification_mismatch(tmp_path, entry, fake_docker):
    fake_docker.probe = probe_of(entry, tensorrt_llm="0.0.1", openai_frontend=not entry.openai_frontend)
    result = run("--tag", entry.tag, "--out", str(tmp_path))
    assert result.exit_code == 1
    assert f"tensorrt_llm: expected {entry.tensorrt_llm}, found 0.0.1" in result.stderr
    assert f"openai_frontend: expected {entry.openai_frontend}, found {not entry.openai_frontend}" in result.stderr
    report = read_report(tmp_path, entry.tag)
    assert report["ok"] is False and report["verification"]["ok"] is False
    assert {e["field"] for e in report["verification"]["images"][0]["errors"]} == {"tensorrt_llm", "openai_frontend"}
    built = [b["tag"] for b in fake_docker.builds]
    assert not set(built) & fake_docker.images, "an image that failed verification keeps no name"


@pytest.mark.process
@needs_hadolint
def test_static_check_errors_stop_before_any_docker_call(tmp_path, entry, monkeypatch):
    def no_docker():
        raise AssertionError("Docker was contacted")

    monkeypatch.setattr(builder, "docker_client", no_docker)
    bad = matrix_variant(tmp_path, entry.tag, f'python: "{entry.python}"', 'python: "3.11.4"')
    result = run("--tag", entry.tag, "--out", str(tmp_path), "--matrix", str(bad))
    assert result.exit_code == 1
    assert "static check error(s): python-version" in result.stderr
    assert read_report(tmp_path, entry.tag)["error"]["message"].startswith(f"tag {entry.tag}: 1 static check")
    assert not (tmp_path / "context" / entry.tag).exists()


@pytest.mark.process
@needs_hadolint
def test_no_docker_engine_is_one_error_and_a_report(tmp_path, entry, monkeypatch):
    def refuse():
        raise Error("no Docker engine answered: refused", "start the Docker daemon or set DOCKER_HOST")

    monkeypatch.setattr(builder, "docker_client", refuse)
    result = run("--tag", entry.tag, "--out", str(tmp_path))
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-2:] == [
        "error: no Docker engine answered: refused",
        "hint: start the Docker daemon or set DOCKER_HOST",
    ]
    assert read_report(tmp_path, entry.tag)["ok"] is False


def test_push_refuses_images_built_from_a_stand_in_before_building(tmp_path, entry, fake_docker):
    fake_docker.images.add("trtllm-standin:25.01")
    result = run(
        "--tag", entry.tag, "--out", str(tmp_path), "--base-image", "trtllm-standin:25.01", "--registry", "r.example",
        "--push",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "refusing to push r.example/trtllm-serve:25.01-trtllm-0.17.0-standin" in result.output
    assert fake_docker.builds == [] and fake_docker.pushes == []


@pytest.mark.process
@needs_hadolint
def test_push_refuses_a_renamed_stand_in_by_its_labels(tmp_path, entry, fake_docker):
    fake_docker.labels = {"io.trtllm-images.standin.python": entry.python}
    result = run("--tag", entry.tag, "--out", str(tmp_path), "--registry", "ghcr.io/me", "--push")
    assert result.exit_code == 2 and "refusing to push ghcr.io/me/trtllm-serve:" in result.output, result.output
    assert fake_docker.pushes == []


@pytest.mark.process
@needs_hadolint
def test_push_pushes_both_refs_after_verification(tmp_path, entry, fake_docker):
    result = run("--tag", entry.tag, "--out", str(tmp_path), "--registry", "ghcr.io/me", "--push")
    assert result.exit_code == 0, result.output
    assert fake_docker.pushes == [b["tag"] for b in fake_docker.builds]
    assert all(ref.startswith("ghcr.io/me/") for ref in fake_docker.pushes)
    assert read_report(tmp_path, entry.tag)["pushed"] == fake_docker.pushes


@pytest.mark.process
@needs_hadolint
def test_a_failing_tag_does_not_stop_the_others(tmp_path, entry, fake_docker):
    other = next(e for e in MATRIX.supported() if e.backend.in_image and e.tag != entry.tag)
    fake_docker.images.add(other.base_image)
    # The fake probe always answers for `entry`, so `other` fails verification (wrong tag baked in).
    result = run("--tag", other.tag, "--tag", entry.tag, "--out", str(tmp_path))
    assert result.exit_code == 1
    assert f"error: 1 of 2 tags failed: {other.tag}" in result.stderr
    assert read_report(tmp_path, entry.tag)["ok"] is True
    assert read_report(tmp_path, other.tag)["ok"] is False


@pytest.mark.process
@needs_hadolint
def test_revision_label_is_the_last_instruction_before_the_runtime_settings(tmp_path, entry, fake_docker):
    result = run("--tag", entry.tag, "--out", str(tmp_path), "--revision", "0123abc")
    assert result.exit_code == 0, result.output
    dockerfile = (tmp_path / "context" / entry.tag / "server.Dockerfile").read_text()
    label = 'LABEL org.opencontainers.image.revision="0123abc"'
    assert label in dockerfile
    assert dockerfile.index(label) > dockerfile.index("pip install"), "it must not invalidate a cached layer"


def test_tiny_model_writes_a_servable_checkpoint_once_and_never_over_anything(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    out = tmp_path / "tiny"
    made = run("tiny-model", "--out", str(out))
    assert made.exit_code == 0, made.output
    assert made.stdout.strip() == str(out) and "MODEL_ID=/models/tiny" in made.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    words = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json")).encode("What is TensorRT-LLM?").tokens
    assert "<unk>" not in words, "the README's prompt is in its vocabulary"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    again = run("tiny-model", "--out", str(out))
    assert again.exit_code == 2 and "already exists" in again.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
