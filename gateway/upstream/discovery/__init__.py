"""Replica discovery: sources that tell the upstream registry which replicas exist and in what state.

Each source runs as one background task and calls `on_change(ReplicaSet)` with the complete new
membership (replica URL → `ready` | `draining`) whenever it changes; `membership.plan_membership`
is how the registry applies it. Sources: `StaticDiscovery`, `DnsDiscovery`,
`KubernetesEndpointSliceDiscovery`; `build_discovery` picks one from a pool's `replicas` settings.
"""

from gateway.config.discovery_settings import DnsReplicas, KubernetesReplicas, ReplicaSources
from gateway.upstream.discovery.dns import DnsDiscovery, GetaddrinfoResolver, Resolver
from gateway.upstream.discovery.factory import DiscoveryRunner, StaticDiscovery, build_discovery
from gateway.upstream.discovery.kubernetes import KubernetesEndpointSliceDiscovery
from gateway.upstream.discovery.membership import MembershipPlan, plan_membership
from gateway.upstream.discovery.types import DiscoverySource, OnChange, ReplicaSet, ReplicaState

__all__ = [
    "DiscoveryRunner",
    "DiscoverySource",
    "DnsDiscovery",
    "DnsReplicas",
    "GetaddrinfoResolver",
    "KubernetesEndpointSliceDiscovery",
    "KubernetesReplicas",
    "MembershipPlan",
    "OnChange",
    "ReplicaSet",
    "ReplicaSources",
    "ReplicaState",
    "Resolver",
    "StaticDiscovery",
    "build_discovery",
    "plan_membership",
]
