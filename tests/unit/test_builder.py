"""builder: Docker error mapping and streaming, against a fake low-level API object (no daemon needed)."""

from __future__ import annotations

import pytest
from docker.errors import APIError, DockerException, ImageNotFound

from trtllm_entrypoint.errors import Error
from trtllm_images import builder

BASE = "nvcr.io/nvidia/tritonserver:25.01-trtllm-python-py3"


class FakeAPI:
    """The slice of docker.APIClient that builder uses; records every call."""

    def __init__(self, build=(), pull=(), push=(), local_images=(), build_raises=None):
        self.build_chunks, self.pull_chunks, self.push_chunks = list(build), list(pull), list(push)
        self.local_images = set(local_images)
        self.build_raises = build_raises
        self.calls: list[tuple[str, tuple, dict]] = []

    def build(self, **kwargs):
        self.calls.append(("build", (), kwargs))
        if self.build_raises:
            raise self.build_raises
        self.local_images.add(kwargs["tag"])
        return iter(self.build_chunks)

    def inspect_image(self, ref):
        self.calls.append(("inspect_image", (ref,), {}))
        if ref not in self.local_images:
            raise ImageNotFound(f"No such image: {ref}")
        return {"Id": "sha256:" + "ab" * 32}

    def pull(self, ref, **kwargs):
        self.calls.append(("pull", (ref,), kwargs))
        return iter(self.pull_chunks)

    def push(self, repository, **kwargs):
        self.calls.append(("push", (repository,), kwargs))
        return iter(self.push_chunks)


class FakeClient:
    def __init__(self, api):
        self.api = api


def calls_named(api, name):
    return [call for call in api.calls if call[0] == name]


def test_build_streams_lines_tags_the_ref_and_returns_the_image_id(tmp_path):
    api = FakeAPI(
        build=[
            {"stream": "Step 1/2 : FROM base\n"},
            {"stream": " ---> 123\nStep 2/2 : RUN true\n"},
            {"aux": {"ID": "sha256:x"}},
            {"stream": "\n"},
        ]
    )
    lines: list[str] = []
    image_id = builder.build_image(FakeClient(api), tmp_path, "Dockerfile.server", "img:1", {"A": "b"}, lines.append)
    assert image_id == "sha256:" + "ab" * 32
    assert lines == ["Step 1/2 : FROM base", " ---> 123", "Step 2/2 : RUN true"]
    ((_, _, kwargs),) = calls_named(api, "build")
    assert kwargs["path"] == str(tmp_path) and kwargs["dockerfile"] == "Dockerfile.server"
    assert kwargs["tag"] == "img:1" and kwargs["buildargs"] == {"A": "b"}
    assert kwargs["decode"] and kwargs["rm"] and kwargs["forcerm"] and kwargs["pull"] is False


def test_an_error_chunk_fails_the_build_with_the_last_lines(tmp_path):
    chunks = [{"stream": f"line {i}\n"} for i in range(30)]
    chunks.append(
        {
            "error": "The command '/bin/sh -c false' returned a non-zero code: 1",
            "errorDetail": {"code": 1, "message": "The command '/bin/sh -c false' returned a non-zero code: 1"},
        }
    )
    api = FakeAPI(build=chunks)
    with pytest.raises(Error) as caught:
        builder.build_image(FakeClient(api), tmp_path, "Dockerfile", "img:1", {}, lambda line: None)
    message = caught.value.message
    assert message.startswith("docker build of img:1 failed: The command '/bin/sh -c false' returned")
    assert "line 29" in message and "line 18" in message and "line 17" not in message
    assert caught.value.hint
    assert not calls_named(api, "inspect_image")


def test_an_api_error_during_build_names_the_ref(tmp_path):
    api = FakeAPI(build_raises=APIError("500", explanation="Cannot locate specified Dockerfile: Dockerfile.x"))
    with pytest.raises(Error, match="docker build of img:1 failed: Cannot locate specified Dockerfile"):
        builder.build_image(FakeClient(api), tmp_path, "Dockerfile.x", "img:1", {}, lambda line: None)


def test_a_lost_engine_during_build_is_an_engine_error(tmp_path):
    api = FakeAPI(build_raises=ConnectionError("connection aborted"))
    with pytest.raises(Error, match="the Docker engine failed while building img:1"):
        builder.build_image(FakeClient(api), tmp_path, "Dockerfile", "img:1", {}, lambda line: None)


def test_a_local_base_image_is_not_pulled():
    api = FakeAPI(local_images=[BASE])
    builder.ensure_base_image(FakeClient(api), BASE, lambda line: None)
    assert not calls_named(api, "pull")


def test_a_missing_base_image_is_pulled_with_status_lines_only():
    api = FakeAPI(
        pull=[
            {"status": "Pulling fs layer", "id": "a1", "progressDetail": {}},
            {"status": "Downloading", "id": "a1", "progressDetail": {"current": 1, "total": 9}},
            {"status": "Pull complete", "id": "a1", "progressDetail": {}},
        ]
    )
    lines: list[str] = []
    builder.ensure_base_image(FakeClient(api), BASE, lines.append)
    assert [call[1] for call in calls_named(api, "pull")] == [(BASE,)]
    assert lines == [f"pulling {BASE}", "a1 Pulling fs layer", "a1 Pull complete"]


class PullDenied(FakeAPI):
    def pull(self, ref, **kwargs):
        raise APIError("404", explanation="pull access denied for nvcr.io/nvidia/tritonserver")


@pytest.mark.parametrize(
    "api",
    [
        FakeAPI(pull=[{"error": "unauthorized: authentication required", "errorDetail": {"message": "unauthorized"}}]),
        PullDenied(),
    ],
    ids=["error-chunk", "api-error"],
)
def test_a_base_image_that_cannot_be_pulled_names_it_and_the_option(api):
    with pytest.raises(Error) as caught:
        builder.ensure_base_image(FakeClient(api), BASE, lambda line: None)
    assert BASE in caught.value.message and "cannot be pulled" in caught.value.message
    assert "--base-image" in caught.value.hint and "nvcr.io" in caught.value.hint


def test_push_splits_the_ref_and_streams_status():
    api = FakeAPI(push=[{"status": "Pushed", "id": "l1"}, {"status": "1: digest: sha256:ff size: 1"}])
    lines: list[str] = []
    builder.push(FakeClient(api), "registry.example.com:5000/team/trtllm:25.01-server", lines.append)
    ((_, args, kwargs),) = calls_named(api, "push")
    assert args == ("registry.example.com:5000/team/trtllm",) and kwargs["tag"] == "25.01-server"
    assert lines == ["l1 Pushed", "1: digest: sha256:ff size: 1"]


def test_a_refused_push_says_which_registry_to_log_in_to():
    api = FakeAPI(push=[{"error": "denied: requested access to the resource is denied"}])
    with pytest.raises(Error, match="pushing ghcr.io/me/img:1 failed: denied") as caught:
        builder.push(FakeClient(api), "ghcr.io/me/img:1", lambda line: None)
    assert "docker login ghcr.io" in caught.value.hint


@pytest.mark.parametrize(
    "repository, registry",
    [
        ("ghcr.io/me/img", "ghcr.io"),
        ("localhost:5000/img", "localhost:5000"),
        ("localhost/img", "localhost"),
        ("me/img", "docker.io"),
        ("img", "docker.io"),
    ],
)
def test_registry_of(repository, registry):
    assert builder.registry_of(repository) == registry


def test_no_daemon_is_one_error_saying_how_to_start_one(monkeypatch):
    def refuse(**kwargs):
        raise DockerException("Error while fetching server API version: Connection refused")

    monkeypatch.setattr(builder.docker, "from_env", refuse)
    with pytest.raises(Error) as caught:
        builder.docker_client()
    assert caught.value.message.startswith("no Docker engine answered")
    assert "DOCKER_HOST" in caught.value.hint


def test_a_daemon_that_does_not_answer_ping_is_the_same_error(monkeypatch):
    class Silent:
        def ping(self):
            raise OSError("timed out")

    monkeypatch.setattr(builder.docker, "from_env", lambda **kwargs: Silent())
    with pytest.raises(Error, match="no Docker engine answered: timed out"):
        builder.docker_client()
