"""verify: the probe-vs-matrix rules (pure) and the probe run against a fake container API (no daemon)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import pytest
from docker.errors import APIError

from trtllm_entrypoint.errors import Error
from trtllm_images import verify


@dataclass(frozen=True)
class Entry:
    """The MatrixEntry fields verify reads."""

    tag: str = "25.01"
    tensorrt_llm: str | None = "0.17.0"
    tensorrt: str | None = "10.8.0.43"
    triton: str | None = "2.54.0"
    python: str | None = "3.12.3"
    workflows: tuple[str, ...] = ("engine",)
    openai_frontend: bool = True
    uncertain: dict = field(default_factory=dict)


def good_probe(**changes) -> dict:
    probe = {
        "tag": "25.01",
        "tensorrt_llm": "0.17.0",
        "tensorrt": "10.8.0.43",
        "triton": "2.54.0",
        "python": "3.12.3",
        "app_dir": "/app",
        "templates": {"inflight_batcher_llm": True, "llmapi": False},
        "fill_template": True,
        "programs": {
            "tritonserver": "/opt/tritonserver/bin/tritonserver",
            "trtllm-build": "/usr/local/bin/trtllm-build",
            "mpirun": "/opt/hpcx/ompi/bin/mpirun",
        },
        "openai_frontend": True,
        "huggingface_hub": "0.27.1",
    }
    probe.update(changes)
    return probe


def fields_and_levels(mismatches) -> set[tuple[str, str]]:
    return {(m.field, m.level) for m in mismatches}


def test_the_group_image_must_also_have_ssh_and_sshd():
    assert verify.expected(Entry(), "group")["programs"] == (*verify.REQUIRED_PROGRAMS, "ssh", "sshd")
    probe = good_probe()
    probe["programs"]["ssh"] = "/usr/bin/ssh"  # a server image may have ssh; the group image must
    assert verify.compare(Entry(), probe, "server") == []
    (mismatch,) = verify.compare(Entry(), probe, "group")
    assert mismatch.field == "programs.sshd" and mismatch.level == verify.ERROR


def test_expected_lists_what_the_image_must_show():
    want = verify.expected(Entry(workflows=("engine", "llmapi")))
    assert want["tensorrt_llm"] == "0.17.0"
    assert want["templates"] == {"inflight_batcher_llm": True, "llmapi": True}
    assert set(want["programs"]) == {"tritonserver", "trtllm-build", "mpirun"}
    assert want["openai_frontend"] is True


def test_a_matching_probe_has_no_mismatch():
    assert verify.compare(Entry(), good_probe()) == []


@pytest.mark.parametrize(
    "name, matrix_value, installed, ok",
    [
        ("tensorrt", "10.1.0", "10.1.0.27", True),
        ("tensorrt", "10.1.0", "10.10.0.31", False),
        ("tensorrt", "9.3.0.post12.dev1", "9.3.0.post12.dev1", True),
        ("python", "3.10", "3.10.12", True),
        ("python", "3.12.3", "3.12.3", True),
        ("python", "3.12.3", "3.12.30", False),
        ("python", "3.12.3", "3.12", False),
        ("triton", "2.54.0", "2.55.0", False),
        ("tensorrt_llm", "0.17.0", "0.17.0.post1", False),
        ("tensorrt_llm", "0.17.0.post1", "0.17.0.post1", True),
        ("tensorrt_llm", "0.17.0", None, False),
    ],
)
def test_versions_compare_at_the_precision_the_matrix_gives(name, matrix_value, installed, ok):
    entry = replace(Entry(), **{name: matrix_value})
    mismatches = verify.compare(entry, good_probe(**{name: installed}))
    assert (mismatches == []) is ok
    if not ok:
        assert fields_and_levels(mismatches) == {(name, "error")}
        assert str(mismatches[0]) == f"{name}: expected {matrix_value}, found {installed or 'nothing'}"


def test_an_uncertain_field_mismatches_as_a_warning():
    entry = Entry(uncertain={"tensorrt": "table says 10.0.1.6, maintainer says 9.3.0"})
    mismatches = verify.compare(entry, good_probe(tensorrt="9.3.0.post12.dev1"))
    assert fields_and_levels(mismatches) == {("tensorrt", "warning")}


def test_a_null_matrix_value_reports_what_the_image_has_as_a_warning():
    entry = Entry(tensorrt=None, uncertain={"tensorrt": "not verified"})
    (mismatch,) = verify.compare(entry, good_probe())
    assert (mismatch.field, mismatch.actual, mismatch.level) == ("tensorrt", "10.8.0.43", "warning")


@pytest.mark.parametrize(
    "workflows, templates, missing",
    [
        (("engine",), {"inflight_batcher_llm": False, "llmapi": False}, {"templates.inflight_batcher_llm"}),
        (("engine",), {"inflight_batcher_llm": True, "llmapi": False}, set()),
        (("llmapi",), {"inflight_batcher_llm": False, "llmapi": True}, set()),
        (("engine", "llmapi"), {"inflight_batcher_llm": True, "llmapi": False}, {"templates.llmapi"}),
        (("engine", "llmapi"), {}, {"templates.inflight_batcher_llm", "templates.llmapi"}),
    ],
)
def test_templates_of_every_workflow_must_be_present(workflows, templates, missing):
    mismatches = verify.compare(Entry(workflows=workflows), good_probe(templates=templates))
    assert fields_and_levels(mismatches) == {(name, "error") for name in missing}


def test_fill_template_is_not_required():
    assert verify.compare(Entry(), good_probe(fill_template=False)) == []


@pytest.mark.parametrize("program", ["tritonserver", "trtllm-build", "mpirun"])
def test_every_program_must_be_on_the_path(program):
    probe = good_probe()
    probe["programs"] = {**probe["programs"], program: None}
    (mismatch,) = verify.compare(Entry(), probe)
    assert (mismatch.field, mismatch.level) == (f"programs.{program}", "error")


@pytest.mark.parametrize("in_matrix, in_image", [(True, False), (False, True)])
def test_openai_frontend_must_match_the_entry(in_matrix, in_image):
    mismatches = verify.compare(Entry(openai_frontend=in_matrix), good_probe(openai_frontend=in_image))
    assert fields_and_levels(mismatches) == {("openai_frontend", "error")}


def test_an_image_baked_for_another_tag_is_an_error():
    mismatches = verify.compare(Entry(), good_probe(tag="25.02"))
    assert fields_and_levels(mismatches) == {("tag", "error")}


def test_errors_fail_the_build_listing_each_mismatch_but_warnings_do_not():
    entry = Entry(uncertain={"python": "inferred"})
    probe = good_probe(tensorrt_llm="0.18.0", python="3.10.12", openai_frontend=False)
    result = verify.Verification("server", "img:1", probe, tuple(verify.compare(entry, probe)))
    assert [m.field for m in result.warnings] == ["python"]
    with pytest.raises(Error) as caught:
        result.raise_for_errors()
    message = caught.value.message
    assert "tensorrt_llm: expected 0.17.0, found 0.18.0" in message
    assert "openai_frontend: expected True, found False" in message
    assert "python" not in message
    report = result.to_dict()
    assert report["ok"] is False and len(report["errors"]) == 2 and len(report["warnings"]) == 1


def test_warnings_alone_pass():
    entry = Entry(uncertain={"python": "inferred"})
    probe = good_probe(python="3.10.12")
    result = verify.Verification("server", "img:1", probe, tuple(verify.compare(entry, probe)))
    result.raise_for_errors()
    assert result.to_dict()["ok"] is True


# --- running the probe -------------------------------------------------------------------------------------------


class FakeContainer:
    def __init__(self, status=0, stdout=b"", stderr=b"", wait_error=None):
        self.status, self.stdout, self.stderr, self.wait_error = status, stdout, stderr, wait_error
        self.removed = False

    def start(self):
        pass

    def wait(self, timeout):
        if self.wait_error:
            raise self.wait_error
        return {"StatusCode": self.status}

    def logs(self, stdout, stderr):
        return self.stdout if stdout else self.stderr

    def remove(self, force):
        self.removed = True


class FakeContainers:
    def __init__(self, container=None, create_error=None, by_command=None):
        self.container, self.create_error, self.created = container, create_error, []
        self.by_command = by_command or {}  # `trtllm-entrypoint COMMAND` -> its container

    def create(self, image, **kwargs):
        self.created.append((image, kwargs))
        if self.create_error:
            raise self.create_error
        return self.by_command.get(kwargs["command"][0], self.container)


class FakeClient:
    def __init__(self, labels=None, **kwargs):
        self.containers = FakeContainers(**kwargs)
        self.api = SimpleNamespace(inspect_image=lambda ref: {"Config": {"Labels": labels}})


def test_run_probe_runs_the_entrypoint_probe_and_removes_the_container():
    container = FakeContainer(stdout=json.dumps(good_probe()).encode())
    client = FakeClient(container=container)
    assert verify.run_probe(client, "img:1") == good_probe()
    ((image, kwargs),) = client.containers.created
    assert image == "img:1"
    assert kwargs["entrypoint"] == ["trtllm-entrypoint"] and kwargs["command"] == ["probe"]
    assert container.removed


def test_run_probe_skips_banner_lines_before_the_json():
    stdout = "[TensorRT-LLM] TensorRT-LLM version: 0.17.0\n" + json.dumps(good_probe(), indent=2) + "\n"
    client = FakeClient(container=FakeContainer(stdout=stdout.encode()))
    assert verify.run_probe(client, "img:1")["tensorrt_llm"] == "0.17.0"


def test_a_failing_probe_is_a_build_error_with_its_stderr():
    container = FakeContainer(status=1, stderr=b"Traceback\nModuleNotFoundError: trtllm_entrypoint\n")
    with pytest.raises(Error, match="exited with 1.*ModuleNotFoundError") as caught:
        verify.run_probe(FakeClient(container=container), "img:1")
    assert "img:1" in caught.value.message
    assert container.removed


def test_probe_output_without_json_is_a_build_error():
    container = FakeContainer(stdout=b"hello\n")
    with pytest.raises(Error, match="printed no JSON object: hello"):
        verify.run_probe(FakeClient(container=container), "img:1")


def test_a_probe_that_cannot_start_is_a_build_error():
    client = FakeClient(create_error=APIError("no such image"))
    with pytest.raises(Error, match="cannot start `trtllm-entrypoint probe` in img:1"):
        verify.run_probe(client, "img:1")


def test_a_probe_that_hangs_is_removed_and_reported():
    container = FakeContainer(wait_error=TimeoutError("read timed out"))
    with pytest.raises(Error, match="did not finish"):
        verify.run_probe(FakeClient(container=container), "img:1")
    assert container.removed


FLAGS_OK = {
    "tag": "25.01",
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


def test_verify_image_is_probe_plus_compare_plus_flags():
    client = FakeClient(
        container=FakeContainer(stdout=json.dumps(good_probe(python="3.10.12")).encode()),
        by_command={"flags": FakeContainer(stdout=json.dumps(FLAGS_OK).encode())},
    )
    result = verify.verify_image(client, Entry(), "server", "img:1")
    assert [(m.field, m.level) for m in result.errors] == [("python", "error")]
    assert result.ref == "img:1" and result.kind == "server"
    assert [kwargs["command"] for _, kwargs in client.containers.created] == [["probe"], ["flags"]]
    assert result.to_dict()["probe"]["flags"] == FLAGS_OK


def test_a_stand_in_is_verified_against_the_python_it_declares_without_a_warning():
    client = FakeClient(
        labels={"io.trtllm-images.standin.python": "3.11.2"},
        container=FakeContainer(stdout=json.dumps(good_probe(python="3.11.2")).encode()),
        by_command={"flags": FakeContainer(stdout=json.dumps(FLAGS_OK).encode())},
    )
    result = verify.verify_image(client, Entry(), "server", "trtllm-serve:25.01-trtllm-0.17.0-standin")
    assert result.mismatches == ()
    real = FakeClient(
        container=FakeContainer(stdout=json.dumps(good_probe(python="3.11.2")).encode()),
        by_command={"flags": FakeContainer(stdout=json.dumps(FLAGS_OK).encode())},
    )
    assert [m.field for m in verify.verify_image(real, Entry(), "server", "img:1").errors] == ["python"]


def test_a_flag_the_program_lacks_fails_the_build_naming_program_flag_and_tag():
    report = {
        "tag": "24.08",
        "programs": [
            {
                "program": "trtllm-build",
                "help": [],
                "flags": ["--kv_cache_type", "--max_seq_len"],
                "missing": ["--kv_cache_type"],
                "error": None,
            },
            {
                "program": "examples/qwen/convert_checkpoint.py",
                "help": [],
                "flags": ["--model_dir"],
                "missing": [],
                "error": "/app/examples/qwen/convert_checkpoint.py does not exist",
            },
            {
                "program": "examples/gpt/convert_checkpoint.py",
                "help": [],
                "flags": ["--model_dir"],
                "missing": [],
                "error": None,
                "unverified": "`python3 … --help` listed no flags: ImportError: libcuda.so.1",
            },
        ],
    }
    client = FakeClient(
        container=FakeContainer(stdout=json.dumps(good_probe(tag="24.08")).encode()),
        by_command={"flags": FakeContainer(stdout=json.dumps(report).encode())},
    )
    result = verify.verify_image(client, Entry(tag="24.08"), "server", "trtllm-serve:24.08-trtllm-0.12.0")
    with pytest.raises(Error) as caught:
        result.raise_for_errors()
    assert (
        "flags.trtllm-build: expected --kv_cache_type (our plans pass it), found no --kv_cache_type in its "
        "--help at tag 24.08"
    ) in caught.value.message
    assert (
        "flags.examples/qwen/convert_checkpoint.py: expected the program our plans run, found "
        "/app/examples/qwen/convert_checkpoint.py does not exist"
    ) in caught.value.message
    assert [m.field for m in result.warnings if m.field.startswith("flags.")] == [
        "flags.examples/gpt/convert_checkpoint.py"
    ], "a help that printed nothing is reported, not passed"
    assert verify.flag_mismatches(Entry(), {"programs": []})[0].field == "flags", "nothing checked is an error"


def test_missing_templates_of_an_uncertain_workflow_are_a_warning():
    entry = Entry(workflows=("engine", "llmapi"), uncertain={"workflows": "llmapi model not seen in a real image"})
    mismatches = verify.compare(entry, good_probe())
    assert fields_and_levels(mismatches) == {("templates.llmapi", "warning")}
