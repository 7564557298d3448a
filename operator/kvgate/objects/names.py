"""Which ModelDeployment names kvgate can build every object from. Pure.

A ModelDeployment is a custom object: the API server accepts any DNS-1123 subdomain (253
characters, dots allowed). kvgate names a Service after it, and a Service name is a DNS-1035
label: `llama-3.1-8b` is a valid ModelDeployment whose Service the API server refuses. So the name
must be a DNS-1035 label, and short enough that every name derived from it (listed by
`derived_names`, built with the same functions the builders use) stays within its own limit.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from kvgate.api import labels
from kvgate.api.revision import REVISION_LENGTH
from kvgate.objects import builders, network_policy

DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_1035_LABEL_MAX = 63
DNS_1123_SUBDOMAIN_MAX = 253
LABEL_VALUE_MAX = 63
# The Deployment controller names a ReplicaSet <deployment>-<pod-template-hash>; the hash is a
# uint32 written in up to 10 characters. Pod names come from the ReplicaSet's generateName, which
# the API server shortens itself, so they never fail.
POD_TEMPLATE_HASH_MAX = 10


@dataclass(frozen=True)
class DerivedName:
    """One name kvgate derives from the ModelDeployment's name, and the longest it may be."""

    what: str
    name: str
    max_length: int


def derived_names(md_name: str) -> list[DerivedName]:
    """Every name kvgate builds from `md_name`, with the Kubernetes limit that applies to it."""
    revision = "0" * REVISION_LENGTH  # revisions are fixed-length hashes
    names = [
        DerivedName("Service", md_name, DNS_1035_LABEL_MAX),
        DerivedName(f"{labels.DEPLOYMENT} label value", md_name, LABEL_VALUE_MAX),
        DerivedName(
            "router ServiceAccount, Role and RoleBinding",
            builders.router_account_name(md_name),
            DNS_1123_SUBDOMAIN_MAX,
        ),
        DerivedName(
            "router control-plane Secret",
            builders.router_control_secret_name(md_name),
            DNS_1123_SUBDOMAIN_MAX,
        ),
    ]
    names += [
        DerivedName("NetworkPolicy", policy, DNS_1123_SUBDOMAIN_MAX)
        for policy in network_policy.policy_names(md_name, revision, router_egress=True)
    ]
    for component in builders.COMPONENTS:
        deployment = builders.component_name(md_name, revision, component)
        names += [
            DerivedName(f"{component} Deployment", deployment, DNS_1123_SUBDOMAIN_MAX),
            DerivedName(
                f"{component} ReplicaSet",
                f"{deployment}-{'0' * POD_TEMPLATE_HASH_MAX}",
                DNS_1123_SUBDOMAIN_MAX,
            ),
        ]
    return names


def _room(derived: DerivedName, md_name: str) -> int:
    """The longest ModelDeployment name this derived name allows."""
    return derived.max_length - (len(derived.name) - len(md_name))


@functools.cache
def max_name_length() -> int:
    """The longest ModelDeployment name for which every derived name fits (63: the Service)."""
    return min(_room(d, "x") for d in derived_names("x"))


def binding_names(md_name: str) -> list[DerivedName]:
    """The derived names that `md_name` makes too long."""
    if len(md_name) <= DNS_1123_SUBDOMAIN_MAX:  # the names the API server lets through
        return list(_binding_names_of(md_name))
    return [d for d in derived_names(md_name) if len(d.name) > d.max_length]


# The webhook sees the same few names again and again (every update of a ModelDeployment).
@functools.lru_cache(maxsize=1024)
def _binding_names_of(md_name: str) -> tuple[DerivedName, ...]:
    return tuple(d for d in derived_names(md_name) if len(d.name) > d.max_length)


def suggest_name(name: str) -> str | None:
    """A DNS-1035 label close to `name` (`Llama-3.1-8B` -> `llama-3-1-8b`), if there is one."""
    candidate = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    candidate = candidate[: max_name_length()].rstrip("-")
    if candidate and DNS_1035_LABEL.fullmatch(candidate):
        return candidate
    return None
