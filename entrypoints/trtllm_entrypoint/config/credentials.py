"""The secrets the environment gives: the Hugging Face token and Triton's admin key (each as a variable or a mounted
file, never both), and every value the log must mask, found before the settings are parsed.

A secret's value never appears in a message; a bad one is named by its variable alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import cast

from trtllm_entrypoint.config.environment import TOKEN, Env, bad
from trtllm_entrypoint.config.variables import SECRET_FILE_LIMIT, VARIABLES
from trtllm_entrypoint.errors import UsageError

# Visible ASCII (valid in HTTP headers and gRPC metadata) except `"` and `\`, which JSON escapes: the log masks a
# key by its text, in JSON lines too.
KEY_CHARACTERS = frozenset(chr(c) for c in range(0x21, 0x7F)) - {'"', "\\"}

TOKEN_VARIABLES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")  # the second is the older name, read when HF_TOKEN is unset
ADMIN_KEY_VARIABLES = ("TRITON_ADMIN_KEY",)
# (variables holding the secret, the variable naming a file that holds it)
SECRETS = ((TOKEN_VARIABLES, "HF_TOKEN_FILE"), (ADMIN_KEY_VARIABLES, "TRITON_ADMIN_KEY_FILE"))


def token_values(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Every secret the environment gives, unvalidated: for masking messages written before settings are parsed."""
    env = Env(environ)
    found = [env.text(name) for names, _ in SECRETS for name in names]
    for _, file_variable in SECRETS:
        path = env.text(file_variable)
        if path is not None:
            with contextlib.suppress(UsageError):  # settings will report it; masking goes on with what there is
                found.append(read_secret_file(file_variable, path))
    return tuple(token for token in found if token) + url_passwords(environ)


# A URL's userinfo (HF_ENDPOINT=https://user:pass@mirror, HTTPS_PROXY=…): the log masks it inside URLs; the password
# alone is masked too, should a library print it apart (long enough not to mask ordinary words).
USERINFO = re.compile(r"://([^/?#\s]*)@")
MIN_MASKED_PASSWORD = 6


def url_passwords(environ: Mapping[str, str]) -> tuple[str, ...]:
    found = []
    for value in environ.values():
        for match in USERINFO.finditer(value):
            password = match[1].partition(":")[2]
            found += [password, urllib.parse.unquote(password)]
    return tuple(dict.fromkeys(p for p in found if len(p) >= MIN_MASKED_PASSWORD))


def read_secret_file(variable: str, path: str) -> str:
    """A regular, readable, non-empty UTF-8 file of at most SECRET_FILE_LIMIT bytes (a mounted secret)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO or device would block or never end
            raise bad(variable, path, "a regular file holding the secret")
        with open(path, "rb") as handle:
            data = handle.read(SECRET_FILE_LIMIT + 1)
    except OSError as exc:
        raise bad(variable, path, f"a readable file holding the secret ({exc.strerror})") from None
    if len(data) > SECRET_FILE_LIMIT:
        raise bad(variable, path, f"a file of at most {SECRET_FILE_LIMIT} bytes holding the secret")
    try:
        secret = data.decode("ascii").strip()  # tokens and keys go into HTTP headers
    except UnicodeDecodeError:
        raise bad(variable, path, "a file holding the secret as ASCII text (it holds other bytes)") from None
    if not secret:
        raise bad(variable, path, "a file holding the secret, but the file is empty")
    return secret


def given_secret(env: Env, variables: tuple[str, ...], file_variable: str) -> str | None:
    """The first of `variables` that is set, or the content of the file `file_variable` names; not both."""
    value = next((v for v in map(env.text, variables) if v), None)
    path = env.text(file_variable)
    if path is None:
        return value
    if value is not None:
        raise UsageError(
            f"{variables[0]} and {file_variable} are both set: expected only one of them",
            f"keep {file_variable} (a mounted secret) and unset {' / '.join(variables)}",
        )
    return read_secret_file(file_variable, path)


def hf_token(env: Env) -> str | None:
    token = given_secret(env, *SECRETS[0])
    source = "HF_TOKEN_FILE" if env.text("HF_TOKEN_FILE") is not None else "HF_TOKEN"
    if token is not None and not TOKEN.fullmatch(token):  # never shown: it may be a real token with a typo
        raise UsageError(
            f"{source} is not allowed: expected a Hugging Face token (printable ASCII, no spaces)",
            "copy the token again from https://huggingface.co/settings/tokens",
        )
    return token


def generated_key() -> str:
    """A random key that no parser reads as an option: hex digits never start with '-' (token_urlsafe's alphabet
    has '-', so about one start in 64 got a key that looked like an option)."""
    return secrets.token_hex(32)


def checked_key(key: str, variable: str) -> str:
    """The key as given; the message of a bad one never shows it."""
    low, high = VARIABLES["TRITON_ADMIN_KEY"].low, VARIABLES["TRITON_ADMIN_KEY"].high
    if not cast(int, low) <= len(key) <= cast(int, high) or not set(key) <= KEY_CHARACTERS:
        raise UsageError(
            f"{variable} is not allowed (the value is not shown): expected {low} to {high} visible "
            "ASCII characters without spaces, '\"' or '\\'",
            "generate one with: openssl rand -hex 32",
        )
    return key


def check_typed_keys(keys: Sequence[str]) -> None:
    """Admin keys typed in a `tritonserver` command follow TRITON_ADMIN_KEY's character rule: a '"' or '\\' would
    reach the logs escaped by JSON, past the mask (the value is never shown)."""
    for key in keys:
        if not set(key) <= KEY_CHARACTERS:
            raise UsageError(
                "an admin key in the typed command's --http-restricted-api/--grpc-restricted-protocol is not allowed "
                "(the value is not shown): expected visible ASCII characters without spaces, '\"' or '\\'",
                "generate one with: openssl rand -hex 32",
            )
