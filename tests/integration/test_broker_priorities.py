"""CREATE BROKER PRIORITY on the real broker: endpoints get their priority when created and keep
it, RECEIVE takes the groups of higher-priority conversations first on both sides of a dialog,
and across namespaces the far side orders by its own priorities."""

from __future__ import annotations

import time
from pathlib import Path

from kbroker.kafka.catalog.apply import apply_paths
from kbroker.sdk.broker import Broker
from tests.helpers import invariants as inv
from tests.integration.test_routing import CLIENT, CONTRACT, REQUEST, SERVER, receive_all, two_namespaces

VIP = "//kbroker/test/Vip"


def receive_groups(b: Broker, queue: str, n: int) -> list:
    """n messages, one RECEIVE (one group) at a time, after the queue's whole backlog is read:
    a first RECEIVE rolled back leaves the receiver holding every partition's records."""
    tx = b.transaction()
    assert tx.receive(queue, top=1, wait=30)
    time.sleep(3)  # the receiver fetches the rest meanwhile
    tx.rollback()
    got: list = []
    deadline = time.monotonic() + 60
    while len(got) < n and time.monotonic() < deadline:
        got += b.receive(queue, top=1, wait=1)
    return got


def test_receive_takes_higher_priority_conversations_first_on_both_sides(kafka_bootstrap, namespace, tmp_path: Path):
    extra = tmp_path / "vip.yaml"
    extra.write_text(
        f"""
services:
  - {{name: '{VIP}', queue: ReplyQueue, contracts: ['{inv.CONTRACT}']}}
broker_priorities:
  - {{name: VipRequests, contract: '{inv.CONTRACT}', local_service: '{inv.SERVER}', remote_service: '{VIP}', priority: 9}}
  - {{name: VipReplies, local_service: '{VIP}', priority: 8}}
  - {{name: Everyone, priority: 3}}
"""
    )
    apply_paths(kafka_bootstrap, namespace, [inv.YAML, extra])
    with Broker(kafka_bootstrap, namespace) as b:
        plain = [b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT) for _ in range(6)]
        vip = [b.begin_dialog(VIP, inv.SERVER, inv.CONTRACT) for _ in range(6)]
        assert {b.endpoints.current(h).priority for h in vip} == {8}
        assert {b.endpoints.current(h).priority for h in plain} == {3}  # Everyone: ANY, ANY, ANY
        for h in plain + vip:  # the plain ones first: older, yet received last
            b.send(h, inv.REQUEST, {"h": h})
        requests = receive_groups(b, "RequestQueue", 12)
        assert [m.priority for m in requests] == [9] * 6 + [3] * 6
        assert {orjson_h(m) for m in requests[:6]} == set(vip)
        targets = {m.conversation_handle: b.endpoints.current(m.conversation_handle) for m in requests}
        assert sorted(ep.priority for ep in targets.values()) == [3] * 6 + [9] * 6
        # The catalog changes: new endpoints get the new level, existing ones keep theirs.
        later = tmp_path / "later.yaml"
        later.write_text("broker_priorities:\n  - {name: Everyone, priority: 2}\n")
        apply_paths(kafka_bootstrap, namespace, [later])
        b.refresh_catalog()
        assert b.endpoints.current(b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT)).priority == 2
        with b.transaction() as tx:
            for m in reversed(requests):  # plain replies sent first
                tx.send(m.conversation_handle, inv.REPLY, {"h": orjson_h(m)})
        replies = receive_groups(b, "ReplyQueue", 12)
        assert [m.priority for m in replies] == [8] * 6 + [3] * 6
        assert {m.conversation_handle for m in replies[:6]} == set(vip)


def orjson_h(m) -> str:
    import orjson

    return str(orjson.loads(m.body)["h"])


def test_the_far_namespace_orders_by_its_own_priorities(kafka_bootstrap, namespace, tmp_path: Path):
    a, b = namespace + "a", namespace + "b"
    with two_namespaces(kafka_bootstrap, tmp_path, a, b) as (ba, bb, _services):
        mine = tmp_path / "b-priorities.yaml"
        mine.write_text(
            f"broker_priorities:\n  - {{name: FromClient, local_service: '{SERVER}', remote_service: '{CLIENT}', "
            "priority: 7}\n"
        )
        apply_paths(kafka_bootstrap, b, [tmp_path / f"{b}.yaml", mine])  # references are checked within a load
        bb.refresh_catalog()
        h = ba.begin_dialog(CLIENT, SERVER, CONTRACT)
        assert ba.endpoints.current(h).priority == 5  # A has no priorities
        ba.send(h, REQUEST, {"i": 0})
        ba.send(h, REQUEST, {"i": 1}, priority=2)  # SEND's own priority: B's priority replaces it too
        got = receive_all(bb, 2)
        assert [m.priority for m in got] == [7, 7]
        assert bb.endpoints.current(got[0].conversation_handle).priority == 7
