"""Dialog timers and dialog lifetimes: BEGIN CONVERSATION TIMER and LIFETIME.

Kafka has no delayed delivery, so a timer is a record in the compacted timers topic, written in
the transaction that armed it, and a timer service fires it:

    timer:<handle>:<arm id>     a DialogTimer for one side (its own queue only; the peer is never told)
    lifetime:<conversation id>  an Error -8489 for each side still open when the lifetime ends

Each arm of a dialog timer has its own key, and re-arming tombstones the previous key in the same
transaction. A firing therefore never races a re-arm for the same key: compaction keeps exactly
the live arms. The service fires a timer by one Kafka transaction holding the system message,
the timer's tombstone, and the timers consumer group's offsets; sending those offsets fences a
service instance that lost the partition (KIP-447), so a timer fires once.

The service instances share the topic's partitions through a consumer group. On assignment an
instance reads its partitions from the beginning (a compacted topic holds one record per armed
timer) into a TimerSchedule; it keeps all armed timers of its partitions in memory.
"""

from __future__ import annotations

from typing import Any

import orjson

from kbroker.core import names
from kbroker.core.catalog.models import DIALOG_TIMER
from kbroker.core.catalog.models import ERROR as ERROR_TYPE
from kbroker.core.dialogs.conversation_endpoint import CLOSED, STARTED_OUTBOUND, Endpoint, handle_for, other
from kbroker.core.dialogs.envelope import SYSTEM_SEQUENCE, Envelope, error_body
from kbroker.core.ids import new_id
from kbroker.core.records import Record
from kbroker.core.rejected import Rejected, json_object, text_key

LIFETIME_EXPIRED = -8489  # Service Broker's system error code for an expired dialog lifetime


def timer_key(handle: str, arm_id: str) -> str:
    return f"timer:{handle}:{arm_id}"


def lifetime_key(conversation_id: str) -> str:
    return f"lifetime:{conversation_id}"


def arm_record(namespace: str, ep: Endpoint, arm_id: str, due: float, queue_topic: str) -> Record:
    """The record arming a DialogTimer for endpoint `ep`, delivered to its own queue."""
    value = {
        "kind": "timer",
        "due": due,
        "conversation_id": ep.conversation_id,
        "side": ep.side,
        "contract": ep.service_contract_name,
        "service": ep.service_name,
        "far_service": ep.far_service_name,
        "topic": queue_topic,
        "key": ep.conversation_group_id,
    }
    return (names.timers_topic(namespace), timer_key(ep.conversation_handle, arm_id), orjson.dumps(value), None)


def disarm_record(namespace: str, ep: Endpoint) -> Record | None:
    if not ep.dialog_timer_id:
        return None
    return (names.timers_topic(namespace), timer_key(ep.conversation_handle, ep.dialog_timer_id), None, None)


def lifetime_record(namespace: str, ep: Endpoint, initiator_topic: str | None, target_topic: str | None) -> Record:
    """Written with BEGIN DIALOG ... LIFETIME: the Error -8489 for both sides when it runs out.
    A side whose topic is None lives in another namespace, whose own timer tells it."""
    return _lifetime(
        namespace,
        ep.conversation_id,
        ep.lifetime,
        ep.service_contract_name,
        (ep.service_name, initiator_topic, ep.conversation_group_id),
        (ep.far_service_name, target_topic, ep.far_conversation_group_id),
    )


def _lifetime(
    namespace: str,
    conversation_id: str,
    due: int | None,
    contract: str,
    initiator: tuple[str, str | None, str],
    target: tuple[str, str | None, str],
) -> Record:
    """The lifetime's timer record; each side is (service, topic or None, key)."""
    value = {
        "kind": "lifetime",
        "due": due,
        "conversation_id": conversation_id,
        "contract": contract,
        **{
            side: {"service": service, "topic": topic, "key": key}
            for side, (service, topic, key) in (("INITIATOR", initiator), ("TARGET", target))
        },
    }
    return (names.timers_topic(namespace), lifetime_key(conversation_id), orjson.dumps(value), None)


def system_message(
    conversation_id: str,
    side: str,
    contract: str,
    to_service: str,
    from_service: str,
    topic: str,
    key: str,
    message_type: str,
    body: bytes,
) -> Record:
    """A message kbroker itself delivers to one side (`side`, of `to_service`) of a dialog: a
    DialogTimer or an Error, keyed `key` (that side's group) on its queue's `topic`."""
    env = Envelope(
        message_id=new_id(),
        conversation_id=conversation_id,
        conversation_group_id=key,
        message_sequence_number=SYSTEM_SEQUENCE,
        message_type_name=message_type,
        service_contract_name=contract,
        from_service_name=from_service,
        to_service_name=to_service,
        to_side=side,
    )
    return (topic, key, body, env.headers())


def firing_records(value: dict[str, Any], endpoint: Any) -> list[Record]:
    """The system messages a due timer delivers. `endpoint(handle)` gives an endpoint or None;
    sides whose endpoint is closed or gone get nothing."""
    conv = value["conversation_id"]
    if value["kind"] == "timer":
        ep = endpoint(handle_for(conv, value["side"]))
        if ep is None or ep.state == CLOSED:
            return []
        return [
            system_message(
                conv,
                value["side"],
                value["contract"],
                value["service"],
                value["far_service"],
                value["topic"],
                value["key"],
                DIALOG_TIMER,
                b"",
            )
        ]
    initiator = endpoint(handle_for(conv, "INITIATOR"))
    target = endpoint(handle_for(conv, "TARGET"))
    body = error_body(LIFETIME_EXPIRED, "The conversation lifetime has expired.")
    out = []
    for side, ep in (("INITIATOR", initiator), ("TARGET", target)):
        open_here = ep is not None and ep.state != CLOSED
        # A target without an endpoint yet still gets the Error if the initiator sent it anything:
        # it arrives after those messages and closes the dialog there too.
        unseen_target = (
            side == "TARGET"
            and ep is None
            and initiator is not None
            and initiator.state not in (STARTED_OUTBOUND, CLOSED)
        )
        if (open_here or unseen_target) and value[side]["topic"] is not None:
            me, peer = value[side], value[other(side)]
            out.append(
                system_message(
                    conv,
                    side,
                    value["contract"],
                    me["service"],
                    peer["service"],
                    me["topic"],
                    me["key"],
                    ERROR_TYPE,
                    body,
                )
            )
    return out


def target_lifetime_record(namespace: str, env: Envelope, target_topic: str) -> Record:
    """The lifetime of a dialog begun in another namespace, armed where its first message is saved:
    the Error -8489 for the target side here (the initiator's namespace tells its own side)."""
    return _lifetime(
        namespace,
        env.conversation_id,
        env.lifetime,
        env.service_contract_name,
        (env.from_service_name, None, env.reply_group or env.conversation_id),
        (env.to_service_name, target_topic, env.conversation_group_id),
    )


def timer_key_of(key: bytes | None, value: bytes | None) -> str:
    """A timers record's key as text, else Rejected; a tombstone's whatever its bytes (it removes
    at most a timer of that key)."""
    return key.decode(errors="replace") if value is None and key is not None else text_key(key)


def timer_value(namespace: str, raw: bytes | None) -> dict[str, Any]:
    """A timers record's value as `firing_records` reads it, else Rejected: anyone who may write
    the topic must not make the timer service write elsewhere than this namespace's queues."""
    return timer_fields(namespace, json_object(raw))


def timer_fields(namespace: str, value: dict[str, Any]) -> dict[str, Any]:
    """timer_value's checks of a value already parsed."""
    due = value.get("due")
    if not isinstance(due, (int, float)) or isinstance(due, bool) or not isinstance(value.get("conversation_id"), str):
        raise Rejected("a timer needs 'due' (a number) and 'conversation_id'")
    if value.get("kind") == "timer":
        sides: list[Any] = [value]
        if value.get("side") not in ("INITIATOR", "TARGET") or not all(
            isinstance(value.get(k), str) for k in ("contract", "service", "far_service")
        ):
            raise Rejected("a dialog timer needs 'side', 'contract', 'service' and 'far_service'")
    elif value.get("kind") == "lifetime":
        sides = [value.get("INITIATOR"), value.get("TARGET")]
        if not isinstance(value.get("contract"), str) or not all(
            isinstance(s, dict) and isinstance(s.get("service"), str) for s in sides
        ):
            raise Rejected("a lifetime needs 'contract' and each side's 'service'")
    else:
        raise Rejected("'kind' is neither timer nor lifetime")
    for side in sides:
        topic = side.get("topic")
        if topic is None and value["kind"] == "lifetime":
            continue  # a side in another namespace
        if (
            not isinstance(topic, str)
            or names.queue_of_topic(namespace, topic) is None
            or not isinstance(side.get("key"), str)
        ):
            raise Rejected(f"topic {topic!r} is not a queue of namespace {namespace}")
    return value
