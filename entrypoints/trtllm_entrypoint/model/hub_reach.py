"""One probe of the Hugging Face hub before its client is called, so that a hub that cannot answer fails a start in
seconds under every client release an image carries.

The client's own retries differ by release (0.x retries a failed metadata call for about 25 s through `http_backoff`,
1.x and 2.x retry through httpx elsewhere), and its internals are not ours to replace. So the probe asks the endpoint
the client will use (HF_ENDPOINT, which settings.py reads; through the same proxy variables) once, with the standard
library, within PROBE_SECONDS in all, name resolution included:
  - no answer (refused, unresolvable, timed out)      -> HubUnreachable, a ConnectionError
  - HTTP 5xx or 429 (the hub's trouble, not ours)     -> HubFailing, with the status
  - any other answer, or a TLS failure               -> the client is called; it knows tokens, certificates, mirrors
The probe carries no token: what it asks about is public or answers 401/404, which the client then turns into the
right message with the token.
"""

from __future__ import annotations

import base64
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

PROBE_SECONDS = 4.0


class HubUnreachable(ConnectionError):
    """Nothing answered at the hub's address."""


@dataclass(frozen=True)
class _Response:
    status_code: int


class HubFailing(Exception):
    """The hub answered with a status that says it is failing or limiting; `response.status_code` as clients have."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP status {status}")
        self.response = _Response(status)


def probe_request(base: str, repo_id: str, revision: str | None) -> urllib.request.Request:
    """HEAD of the model's API entry, the first thing every client release asks; a mirror's userinfo becomes Basic
    authentication, as the clients send it."""
    parts = urllib.parse.urlsplit(base)
    netloc = parts.hostname or ""
    if ":" in netloc:  # an IPv6 literal
        netloc = f"[{netloc}]"
    if parts.port is not None:
        netloc += f":{parts.port}"
    path = f"{parts.path}/api/models/{urllib.parse.quote(repo_id)}"
    if revision:
        path += f"/revision/{urllib.parse.quote(revision, safe='')}"
    url = urllib.parse.urlunsplit((parts.scheme, netloc, path, "", ""))
    request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "trtllm-entrypoint-probe"})
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    return request


def _ask(request: urllib.request.Request, timeout: float) -> int | Exception | None:
    """The answer's status, the failure, or None when TLS failed (the client, with its own certificates, decides)."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except urllib.error.URLError as exc:
        return None if isinstance(exc.reason, ssl.SSLError) else exc
    except ssl.SSLError:
        return None
    except (OSError, ValueError) as exc:
        return exc


_ANSWERED: set[tuple[str, str, str | None]] = set()  # asked once per start: config.json first, then the download


def check(repo_id: str, revision: str | None, base: str, seconds: float = PROBE_SECONDS) -> None:
    """Raise HubUnreachable or HubFailing when one probe of `base` (settings: HF_ENDPOINT or the hub's own) says the
    hub cannot serve `repo_id`; return otherwise (at once when this process asked already and the hub answered)."""
    base = base.rstrip("/")
    if (base, repo_id, revision) in _ANSWERED:
        return
    request = probe_request(base, repo_id, revision)
    result: list[int | Exception | None] = []
    # A thread, so that name resolution (which no socket timeout bounds) is inside the deadline too.
    worker = threading.Thread(target=lambda: result.append(_ask(request, seconds)), daemon=True)
    worker.start()
    worker.join(seconds)
    where = urllib.parse.urlsplit(base).hostname
    if not result:
        raise HubUnreachable(f"{where} did not answer within {seconds:g} s")
    answer = result[0]
    if isinstance(answer, Exception):
        raise HubUnreachable(f"{where}: {type(answer).__name__}")
    if answer is not None and (answer >= 500 or answer == 429):
        raise HubFailing(answer)
    _ANSWERED.add((base, repo_id, revision))
