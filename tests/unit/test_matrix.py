"""matrix.yaml (the data) and trtllm_images.matrix (its loader and validator)."""

from __future__ import annotations

import copy
import dataclasses
from types import MappingProxyType

import pytest
from packaging.version import Version

from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.versions import version_tuple
from trtllm_images import capabilities, matrix


@pytest.fixture(scope="module")
def real() -> matrix.Matrix:
    return matrix.load()


# --- the real matrix -------------------------------------------------------------------------------------------


def test_real_matrix_covers_every_month_from_24_01_to_26_07(real):
    expected = [f"{year}.{month:02d}" for year in (24, 25, 26) for month in range(1, 13) if (year, month) <= (26, 7)]
    assert real.tags() == expected


def test_first_three_tags_are_unsupported_because_the_image_lacks_tensorrt_llm(real):
    for tag in ("24.01", "24.02", "24.03"):
        entry = real.get(tag)
        assert not entry.supported
        assert "no tensorrt_llm package" in entry.note
    assert [e.tag for e in real.entries if not e.supported] == ["24.01", "24.02", "24.03"]
    assert real.supported()[0].tag == "24.04"


def test_25_01_facts(real):
    entry = real.get("25.01")
    assert (entry.tensorrt_llm, entry.triton, entry.tensorrt) == ("0.17.0", "2.54.0", "10.8.0.43")
    assert entry.backend == matrix.Backend("triton-inference-server/tensorrtllm_backend", "v0.17.0", "", True)
    assert entry.base_image == "nvcr.io/nvidia/tritonserver:25.01-trtllm-python-py3"


def test_post_release_keeps_the_base_release_backend_ref(real):
    entry = real.get("25.02")
    assert (entry.tensorrt_llm, entry.backend.ref) == ("0.17.0.post1", "v0.17.0")


@pytest.mark.parametrize(
    "tag, fields",
    [
        ("24.05", ("tensorrt",)),
        ("25.11", ("tensorrt_llm", "backend.ref")),
        ("26.03", ("tensorrt_llm",)),
        ("25.01", ("ubuntu",)),
    ],
)
def test_conflicting_or_inferred_values_are_marked_uncertain(real, tag, fields):
    entry = real.get(tag)
    for name in fields:
        assert entry.uncertain.get(name), f"{tag} {name} should carry a reason"


def test_24_05_tensorrt_records_both_sides_of_the_conflict(real):
    reason = real.get("24.05").uncertain["tensorrt"]
    assert "10.0.1.6" in reason and "9.3" in reason


def test_every_null_in_the_real_matrix_has_a_reason(real):
    for entry in real.entries:
        for name in matrix.VERSION_FIELDS:
            if getattr(entry, name) is None:
                assert entry.uncertain.get(name), f"{entry.tag} {name}"


def _release(version: str) -> tuple[int, ...]:
    return version_tuple(version)


@pytest.mark.parametrize("tag", [f"{y}.{m:02d}" for y in (24, 25, 26) for m in range(1, 13) if (y, m) <= (26, 7)])
def test_derived_fields_follow_the_release_thresholds(real, tag):
    """What the loader derives from capabilities.yaml, against the thresholds the release notes give; a backend ref
    other than "v" + the base release is allowed only where `uncertain` explains it."""
    e = real.get(tag)
    trtllm, when = _release(e.tensorrt_llm), _release(e.tag)
    if "backend.ref" not in e.uncertain:
        assert e.backend.ref == "v" + ".".join(map(str, trtllm))
    if trtllm <= (0, 19, 0):
        assert (e.backend.repo, e.backend.subdir) == ("triton-inference-server/tensorrtllm_backend", "")
    else:
        assert (e.backend.repo, e.backend.subdir) == ("NVIDIA/TensorRT-LLM", "triton_backend")
    assert e.backend.in_image == (when >= (25, 1))
    assert e.workflows == (("engine", "llmapi") if trtllm >= (0, 19) else ("engine",))
    assert e.engine_deprecated == (trtllm >= (1, 0))
    assert e.openai_frontend == (when >= (24, 12))
    assert _release(e.python)[:2] == (3, 10) or (trtllm >= (0, 16) and _release(e.python)[:2] == (3, 12))


# --- a small valid document to break ---------------------------------------------------------------------------


def _entry(tag: str, **changes) -> dict:
    entry = {
        "tag": tag,
        "status": "supported",
        "note": "",
        "triton": "2.54.0",
        "tensorrt_llm": "0.17.0",
        "tensorrt": "10.8.0.43",
        "cuda": "12.8.0.038",
        "python": "3.12.3",
        "pytorch": "2.6.0a0+ecf3bae40a.nv25.1",
        "ubuntu": "24.04",
        "uncertain": {"ubuntu": "inferred"},
        "sources": ["Triton compatibility table"],
    }
    entry.update(changes)
    return entry


def _doc() -> dict:
    return {"entries": [_entry("24.12"), _entry("25.01")]}


def test_the_small_valid_document_parses():
    parsed = matrix.parse(_doc(), "test.yaml")
    assert parsed.tags() == ["24.12", "25.01"]
    assert parsed.get("25.01").uncertain == {"ubuntu": "inferred"}
    assert parsed.get("25.01").backend == matrix.Backend(
        "triton-inference-server/tensorrtllm_backend", "v0.17.0", "", True
    )


def test_derived_fields_come_from_the_capabilities_given():
    """One source: move a threshold in capabilities.yaml and every entry's derived field follows."""
    real_caps = capabilities.load_capabilities()
    features = dict(real_caps.features)
    features["llmapi_workflow"] = capabilities.Rule(since="0.17.0")
    features["openai_frontend"] = capabilities.Rule(since_tag="25.01")
    moved = dataclasses.replace(real_caps, features=MappingProxyType(features))
    before, after = matrix.parse(_doc(), "m.yaml"), matrix.parse(_doc(), "m.yaml", moved)
    assert [e.workflows for e in before.entries] == [("engine",), ("engine",)]
    assert [e.workflows for e in after.entries] == [("engine", "llmapi"), ("engine", "llmapi")]
    assert [e.openai_frontend for e in before.entries] == [True, True]
    assert [e.openai_frontend for e in after.entries] == [False, True]


def test_backend_ref_is_the_base_release_unless_the_entry_gives_one(real):
    assert real.get("24.01").backend.ref == "v0.7.2"  # the backend release built into 24.01 ships TensorRT-LLM 0.7.1
    assert real.get("24.01").uncertain["backend.ref"]
    doc = {"entries": [_entry("25.01", tensorrt_llm="0.17.0.post1", backend_ref="v0.17.1")]}
    assert matrix.parse(doc, "m.yaml").get("25.01").backend.ref == "v0.17.1"
    doc = {"entries": [_entry("25.01", tensorrt_llm="0.17.0.post1")]}
    assert matrix.parse(doc, "m.yaml").get("25.01").backend.ref == "v0.17.0"


def _set(index, key, value):
    def change(doc):
        doc["entries"][index][key] = value

    return change


def _delete(key):
    def change(doc):
        del doc["entries"][1][key]

    return change


def _unknown_tensorrt_llm(doc):
    doc["entries"][1].update(tensorrt_llm=None, uncertain={"tensorrt_llm": "not documented"})


def _swap(doc):
    doc["entries"].reverse()


def _append_string(doc):
    doc["entries"].append("25.02")


MALFORMED = [
    # (id, change, words the message must contain: the entry and the field)
    ("unknown key", _set(1, "colour", "red"), ["entry 25.01", "colour", "unknown key"]),
    ("missing key", _delete("cuda"), ["entry 25.01", "cuda", "missing key"]),
    ("derived field given", _set(1, "workflows", ["engine"]), ["entry 25.01", "workflows", "unknown key"]),
    ("unquoted version", _set(1, "triton", 2.54), ["entry 25.01", "triton", "quoted version"]),
    ("malformed version", _set(1, "tensorrt", "10.8.x"), ["entry 25.01", "tensorrt", "malformed version"]),
    ("version with spaces", _set(1, "tensorrt_llm", "0.17.0 post1"), ["entry 25.01", "tensorrt_llm", "malformed"]),
    ("malformed tag", _set(1, "tag", "25.1"), ["entry #1", "tag", "YY.MM"]),
    ("month 13", _set(1, "tag", "25.13"), ["entry #1", "tag", "YY.MM"]),
    ("tag as float", _set(1, "tag", 25.01), ["entry #1", "tag", "float"]),
    ("duplicate tag", _set(0, "tag", "25.01"), ["entry 25.01", "tag", "duplicate tag"]),
    ("not sorted", _swap, ["entry 24.12", "tag", "not sorted"]),
    ("null without reason", _set(1, "pytorch", None), ["entry 25.01", "pytorch", "uncertain"]),
    ("uncertain names no field", _set(1, "uncertain", {"colour": "why"}), ["entry 25.01", "uncertain.colour"]),
    ("uncertain empty reason", _set(1, "uncertain", {"ubuntu": " "}), ["entry 25.01", "uncertain.ubuntu", "reason"]),
    ("uncertain not a mapping", _set(1, "uncertain", ["ubuntu"]), ["entry 25.01", "uncertain", "mapping"]),
    ("bad status", _set(1, "status", "maybe"), ["entry 25.01", "status", "supported, unsupported"]),
    ("unsupported without note", _set(1, "status", "unsupported"), ["entry 25.01", "note", "why"]),
    ("note not a string", _set(1, "note", None), ["entry 25.01", "note", "string"]),
    ("backend_ref", _set(1, "backend_ref", "v0.17.0; rm -rf /"), ["entry 25.01", "backend_ref", "git tag"]),
    ("backend_ref not a string", _set(1, "backend_ref", 17), ["entry 25.01", "backend_ref", "int"]),
    (
        "null tensorrt_llm without backend_ref",
        _unknown_tensorrt_llm,
        ["entry 25.01", "backend_ref", "needed when tensorrt_llm is null"],
    ),
    ("sources empty", _set(1, "sources", []), ["entry 25.01", "sources", "non-empty"]),
    ("source not a string", _set(1, "sources", ["ok", 3]), ["entry 25.01", "sources", "int"]),
    ("entry not a mapping", _append_string, ["entry #2", "mapping"]),
]


@pytest.mark.parametrize("change, words", [(c, w) for _, c, w in MALFORMED], ids=[i for i, _, _ in MALFORMED])
def test_malformed_input_names_the_entry_and_the_field(change, words):
    doc = copy.deepcopy(_doc())
    change(doc)
    with pytest.raises(UsageError) as caught:
        matrix.parse(doc, "broken.yaml")
    message = caught.value.message
    assert message.startswith("broken.yaml: 1 problem in the matrix:")
    for word in words:
        assert word in message
    assert caught.value.exit_code == 2


def test_all_problems_are_collected_into_one_error():
    doc = _doc()
    doc["entries"][0]["cuda"] = 12.8
    doc["entries"][1]["status"] = "maybe"
    del doc["entries"][1]["sources"]
    with pytest.raises(UsageError) as caught:
        matrix.parse(doc, "m.yaml")
    lines = caught.value.message.splitlines()
    assert lines[0] == "m.yaml: 3 problems in the matrix:"
    assert any("entry 24.12: cuda" in line for line in lines[1:])
    assert any("entry 25.01: status" in line for line in lines[1:])
    assert any("entry 25.01: sources: missing key" in line for line in lines[1:])


@pytest.mark.parametrize("data", [None, [], {"entries": []}, {"entries": [], "extra": 1}, {"tags": []}])
def test_a_document_without_entries_is_rejected(data):
    with pytest.raises(UsageError, match="entries"):
        matrix.parse(data, "m.yaml")


@pytest.mark.parametrize(
    "version",
    [
        "9.3.0.post12.dev1",
        "2.3.0a0+ebedce2",
        "2.6.0a0+ecf3bae40a.nv25.1",
        "1.2.0rc8",
        "1.0.3.2510",
        "0.17.0.post1",
        "12.8.0.038",
        "24.04",
        "3.10",
    ],
)
def test_version_syntax_accepts_what_nvidia_ships(version):
    entry = matrix.parse({"entries": [_entry("25.01", tensorrt=version)]}, "m.yaml").get("25.01")
    assert entry.tensorrt == version


@pytest.mark.parametrize(
    "version, expected",
    [
        ("0.17.0.post1", (0, 17, 0)),
        ("1.2.0rc8", (1, 2, 0)),
        ("1.0.3.2510", (1, 0, 3)),
        ("2.6.0a0+ecf3bae40a.nv25.1", (2, 6, 0)),
        ("24.01", (24, 1)),
        ("3.10.12", (3, 10, 12)),
    ],
)
def test_version_tuple(version, expected):
    assert version_tuple(version) == expected


def test_version_tuple_reads_every_matrix_version_as_pep_440_does(real):
    """Both sides parse with the standard library (the image has no packaging); packaging is the reference."""
    versions = {e.tag for e in real.entries} | {e.backend.ref.removeprefix("v") for e in real.entries}
    versions |= {getattr(e, name) for e in real.entries for name in matrix.VERSION_FIELDS} - {None}
    assert len(versions) > 50
    for version in versions:
        assert version_tuple(version) == Version(version).release[:3], version


# --- files -------------------------------------------------------------------------------------------------------


def test_yaml_syntax_error_reports_the_line(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text('entries:\n  - tag: "25.01"\n   status: supported\n')
    with pytest.raises(UsageError, match=r"YAML syntax error at line 3") as caught:
        matrix.load(path)
    assert str(path) in caught.value.message


def test_a_key_given_twice_is_a_yaml_error_not_a_silent_override(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text('entries:\n  - tag: "25.01"\n    tag: "25.02"\n')
    with pytest.raises(UsageError, match=r"line 3.*duplicate key 'tag'"):
        matrix.load(path)


def test_missing_file(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        matrix.load(tmp_path / "nope.yaml")


def test_validation_errors_name_the_file(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text("entries:\n  - tag: 25.01\n")
    with pytest.raises(UsageError) as caught:
        matrix.load(path)
    assert caught.value.message.startswith(f"{path}: ")
    assert "quoted NGC tag" in caught.value.message


# --- lookups and serialisation -------------------------------------------------------------------------------------


def test_unknown_tag_lists_the_known_ones(real):
    with pytest.raises(UsageError) as caught:
        real.get("99.99")
    message = caught.value.message
    assert message.startswith("unknown tag '99.99'; known tags: 24.04, ")
    assert "26.07" in message
    assert "unsupported: 24.01, 24.02, 24.03" in message
    assert caught.value.exit_code == 2


def test_entries_are_immutable(real):
    entry = real.get("25.01")
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.tensorrt_llm = "9.9.9"
    with pytest.raises(TypeError):
        entry.uncertain["ubuntu"] = "changed"


def test_to_dict_carries_the_facts_and_the_derived_fields(real):
    dicts = [e.to_dict() for e in real.entries]
    assert list(dicts[0]) == list(matrix.IMAGE_KEYS)
    assert list(dicts[0]["backend"]) == list(matrix.BACKEND_KEYS)
    last = real.entries[-1]
    assert dicts[-1]["workflows"] == list(last.workflows) and dicts[-1]["backend"]["ref"] == last.backend.ref
    assert (dicts[-1]["uncertain"], dicts[-1]["sources"]) == (dict(last.uncertain), list(last.sources))


def test_the_container_side_reads_the_derived_fields(real, tmp_path):
    from trtllm_entrypoint.config import image_facts

    path = tmp_path / "matrix.json"
    path.write_text(matrix.image_matrix_json(real, capabilities.load_capabilities()))
    for entry in real.supported():
        seen = image_facts.load_facts({"MATRIX_TAG": entry.tag, "TRTLLM_MATRIX_FILE": str(path)})
        assert (seen.workflows, seen.engine_deprecated, seen.openai_frontend) == (
            entry.workflows,
            entry.engine_deprecated,
            entry.openai_frontend,
        ), entry.tag
        assert seen.app_dir == image_facts.app_dir({}, entry.backend.in_image)


def test_markdown_table_has_every_tag_and_footnotes_uncertain_cells(real):
    table = matrix.markdown_table(real)
    rows = [line for line in table.splitlines() if line.startswith("| ") and line[2:4].isdigit()]
    assert [row.split(" | ")[0][2:] for row in rows] == real.tags()
    row_24_05 = next(row for row in rows if row.startswith("| 24.05 "))
    assert "9.3.0.post12.dev1 ?" in row_24_05
    assert "24.05 tensorrt: the compatibility table says 10.0.1.6" in table
    assert "25.11 tensorrt_llm:" in table and "25.11 backend.ref:" in table
    header = table.splitlines()[0]
    for title in (
        "Triton",
        "TRT-LLM",
        "TensorRT",
        "CUDA",
        "Python",
        "backend",
        "templates in image",
        "workflows",
        "OpenAI",
    ):
        assert title in header


def test_markdown_footnote_numbers_point_at_their_reasons():
    doc = {"entries": [_entry("25.01", tensorrt=None, uncertain={"tensorrt": "unknown", "cuda": "guessed"})]}
    table = matrix.markdown_table(matrix.parse(doc, "m.yaml"))
    assert "| — ?1 | 12.8.0.038 ?2 |" in table
    assert "1. 25.01 tensorrt: unknown" in table and "2. 25.01 cuda: guessed" in table
