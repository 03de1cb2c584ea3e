"""`kbroker diagnose runtime` and `diagnose conversation` (pure logic): what stops messages in a
namespace now, judged from what the Kafka layer measured (kafka/diagnosis.py): disabled and unread
queues, locks and Kafka transactions held too long, routed messages not acknowledged, an analytics
job behind, one dialog's endpoints. Apart from core/diagnosis.py (CONFIGURATION, what a dialog
needs defined), whose Problem it reports with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kbroker.core.diagnosis import ERROR, WARNING, Problem
from kbroker.core.receive.poison import POISON_THRESHOLD

ANALYTICS_LATE_S = 120.0  # the analytics job's newest figures older than this: it is behind or stopped
TRANSMISSION_LATE_S = 60.0  # an unacknowledged routed message older than this is stuck (docs/sources.md#periodic-tasks)
# A Kafka transaction or a conversation group's lock held longer than this is stuck. kbroker's
# producers' transactions time out after 10 s (the analytics job's after 60 s) and Kafka aborts
# them within its check interval after that: one still open at 120 s outlived its producer's
# timeout. A lock lasts as long as the transaction that RECEIVEd: minutes is a handler stuck.
STUCK_AFTER_S = 120.0
CLOCK_SKEW_S = 300.0  # a timestamp further ahead than this was not written by a clock of ours


@dataclass(frozen=True)
class QueueState:
    """What the Kafka layer measured of one queue (kafka/queue_views.queue_view)."""

    name: str
    status: str  # ON | OFF
    activation: str | None  # None: no activation; "internal ON", "external OFF", ...
    ready: int  # an upper bound (see queue_view)
    readers: int  # members of the queue's consumer group
    locks: tuple[tuple[str, float], ...] = ()  # (process, epoch s its oldest group lock was taken)
    # The message still in the queue rolled back most often lately: ("partition:offset", count).
    rolled_back: tuple[str, int] | None = None


@dataclass(frozen=True)
class OpenTransaction:
    """A Kafka transaction open on a partition of the namespace (kafka/txn/open_transactions.py)."""

    topic: str
    partition: int
    start: int  # the last stable offset: the transaction's first record, where read_committed readers stop
    end: int  # the high watermark
    began: float | None  # epoch s of its first record; None: not read

    def ending(self) -> str:
        return (
            f"kbroker diagnose end-transaction --topic {self.topic} --partition {self.partition} "
            f"--start-offset {self.start}"
        )


def runtime(
    namespace: str,
    queues: list[QueueState],
    transmission: list[dict[str, Any]],
    analytics_as_of: float | None,
    now: float,
    transactions: list[OpenTransaction] | None = None,
    stuck_after: float = STUCK_AFTER_S,
) -> list[Problem]:
    """What stops messages in `namespace` now: disabled queues, messages ready that no reader
    takes, group locks and Kafka transactions held longer than `stuck_after`, routed messages the
    far side has not acknowledged (per destination and status), and an analytics job whose
    figures are old (`analytics_as_of`: epoch s of its newest, None: no job)."""
    out: list[Problem] = _hanging(namespace, transactions or [], now, stuck_after)
    for q in sorted(queues, key=lambda q: q.name):
        for process, since in q.locks:
            if since > 0 and now - since >= stuck_after:
                out.append(
                    Problem(
                        "lock_held",
                        WARNING,
                        namespace,
                        f"queue {q.name!r}: process {process} has held a conversation group's lock for "
                        f"{now - since:.0f} s: a transaction that received and has not ended (its handler "
                        "stuck or waiting); no other reader takes the group until it commits or rolls back",
                    )
                )
        if q.rolled_back is not None and q.status == "ON":
            where, count = q.rolled_back
            out.append(
                Problem(
                    "message_rolling_back",
                    WARNING,
                    namespace,
                    f"queue {q.name!r}: message {where} rolled back {count} time(s) lately (at "
                    f"{POISON_THRESHOLD} in a row the queue is disabled): a handler failing on it",
                )
            )
        if q.status != "ON":
            out.append(
                Problem(
                    "queue_disabled",
                    ERROR,
                    namespace,
                    f"queue {q.name!r} is disabled with {q.ready} message(s) in it: RECEIVE fails until "
                    f"`kbroker queue enable {q.name}` (a poisoned queue: see `kbroker events`)",
                )
            )
        elif q.ready > 0 and q.readers == 0:
            if q.activation is not None and q.activation.endswith(" ON"):
                why = "activation is ON but nothing reads: is a worker (or the external activator) running?"
            else:
                why = "no reader, and no activation to start one"
            out.append(
                Problem(
                    "queue_unread", WARNING, namespace, f"queue {q.name!r}: up to {q.ready} message(s) ready; {why}"
                )
            )
    stuck: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in transmission:
        if now - float(row.get("enqueue_time") or now) >= TRANSMISSION_LATE_S or row.get("transmission_status"):
            key = (row.get("destination") or row.get("to_service_name") or "?", row.get("transmission_status") or "")
            stuck.setdefault(key, []).append(row)
    for (dest, status), rows in sorted(stuck.items()):
        oldest = now - min(float(r.get("enqueue_time") or now) for r in rows)
        dialogs = len({r.get("conversation_handle") for r in rows})
        out.append(
            Problem(
                "transmission_waiting",
                ERROR if status else WARNING,
                namespace,
                f"{len(rows)} routed message(s) of {dialogs} dialog(s) to {dest} unacknowledged, the oldest "
                f"{oldest:.0f} s: {status or 'no status yet (not sent, or sent and not answered)'}",
            )
        )
    if analytics_as_of is not None and now - analytics_as_of > ANALYTICS_LATE_S:
        out.append(
            Problem(
                "analytics_behind",
                WARNING,
                namespace,
                f"the analytics job's newest figures are {now - analytics_as_of:.0f} s old: it is stopped "
                "or behind (`kbroker analytics run`; its --metrics-port says which)",
            )
        )
    return out


# What each state of an endpoint means for its dialog, when it is not simply going on.
_STATES = {
    "DI": (
        "conversation_ended_there",
        WARNING,
        "the far side ended the dialog: RECEIVE its EndDialog and END CONVERSATION here, or the endpoint stays",
    ),
    "DO": (
        "conversation_ending",
        WARNING,
        "this side ended the dialog and waits for the far side to end it too "
        "(its acknowledgement); nothing more can be sent",
    ),
    "ER": (
        "conversation_error",
        ERROR,
        "the dialog ended with an error (an Error message is in the queue): RECEIVE it and END CONVERSATION here",
    ),
    "CD": ("conversation_closed", WARNING, "the dialog is closed: SEND fails, and what arrives for it is set aside"),
}


def conversation(
    namespace: str,
    endpoints: list[dict[str, Any]],
    queues: list[QueueState],
    transmission: list[dict[str, Any]],
    now: float,
    stuck_after: float = STUCK_AFTER_S,
) -> list[Problem]:
    """What stops one dialog: `endpoints` are its endpoints in this namespace (one, or both sides
    when both services are here: dicts with conversation_handle, state, lifetime (epoch s or
    None), service_name, is_initiator), `queues` their services' queues, `transmission` its
    routed messages not acknowledged."""
    if not endpoints:
        return [
            Problem(
                "conversation_not_found",
                ERROR,
                namespace,
                "no endpoint of this dialog here: never begun in this namespace, or ended and cleaned up "
                "(a closed endpoint is kept for the worker's --closed-grace)",
            )
        ]
    out: list[Problem] = []
    for ep in endpoints:
        side = f"{'initiator' if ep['is_initiator'] else 'target'} {ep['conversation_handle']} ({ep['service_name']})"
        if ep["state"] in _STATES:
            code, severity, text = _STATES[ep["state"]]
            out.append(Problem(code, severity, namespace, f"{side}: {text}"))
        elif ep.get("lifetime") is not None and ep["lifetime"] <= now:
            out.append(
                Problem(
                    "conversation_expired",
                    ERROR,
                    namespace,
                    f"{side}: its lifetime ran out {now - ep['lifetime']:.0f} s ago; the worker's timer "
                    "service ends it with an error (is one running?)",
                )
            )
    return out + runtime(namespace, queues, transmission, None, now, stuck_after=stuck_after)


def _hanging(namespace: str, transactions: list[OpenTransaction], now: float, stuck_after: float) -> list[Problem]:
    out = []
    for t in transactions:
        where = f"{t.topic} partition {t.partition}"
        held = f"{t.end - t.start} record(s) from offset {t.start} on wait for it (read_committed readers stop there)"
        if t.began is None or t.began > now + CLOCK_SKEW_S:
            out.append(
                Problem(
                    "transaction_open",
                    WARNING,
                    namespace,
                    f"{where}: a Kafka transaction is open, since when is not known (its first record "
                    f"is unreadable or stamped ahead); {held}. Still open with the same offset a few "
                    "minutes on, it is hanging",
                    t.ending(),
                )
            )
        elif now - t.began >= stuck_after:
            out.append(
                Problem(
                    "transaction_hanging",
                    ERROR,
                    namespace,
                    f"{where}: a Kafka transaction open for {now - t.began:.0f} s, past any kbroker "
                    f"producer's transaction timeout (its producer gone, or the broker lost track of "
                    f"it: a one-node cluster stopped with controlled shutdown as it committed); {held}",
                    t.ending(),
                )
            )
    return out
