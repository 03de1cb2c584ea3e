"""`kbroker diagnose` (pure logic). CONFIGURATION: what a dialog from one service to another needs,
checked the way Service Broker's ssbdiagnose CONFIGURATION checks it. RUNTIME, what stops messages
in a namespace now, is core/runtime_diagnosis.py. Each problem is named with a code a script can
match and one line saying what to change.

A dialog from FROM (in namespace A) to TO needs: both services defined; the contract defined on
both sides, with the same message types; TO accepting the contract; both services' queues ON
(a message waits in a disabled queue; a queue with activation OFF and no reader waits for one);
a route in A that leads to TO's namespace, and when that is another namespace, one in TO's
namespace leading back to FROM (replies, acknowledgements and the end of the dialog take it),
TO's service taking A as a remote sender, and TO's namespace answering at the route's address.
The Kafka layer (kafka/diagnosis.py) reads the catalogs and asks the far cluster; this module
only compares.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kbroker.core.catalog.models import Catalog
from kbroker.core.dialogs.arrival import CONTRACT_NOT_FOUND, CONTRACT_NOT_SUPPORTED, NO_PERMISSION
from kbroker.core.routing.routes import hop, match_route, parse_address, routes_of

ERROR, WARNING = "error", "warning"


@dataclass(frozen=True)
class Problem:
    code: str  # stable: route_missing, contract_not_accepted, ...
    severity: str  # error: the dialog cannot work; warning: it works, but not as it may be meant to
    where: str  # the namespace whose catalog (or cluster) to change
    text: str
    command: str | None = None  # the kbroker command that ends it, where one does

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Side:
    """One end: its namespace, its address (`<bootstrap>/<namespace>`), its catalog."""

    namespace: str
    address: str
    catalog: Catalog


def route_to(side: Side, service: str, now: float) -> tuple[str | None, str | None]:
    """(the next hop's address `side` sends `service`'s messages to, None) or (None, why not)."""
    route = match_route(routes_of(side.catalog), service, None, now)
    if route is None:
        return None, f"no route in {side.namespace} matches service {service!r}"
    nxt = hop(route, service, side.address)
    if nxt is None:
        return None, f"route {route.name!r} in {side.namespace} gives no address for service {service!r}"
    return nxt, None


def configuration(
    frm: Side, from_service: str, to: Side | None, to_service: str, contract: str, now: float
) -> list[Problem]:
    """The problems of a dialog from `from_service` in `frm` to `to_service` in `to` (None: the
    far namespace could not be read; the Kafka layer says why) on `contract`."""
    out: list[Problem] = []
    a = frm.catalog
    sender = a.services.get(from_service)
    if sender is None:
        out.append(
            Problem(
                "service_missing",
                ERROR,
                frm.namespace,
                f"service {from_service!r} is not in {frm.namespace}'s catalog (BEGIN DIALOG fails)",
            )
        )
    if contract not in a.contracts:
        out.append(
            Problem(
                "contract_missing",
                ERROR,
                frm.namespace,
                f"contract {contract!r} is not in {frm.namespace}'s catalog (BEGIN DIALOG fails)",
            )
        )
    if sender is not None:
        out += _queue(frm, sender.queue, "the initiator's replies wait")
    hop_address, why = route_to(frm, to_service, now)
    if hop_address is None:
        out.append(
            Problem(
                "route_missing",
                ERROR,
                frm.namespace,
                f"{why}: messages to it wait in the transmission queue (add a route)",
            )
        )
    elif to is not None and hop_address == frm.address != to.address:
        out.append(
            Problem(
                "route_missing",
                ERROR,
                frm.namespace,
                f"no route in {frm.namespace} leads service {to_service!r} to {to.address}: "
                "AutoCreatedLocal keeps its messages here (add a route)",
            )
        )
    elif to is not None and hop_address != to.address:
        out.append(
            Problem(
                "route_elsewhere",
                WARNING,
                frm.namespace,
                f"{frm.namespace} routes service {to_service!r} to {hop_address}, not to {to.address} "
                "(a forwarding namespace there must pass it on)",
            )
        )
    if to is None:
        return out
    b = to.catalog
    target = b.services.get(to_service)
    if target is None:
        out.append(
            Problem(
                "service_missing",
                ERROR,
                to.namespace,
                f"service {to_service!r} is not in {to.namespace}'s catalog: its messages wait in "
                f"{frm.namespace}'s transmission queue until it is",
            )
        )
    if contract not in b.contracts:
        out.append(
            Problem(
                "contract_missing",
                ERROR,
                to.namespace,
                f"contract {contract!r} is not in {to.namespace}'s catalog (Error {CONTRACT_NOT_FOUND} there)",
            )
        )
    elif target is not None and contract not in target.contracts:
        out.append(
            Problem(
                "contract_not_accepted",
                ERROR,
                to.namespace,
                f"service {to_service!r} does not accept contract {contract!r} (Error "
                f"{CONTRACT_NOT_SUPPORTED}; add it to its contracts)",
            )
        )
    if contract in a.contracts and contract in b.contracts:
        out += _message_types(frm, to, contract)
    if target is not None:
        out += _queue(to, target.queue, "messages to the target wait")
    if to.address != frm.address:
        out += _remote(frm, from_service, to, target, now)
    return out


@dataclass(frozen=True)
class Access:
    """What the cluster's authorizer lets the diagnosing principal do (KIP-430's authorized
    operations): on the target service's queue topic (None: not asked, a routed dialog's sends go
    through the transmission topic) and on the initiator's queue topic; each a set of operation
    names, or None when the authorizer gave no answer (none configured, a topic not there yet)."""

    principal: str
    target_queue: frozenset[str] | None
    initiator_queue: frozenset[str] | None


def access(frm: Side, from_service: str, to_service: str, seen: Access) -> list[Problem]:
    """The grants a dialog from `from_service` needs of the principal that begins it: SEND ON
    SERVICE::to_service (WRITE on its queue's topic, for a dialog within the namespace) and
    RECEIVE ON QUEUE of the initiator's queue (its replies, acknowledgements and EndDialog)."""
    out = []
    who = seen.principal
    if seen.target_queue is not None and not {"WRITE", "ALL"} & seen.target_queue:
        out.append(
            Problem(
                "send_not_permitted",
                ERROR,
                frm.namespace,
                f"{who} may not SEND to service {to_service!r} (no WRITE on its queue's topic; Error "
                f"-8494): GRANT SEND ON SERVICE::{to_service} TO {who}",
            )
        )
    sender = frm.catalog.services.get(from_service)
    if sender is not None and seen.initiator_queue is not None and not {"READ", "ALL"} & seen.initiator_queue:
        out.append(
            Problem(
                "receive_not_permitted",
                ERROR,
                frm.namespace,
                f"{who} may not RECEIVE from queue {sender.queue!r}, where the dialog's replies, "
                f"acknowledgements and EndDialog arrive: GRANT RECEIVE ON QUEUE::{sender.queue} TO {who}",
            )
        )
    return out


def _queue(side: Side, name: str, what: str) -> list[Problem]:
    queue = side.catalog.queues.get(name)
    if queue is None:
        return [Problem("queue_missing", ERROR, side.namespace, f"queue {name!r} is not in {side.namespace}'s catalog")]
    if queue.status != "ON":
        return [
            Problem(
                "queue_disabled",
                ERROR,
                side.namespace,
                f"queue {name!r} is disabled: {what} until `kbroker queue enable {name}`",
            )
        ]
    if queue.activation is not None and queue.activation.status != "ON":
        return [
            Problem(
                "activation_off",
                WARNING,
                side.namespace,
                f"queue {name!r} has activation OFF: its messages wait for a reader started by hand",
            )
        ]
    return []


def _message_types(frm: Side, to: Side, contract: str) -> list[Problem]:
    out = []
    ours = {m.type: m.sent_by for m in frm.catalog.contracts[contract].messages}
    theirs = {m.type: m.sent_by for m in to.catalog.contracts[contract].messages}
    if ours != theirs:
        out.append(
            Problem(
                "contract_differs",
                WARNING,
                to.namespace,
                f"contract {contract!r} differs between the two ends: {frm.namespace} "
                f"{sorted(ours.items())}, {to.namespace} {sorted(theirs.items())} (a message type only "
                "one end lists is refused by the other)",
            )
        )
    for name in sorted(set(ours) & set(theirs)):
        for side in (frm, to):
            if name not in side.catalog.message_types:
                out.append(
                    Problem(
                        "message_type_missing",
                        ERROR,
                        side.namespace,
                        f"message type {name!r} of contract {contract!r} is not in {side.namespace}'s catalog",
                    )
                )
        one, other = frm.catalog.message_types.get(name), to.catalog.message_types.get(name)
        if one is not None and other is not None and one.validation != other.validation:
            out.append(
                Problem(
                    "validation_differs",
                    WARNING,
                    to.namespace,
                    f"message type {name!r} is validated {other.validation} in {to.namespace}, "
                    f"{one.validation} in {frm.namespace}: a message one side takes the other may "
                    "refuse",
                )
            )
    return out


def _remote(frm: Side, from_service: str, to: Side, target: Any, now: float) -> list[Problem]:
    out = []
    back, why = route_to(to, from_service, now)
    if back == to.address:
        back, why = None, f"no route in {to.namespace} leads service {from_service!r} back (AutoCreatedLocal keeps it)"
    if back is None:
        out.append(
            Problem(
                "return_route_missing",
                ERROR,
                to.namespace,
                f"{why}: replies, acknowledgements and the end of the dialog cannot come back "
                f"(add a route to {frm.address})",
            )
        )
    elif back != frm.address:
        out.append(
            Problem(
                "return_route_elsewhere",
                WARNING,
                to.namespace,
                f"{to.namespace} routes service {from_service!r} to {back}, not to {frm.address}",
            )
        )
    senders = getattr(target, "remote_senders", None)
    if senders is not None and parse_address(frm.address)[1] not in senders:
        out.append(
            Problem(
                "sender_not_granted",
                ERROR,
                to.namespace,
                f"service {target.name!r} takes routed messages only from {sorted(senders)}, not from "
                f"{frm.namespace} (Error {NO_PERMISSION}; add it to remote_senders)",
            )
        )
    return out


def describe(problems: list[Problem]) -> str:
    """One line per problem, errors first; a line saying so when there is none."""
    if not problems:
        return "no problems found"
    ordered = sorted(problems, key=lambda p: (p.severity != ERROR, p.where, p.code))
    return "\n".join(
        f"{p.severity.upper():7} {p.code:24} {p.where}: {p.text}"
        + (f"\n{'':33}end it: {p.command}" if p.command else "")
        for p in ordered
    )
