"""GRANT, DENY and REVOKE on the cluster: core/security/permissions.py's ACLs created and deleted through
kafka/security/acls.py (as a principal that may alter the cluster's ACLs), and a principal's permissions
read back from the ACLs the cluster holds, so `kbroker permissions` shows what the authorizer
enforces. The namespace's catalog names its services and queues."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient

from kbroker.core.cluster import ClusterLike
from kbroker.core.security.acl_bindings import AclBinding
from kbroker.core.security.permissions import GRANT, Objects, Permission, bindings_of, held, revoke_plan
from kbroker.errors import SendPermissionDeniedError, denied_code
from kbroker.kafka import clients
from kbroker.kafka.catalog.catalog_store import read_catalog
from kbroker.kafka.security import acls

log = logging.getLogger("kbroker.permissions")


@dataclass
class Change:
    """What a GRANT, DENY or REVOKE did: the ACLs created or deleted, and the permissions that
    the principal held before and no longer does besides the ones named (services that share a
    queue share its SEND)."""

    statements: list[Permission]
    acls: list[AclBinding]
    also_lost: list[Permission] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "statements": [p.statement() for p in self.statements],
            "acls": [b.as_dict() for b in self.acls],
            "also_lost": [p.statement() for p in self.also_lost],
        }


def objects(cluster: ClusterLike, namespace: str, timeout: float = 10.0) -> Objects:
    """The namespace's services and queues, as its catalog says now."""
    return Objects.of(read_catalog(cluster, namespace, timeout=timeout))


def grant(
    cluster: ClusterLike,
    namespace: str,
    permissions: Iterable[Permission],
    *,
    timeout: float = 10.0,
    dry_run: bool = False,
) -> Change:
    """GRANT or DENY `permissions` (each its own state): their ACLs created, returned once the
    cluster lists them (those already there stay)."""
    todo = list(permissions)
    plan = sorted(bindings_of(todo, objects(cluster, namespace, timeout)))
    if not dry_run:
        acls.grant(cluster, plan, timeout=timeout)
    return Change(todo, plan)


def revoke(
    cluster: ClusterLike,
    namespace: str,
    permissions: Iterable[Permission],
    *,
    timeout: float = 10.0,
    dry_run: bool = False,
) -> Change:
    """REVOKE `permissions`: the ACLs of each one's grant and deny deleted, with the base ACLs no
    permission left needs; returned once the cluster no longer lists them."""
    todo = list(permissions)
    objs = objects(cluster, namespace, timeout)
    principals = sorted({p.principal for p in todo})
    before = {b for pr in principals for b in acls.listed(cluster, pr, timeout=timeout)}
    remove: set[AclBinding] = set()
    left = set(before)
    for p in todo:
        gone = revoke_plan(p, left, objs)
        remove |= gone
        left -= gone
    if not dry_run and remove:
        acls.revoke(cluster, sorted(remove), timeout=timeout)
    named = {(p.principal, p.action, p.cls, p.name) for p in todo}
    lost = [
        p
        for pr in principals
        for p in set(held(before, pr, objs)[0]) - set(held(left, pr, objs)[0])
        if (p.principal, p.action, p.cls, p.name) not in named and p.state == GRANT
    ]
    return Change(todo, sorted(remove), sorted(lost))


def listed(
    cluster: ClusterLike, namespace: str, principal: str | None = None, *, timeout: float = 10.0
) -> tuple[list[Permission], list[AclBinding]]:
    """The permissions in the namespace of `principal` (or of every principal with an ACL), read
    back from the cluster's ACLs, and the ACLs that make no permission (raw)."""
    objs = objects(cluster, namespace, timeout)
    found = acls.listed(cluster, principal, timeout=timeout)
    shown: list[Permission] = []
    raw: list[AclBinding] = []
    for pr in sorted({b.principal for b in found}):
        perms, rest = held(found, pr, objs)
        shown += perms
        raw += rest
    return shown, raw


def authorized(cluster: ClusterLike, topics: list[str], timeout: float = 10.0) -> dict[str, frozenset[str] | None]:
    """topic -> the operations the authorizer lets this principal do on it (KIP-430), an empty set
    when it may not even DESCRIBE it, None when there is no answer (no authorizer, no topic)."""
    if not topics:
        return {}
    admin = clients.admin(cluster)  # kept until the answers came: a client collected meanwhile fails them
    futures = admin.describe_topics(
        TopicCollection(topics), include_authorized_operations=True, request_timeout=timeout
    )
    out: dict[str, frozenset[str] | None] = {}
    for topic, future in futures.items():
        try:
            ops = future.result(timeout=timeout + 1.0).authorized_operations
        except KafkaException as exc:
            out[topic] = frozenset() if denied_code(exc.args[0]) else None
            continue
        except Exception:  # noqa: BLE001 - a future's timeout: no answer
            out[topic] = None
            continue
        out[topic] = None if ops is None else frozenset(op.name for op in ops)
    return out


class SendChecks:
    """SEND's permission, asked of the cluster before a statement writes anything: whether this
    process's principal may WRITE a queue topic (DescribeTopics with the authorized operations,
    KIP-430: the authorizer's own answer, DENY ACLs included).

    Only a topic's first SEND, and a SEND after a no (a grant works at once), wait for the
    answer. After a yes a SEND goes on at once; once the yes is older than `keep` seconds the
    check asks again in the background, so a revoke is refused here within about `keep` seconds
    (and by the cluster at the write before that). The check only brings the refusal forward:
    when the cluster gives no answer within `timeout` (a broker down, a node failing over), the
    SEND goes on and the authorizer decides at the write, as it would without the check; a slow
    cluster never slows a SEND that was allowed before."""

    def __init__(self, cluster: ClusterLike, *, keep: float = 5.0, timeout: float = 5.0):
        self._cluster, self._keep, self._timeout = cluster, keep, timeout
        self._answers: dict[str, tuple[bool | None, float]] = {}  # topic -> (answer, when); None: none came
        self._asking: set[str] = set()  # topics asked again in the background, not answered yet
        self._lock = threading.Lock()
        self._admin: AdminClient | None = None
        self._unanswered = False  # logged once per spell without answers

    def check(self, service: str, topic: str) -> None:
        """SendPermissionDeniedError (Service Broker's -8494) when the principal may not WRITE `topic`."""
        with self._lock:
            known = self._answers.get(topic)
        if known is None or known[0] is False:
            future = self._ask(topic)
            answer = None if future is None else self._answer(future, self._timeout + 1.0)
            self._note(topic, answer)
            if answer is False:
                raise SendPermissionDeniedError(service, topic, clients.principal(self._cluster))
            return
        if time.monotonic() - known[1] > self._keep:
            self._ask_in_background(topic)

    def _ask(self, topic: str) -> Any:
        """The authorizer's answer to come (a future); None when the question could not be put
        (logged as no answer: the write will say)."""
        try:
            if self._admin is None:
                self._admin = clients.admin(self._cluster)
            return self._admin.describe_topics(
                TopicCollection([topic]), include_authorized_operations=True, request_timeout=self._timeout
            )[topic]
        except Exception as exc:  # noqa: BLE001 - a client that cannot be made or asked: no answer
            self._no_answer(exc)
            return None

    def _ask_in_background(self, topic: str) -> None:
        with self._lock:
            if topic in self._asking:
                return
            self._asking.add(topic)
        future = self._ask(topic)
        if future is None:  # no answer: the yes stands, asked again next time
            self._note(topic, None)
            return
        future.add_done_callback(lambda done: self._note(topic, self._answer(done, 0.0)))

    def _note(self, topic: str, answer: bool | None) -> None:
        with self._lock:
            self._answers[topic] = (answer, time.monotonic())
            self._asking.discard(topic)

    def _answer(self, future: Any, seconds: float) -> bool | None:
        """The authorizer's answer in `future`; None when the cluster gave none (the write will say)."""
        try:
            described = future.result(timeout=seconds)
        except KafkaException as exc:
            err = exc.args[0]
            if denied_code(err):
                return False  # not even DESCRIBE
            if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return True  # the write will say so (a secondary queue is made on first use)
            self._no_answer(err)
            return None
        except Exception as exc:  # noqa: BLE001 - a future's timeout, a client closing: no answer
            self._no_answer(exc)
            return None
        self._unanswered = False
        ops = described.authorized_operations
        return ops is None or AclOperation.WRITE in ops or AclOperation.ALL in ops

    def _no_answer(self, why: object) -> None:
        """Logged once per spell of unanswered checks, not per SEND."""
        if not self._unanswered:
            log.warning("SEND's permission not asked (%s): the write will be authorized", why)
        self._unanswered = True
