"""Kafka ACLs through the admin API: grant a role's plan (core/security/acl_roles.py), revoke it, list
what a principal holds. The one place kbroker builds confluent-kafka's AclBindings.

Kafka's cluster resource is ResourceType.BROKER named `kafka-cluster` (confluent-kafka has no
CLUSTER member). A change reaches the authorizer through the metadata log, a moment after the
admin call returns: `grant` and `revoke` wait until the cluster lists the change."""

from __future__ import annotations

import time
from collections.abc import Iterable
from enum import Enum
from typing import Any

from confluent_kafka.admin import (
    AclBinding as KafkaAclBinding,
)
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from kbroker.core.cluster import ClusterLike
from kbroker.core.security.acl_bindings import AclBinding, check_principal
from kbroker.errors import BrokerUnavailableError
from kbroker.kafka import clients

SETTLE_INTERVAL = 0.1  # seconds between looks at whether the cluster lists a change yet


def _resource_type(name: str) -> ResourceType:
    return ResourceType.BROKER if name == "CLUSTER" else ResourceType[name]


def _name(value: Enum | str | int) -> str:
    """An enum member's name (confluent-kafka's bindings hold their enums as given)."""
    return value.name if isinstance(value, Enum) else str(value)


def _type_name(restype: Enum | str | int) -> str:
    return "CLUSTER" if restype == ResourceType.BROKER else _name(restype)


def to_kafka(b: AclBinding) -> KafkaAclBinding:
    """`b` as confluent-kafka's AclBinding."""
    return KafkaAclBinding(
        _resource_type(b.resource_type),
        b.name,
        ResourcePatternType[b.pattern],
        b.principal,
        b.host,
        AclOperation[b.operation],
        AclPermissionType[b.permission],
    )


def from_kafka(k: KafkaAclBinding) -> AclBinding:
    """confluent-kafka's AclBinding as kbroker's."""
    return AclBinding(
        k.principal,
        _name(k.operation),
        _type_name(k.restype),
        _name(k.resource_pattern_type),
        k.name,
        _name(k.permission_type),
        k.host,
    )


def _principal_filter(principal: str | None) -> AclBindingFilter:
    anything: Any = None  # matches any name, principal and host (the library's type hints say str only)
    return AclBindingFilter(
        ResourceType.ANY,
        anything,
        ResourcePatternType.ANY,
        principal or anything,
        anything,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )


def _exact_filter(b: AclBinding) -> AclBindingFilter:
    return AclBindingFilter(
        _resource_type(b.resource_type),
        b.name,
        ResourcePatternType[b.pattern],
        b.principal,
        b.host,
        AclOperation[b.operation],
        AclPermissionType[b.permission],
    )


def listed(cluster: ClusterLike, principal: str | None = None, *, timeout: float = 10.0) -> list[AclBinding]:
    """The ACLs the cluster holds (of `principal`, or everyone's), sorted."""
    if principal is not None:
        check_principal(principal)
    admin = clients.admin(cluster)
    found = clients.result_of(
        admin.describe_acls(_principal_filter(principal), request_timeout=timeout),
        "cannot list the cluster's ACLs (DESCRIBE on the cluster)",
    )
    return sorted(from_kafka(k) for k in found)


def grant(
    cluster: ClusterLike, bindings: Iterable[AclBinding], *, timeout: float = 10.0, wait: bool = True
) -> list[AclBinding]:
    """Create `bindings` (those that exist already stay as they are); with `wait`, return once
    the cluster lists them all. Returns the bindings asked for, without repeats."""
    todo = list(dict.fromkeys(bindings))
    if not todo:
        return []
    admin = clients.admin(cluster)
    for kafka_binding, future in admin.create_acls([to_kafka(b) for b in todo], request_timeout=timeout).items():
        clients.result_of(
            future, f"cannot create the ACL {from_kafka(kafka_binding).command('…')} (ALTER on the cluster)"
        )
    if wait:
        _settle(cluster, todo, present=True, timeout=timeout)
    return todo


def revoke(
    cluster: ClusterLike, bindings: Iterable[AclBinding], *, timeout: float = 10.0, wait: bool = True
) -> list[AclBinding]:
    """Delete `bindings` (a binding the cluster does not hold is no error); with `wait`, return
    once the cluster no longer lists them. Returns the ACLs deleted."""
    todo = list(dict.fromkeys(bindings))
    return _delete(cluster, [_exact_filter(b) for b in todo], todo, timeout, wait)


def revoke_all(cluster: ClusterLike, principal: str, *, timeout: float = 10.0, wait: bool = True) -> list[AclBinding]:
    """Delete every ACL of `principal`; returns them."""
    check_principal(principal)
    return _delete(cluster, [_principal_filter(principal)], None, timeout, wait)


def _delete(
    cluster: ClusterLike, filters: list[AclBindingFilter], expected: list[AclBinding] | None, timeout: float, wait: bool
) -> list[AclBinding]:
    if not filters:
        return []
    admin = clients.admin(cluster)
    deleted: list[AclBinding] = []
    for future in admin.delete_acls(filters, request_timeout=timeout).values():
        deleted += [from_kafka(k) for k in clients.result_of(future, "cannot delete ACLs (ALTER on the cluster)")]
    if wait:
        _settle(cluster, expected if expected is not None else deleted, present=False, timeout=timeout)
    return sorted(set(deleted))


def _settle(cluster: ClusterLike, bindings: list[AclBinding], *, present: bool, timeout: float) -> None:
    """Until the cluster lists each of `bindings` (present) or none of them (not present)."""
    deadline = time.monotonic() + timeout
    principals = sorted({b.principal for b in bindings})
    while True:
        held = {b for p in principals for b in listed(cluster, p, timeout=timeout)}
        missing = [b for b in bindings if (b in held) != present]
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise BrokerUnavailableError(
                f"the cluster did not list {len(missing)} ACL change(s) within "
                f"{timeout:g} s, e.g. {missing[0].command('…')}"
            )
        time.sleep(SETTLE_INTERVAL)
