"""What the scenarios share: the sample service's names, bodies and headers in kbroker's wire
format, the backlog writer, and small helpers.

Each scenario measures kbroker and a plain confluent-kafka baseline doing the same job, in the
same repetition, on the same broker, in fresh namespaces with topics/samples applied
(ExpenseQueue has 4 partitions). Bodies are 100-byte JSON expense claims.

Records written by the harness itself (requests, backlogs) are kbroker's wire format: key = the
receiving side's conversation group, headers from kbroker.core.dialogs.envelope.Envelope. A request is the
first (or next) message of a dialog from //Adventure-Works.com/Employees to
//Adventure-Works.com/Expenses on the ExpenseSubmission contract, as Broker.send would write it.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable

import orjson

from kbroker.bench.registry import Skip
from kbroker.core.dialogs.envelope import Envelope
from kbroker.kafka.baseline import Delivery, fast_producer
from kbroker.kafka.clients import produce
from kbroker.sdk.broker import Broker

if TYPE_CHECKING:
    from kbroker.bench.harness import BenchContext

EMP = "//Adventure-Works.com/Employees"
EXP = "//Adventure-Works.com/Expenses"
CONTRACT = "//Adventure-Works.com/Expenses/ExpenseSubmission"
CLAIM = "//Adventure-Works.com/Expenses/ExpenseClaim"
APPROVAL = "//Adventure-Works.com/Expenses/ExpenseApproval"
QUEUE, REPLY_QUEUE = "ExpenseQueue", "EmployeeQueue"

NOT_IMPLEMENTED = "transactions not implemented"
IO_DELAY = 0.005  # io-bound and transport-io-bound: what the handler awaits per message


def json_body(size: int = 100, **fields: Any) -> bytes:
    """A JSON object of exactly `size` bytes (ExpenseClaim and ExpenseApproval validate JSON)."""
    head = orjson.dumps({**fields, "pad": ""})[:-2]  # ... "pad":"
    pad = size - len(head) - 2
    if pad < 0:
        raise ValueError(f"a {size}-byte body cannot hold {fields}")
    body = head + b"x" * pad + b'"}'
    assert len(body) == size
    return body


def claim_body(size: int) -> bytes:
    """An ExpenseClaim body of `size` bytes."""
    return json_body(size, amount=12.5, currency="EUR", employee="E-1042")


def approval_body(size: int) -> bytes:
    """An ExpenseApproval body of `size` bytes."""
    return json_body(size, approved=True, by="expenses")


def has_transactions() -> bool:
    """Whether this kbroker's Broker has transactions (the scenarios that need them skip otherwise)."""
    return hasattr(Broker, "transaction")


# --- records in kbroker's wire format --------------------------------------------------------


# Headers as Producer.produce types them (a wider list than kbroker's (name, bytes) pairs).
WireHeaders = list[tuple[str, str | bytes | None]]


def _headers(
    conversation_id: str, seq: int, message_type: str, sender: str, receiver: str, to_side: str
) -> WireHeaders:
    # Keyed and grouped by the conversation id, as the baseline's records are: the form of a
    # dialog begun when a dialog's id was its default group, which receivers still take.
    return list(
        Envelope(
            message_id=str(uuid.uuid4()),
            conversation_id=conversation_id,
            conversation_group_id=conversation_id,
            message_sequence_number=seq,
            message_type_name=message_type,
            service_contract_name=CONTRACT,
            from_service_name=sender,
            to_service_name=receiver,
            to_side=to_side,
        ).headers()
    )


def claim_headers(conversation_id: str, seq: int) -> WireHeaders:
    """Headers of the seq-th ExpenseClaim of a dialog, as the initiator's SEND writes them."""
    return _headers(conversation_id, seq, CLAIM, EMP, EXP, "TARGET")


def approval_headers(conversation_id: str, seq: int) -> WireHeaders:
    """Headers of the seq-th ExpenseApproval, sent back by the target."""
    return _headers(conversation_id, seq, APPROVAL, EXP, EMP, "INITIATOR")


# What a backlog's i-th record is: (key, value, headers).
BacklogRecord = tuple[str | bytes, bytes | None, WireHeaders]


def write_backlog(ctx: BenchContext, topic: str, total: int, label: str, record: Callable[[int], BacklogRecord]) -> int:
    """Write `total` records, record(0) to record(total - 1), to `topic` with a fast producer (not
    timed). Returns the bytes written, taking every record to be the size of the first (key +
    value + headers)."""
    producer, delivery = fast_producer(ctx.cluster), Delivery()
    written = 0
    with ctx.reporter.bar(label, total) as advance:
        for i in range(total):
            key, value, hs = record(i)
            if i == 0:
                written = len(key) + len(value or b"") + sum(len(k) + len(v or b"") for k, v in hs)
            produce(producer, topic, key=key, value=value, headers=hs, on_delivery=delivery)
            if i % 10_000 == 9_999:
                producer.poll(0)
                advance(10_000)
        advance(total % 10_000)
        delivery.check(producer.flush(300))
    return written * total


def produce_dialogs(
    ctx: BenchContext,
    topic: str,
    conversations: list[str],
    per_conversation: int,
    body: bytes,
    label: str,
    total: int | None = None,
) -> int:
    """Write a backlog of ExpenseClaims: round-robin over the dialogs, each dialog's messages in
    sequence order. Returns the bytes written (key + value + headers)."""
    total = total if total is not None else len(conversations) * per_conversation

    def claim(i: int) -> BacklogRecord:
        conv = conversations[i % len(conversations)]
        return conv, body, claim_headers(conv, i // len(conversations))

    return write_backlog(ctx, topic, total, label, claim)


def new_conversations(n: int) -> list[str]:
    """`n` new conversation ids."""
    return [str(uuid.uuid4()) for _ in range(n)]


def sides(rep: int) -> tuple[str, str]:
    """Which side goes first alternates between repetitions."""
    return ("kbroker", "baseline") if rep % 2 == 0 else ("baseline", "kbroker")


def side_by_side(rep: int, measure: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """A row of both sides, measured in this repetition's order: {side: value, side_detail: ...}."""
    row: dict[str, Any] = {}
    for side in sides(rep):
        m = measure(side)
        row[side], row[f"{side}_detail"] = m["value"], m["detail"]
    return row


def details(out: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A summarised row's kbroker and baseline details ({} for a side without one)."""
    return out.get("kbroker_detail") or {}, out.get("baseline_detail") or {}


def cpu_summary(out: dict[str, Any]) -> str:
    """The CPU time per message of both sides (their details' median cpu_ms_per_msg), for a
    row's summary; empty when neither measured it."""
    k, b = details(out)
    kc, bc = k.get("cpu_ms_per_msg"), b.get("cpu_ms_per_msg")
    if kc is None and bc is None:
        return ""
    ratio = f" ({kc / bc:.2f}x)" if kc and bc else ""
    return f"CPU ms/msg: kbroker {kc}, baseline {bc}{ratio}"


def join_all(threads: list[threading.Thread], timeout: float) -> bool:
    """Join with one deadline for all; True when every thread ended."""
    deadline = time.monotonic() + timeout
    for t in threads:
        if t.ident is not None:
            t.join(max(0.0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in threads)


def percentile(values: list[float], pct: float) -> float | None:
    """The `pct` percentile of `values` (inclusive method); None when there are none."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(pct) - 1]


def need_transactions(_ctx: BenchContext) -> None:
    """A scenario's setup: skip it when the Broker has no transactions."""
    if not has_transactions():
        raise Skip(NOT_IMPLEMENTED)
