"""API-key hashing, tenant lookup (401 rules, anonymous access) and priority clamping."""

import hashlib

import pytest

from admission.rate_limit import TokenBucketLimit
from admission.tenants import (
    ANONYMOUS_TENANT,
    AuthenticationFailed,
    Tenant,
    TenantDirectory,
    hash_api_key,
    main,
)
from router.types import CapTier

ACME_KEY = "sk-acme-123"
ACME = Tenant("acme", api_key_hashes=(hash_api_key(ACME_KEY),), priority_ceiling="interactive")
VIP = Tenant("vip", api_key_hashes=(hash_api_key("sk-vip-1"), hash_api_key("sk-vip-2")))


def test_hash_api_key_is_sha256_hex_and_the_cli_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert hash_api_key("abc") == hashlib.sha256(b"abc").hexdigest()
    assert main(["abc\n", "\n", "  def  \n"]) == 0
    assert capsys.readouterr().out.split() == [hash_api_key("abc"), hash_api_key("def")]


def test_unknown_key_is_unauthorized_when_tenants_are_configured() -> None:
    directory = TenantDirectory([ACME, VIP], allow_anonymous=True)
    assert directory.resolve(f"Bearer {ACME_KEY}") is ACME
    assert directory.resolve("bearer   sk-vip-2 ") is VIP  # scheme case-insensitive, key rotation
    for header in ["Bearer sk-wrong", "Basic dXNlcjpwYXNz", "Bearer ", ACME_KEY]:
        with pytest.raises(AuthenticationFailed) as failed:
            directory.resolve(header)
        assert failed.value.reason == "unauthorized"


def test_missing_key_is_anonymous_only_when_allowed() -> None:
    assert TenantDirectory([ACME], allow_anonymous=True).resolve(None) is ANONYMOUS_TENANT
    assert TenantDirectory([ACME], allow_anonymous=True).resolve("  ") is ANONYMOUS_TENANT
    with pytest.raises(AuthenticationFailed, match="API key is required"):
        TenantDirectory([ACME], allow_anonymous=False).resolve(None)


def test_without_tenants_everyone_is_anonymous() -> None:
    directory = TenantDirectory([], allow_anonymous=False)
    assert not directory.tenants_configured
    assert directory.resolve(None) is ANONYMOUS_TENANT
    assert directory.resolve("Bearer anything") is ANONYMOUS_TENANT


def test_priority_is_clamped_to_the_ceiling_and_defaults_to_interactive() -> None:
    batch_only = Tenant("bulk", priority_ceiling="batch")
    directory = TenantDirectory([ACME, VIP, batch_only])
    assert directory.resolve_priority(ACME, "critical") == "interactive"
    assert directory.resolve_priority(ACME, "batch") == "batch"
    assert directory.resolve_priority(VIP, " Critical ") == "critical"  # no ceiling
    assert directory.resolve_priority(VIP, None) == "interactive"
    assert directory.resolve_priority(VIP, "urgent") == "interactive"  # unknown → default
    assert directory.resolve_priority(batch_only, None) == "batch"  # the default is clamped too
    custom = TenantDirectory([], class_names=["gold", "silver"], default_priority="silver")
    assert custom.resolve_priority(custom.anonymous_tenant, "gold") == "gold"


def test_cap_tier_names_the_top_and_the_lowest_of_several_classes() -> None:
    directory = TenantDirectory([])
    assert [directory.cap_tier(c) for c in ("critical", "interactive", "batch")] == [
        CapTier.TOP,
        CapTier.PLAIN,
        CapTier.LOWEST,
    ]
    only = TenantDirectory([], class_names=["gold"], default_priority="gold")
    assert only.cap_tier("gold") is CapTier.PLAIN, "one class is neither above nor below another"


def test_tenant_limits_become_per_minute_buckets() -> None:
    tenant = Tenant("t", requests_per_min=60, tokens_per_min=6000, max_concurrent=4, weight=2.0)
    assert tenant.rate_limits.requests == TokenBucketLimit(capacity=60, refill_per_s=1.0)
    assert tenant.rate_limits.tokens == TokenBucketLimit(capacity=6000, refill_per_s=100.0)
    assert Tenant("free").rate_limits.requests is None and Tenant("free").rate_limits.tokens is None
    assert Tenant("h", api_key_hashes=(hash_api_key("k").upper(),)).api_key_hashes == (hash_api_key("k"),)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "non-empty name"),
        ({"name": "t", "api_key_hashes": ("sk-plain-key",)}, "SHA-256 hex"),
        ({"name": "t", "requests_per_min": 0}, "requests_per_min"),
        ({"name": "t", "tokens_per_min": -5}, "tokens_per_min"),
        ({"name": "t", "max_concurrent": 0}, "max_concurrent"),
        ({"name": "t", "weight": 0}, "weight"),
    ],
)
def test_invalid_tenants_are_rejected_with_the_key_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Tenant(**kwargs)  # type: ignore[arg-type]


def test_directory_validation() -> None:
    with pytest.raises(ValueError, match="configured twice"):
        TenantDirectory([ACME, Tenant("acme")])
    with pytest.raises(ValueError, match="shared by tenants 'acme' and 'copy'"):
        TenantDirectory([ACME, Tenant("copy", api_key_hashes=ACME.api_key_hashes)])
    with pytest.raises(ValueError, match="priority_ceiling 'gold'"):
        TenantDirectory([Tenant("t", priority_ceiling="gold")])
    with pytest.raises(ValueError, match="default_priority"):
        TenantDirectory([], default_priority="urgent")
    with pytest.raises(ValueError, match="reserved for the anonymous tenant"):
        TenantDirectory([Tenant("anonymous")])
    with pytest.raises(ValueError, match="cannot have API keys"):
        TenantDirectory([], anonymous_tenant=ACME)
