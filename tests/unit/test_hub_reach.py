"""The one probe before the hub client is called: a hub that cannot answer is named within seconds, whatever client
release the image carries (tests/unit/test_library_versions.py runs it under each)."""

import base64
import http.server
import socket
import threading
import time

import pytest

from trtllm_entrypoint.model import hub_reach


class _Hub:
    """An endpoint on 127.0.0.1 answering `status` after `delay` seconds, recording each request's path and headers."""

    def __init__(self, status: int, delay: float = 0.0):
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self):  # noqa: N802 (http.server's naming)
                hub.seen.append((self.command, self.path, dict(self.headers.items())))
                time.sleep(delay)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.block_on_close = False  # a handler still sleeping must not hold up the test's end
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def _fresh_process():
    hub_reach._ANSWERED.clear()


@pytest.fixture
def hub(request):
    made = []

    def make(status, delay=0.0):
        made.append(_Hub(status, delay))
        return made[-1]

    yield make
    for one in made:
        one.close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("status", [200, 401, 403, 404])
def test_an_answering_hub_leaves_the_answer_to_the_client(hub, status):
    endpoint = hub(status)
    hub_reach.check("org/model", None, endpoint.url)
    assert [(method, path) for method, path, _ in endpoint.seen] == [("HEAD", "/api/models/org/model")]


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_a_failing_hub_is_named_with_its_status(hub, status):
    with pytest.raises(hub_reach.HubFailing) as err:
        hub_reach.check("org/model", "v1.0", hub(status).url)
    assert err.value.response.status_code == status


def test_nothing_listening_is_unreachable_at_once():
    started = time.monotonic()
    with pytest.raises(hub_reach.HubUnreachable):
        hub_reach.check("org/model", None, f"http://127.0.0.1:{_closed_port()}")
    assert time.monotonic() - started < 2


def test_a_hub_that_never_answers_is_unreachable_within_the_deadline(hub):
    started = time.monotonic()
    with pytest.raises(hub_reach.HubUnreachable):  # the socket's timeout or the deadline, whichever comes first
        hub_reach.check("org/model", None, hub(200, delay=4).url, seconds=0.5)
    assert time.monotonic() - started < 3, "the deadline, not the 4 s answer"


def test_the_probe_asks_the_revision_and_sends_a_mirrors_userinfo_as_basic_auth_never_a_token(hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    endpoint = hub(200)
    port = endpoint.server.server_address[1]
    hub_reach.check("org/model", "refs/pr/1", f"http://mirror%40corp:p%3Ass@127.0.0.1:{port}/hf/")
    ((_method, path, headers),) = endpoint.seen
    assert path == "/hf/api/models/org/model/revision/refs%2Fpr%2F1"
    assert headers["Authorization"] == "Basic " + base64.b64encode(b"mirror@corp:p:ss").decode()
    assert "hf_secret" not in repr(headers)


def test_a_hub_that_answered_is_not_asked_again_in_the_same_start(hub):
    endpoint = hub(200)
    hub_reach.check("org/model", None, endpoint.url)
    hub_reach.check("org/model", None, endpoint.url + "/")
    hub_reach.check("org/other", None, endpoint.url)
    assert [path for _, path, _ in endpoint.seen] == ["/api/models/org/model", "/api/models/org/other"]
