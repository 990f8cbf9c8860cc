"""Tenants: who is calling (API key → `Tenant`), what they may use, and at which priority.

API keys never appear in configuration: a tenant lists the SHA-256 hex digests of its keys
(`hash_api_key`, or `python -m admission.tenants` which reads keys from stdin, one per line, and prints
their hashes). Several hashes per tenant allow key rotation. A lookup hashes the presented key and
looks the digest up in a dict; the attacker controls the preimage, not the digest, so the lookup leaks
nothing useful through timing.

`TenantDirectory.resolve(authorization_header)`:

| tenants configured | header                      | result                                          |
|--------------------|-----------------------------|-------------------------------------------------|
| none               | anything                    | the anonymous tenant (DESIGN §4)                |
| some               | absent / empty              | anonymous if `allow_anonymous`, else 401        |
| some               | `Bearer <known key>`        | that tenant                                     |
| some               | unknown key, other scheme   | 401 `unauthorized` — even with `allow_anonymous`|

A wrong key is always refused, never silently downgraded to anonymous, so a misconfigured client
fails loudly. Refusals raise `AuthenticationFailed`, which the gateway maps to its 401 error.

`TenantDirectory.resolve_priority(tenant, header_value)`: the `x-gateway-priority` value
(case-insensitive); absent or unknown → `default_priority` (default `interactive`); the result is then
clamped to the tenant's `priority_ceiling` (a tenant with ceiling `interactive` asking for `critical`
gets `interactive`; the default is clamped too). No ceiling means any class.

Limits (None = unlimited): `requests_per_min` and `tokens_per_min` become token buckets whose burst is
one minute's quota (`TokenBucketLimit.per_minute`); `max_concurrent` is the bulkhead (requests admitted
and not yet released, queued ones included); `weight` (> 0, default 1) is the tenant's share in weighted
fair queuing within a class.
"""

from __future__ import annotations

import hashlib
import string
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from admission.priority_classes import DEFAULT_PRIORITY_CLASSES
from admission.rate_limit import TenantRateLimits, TokenBucketLimit
from router.types import CapTier

ANONYMOUS_TENANT_NAME = "anonymous"
DEFAULT_PRIORITY = "interactive"
DEFAULT_CLASS_NAMES: tuple[str, ...] = tuple(spec.name for spec in DEFAULT_PRIORITY_CLASSES)
UNAUTHORIZED_REASON = "unauthorized"
_SHA256_HEX_CHARS = 64
_BEARER_SCHEME = "bearer"


def hash_api_key(key: str) -> str:
    """The value to put in a tenant's `api_key_hashes`: SHA-256 of the UTF-8 key, lowercase hex."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _normalise_hash(tenant: str, value: str) -> str:
    digest = value.strip().lower()
    if len(digest) != _SHA256_HEX_CHARS or not set(digest) <= set(string.hexdigits.lower()):
        raise ValueError(
            f"tenant {tenant!r}: api_key_hashes must be SHA-256 hex digests (64 hex chars); "
            "hash a key with `python -m admission.tenants`"
        )
    return digest


def _per_minute(limit_per_min: float | None) -> TokenBucketLimit | None:
    return None if limit_per_min is None else TokenBucketLimit.per_minute(limit_per_min)


class AuthenticationFailed(Exception):
    """A request without a valid API key where one is required (the gateway answers 401 `unauthorized`,
    no Retry-After: waiting does not fix a wrong key)."""

    reason = UNAUTHORIZED_REASON

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant's identity, limits, priority ceiling and fair-share weight (see module docstring).

    ValueError at construction for an empty name, a malformed hash, a limit ≤ 0 or a weight ≤ 0.
    `rate_limits` is derived from the per-minute limits.
    """

    name: str
    api_key_hashes: tuple[str, ...] = ()
    requests_per_min: float | None = None
    tokens_per_min: float | None = None
    max_concurrent: int | None = None
    priority_ceiling: str | None = None
    weight: float = 1.0
    rate_limits: TenantRateLimits = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a tenant needs a non-empty name")
        hashes = tuple(_normalise_hash(self.name, value) for value in self.api_key_hashes)
        object.__setattr__(self, "api_key_hashes", hashes)
        per_minute = {"requests_per_min": self.requests_per_min, "tokens_per_min": self.tokens_per_min}
        for key, value in per_minute.items():
            if value is not None and value <= 0:
                raise ValueError(f"tenant {self.name!r}: {key} must be > 0 or unset (got {value})")
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ValueError(f"tenant {self.name!r}: max_concurrent must be ≥ 1 or unset")
        if self.weight <= 0:
            raise ValueError(f"tenant {self.name!r}: weight must be > 0 (got {self.weight})")
        limits = TenantRateLimits(
            requests=_per_minute(self.requests_per_min),
            tokens=_per_minute(self.tokens_per_min),
        )
        object.__setattr__(self, "rate_limits", limits)


ANONYMOUS_TENANT = Tenant(ANONYMOUS_TENANT_NAME)


class TenantDirectory:
    """Maps `Authorization` headers to tenants and `x-gateway-priority` values to classes.

    `class_names` are the controller's priority classes, highest first (they must match the
    `PriorityClass` names the controller was built with). Construction validates everything it can:
    duplicate tenant names or key hashes, unknown ceilings or default class, an anonymous tenant with
    keys or sharing a configured tenant's name (ValueError naming the culprit).
    """

    def __init__(
        self,
        tenants: Sequence[Tenant],
        allow_anonymous: bool = False,
        anonymous_tenant: Tenant = ANONYMOUS_TENANT,
        class_names: Sequence[str] = DEFAULT_CLASS_NAMES,
        default_priority: str = DEFAULT_PRIORITY,
    ) -> None:
        self._classes = tuple(class_names)
        self._rank = {name: rank for rank, name in enumerate(self._classes)}
        if len(self._rank) != len(self._classes) or not self._classes:
            raise ValueError(f"class_names must be non-empty and unique (got {self._classes})")
        self._default_rank = self._rank_of(default_priority, "default_priority")
        self._by_hash: dict[str, Tenant] = {}
        self._by_name: dict[str, Tenant] = {}
        for tenant in (*tenants, anonymous_tenant):
            self._ceiling_rank(tenant)
        for tenant in tenants:
            self._add(tenant)
        if anonymous_tenant.api_key_hashes:
            raise ValueError("the anonymous tenant cannot have API keys")
        if anonymous_tenant.name in self._by_name:
            raise ValueError(f"tenant name {anonymous_tenant.name!r} is reserved for the anonymous tenant")
        self._allow_anonymous = allow_anonymous
        self._anonymous = anonymous_tenant

    @property
    def tenants_configured(self) -> bool:
        """True when at least one tenant is configured (API keys are then checked)."""
        return bool(self._by_name)

    @property
    def anonymous_tenant(self) -> Tenant:
        """The tenant of unauthenticated requests (when they are allowed)."""
        return self._anonymous

    def tenant(self, name: str) -> Tenant | None:
        """A configured tenant by name."""
        return self._by_name.get(name)

    def resolve(self, authorization_header: str | None) -> Tenant:
        """The caller's tenant per the table in the module docstring; AuthenticationFailed otherwise."""
        if not self._by_name:
            return self._anonymous
        if authorization_header is None or not authorization_header.strip():
            if self._allow_anonymous:
                return self._anonymous
            raise AuthenticationFailed("an API key is required: send 'Authorization: Bearer <key>'")
        scheme, _, key = authorization_header.strip().partition(" ")
        key = key.strip()
        if scheme.lower() != _BEARER_SCHEME or not key:
            raise AuthenticationFailed("malformed Authorization header: expected 'Bearer <key>'")
        tenant = self._by_hash.get(hash_api_key(key))
        if tenant is None:
            raise AuthenticationFailed("invalid API key")
        return tenant

    def resolve_priority(self, tenant: Tenant, header_value: str | None) -> str:
        """The class for `header_value` (default when absent/unknown), clamped to the tenant's ceiling."""
        requested = (header_value or "").strip().lower()
        rank = self._rank.get(requested, self._default_rank)
        return self._classes[max(rank, self._ceiling_rank(tenant))]

    def cap_tier(self, priority: str) -> CapTier:
        """Where class `priority` stands for a learned cap (`router.types.CapTier`): the top or the
        lowest of several classes, else plain."""
        classes = self._classes
        if len(classes) < 2:
            return CapTier.PLAIN
        if priority == classes[0]:
            return CapTier.TOP
        return CapTier.LOWEST if priority == classes[-1] else CapTier.PLAIN

    def _add(self, tenant: Tenant) -> None:
        if tenant.name in self._by_name:
            raise ValueError(f"tenant name {tenant.name!r} is configured twice")
        self._by_name[tenant.name] = tenant
        for key_hash in tenant.api_key_hashes:
            owner = self._by_hash.setdefault(key_hash, tenant)
            if owner is not tenant:
                raise ValueError(f"an API key hash is shared by tenants {owner.name!r} and {tenant.name!r}")

    def _ceiling_rank(self, tenant: Tenant) -> int:
        if tenant.priority_ceiling is None:
            return 0
        return self._rank_of(tenant.priority_ceiling, f"tenant {tenant.name!r}: priority_ceiling")

    def _rank_of(self, name: str, what: str) -> int:
        rank = self._rank.get(name)
        if rank is None:
            raise ValueError(f"{what} {name!r} is not a priority class; known: {', '.join(self._classes)}")
        return rank


def main(lines: Sequence[str] | None = None) -> int:
    """Print `hash_api_key` of each non-empty line of stdin (keys stay out of shell history)."""
    for line in sys.stdin if lines is None else lines:
        key = line.strip()
        if key:
            print(hash_api_key(key))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
