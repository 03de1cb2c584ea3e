"""The invariant run across namespaces: request and reply on many dialogs between two namespaces on
two Kafka clusters (the session's broker and one of the test's own), carried by real `kbroker
worker`s, answered by a replying process. Through kill -9 of the replying process while it holds
its dialogs' send leases, kill -9 of both workers, and the far broker stopped for longer than a
lease (so the replying process's leases run out and are claimed again past a gap), every message
is counted by a plain read_committed consumer: 0 lost, 0 duplicated, 0 out of order. The
transport's suppression after the outage (15 s after a disconnect, 60 s after a failed attempt) is
measured on the way (60 s after a failed attempt; 15 s after a disconnect when the link was open
as the broker went)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

import httpx
import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from kbroker.core import names
from kbroker.core.dialogs.envelope import H_CONVERSATION_ID, H_MESSAGE_TYPE, H_SEQUENCE
from kbroker.core.dialogs.send_lease import LEASE_SECONDS
from kbroker.embedded.broker import EmbeddedBroker
from kbroker.kafka import clients
from kbroker.sdk.broker import Broker
from tests.helpers import ROOT, free_port, wait_for
from tests.integration.test_routing import CLIENT, CONTRACT, REPLY, REQUEST, SERVER, kbroker_json, setup_catalogs
from tests.integration.test_worker import Worker

DIALOGS, ROUNDS = 12, 6
GAP = 1024  # a lease claimed after its holder died starts this far past the dead holder's start


class Replier:
    """The replying process (tests/helpers/routing_runs.py) on namespace `ns`."""

    def __init__(self, bootstrap: str, ns: str, tmp: Path, n: int):
        self.stop_file, self.log = tmp / f"replier-{n}.stop", tmp / f"replier-{n}.log"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.helpers.routing_runs",
                "replier",
                bootstrap,
                ns,
                str(self.stop_file),
                str(self.log),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )

    def stop(self) -> None:
        self.stop_file.touch()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


class Replies:
    """Every committed reply on A's queue, read by a plain read_committed consumer as it lands
    (kept here, so the worker's clean-up of received records cannot hide one)."""

    def __init__(self, bootstrap: str, ns: str):
        topic = names.queue_topic(ns, "Q")
        self._consumer = clients.consumer(bootstrap, names.reader_group(ns), **{"isolation.level": "read_committed"})
        parts = self._consumer.list_topics(topic, timeout=10).topics[topic].partitions
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        self.records: list[dict] = []  # in log order per partition

    def take(self) -> int:
        for m in self._consumer.consume(500, 0.5):
            if m.error():
                continue
            hs = {k: v.decode() for k, v in m.headers() or []}
            self.records.append(
                {
                    "type": hs.get(H_MESSAGE_TYPE),
                    "conversation": hs.get(H_CONVERSATION_ID),
                    "sequence": int(hs.get(H_SEQUENCE, "-2")),
                    "body": orjson.loads(m.value() or b"null"),
                }
            )
        return len(self.records)

    def close(self) -> None:
        self._consumer.close()


def tally(sent: dict[str, list[str]], replies: list[dict]) -> dict[str, object]:
    """Lost, duplicated and out-of-order, per request and per dialog. `sent`: per conversation,
    the ids of the requests sent, in the order sent."""
    answered: dict[str, int] = defaultdict(int)
    by_conv: dict[str, list[dict]] = defaultdict(list)
    unknown = []
    for r in replies:
        if r["type"] != REPLY or not isinstance(r["body"], dict):
            unknown.append(r)
            continue
        answered[r["body"]["request"]] += 1
        by_conv[r["conversation"]].append(r)
    all_sent = {i for ids in sent.values() for i in ids}
    order = []
    for conv, rs in by_conv.items():
        requests = [r["body"]["request"] for r in rs]
        seqs = [r["sequence"] for r in rs]
        position = {i: n for n, i in enumerate(sent.get(conv, []))}
        if [position.get(i, -1) for i in requests] != sorted(position.get(i, -1) for i in requests) or seqs != sorted(
            set(seqs)
        ):
            order.append((conv, requests, seqs))
    return {
        "lost": sorted(all_sent - set(answered)),
        "duplicated": sorted(i for i, n in answered.items() if n > 1),
        "out_of_order": order,
        "unknown": unknown,
        "jumps": sum(1 for rs in by_conv.values() for x, y in zip(rs, rs[1:]) if y["sequence"] - x["sequence"] >= GAP),
    }


def link_history(bootstrap: str, namespace: str, far: str) -> list[tuple[float, str]]:
    """The state changes of `namespace`'s connection to namespace `far` (the connections view)."""
    links = [r for r in kbroker_json("connections", bootstrap, namespace) if r["destination"].endswith("/" + far)]
    return [(t, e) for link in links for t, e in link["history"]]


@pytest.mark.kafka_cluster  # about 3 minutes: `make test-clusters` (CI runs it), not `make test`
@pytest.mark.timeout(720)  # the 60 s suppression after a failed attempt is waited out
def test_request_reply_across_clusters_loses_nothing_through_kills_and_an_outage_longer_than_a_lease(
    kafka_bootstrap, tmp_path
):
    remote = EmbeddedBroker(tmp_path / "remote-kafka")
    port, cport = free_port(), free_port()
    remote_bootstrap = remote.start(port=port, controller_port=cport).bootstrap
    assert remote_bootstrap is not None
    a, b = "ra" + uuid.uuid4().hex[:8], "rb" + uuid.uuid4().hex[:8]
    workers: list[Worker] = []
    repliers: list[Replier] = []
    try:
        setup_catalogs(kafka_bootstrap, tmp_path, a, b, b_bootstrap=remote_bootstrap)
        workers += [Worker(kafka_bootstrap, a, tmp_path), Worker(remote_bootstrap, b, tmp_path)]
        for w in workers:
            w.wait_ready()
        repliers.append(Replier(remote_bootstrap, b, tmp_path, 1))
        ba = Broker(kafka_bootstrap, a)
        replies = Replies(kafka_bootstrap, a)
        handles = [ba.begin_dialog(CLIENT, SERVER, CONTRACT) for _ in range(DIALOGS)]
        convs = [ba.endpoints.current(h).conversation_id for h in handles]
        sent: dict[str, list[str]] = defaultdict(list)

        def send_round(i: int) -> None:
            for h, conv in zip(handles, convs):
                sent[conv].append(ba.send(h, REQUEST, {"i": i}))

        def replies_at_least(n: int, timeout: float, what: str) -> None:
            wait_for(
                lambda: replies.take() >= n,
                timeout,
                f"{n} replies {what} (have {len(replies.records)}; "
                f"logs: {[str(w.log) for w in workers]}, {[str(r.log) for r in repliers]})",
            )

        send_round(0)
        send_round(1)
        replies_at_least(2 * DIALOGS, 120, "before any kill")

        # 1. The replying process dies with kill -9 while it holds the leases of the dialogs it just
        # answered; the next one claims them when they run out, numbering past the gap.
        send_round(2)
        replies_at_least(2 * DIALOGS + 1, 60, "of the third round")
        repliers[-1].proc.kill()
        repliers[-1].proc.wait(10)
        repliers.append(Replier(remote_bootstrap, b, tmp_path, 2))
        send_round(3)

        # 2. kill -9 of both workers (the transmitters, dispatchers, timer services).
        for w in workers:
            w.stop(signal.SIGKILL)
        workers += [Worker(kafka_bootstrap, a, tmp_path), Worker(remote_bootstrap, b, tmp_path)]
        replies_at_least(4 * DIALOGS, 180, "after the kills")

        # 3. The far broker stops while the replying process holds leases, for longer than a lease.
        send_round(4)
        replies_at_least(4 * DIALOGS + 1, 60, "of the fifth round")
        remote.stop()
        stopped = time.time()
        send_round(5)
        rows = wait_for(
            lambda: [r for r in kbroker_json("transmission", kafka_bootstrap, a) if r["transmission_status"]] or None,
            60,
            "statuses while B's broker is down",
        )
        assert any(b in r["transmission_status"] for r in rows), rows
        # Down until a connection attempt has failed (the first one comes 15 s after the disconnect
        # and takes up to 5 s: a fixed outage raced it) and for longer than a lease.
        wait_for(
            lambda: any(t >= stopped - 1 and e == "FAILED" for t, e in link_history(kafka_bootstrap, a, b)),
            90,
            "a failed connection attempt while B's broker is down",
        )
        time.sleep(max(0.0, stopped + LEASE_SECONDS + 5 - time.time()))
        remote.start(port=port, controller_port=cport)
        replies_at_least(ROUNDS * DIALOGS, 300, "after B's broker came back")
        time.sleep(3)  # anything more (a duplicate) would land now
        replies.take()

        counts = tally(sent, replies.records)
        print(
            f"invariant run across clusters: {len(replies.records)} replies to {ROUNDS * DIALOGS} requests, "
            f"lost {len(counts['lost'])}, duplicated {len(counts['duplicated'])}, "
            f"out of order {len(counts['out_of_order'])}, sequence jumps past a dead lease {counts['jumps']}"
        )
        assert (counts["lost"], counts["duplicated"], counts["out_of_order"], counts["unknown"]) == ([], [], [], []), (
            counts
        )
        assert counts["jumps"] >= 1, "no dialog went on past a lease claimed after its holder died"

        events = [(t, e) for t, e in link_history(kafka_bootstrap, a, b) if t >= stopped - 1]
        kinds = [e for _, e in events]
        assert "FAILED" in kinds and kinds[-1] == "CONNECTED", events
        failed = [t for t, e in events if e == "FAILED"]
        attempts = [t for t, e in events if e == "CONNECTING"]
        next_after_fail = min(t for t in attempts if t > failed[0])
        print(f"suppression measured: {next_after_fail - failed[0]:.1f} s after the failed attempt")
        assert next_after_fail - failed[0] >= 60.0, events
        if "DISCONNECTED" in kinds:  # the link was open when the broker went (not when it had closed idle)
            disconnect = next(t for t, e in events if e == "DISCONNECTED")
            first_after = min(t for t in attempts if t > disconnect)
            print(f"suppression measured: {first_after - disconnect:.1f} s after the disconnect")
            assert first_after - disconnect >= 15.0, events
        for w in workers[-2:]:
            assert w.proc.poll() is None, w.log.read_text()[-3000:]
            httpx.get(w.url + "/tasks/", timeout=5).raise_for_status()
        assert repliers[-1].proc.poll() is None, repliers[-1].log.read_text()[-3000:]
        replies.close()
        ba.close()
    finally:
        for r in repliers:
            r.stop()
        for w in workers:
            w.stop()
        remote.stop()
