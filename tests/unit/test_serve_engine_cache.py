"""The engine cache as a user's starts meet it, the entrypoint in a real process: built once per key, reused by
later and concurrent starts, never half-published, and served from this UID's own copy when another could change it.

The NVIDIA programs are the doubles from tests/doubles (on PATH / PYTHONPATH); what is asserted is our behaviour:
exit codes, messages, the files we write, and the arguments we gave the programs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # each test runs the entrypoint as its own process


def test_second_start_reuses_the_engine(image):
    first = image.run("prepare")
    second = image.run("prepare")
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert json.loads(first.stdout)["engine_dir"] == json.loads(second.stdout)["engine_dir"]
    assert image.builds() == 1
    assert "cache=hit" in second.stderr


def test_the_same_checkpoint_mounted_elsewhere_reuses_the_engine_and_a_changed_byte_does_not(image):
    first = image.run("prepare")
    moved = image.model.parent.parent / "mnt" / "models"  # where KServe mounts what Docker had at /models/x
    shutil.copytree(image.model, moved)
    second = image.run("prepare", MODEL_ID=str(moved))
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert json.loads(first.stdout)["engine_dir"] == json.loads(second.stdout)["engine_dir"]
    assert image.builds() == 1 and "cache=hit" in second.stderr
    weights = max((p for p in moved.iterdir() if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 1  # one bit, same size
    weights.write_bytes(bytes(data))
    third = image.run("prepare", MODEL_ID=str(moved))
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout)["engine_dir"] != json.loads(first.stdout)["engine_dir"]
    assert image.builds() == 2


def test_changed_build_setting_builds_a_new_engine(image):
    assert image.run("prepare").returncode == 0
    other = image.run("prepare", MAX_BATCH_SIZE="8")
    assert other.returncode == 0, other.stderr
    assert image.builds() == 2
    assert len(image.published()) == 2


def test_four_concurrent_prepares_on_an_empty_cache_build_once(image):
    procs = [image.start("prepare", TRTLLM_BUILD_DOUBLE_SLEEP="1") for _ in range(4)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [err for _, err in outputs]
    assert image.builds() == 1
    assert len({json.loads(out)["engine_dir"] for out, _ in outputs}) == 1


def test_build_killed_midway_is_never_loaded_and_the_next_start_rebuilds(image):
    proc = image.start("prepare", TRTLLM_BUILD_DOUBLE_SLEEP="60")
    deadline = time.monotonic() + 60
    while image.builds() == 0:
        assert time.monotonic() < deadline and proc.poll() is None, "the build never started"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert image.published() == []
    result = image.run("prepare")
    assert result.returncode == 0, result.stderr
    assert image.builds() == 2
    assert len(image.published()) == 1
    leftovers = [p.name for p in (image.cache / "engines").iterdir() if ".new-" in p.name]
    assert leftovers == []


def test_failed_build_exits_non_zero_and_publishes_nothing(image):
    result = image.run("prepare", TRTLLM_BUILD_DOUBLE_FAIL="1")
    assert result.returncode == 1
    assert "trtllm-build" in result.stderr
    assert image.published() == []


def test_weights_changed_in_place_with_their_mtime_put_back_build_a_new_engine(image):
    assert image.run("prepare").returncode == 0 and image.builds() == 1
    weights = max(image.model.glob("*.safetensors"), key=lambda p: p.stat().st_size)
    before = weights.stat()
    with open(weights, "r+b") as file:  # another model of the same size: bytes changed in the middle
        file.seek(before.st_size // 2)
        file.write(bytes(b ^ 0xFF for b in file.read(16)[:16]))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert weights.stat().st_size == before.st_size
    result = image.run("prepare")
    assert result.returncode == 0, result.stderr
    assert image.builds() == 2 and len(image.published()) == 2
    again = image.run("prepare")  # unchanged since: the memo answers, nothing is built
    assert again.returncode == 0 and image.builds() == 2


def chown_tree(root: Path, uid: int) -> None:
    for path in [root, *root.rglob("*")]:
        os.lchown(path, uid, uid)


def test_what_another_uid_published_is_served_from_this_uids_private_copies(image):
    """The cache entries of another UID (simulated with chown: the tests run as root) could change between the
    check and the load; this UID serves copies of its own, builds nothing, and later starts reuse them."""
    first = image.run("prepare", REPOSITORY_DIR="")
    assert first.returncode == 0, first.stderr
    shared = json.loads(first.stdout)
    engine, repo = Path(shared["engine_dir"]), Path(shared["repository"])
    uid = os.geteuid()
    chown_tree(repo, 1001)
    own_repo = image.run("prepare", REPOSITORY_DIR="")
    assert own_repo.returncode == 0, own_repo.stderr
    assert json.loads(own_repo.stdout)["repository"] == f"{repo}.uid{uid}"
    chown_tree(engine, 1001)
    second = image.run("prepare", REPOSITORY_DIR="")
    assert second.returncode == 0, second.stderr
    private = json.loads(second.stdout)
    # The repository names the engine it serves, so it is another (this UID's) repository too.
    assert private["engine_dir"] == f"{engine}.uid{uid}" and Path(private["repository"]).stat().st_uid == uid
    assert image.builds() == 1, "replicas of different UIDs still build once"
    assert "copying the engine privately" in second.stderr
    for path in [Path(private["engine_dir"]), *Path(private["engine_dir"]).rglob("*")]:
        st = path.lstat()
        assert st.st_uid == uid and not st.st_mode & 0o022
    os.chmod(engine, 0o755)
    (engine / "plugin.so").write_bytes(b"planted")  # the other UID changes its entry afterwards
    third = image.run("prepare", REPOSITORY_DIR="")
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout)["engine_dir"] == private["engine_dir"]
    assert not (Path(private["engine_dir"]) / "plugin.so").exists()
    assert "copying" not in third.stderr and image.builds() == 1


def test_what_we_publish_is_writable_by_this_uid_alone(image):
    os.umask(0o002)  # the arbitrary-UID pattern with GID 0 makes files group-writable
    try:
        result = image.run("prepare", REPOSITORY_DIR="")
    finally:
        os.umask(0o022)
    assert result.returncode == 0, result.stderr
    prepared = json.loads(result.stdout)
    for root in (Path(prepared["engine_dir"]), Path(prepared["repository"])):
        assert all(not p.lstat().st_mode & 0o022 for p in [root, *root.rglob("*")]), root
