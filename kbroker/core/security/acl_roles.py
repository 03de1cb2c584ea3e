"""Least privilege: the Kafka ACLs each kbroker role needs, as pure plans (kafka/security/acls.py applies
them). Pure: no I/O.

Every name kbroker gives a topic, a consumer group or a transactional id lies under the
namespace's prefix P = `kbroker.<ns>.` (core/names.py), so a namespace's rights are PREFIXED
rules on P (with its trailing dot: `kbroker.sales` would also match `kbroker.salesforce.`) or
LITERAL rules on one of its topics. A role is a list of Rules (resource, pattern, operations, why;
acl_bindings.py), made of the rule sets of rule_sets.py; `bindings` gives one principal those rules
as AclBindings.

The roles, by the process that runs with them:

    sender               an SDK process that BEGINs dialogs and SENDs outside a transaction
    reader               an SDK process that RECEIVEs in transactions (and commits them)
    app                  both: an application that SENDs and RECEIVEs in transactions
    worker               `kbroker worker` (Faust, monitors, activation, tick, reclaim, timers, routing)
    analytics            `kbroker analytics run` (Spark reads the namespace, writes results)
    router               the transmitter and dispatcher (`--route-to NS`: a route to that namespace)
    transport-installer  `kbroker endpoint install` (creates an endpoint's queue topics)
    transport-runner     a running transport endpoint (reads its queues, sends to any; with
                         `sends_to`, to queues of other namespaces too)
    deployer             `kbroker apply` (creates and configures topics, publishes the catalog)

Operations a rule grants imply DESCRIBE (Kafka: READ, WRITE, DELETE, ALTER imply it), so rules
name DESCRIBE only where nothing else is granted. No role needs IDEMPOTENT_WRITE on the cluster:
since Kafka 2.8 WRITE on any topic lets a producer be idempotent (KIP-679).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kbroker.core.security import rule_sets, transport_rules
from kbroker.core.security.acl_bindings import AclBinding, Rule, check_principal


@dataclass(frozen=True)
class RoleOptions:
    """What narrows or widens a role: a transport endpoint (its queues only, else every
    transport queue of the namespace), the namespaces on this cluster the router delivers to,
    and the transport addresses of other namespaces (`queue@namespace`) a transport runner sends to."""

    endpoint: str | None = None
    routes_to: tuple[str, ...] = ()
    sends_to: tuple[str, ...] = ()


@dataclass(frozen=True)
class Role:
    """A role: what it is for, and its rules for a namespace and options."""

    name: str
    summary: str
    rules_for: Callable[[str, RoleOptions], list[Rule]]


ROLES: dict[str, Role] = {
    r.name: r
    for r in (
        Role(
            "sender",
            "an SDK process that BEGINs dialogs and SENDs outside a transaction",
            lambda ns, _o: rule_sets.sender(ns),
        ),
        Role(
            "reader",
            "an SDK process that RECEIVEs in transactions and commits them",
            lambda ns, _o: rule_sets.reader(ns),
        ),
        Role(
            "app",
            "an application that SENDs and RECEIVEs in transactions (sender and reader)",
            lambda ns, _o: rule_sets.sender(ns) + rule_sets.reader(ns),
        ),
        Role(
            "worker",
            "`kbroker worker`: monitors, activation, tick, reclaim, timers and routing",
            lambda ns, o: rule_sets.worker(ns) + rule_sets.links(o.routes_to),
        ),
        Role(
            "analytics",
            "`kbroker analytics run`: the Spark job of the namespace",
            lambda ns, _o: rule_sets.analytics(ns),
        ),
        Role(
            "router",
            "the transmitter and the dispatcher (messages between namespaces on this cluster)",
            lambda ns, o: rule_sets.router(ns) + rule_sets.links(o.routes_to),
        ),
        Role(
            "transport-installer",
            "`kbroker endpoint install`: creates a transport endpoint's queues",
            lambda ns, o: transport_rules.transport_installer(ns, o.endpoint),
        ),
        Role(
            "transport-runner",
            "a running transport endpoint: receives from its queues, sends to any",
            lambda ns, o: transport_rules.transport_runner(ns, o.endpoint) + transport_rules.sends_to(ns, o.sends_to),
        ),
        Role(
            "deployer",
            "`kbroker apply`: creates and configures the catalog's topics, publishes the catalog",
            lambda ns, _o: rule_sets.deployer(ns),
        ),
    )
}


def role(name: str) -> Role:
    """The role of that name; ValueError naming the roles otherwise."""
    try:
        return ROLES[name]
    except KeyError:
        raise ValueError(f"unknown role {name!r} (one of {', '.join(ROLES)})") from None


def rules(
    role_name: str,
    namespace: str,
    *,
    endpoint: str | None = None,
    routes_to: Sequence[str] = (),
    sends_to: Sequence[str] = (),
) -> list[Rule]:
    """What `role_name` needs in `namespace` (see RoleOptions for `endpoint`, `routes_to` and
    `sends_to`), one rule per resource pattern: a pattern two rule sets name gets the union of
    their operations."""
    merged: dict[tuple[str, str, str], Rule] = {}
    for r in role(role_name).rules_for(namespace, RoleOptions(endpoint, tuple(routes_to), tuple(sends_to))):
        key = (r.resource_type, r.pattern, r.name)
        old = merged.get(key)
        if old is None:
            merged[key] = r
        elif not set(r.operations) <= set(old.operations):
            ops = old.operations + tuple(op for op in r.operations if op not in old.operations)
            merged[key] = Rule(r.resource_type, r.pattern, r.name, ops, f"{old.why}; {r.why}")
    return list(merged.values())


def bindings(
    role_name: str,
    principal: str,
    namespace: str,
    *,
    endpoint: str | None = None,
    routes_to: Sequence[str] = (),
    sends_to: Sequence[str] = (),
) -> list[AclBinding]:
    """The ACLs that give `principal` what `role_name` needs in `namespace`: one per rule and
    operation, none twice."""
    check_principal(principal)
    return [
        AclBinding(principal, op, r.resource_type, r.pattern, r.name)
        for r in rules(role_name, namespace, endpoint=endpoint, routes_to=routes_to, sends_to=sends_to)
        for op in r.operations
    ]


def transport_split(
    ns: str, endpoint: str, installer: str, runner: str, *, sends_to: Sequence[str] = ()
) -> list[AclBinding]:
    """The transport's split of an endpoint's permissions between two principals: the installer
    may create the endpoint's queue topics (CREATE TABLE, VIEW DEFINITION); the running endpoint
    only reads and writes (db_datareader, db_datawriter), and writes the queues of other
    namespaces that `sends_to` names (`queue@namespace`: transport_rules.sends_to)."""
    return bindings("transport-installer", installer, ns, endpoint=endpoint) + bindings(
        "transport-runner", runner, ns, endpoint=endpoint, sends_to=sends_to
    )
