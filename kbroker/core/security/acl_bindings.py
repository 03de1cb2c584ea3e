"""Kafka ACLs as values: the resource types, patterns and operations kbroker names, a principal's
spelling, one ACL (AclBinding, with its `kafka-acls.sh` line), one rule of a role's plan (Rule), and
whether a list of ACLs allows an operation. Pure: no I/O. Apart from the roles (acl_roles.py and
its rule_sets.py) because GRANT/DENY/REVOKE (permissions.py) and the Kafka side (kafka/security/)
take and give these values too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

RESOURCE_TYPES = ("TOPIC", "GROUP", "TRANSACTIONAL_ID", "CLUSTER")
PATTERNS = ("LITERAL", "PREFIXED")
OPERATIONS = (
    "READ",
    "WRITE",
    "CREATE",
    "DELETE",
    "ALTER",
    "DESCRIBE",
    "DESCRIBE_CONFIGS",
    "ALTER_CONFIGS",
    "IDEMPOTENT_WRITE",
    "CLUSTER_ACTION",
)
CLUSTER_NAME = "kafka-cluster"  # the one name of Kafka's cluster resource
PRINCIPAL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*:\S.*$")  # `User:alice`, as Kafka spells principals


def check_principal(principal: str) -> str:
    """`principal` when it reads as Kafka's `Type:name` (User:alice); ValueError otherwise."""
    if not isinstance(principal, str) or not PRINCIPAL_RE.match(principal) or principal.endswith(":*"):
        raise ValueError(f"principal {principal!r} must be Kafka's Type:name, e.g. User:alice")
    return principal


@dataclass(frozen=True, order=True)
class AclBinding:
    """One Kafka ACL: principal, operation, resource type, pattern type, resource name; it allows,
    from any host, unless listed otherwise."""

    principal: str
    operation: str
    resource_type: str
    pattern: str
    name: str
    permission: str = "ALLOW"  # as listed from a cluster; kbroker's plans only allow
    host: str = "*"

    def command(self, bootstrap: str) -> str:
        """The `kafka-acls.sh` line that grants it."""
        flag = {
            "TOPIC": "--topic",
            "GROUP": "--group",
            "TRANSACTIONAL_ID": "--transactional-id",
            "CLUSTER": "--cluster",
        }[self.resource_type]
        target = flag if self.resource_type == "CLUSTER" else f"{flag} '{self.name}'"
        pattern = f" --resource-pattern-type {self.pattern.lower()}" if self.resource_type != "CLUSTER" else ""
        return (
            f"kafka-acls.sh --bootstrap-server {bootstrap} --add --allow-principal '{self.principal}' "
            f"--operation {self.operation}{pattern} {target}"
        )

    def covers(self, resource_type: str, name: str) -> bool:
        """Whether this binding's resource pattern matches the resource `name` of that type."""
        if resource_type != self.resource_type:
            return False
        return name == self.name if self.pattern == "LITERAL" else name.startswith(self.name)

    def as_dict(self) -> dict[str, str]:
        return {
            "principal": self.principal,
            "operation": self.operation,
            "resource_type": self.resource_type,
            "pattern": self.pattern,
            "name": self.name,
            "permission": self.permission,
            "host": self.host,
        }


@dataclass(frozen=True)
class Rule:
    """What a role is granted on one resource pattern, and why (the table `kbroker acls roles`
    prints)."""

    resource_type: str
    pattern: str
    name: str
    operations: tuple[str, ...]
    why: str

    def __post_init__(self) -> None:
        if self.resource_type not in RESOURCE_TYPES or self.pattern not in PATTERNS:
            raise ValueError(f"rule on {self.resource_type} {self.pattern} {self.name!r}: unknown type or pattern")
        unknown = [op for op in self.operations if op not in OPERATIONS]
        if unknown or not self.operations:
            raise ValueError(f"rule on {self.name!r}: unknown operations {unknown or 'none given'}")


def allowed(acls: Sequence[AclBinding], principal: str, operation: str, resource_type: str, name: str) -> bool:
    """Whether `acls` allow `principal` the operation on the resource, with the operations Kafka
    implies (READ, WRITE, DELETE, ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS)."""
    implied = {
        "DESCRIBE": {"DESCRIBE", "READ", "WRITE", "DELETE", "ALTER"},
        "DESCRIBE_CONFIGS": {"DESCRIBE_CONFIGS", "ALTER_CONFIGS"},
    }.get(operation, {operation})
    return any(
        a.principal == principal
        and a.operation in implied
        and a.permission == "ALLOW"
        and a.covers(resource_type, name)
        for a in acls
    )
