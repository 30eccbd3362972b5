"""The fixtures of the KServe tests: the matrix, its 25.01 entry, and validators of KServe's own CRDs."""

from __future__ import annotations

import contextlib

import pytest
import yaml

from harness.upstream_files import UpstreamMissing, upstream_path
from harness.upstream_files import find as find_upstream
from tests.unit.kserve.kserve_documents import SCALE_OUT_CRDS, load_matrix


@pytest.fixture(scope="session")
def the_matrix():
    return load_matrix()


@pytest.fixture(scope="session")
def entry(the_matrix):
    return the_matrix.get("25.01")


@pytest.fixture(scope="session")
def crd_validators():
    """(apiVersion, kind) -> (Draft7Validator, schema); the InferenceService CRD is ~2 MB, so parse it once."""
    jsonschema = pytest.importorskip("jsonschema")
    files = sorted(upstream_path("kserve/crd").glob("*.yaml"))
    assert files, "the upstream layout's kserve/crd holds the CRDs"
    for relpath in SCALE_OUT_CRDS.values():  # each from the first source that has it; a missing one skips later
        with contextlib.suppress(UpstreamMissing):
            files.append(find_upstream(relpath))
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    validators = {}
    for path in files:
        crd = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = version["schema"]["openAPIV3Schema"]
            validators[(f"{group}/{version['name']}", kind)] = (jsonschema.Draft7Validator(schema), schema)
    return validators
