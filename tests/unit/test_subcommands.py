"""The subcommands that look without serving (`check`, `health`, `flags`), the entrypoint in a real process.

The NVIDIA programs are the doubles from tests/doubles (on PATH / PYTHONPATH); what is asserted is our behaviour:
exit codes, messages, the files we write, and the arguments we gave the programs.
"""

from __future__ import annotations

import json

import pytest

from trtllm_entrypoint import contract

pytestmark = pytest.mark.process  # each test runs the entrypoint as its own process


def test_check_reports_versions_and_fails_on_too_few_gpus(image):
    ok = image.run("check")
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["installed"]["tensorrt_llm"] == "0.17.0"
    assert report["gpus"][0]["compute_capability"] == "9.0"
    short = image.run("check", TP_SIZE="2")
    assert short.returncode == 1
    assert "needs 2 GPUs" in short.stderr


def test_health_asks_the_ready_endpoint_on_the_configured_port(image, tmp_path):
    import http.server
    import threading

    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            self.send_response(200 if self.path == "/v2/health/ready" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = str(server.server_address[1])
    isolated = {"TMPDIR": str(tmp_path)}  # no state file from another test's serve
    try:
        assert image.run("health", HTTP_PORT=port, **isolated).returncode == 0
    finally:
        server.shutdown()
        server.server_close()
    assert image.run("health", HTTP_PORT=port, **isolated).returncode == 1


def test_flags_reports_each_program_the_plans_run_with_its_missing_flags(image):
    result = image.run("flags")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    programs = {p["program"]: p for p in report["programs"]}
    assert report["tag"] == "25.01" and "examples/llama/convert_checkpoint.py" in programs
    # The doubles on PATH answer --help like the 0.17.0 programs; /opt/tritonserver is not on this host.
    assert programs["trtllm-build"]["missing"] == [] and programs["trtllm-build"]["error"] is None
    assert "--kv_cache_type" in programs["trtllm-build"]["flags"]
    absent = {"tritonserver": f"{contract.TRITONSERVER} is not installed"}
    assert all(p["missing"] == [] and p["error"] is None for name, p in programs.items() if name not in absent)
    assert {name: programs[name]["error"] for name in absent} == absent
