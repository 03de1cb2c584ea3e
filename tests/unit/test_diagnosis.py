"""The configuration checks of `kbroker diagnose` (core/diagnosis.py) on catalogs built here: each
problem is named by its code, at the namespace whose catalog to change, and a working pair has
none."""

from __future__ import annotations

from kbroker.core.catalog.models import Catalog
from kbroker.core.diagnosis import ERROR, WARNING, Side, configuration, describe

A, B = "127.0.0.1:9092/a", "127.0.0.1:9092/b"
CONTRACT = "//C"


def catalog(
    ns: str,
    *,
    services: list[dict],
    routes: list[dict] = (),
    queue: dict | None = None,
    types: dict | None = None,
    contract: list[dict] | None = None,
) -> Catalog:
    types = types if types is not None else {"//Req": "JSON", "//Rep": "NONE"}
    return Catalog.model_validate(
        {
            "namespace": ns,
            "message_types": {n: {"name": n, "validation": v} for n, v in types.items()},
            "contracts": {
                CONTRACT: {
                    "name": CONTRACT,
                    "messages": contract
                    or [{"type": "//Req", "sent_by": "INITIATOR"}, {"type": "//Rep", "sent_by": "TARGET"}],
                }
            },
            "queues": {"Q": {"name": "Q", **(queue or {})}},
            "services": {s["name"]: {"queue": "Q", **s} for s in services},
            "routes": {r["name"]: r for r in routes},
        }
    )


def pair(a_kw: dict | None = None, b_kw: dict | None = None) -> tuple[Side, Side]:
    a = catalog(
        "a",
        services=[{"name": "//From"}],
        routes=[{"name": "ToB", "service_name": "//To", "address": "kafka://127.0.0.1:9092/b"}],
        **(a_kw or {}),
    )
    b = catalog(
        "b",
        services=[{"name": "//To", "contracts": [CONTRACT]}],
        routes=[{"name": "ToA", "service_name": "//From", "address": "kafka://127.0.0.1:9092/a"}],
        **(b_kw or {}),
    )
    return Side("a", A, a), Side("b", B, b)


def codes(problems) -> dict[str, tuple[str, str]]:
    return {p.code: (p.severity, p.where) for p in problems}


def check(frm: Side, to: Side | None, **kw) -> dict[str, tuple[str, str]]:
    return codes(
        configuration(
            frm,
            kw.get("from_service", "//From"),
            to,
            kw.get("to_service", "//To"),
            kw.get("contract", CONTRACT),
            1_000.0,
        )
    )


def test_a_working_pair_has_no_problem():
    a, b = pair()
    assert check(a, b) == {}
    assert describe([]) == "no problems found"


def test_services_and_contracts_missing_on_either_side():
    a, b = pair()
    assert check(a, b, from_service="//Nobody") == {
        "service_missing": (ERROR, "a"),
        "return_route_missing": (ERROR, "b"),
    }  # routes name //From
    assert check(a, b, to_service="//Nobody") == {"service_missing": (ERROR, "b"), "route_missing": (ERROR, "a")}
    assert sorted((p.code, p.where) for p in configuration(a, "//From", b, "//To", "//Other", 1_000.0)) == [
        ("contract_missing", "a"),
        ("contract_missing", "b"),
    ]
    a2, b2 = pair(b_kw={"contract": [{"type": "//Req", "sent_by": "INITIATOR"}]})
    assert check(a2, b2) == {"contract_differs": (WARNING, "b")}


def test_a_target_that_does_not_accept_the_contract_or_the_sender():
    a, _ = pair()
    b = Side(
        "b",
        B,
        catalog(
            "b",
            services=[{"name": "//To", "contracts": [], "remote_senders": ["c"]}],
            routes=[{"name": "ToA", "service_name": "//From", "address": "kafka://127.0.0.1:9092/a"}],
        ),
    )
    assert check(a, b) == {"contract_not_accepted": (ERROR, "b"), "sender_not_granted": (ERROR, "b")}


def test_routes_missing_either_way_or_leading_elsewhere():
    a, b = pair()
    no_route = Side("a", A, catalog("a", services=[{"name": "//From"}]))
    assert check(no_route, b) == {"route_missing": (ERROR, "a")}  # AutoCreatedLocal keeps it in a
    elsewhere = Side(
        "a",
        A,
        catalog(
            "a",
            services=[{"name": "//From"}],
            routes=[{"name": "ToC", "service_name": "//To", "address": "kafka://127.0.0.1:9092/c"}],
        ),
    )
    assert check(elsewhere, b) == {"route_elsewhere": (WARNING, "a")}
    no_return = Side("b", B, catalog("b", services=[{"name": "//To", "contracts": [CONTRACT]}]))
    assert check(a, no_return) == {"return_route_missing": (ERROR, "b")}
    # The far end could not be read: only the near side's problems.
    assert check(a, None) == {}


def test_queues_message_types_and_validation():
    a, b = pair(b_kw={"queue": {"status": "OFF"}})
    assert check(a, b) == {"queue_disabled": (ERROR, "b")}
    a, b = pair(a_kw={"queue": {"activation": {"status": "OFF", "procedure": "m:f"}}})
    assert check(a, b) == {"activation_off": (WARNING, "a")}
    a, b = pair(b_kw={"types": {"//Req": "NONE", "//Rep": "NONE"}})
    assert check(a, b) == {"validation_differs": (WARNING, "b")}
    text = describe(
        configuration(
            *pair(b_kw={"queue": {"status": "OFF"}})[:1],
            "//From",
            pair(b_kw={"queue": {"status": "OFF"}})[1],
            "//To",
            CONTRACT,
            1_000.0,
        )
    )
    assert text.startswith("ERROR") and "queue_disabled" in text and "kbroker queue enable Q" in text


# --- RUNTIME ----------------------------------------------------------------------------------

from kbroker.core.runtime_diagnosis import ANALYTICS_LATE_S, TRANSMISSION_LATE_S, QueueState, runtime  # noqa: E402

NOW = 10_000.0


def test_runtime_names_disabled_and_unread_queues_only():
    queues = [
        QueueState("Off", "OFF", None, 4, 1),
        QueueState("Idle", "ON", None, 0, 0),
        QueueState("Busy", "ON", "internal ON", 9, 2),
        QueueState("Stuck", "ON", "internal ON", 5, 0),
        QueueState("Manual", "ON", "internal OFF", 2, 0),
    ]
    got = {(p.code, p.text.split("'")[1]): p.severity for p in runtime("ns", queues, [], None, NOW)}
    assert got == {
        ("queue_disabled", "Off"): ERROR,
        ("queue_unread", "Stuck"): WARNING,
        ("queue_unread", "Manual"): WARNING,
    }
    texts = {p.text.split("'")[1]: p.text for p in runtime("ns", queues, [], None, NOW)}
    assert "is a worker" in texts["Stuck"] and "no activation" in texts["Manual"]


def test_runtime_groups_unacknowledged_messages_per_destination_and_status():
    def row(handle, age, status="", dest="h:1/far"):
        return {
            "conversation_handle": handle,
            "enqueue_time": NOW - age,
            "transmission_status": status,
            "destination": dest,
        }

    rows = [
        row("d1", 5),
        row("d1", 3, "Connection to h:1/far failed"),
        row("d2", 90, "Connection to h:1/far failed"),
        row("d3", TRANSMISSION_LATE_S + 1, dest=None),
        row("d4", 1, dest=None),
    ]
    got = [(p.code, p.severity, p.text) for p in runtime("ns", [], rows, None, NOW)]
    assert len(got) == 2
    failed = next(t for c, s, t in got if s == ERROR)
    assert failed.startswith("2 routed message(s) of 2 dialog(s) to h:1/far unacknowledged, the oldest 90 s")
    assert failed.endswith("Connection to h:1/far failed")
    late = next(t for c, s, t in got if s == WARNING)  # d4 is young and has no status: not yet a problem
    assert late.startswith("1 routed message(s) of 1 dialog(s) to ? unacknowledged, the oldest 61 s")


def test_runtime_says_when_the_analytics_job_is_behind():
    assert runtime("ns", [], [], NOW - ANALYTICS_LATE_S, NOW) == []
    late = runtime("ns", [], [], NOW - ANALYTICS_LATE_S - 1, NOW)
    assert [(p.code, p.severity) for p in late] == [("analytics_behind", WARNING)]
    assert runtime("ns", [], [], None, NOW) == []  # no job: nothing to say


from kbroker.core.runtime_diagnosis import CLOCK_SKEW_S, STUCK_AFTER_S, OpenTransaction  # noqa: E402


def test_a_transaction_open_past_the_bound_is_hanging_and_its_ending_is_named():
    young = OpenTransaction("kbroker.ns.queue.Q", 0, 7, 9, NOW - STUCK_AFTER_S + 1)
    old = OpenTransaction("kbroker.ns.queue.Q", 1, 40, 45, NOW - STUCK_AFTER_S)
    got = runtime("ns", [], [], None, NOW, [young, old])
    assert [(p.code, p.severity) for p in got] == [("transaction_hanging", ERROR)]
    assert got[0].text.startswith("kbroker.ns.queue.Q partition 1: a Kafka transaction open for 120 s")
    assert "5 record(s) from offset 40 on wait for it" in got[0].text
    assert (
        got[0].command == "kbroker diagnose end-transaction --topic kbroker.ns.queue.Q --partition 1 --start-offset 40"
    )
    assert runtime("ns", [], [], None, NOW, [young], stuck_after=0.5)[0].code == "transaction_hanging"
    assert "end it: kbroker diagnose end-transaction" in describe(got)


def test_a_transaction_of_unknown_or_future_start_is_named_open_not_hanging():
    unknown = OpenTransaction("t", 0, 1, 2, None)
    ahead = OpenTransaction("t", 1, 1, 2, NOW + CLOCK_SKEW_S + 1)  # a forged timestamp
    near = OpenTransaction("t", 2, 1, 2, NOW + 5)  # a clock a little ahead: young
    got = runtime("ns", [], [], None, NOW, [unknown, ahead, near])
    assert [(p.code, p.severity, p.text.split(":")[0]) for p in got] == [
        ("transaction_open", WARNING, "t partition 0"),
        ("transaction_open", WARNING, "t partition 1"),
    ]
    assert all(p.command for p in got)


def test_a_group_lock_held_past_the_bound_is_named_with_its_process():
    q = QueueState("Q", "ON", None, 3, 1, (("p1", NOW - STUCK_AFTER_S - 3), ("p2", NOW - 5), ("p3", NOW + 60)))
    got = runtime("ns", [q], [], None, NOW)
    assert [(p.code, p.severity) for p in got] == [("lock_held", WARNING)]
    assert got[0].text.startswith("queue 'Q': process p1 has held a conversation group's lock for 123 s")


from kbroker.core.runtime_diagnosis import conversation  # noqa: E402


def endpoint(state, lifetime=None, initiator=True):
    return {
        "conversation_handle": "h1" if initiator else "h2",
        "state": state,
        "lifetime": lifetime,
        "service_name": "S",
        "is_initiator": initiator,
    }


def test_a_conversation_s_states_and_lifetime_are_named():
    assert [p.code for p in conversation("ns", [], [], [], NOW)] == ["conversation_not_found"]
    assert conversation("ns", [endpoint("CO", NOW + 10)], [], [], NOW) == []
    got = {
        p.code: p.severity
        for p in conversation("ns", [endpoint("CO", NOW - 5), endpoint("ER", initiator=False)], [], [], NOW)
    }
    assert got == {"conversation_expired": ERROR, "conversation_error": ERROR}
    ended = conversation(
        "ns", [endpoint("DI"), endpoint("CD", initiator=False)], [QueueState("Q", "OFF", None, 1, 0)], [], NOW
    )
    assert [(p.code, p.text.split(":")[0]) for p in ended] == [
        ("conversation_ended_there", "initiator h1 (S)"),
        ("conversation_closed", "target h2 (S)"),
        ("queue_disabled", "queue 'Q' is disabled with 1 message(s) in it"),
    ]


from kbroker.core.diagnosis import Access, access  # noqa: E402


def test_grants_missing_are_named_only_when_the_authorizer_answered():
    a, _ = pair()
    everything, nothing = frozenset({"READ", "WRITE", "DESCRIBE"}), frozenset()
    assert access(a, "//From", "//To", Access("User:u", everything, everything)) == []
    assert access(a, "//From", "//To", Access("User:u", None, None)) == []  # no authorizer: nothing to say
    assert access(a, "//From", "//To", Access("User:u", frozenset({"ALL"}), frozenset({"ALL"}))) == []
    got = access(a, "//From", "//To", Access("User:u", frozenset({"READ", "DESCRIBE"}), nothing))
    assert [(p.code, p.severity, p.text.rsplit(": ", 1)[-1]) for p in got] == [
        ("send_not_permitted", ERROR, "GRANT SEND ON SERVICE:://To TO User:u"),
        ("receive_not_permitted", ERROR, "GRANT RECEIVE ON QUEUE::Q TO User:u"),
    ]


def test_a_message_rolled_back_lately_is_named_while_its_queue_is_on():
    rolling = QueueState("Q", "ON", None, 1, 1, rolled_back=("0:7", 3))
    got = runtime("ns", [rolling], [], None, NOW)
    assert [(p.code, p.severity) for p in got] == [("message_rolling_back", WARNING)]
    assert "message 0:7 rolled back 3 time(s) lately (at 5 in a row the queue is disabled)" in got[0].text
    off = QueueState("Q", "OFF", None, 1, 1, rolled_back=("0:7", 5))
    assert [p.code for p in runtime("ns", [off], [], None, NOW)] == ["queue_disabled"]
