"""The worker's scrape-time gauges (worker/web/metrics.py), from a monitor table and task rows given
here: what Prometheus's text format then says."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kbroker.core.activation.monitor import MonitorStatus
from kbroker.worker.web.metrics import WorkerCollector


def scrape(collector: WorkerCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_each_owned_monitor_and_running_reader_is_one_sample_with_bounded_labels():
    monitors = [
        ("SlowQueue", {"state": "RECEIVES_OCCURRING", "backlog": 7, "ready_groups": 3, "tasks_waiting": 2}),
        ("Idle", {"state": "INACTIVE"}),
    ]
    readers = [
        {"queue": "SlowQueue", "task_id": "t1"},
        {"queue": "SlowQueue", "task_id": "t2"},
        {"queue": "Other", "task_id": "t3"},
    ]
    got = scrape(WorkerCollector("ns1", "w1", lambda: monitors, lambda: readers, slots=8))
    q = (("namespace", "ns1"), ("queue", "SlowQueue"))
    assert got[("kbroker_queue_backlog_messages", q)] == 7
    assert got[("kbroker_queue_ready_groups", q)] == 3
    assert got[("kbroker_queue_tasks_waiting", q)] == 2
    assert got[("kbroker_readers_running", q)] == 2
    assert got[("kbroker_readers_running", (("namespace", "ns1"), ("queue", "Other")))] == 1
    assert got[("kbroker_reader_slots", (("namespace", "ns1"),))] == 8
    # One state at a time, every state named: a PromQL sum over states is 1 per queue.
    states = {
        dict(labels)["state"]: v
        for (name, labels), v in got.items()
        if name == "kbroker_queue_monitor_state" and dict(labels)["queue"] == "SlowQueue"
    }
    assert states.keys() == {s.value for s in MonitorStatus} and sum(states.values()) == 1
    assert states["RECEIVES_OCCURRING"] == 1
    idle = (("namespace", "ns1"), ("queue", "Idle"))
    assert got[("kbroker_queue_backlog_messages", idle)] == 0  # a monitor row without counts yet
    # Labels never carry a task, a conversation or a worker id.
    assert all(set(dict(labels)) <= {"namespace", "queue", "state"} for _, labels in got)


def test_the_transmitters_backlog_and_links_per_destination():
    held = {"127.0.0.1:9092/far": (3, 12.5), "": (1, 2.0)}
    links = {"127.0.0.1:9092/far": "CONNECTED", "10.0.0.1:9092/gone": "FAILED"}
    got = scrape(WorkerCollector("ns1", "w1", lambda: [], lambda: [], slots=1, routing=lambda: (held, links)))
    far = (("destination", "127.0.0.1:9092/far"), ("namespace", "ns1"))
    assert got[("kbroker_transmission_backlog_messages", far)] == 3
    assert got[("kbroker_transmission_oldest_age_seconds", far)] == 12.5
    assert got[("kbroker_transmission_backlog_messages", (("destination", ""), ("namespace", "ns1")))] == 1
    states = {
        (dict(lb)["destination"], dict(lb)["state"]): v for (name, lb), v in got.items() if name == "kbroker_link_state"
    }
    assert states[("127.0.0.1:9092/far", "CONNECTED")] == 1 and states[("127.0.0.1:9092/far", "NEW")] == 0
    assert states[("10.0.0.1:9092/gone", "FAILED")] == 1  # a state outside the usual four still shows
    assert sum(v for (d, _), v in states.items() if d == "10.0.0.1:9092/gone") == 1
    # No transmitter (routing off, or not started yet): no routing families at all.
    none = scrape(WorkerCollector("ns1", "w1", lambda: [], lambda: [], slots=1))
    assert not any(name.startswith(("kbroker_transmission", "kbroker_link")) for name, _ in none)


def test_a_monitor_row_holding_no_counts_is_scraped_as_zero_and_the_rest_goes_on():
    """The monitor table is restored from a changelog topic another client may have written:
    strings, booleans, NaN and nested objects where counts belong give 0, and the other rows and
    families are scraped as usual."""
    monitors = [
        ("Forged", {"state": {"x": 1}, "backlog": "lots", "ready_groups": True, "tasks_waiting": float("nan")}),
        ("Good", {"state": "INACTIVE", "backlog": 3}),
    ]
    got = scrape(WorkerCollector("ns1", "w1", lambda: monitors, lambda: [], slots=2))
    forged = (("namespace", "ns1"), ("queue", "Forged"))
    assert [
        got[(f, forged)]
        for f in ("kbroker_queue_backlog_messages", "kbroker_queue_ready_groups", "kbroker_queue_tasks_waiting")
    ] == [0, 0, 0]
    assert not any(
        v for (name, lb), v in got.items() if name == "kbroker_queue_monitor_state" and dict(lb)["queue"] == "Forged"
    )  # a state that is none of the states
    assert got[("kbroker_queue_backlog_messages", (("namespace", "ns1"), ("queue", "Good")))] == 3
    assert got[("kbroker_reader_slots", (("namespace", "ns1"),))] == 2
