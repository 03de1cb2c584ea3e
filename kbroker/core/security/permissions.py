"""Service Broker's permissions (GRANT, DENY, REVOKE) as the Kafka ACLs that enforce them. Pure:
no I/O (kafka/security/permissions.py reads and changes the cluster's ACLs).

    SEND ON SERVICE::s     BEGIN DIALOG to s and SEND to it: WRITE on its queue's topic
    RECEIVE ON QUEUE::q    RECEIVE from q: READ on its topic and consumer group
    ALTER ON QUEUE::q      ALTER QUEUE (STATUS, ACTIVATION, partitions, config): the queue
                           topic's configuration, and the catalog record that holds the queue
    CONTROL ON QUEUE::q    all of the above on q, and deleting its records (the reclaim)
    ALTER ON SERVICE::s    ALTER ON QUEUE of s's queue (a service has no topic of its own)
    CONTROL ON SERVICE::s  SEND ON SERVICE::s and ALTER ON SERVICE::s
    CONTROL ON CATALOG::ns the catalog's owner: `kbroker apply`, every queue and service

Each permission's ACLs are of two parts. Its own part names the object (the queue topic, its
secondary queues `<topic>.`, its group): what a DENY denies, with Kafka's DENY winning over any
ALLOW as in SQL Server. Its base is what any process doing such a statement needs besides
(the catalog to read, the endpoints topic, transactional ids, ...): granted with it, never
denied (a DENY on the endpoints topic would take every other grant away too), and revoked with
the last permission that needs it.

Kafka authorizes whole topics, not records, which bounds what can be told apart:
- services sharing a queue share their SEND: the ACL is on the queue's topic;
- ALTER on any queue writes the catalog topic (a queue's STATUS is a catalog record), so its
  holder is trusted with the catalog's records as Kafka sees them.
`held` reads permissions back from ACLs by that rule (a permission is held when all of its
ACLs are), so what it lists is what the authorizer enforces.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kbroker.core import names
from kbroker.core.catalog.models import Catalog
from kbroker.core.security.acl_bindings import AclBinding, Rule, check_principal
from kbroker.core.security.rule_sets import receiver_base, sender_base
from kbroker.errors import InvalidArgumentError

SERVICE, QUEUE, CATALOG = "SERVICE", "QUEUE", "CATALOG"
SEND, RECEIVE, ALTER, CONTROL = "SEND", "RECEIVE", "ALTER", "CONTROL"
ACTIONS: dict[str, tuple[str, ...]] = {
    SERVICE: (SEND, ALTER, CONTROL),
    QUEUE: (RECEIVE, ALTER, CONTROL),
    CATALOG: (CONTROL,),
}
GRANT, DENY = "GRANT", "DENY"
# Never denied: a DENY on seeing a topic would hide it from every other grant too.
_NOT_DENIED = frozenset({"DESCRIBE", "DESCRIBE_CONFIGS"})
_TOPIC_CONFIG = ("ALTER", "ALTER_CONFIGS", "DESCRIBE_CONFIGS")


@dataclass(frozen=True, order=True)
class Permission:
    """`state` (GRANT or DENY) of `action` ON `cls`::`name` to `principal`."""

    principal: str
    action: str
    cls: str
    name: str
    state: str = GRANT

    def __post_init__(self) -> None:
        if self.cls not in ACTIONS:
            raise InvalidArgumentError(f"unknown class {self.cls!r} (one of {', '.join(ACTIONS)})")
        if self.action not in ACTIONS[self.cls]:
            raise InvalidArgumentError(
                f"{self.action} is not a permission on a {self.cls.lower()} (one of {', '.join(ACTIONS[self.cls])})"
            )
        if self.state not in (GRANT, DENY) or not self.name:
            raise InvalidArgumentError(f"permission {self.state} {self.action} ON {self.cls}::{self.name!r}")
        try:
            check_principal(self.principal)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None

    def statement(self) -> str:
        """As Service Broker writes it: `GRANT SEND ON SERVICE::s TO User:alice`."""
        return f"{self.state} {self.action} ON {self.cls}::{self.name} TO {self.principal}"

    def as_dict(self) -> dict[str, str]:
        return {
            "state": self.state,
            "permission": self.action,
            "class": self.cls,
            "name": self.name,
            "principal": self.principal,
        }


@dataclass(frozen=True)
class Objects:
    """What permissions are on in one namespace: its services (name -> queue) and queues."""

    namespace: str
    services: Mapping[str, str]
    queues: frozenset[str]

    @classmethod
    def of(cls, catalog: Catalog) -> "Objects":
        return cls(catalog.namespace, {s.name: s.queue for s in catalog.services.values()}, frozenset(catalog.queues))

    def queue_of(self, service: str) -> str:
        if service not in self.services:
            raise InvalidArgumentError(
                f"{service!r} is not a service of namespace {self.namespace}: SEND to another namespace's "
                "service is that namespace's grant"
            )
        return self.services[service]

    def check(self, p: Permission) -> None:
        """InvalidArgumentError unless `p`'s object is one of the namespace's."""
        if p.cls == QUEUE and p.name not in self.queues:
            raise InvalidArgumentError(f"{p.name!r} is not a queue of namespace {self.namespace}")
        if p.cls == SERVICE:
            self.queue_of(p.name)
        if p.cls == CATALOG and p.name != self.namespace:
            raise InvalidArgumentError(
                f"CATALOG::{p.name} is not namespace {self.namespace}'s catalog (CATALOG::{self.namespace})"
            )


# --- the two parts of each permission, as (operation, resource type, pattern, name) -------------

Acl = tuple[str, str, str, str]


def _on(resource: str, pattern: str, name: str, *ops: str) -> list[Acl]:
    return [(op, resource, pattern, name) for op in ops]


def _queue_topics(ns: str, queue: str, *ops: str) -> list[Acl]:
    """The queue's topic and its secondary queues `<topic>.<instance>` (names.py: no other
    queue's name lies in that space)."""
    topic = names.queue_topic(ns, queue)
    return _on("TOPIC", "LITERAL", topic, *ops) + _on("TOPIC", "PREFIXED", topic + ".", *ops)


def _acls(rules: Iterable[Rule]) -> list[Acl]:
    return [(op, r.resource_type, r.pattern, r.name) for r in rules for op in r.operations]


def _catalog_writer(ns: str) -> list[Acl]:
    """ALTER QUEUE (kafka/queue_views.py): the catalog record, its event, the monitors' notice."""
    return (
        _on("TOPIC", "LITERAL", names.catalog_topic(ns), "READ", "WRITE")
        + _on("GROUP", "LITERAL", names.reader_group(ns), "DESCRIBE")
        + _on("TOPIC", "LITERAL", names.events_topic(ns), "WRITE")
        + _on("TOPIC", "LITERAL", names.monitor_events_topic(ns), "WRITE")
    )


def _own(p: Permission, objects: Objects) -> list[Acl]:
    ns, (action, cls, name) = objects.namespace, (p.action, p.cls, p.name)
    if cls == SERVICE:
        queue = objects.queue_of(name)
        send = _queue_topics(ns, queue, "WRITE")
        alter = _queue_topics(ns, queue, *_TOPIC_CONFIG)
        return {SEND: send, ALTER: alter, CONTROL: send + alter}[action]
    if cls == QUEUE:
        group = names.queue_group(ns, name)
        receive = (
            _queue_topics(ns, name, "READ")
            + _on("TOPIC", "PREFIXED", group + ".", "CREATE")  # secondaries
            + _on("GROUP", "LITERAL", group, "READ")
            + _on("GROUP", "PREFIXED", group + ".", "READ")
        )
        alter = _queue_topics(ns, name, *_TOPIC_CONFIG)
        return {RECEIVE: receive, ALTER: alter, CONTROL: receive + alter + _queue_topics(ns, name, "WRITE", "DELETE")}[
            action
        ]
    p_ = names.prefix(ns)  # CONTROL ON CATALOG: `kbroker apply` (acl_roles' deployer) and ALTER QUEUE
    return (
        _on("TOPIC", "PREFIXED", p_, "CREATE", *_TOPIC_CONFIG, "DESCRIBE")
        + _on("TOPIC", "LITERAL", names.catalog_topic(ns), "WRITE")
        + _on("GROUP", "PREFIXED", p_, "DESCRIBE")
    )


def _base(p: Permission, objects: Objects) -> list[Acl]:
    ns = objects.namespace
    send, receive, alter = _acls(sender_base(ns)), _acls(receiver_base(ns)), _catalog_writer(ns)
    return {
        (SERVICE, SEND): send,
        (SERVICE, ALTER): alter,
        (SERVICE, CONTROL): send + alter,
        (QUEUE, RECEIVE): receive,
        (QUEUE, ALTER): alter,
        (QUEUE, CONTROL): receive + alter,
        (CATALOG, CONTROL): alter,
    }[(p.cls, p.action)]


def _bind(principal: str, acls: Iterable[Acl], permission: str) -> set[AclBinding]:
    return {
        AclBinding(principal, op, rtype, pattern, name, "ALLOW" if permission == GRANT else "DENY")
        for op, rtype, pattern, name in acls
        if permission == GRANT or op not in _NOT_DENIED
    }


def own_bindings(p: Permission, objects: Objects) -> set[AclBinding]:
    """The ACLs naming `p`'s object: ALLOW for a grant, DENY for a deny (what REVOKE removes)."""
    objects.check(p)
    return _bind(p.principal, _own(p, objects), p.state)


def bindings(p: Permission, objects: Objects) -> set[AclBinding]:
    """The ACLs that give exactly `p`: its own, and for a grant its base."""
    extra = _bind(p.principal, _base(p, objects), GRANT) if p.state == GRANT else set()
    return own_bindings(p, objects) | extra


def bindings_of(permissions: Iterable[Permission], objects: Objects) -> set[AclBinding]:
    return set().union(*(bindings(p, objects) for p in permissions))


def candidates(principal: str, objects: Objects) -> list[Permission]:
    """Every permission `held` looks for. ALTER ON SERVICE is not among them: it is ALTER ON
    QUEUE of the service's queue, and listed as that."""
    found = [Permission(principal, CONTROL, CATALOG, objects.namespace, state) for state in (GRANT, DENY)]
    for state in (GRANT, DENY):
        found += [
            Permission(principal, a, SERVICE, s, state) for s in sorted(objects.services) for a in (SEND, CONTROL)
        ]
        found += [Permission(principal, a, QUEUE, q, state) for q in sorted(objects.queues) for a in ACTIONS[QUEUE]]
    return found


def held(acls: Iterable[AclBinding], principal: str, objects: Objects) -> tuple[list[Permission], list[AclBinding]]:
    """The permissions `acls` give `principal` in the namespace (each one whose ACLs are all
    there; one whose ACLs lie within another's, such as SEND within CONTROL on the same service,
    is left out as implied), and the principal's ACLs that belong to none of them (raw)."""
    mine = {b for b in acls if b.principal == principal}
    found = {p: bindings(p, objects) for p in candidates(principal, objects)}
    found = {p: b for p, b in found.items() if b <= mine}
    shown = sorted(p for p, b in found.items() if not any(b < other for other in found.values()))
    covered = set().union(*found.values()) if found else set()
    return shown, sorted(mine - covered)


def revoke_plan(p: Permission, acls: Iterable[AclBinding], objects: Objects) -> set[AclBinding]:
    """REVOKE `p` (its grant and its deny, as SQL Server's REVOKE removes either): the ACLs to
    delete from `acls` (the principal's): `p`'s own ALLOW and DENY, and the base ACLs no
    permission still held after that needs."""
    mine = {b for b in acls if b.principal == p.principal}
    own = own_bindings(Permission(p.principal, p.action, p.cls, p.name, GRANT), objects) | own_bindings(
        Permission(p.principal, p.action, p.cls, p.name, DENY), objects
    )
    left = mine - own
    still = [q for q in candidates(p.principal, objects) if q.state == GRANT and bindings(q, objects) <= left]
    needed = bindings_of(still, objects)
    base = bindings(Permission(p.principal, p.action, p.cls, p.name, GRANT), objects) - own
    return (own | (base - needed)) & mine


# --- the statements' text --------------------------------------------------------------------

_STATEMENT = re.compile(
    r"^(?P<actions>[A-Za-z]+(?:\s*,\s*[A-Za-z]+)*)\s+ON\s+(?P<cls>[A-Za-z]+)::(?P<name>\S.*?)"
    r"\s+(?P<to>TO|FROM)\s+(?P<principal>\S+)$",
    re.IGNORECASE,
)


def parse(state: str, words: Iterable[str], default_namespace: str) -> list[Permission]:
    """`SEND[, ALTER] ON SERVICE::name TO|FROM principal` as the permissions it names;
    InvalidArgumentError naming the expected form otherwise. A bare principal name is a User."""
    text = " ".join(words).strip()
    m = _STATEMENT.match(text)
    if not m:
        raise InvalidArgumentError(
            f"{text!r}: expected PERMISSION ON CLASS::name TO principal, e.g. SEND ON SERVICE::orders TO User:alice"
        )
    cls = m["cls"].upper()
    name = m["name"].strip().strip("[]")  # [name] as T-SQL quotes it
    if cls == CATALOG and name.upper() == "CURRENT":
        name = default_namespace
    principal = m["principal"].strip("[]")
    principal = principal if ":" in principal else f"User:{principal}"
    return [Permission(principal, a.strip().upper(), cls, name, state) for a in m["actions"].split(",")]
