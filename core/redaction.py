"""Credentials out of everything the gateway shows: configuration dumps, error messages, log lines.

`redact(value)` is the one function every such place calls:
- a string: in every URL in it (`scheme://userinfo@host…`) the userinfo's password becomes `***`
  (`redis://:secret@h` → `redis://:***@h`, `user:pw@` → `user:***@`), and a userinfo without a
  password — often a bare token (`https://tok@h`) — becomes `***`. A string without `://` is returned
  as it is, after one substring test: cheap enough for every error message;
- a mapping: every value redacted, and replaced by `***` when it is a secret — each value of a mapping
  under a `headers` key (e.g. `tracing.headers`, a collector's auth token) and the value of a key
  naming one (`password`, `secret`, `token`, `api_key`, `authorization`, or ending `_<that>`);
- a list or tuple: each item; anything else unchanged.

Names of environment variables (`api_key_env`) and key hashes (`api_key_hashes`) are not secrets and
stay. The userinfo ends at the last `@` before the host (a password may hold an unescaped `@`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "***"
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s]*)@")
_SECRET_KEY = re.compile(r"(?:^|_)(?:password|secret|token|api_key|authorization)$", re.IGNORECASE)
_SECRET_MAPPINGS = frozenset({"headers"})
"""Keys whose value is a mapping of secrets (every value redacted, the names kept)."""


def _userinfo(match: re.Match[str]) -> str:
    user, colon, _ = match["userinfo"].partition(":")
    kept = f"{user}:{REDACTED}" if colon else REDACTED
    return f"{match['scheme']}{kept}@"


def redact(value: Any) -> Any:
    """`value` with its credentials replaced by `***` (module docstring); the same type back."""
    if isinstance(value, str):
        return _URL_USERINFO.sub(_userinfo, value) if "://" in value else value
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if isinstance(key, str) and key.lower() in _SECRET_MAPPINGS and isinstance(item, Mapping):
                out[key] = dict.fromkeys(item, REDACTED)
            elif isinstance(key, str) and _SECRET_KEY.search(key) and item is not None:
                out[key] = REDACTED
            else:
                out[key] = redact(item)
        return out
    if isinstance(value, list):
        return [redact(item) for item in value]
    if isinstance(value, tuple):
        return tuple(redact(item) for item in value)
    return value
