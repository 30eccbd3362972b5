"""`health`, the image's HEALTHCHECK: whether the server answers ready, asked where `serve` recorded that it listens.

`serve` records the URL in this process's private state directory (paths.py); `health`, a separate short-lived
process, reads the newest record of its UID, or falls back to the ports the environment gives.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping

from trtllm_entrypoint import contract
from trtllm_entrypoint.storage import paths


def health_url(port: int | str, path: str = contract.READY_PATHS["triton"]) -> str:
    return f"http://127.0.0.1:{port}{path}"


HEALTH_FILE = "health.json"


def record_health_url(url: str) -> None:
    """Where `serve` says the server listens, for `health` (the image's HEALTHCHECK): in this process's private
    state directory (paths.py), never at a fixed name another UID could create first."""
    with contextlib.suppress(OSError):  # the health check then falls back to HTTP_PORT; serving must not fail over it
        paths.write_private(paths.state_dir(), HEALTH_FILE, json.dumps({"url": url}))


def recorded_health_url() -> str | None:
    """The URL the newest start of this UID recorded, when it is one of ours: http on the loopback address."""
    for directory in paths.state_dirs():
        text = paths.private_file(directory, HEALTH_FILE)
        if text is None:
            continue
        try:
            url = json.loads(text)["url"]
        except (ValueError, KeyError, TypeError):
            return None
        return url if isinstance(url, str) and LOCAL_URL.fullmatch(url) else None
    return None


LOCAL_URL = re.compile(r"http://127\.0\.0\.1:[0-9]{1,5}/[A-Za-z0-9/_.-]*")


def health(env: Mapping[str, str]) -> int:
    """Exit 0 when the server answers ready; the image's HEALTHCHECK runs this."""
    import urllib.error  # noqa: PLC0415  (only this short-lived subcommand needs HTTP)
    import urllib.request  # noqa: PLC0415

    url = recorded_health_url()
    if url is None:  # not recorded (yet): where the environment says the server listens
        if (env.get("FRONTEND") or "").lower() == "openai":
            url = health_url(env.get("OPENAI_PORT") or contract.DEFAULT_OPENAI_PORT, contract.READY_PATHS["openai"])
        else:
            url = health_url(env.get("HTTP_PORT") or contract.DEFAULT_HTTP_PORT)
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError, ValueError):
        return 1
