"""kbroker on a real replicated cluster: three embedded KRaft nodes (real JVMs) on free ports.

The sample catalog applied to the cluster gets three replicas per topic (two in sync). Messages
sent before a node is killed with SIGKILL (the leader of the queue partition that holds them) are
all received afterwards, in transactions, exactly once and in order; the node then comes back and
rejoins every replica set. The test prints how long the cluster took to start and how long the
first RECEIVE took to commit after the kill. A second test kills the transaction coordinator of
reader processes' transactional ids while they commit, and checks the invariants of
tests/helpers/invariants.py."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    ClusterMetadata,
    ConfigResource,
    ResourceType,
)

from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core import names
from kbroker.embedded import ports
from kbroker.embedded.cluster import EmbeddedCluster
from kbroker.errors import TransactionAbortedError
from kbroker.kafka.catalog.apply import apply_paths, choose_replication
from kbroker.kafka.snapshot import reading_consumer, watermarks
from kbroker.sdk.broker import Broker
from tests.helpers import SAMPLES, wait_for
from tests.helpers import invariants as inv
from tests.helpers.kafka_wire import list_transactions
from tests.helpers.reader_runs import (
    assert_no_violations,
    commits,
    first_commit_after,
    start_fault_run,
    wait_for_all_replies,
    wait_for_commits,
)

NODES = 3
MESSAGES = 40
BEFORE_KILL = 10  # received (and committed) before the node is killed
QUEUE = "ExpenseQueue"


def free_port_run(count: int) -> int:
    """The first of `count` consecutive free ports (a cluster's brokers take port..port+count-1)."""
    for _ in range(100):
        base = ports.free_port()  # below the ephemeral range, in this process's slice
        if base + count <= ports.port_range()[1] and all(ports.bind(base + k) is not None for k in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    """A three-node cluster of its own (not the session broker), stopped at the end."""
    data_dir: Path = tmp_path_factory.mktemp("cluster")
    cluster = EmbeddedCluster(data_dir, NODES)
    started = time.monotonic()
    try:
        cluster.start(port=free_port_run(NODES), wait=150)
    except Exception as exc:  # noqa: BLE001 - the nodes are stopped, then the test fails with it
        cluster.stop(timeout=10)
        pytest.fail(f"the {NODES}-node cluster did not start: {exc}")
    print(f"\n{NODES}-node cluster started in {time.monotonic() - started:.1f} s")
    try:
        yield cluster
    finally:
        cluster.stop(timeout=30)
        assert not cluster.status().running


def metadata(admin: AdminClient) -> ClusterMetadata:
    return admin.list_topics(timeout=10)


def partition_holding_messages(bootstrap: str, admin: AdminClient, topic: str) -> int:
    """The one partition of `topic` with records (a conversation's messages share a partition)."""
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "kb-probe"})
    try:
        partitions = metadata(admin).topics[topic].partitions
        filled = [
            p for p in sorted(partitions) if probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] > 0
        ]
    finally:
        probe.close()
    assert len(filled) == 1, f"messages of one conversation in partitions {filled}"
    return filled[0]


def receive_in_transactions(broker: Broker, until: int, got: list[int], deadline: float) -> float | None:
    """RECEIVE (top 5, one transaction each) until `got` holds `until` claims; a transaction the
    cluster aborts is simply tried again, as an application would. Returns when the first
    transaction that received something committed (monotonic), or None if none did."""
    first_commit = None
    while len(got) < until:
        assert time.monotonic() < deadline, f"only {len(got)} of {until} messages received in time"
        try:
            with broker.transaction() as tx:
                msgs = tx.receive(QUEUE, top=5, wait=5)
                claims = [orjson.loads(m.body)["claim"] for m in msgs]
        except TransactionAbortedError:
            continue  # rolled back: the same messages come back to the next RECEIVE
        if claims:
            got += claims
            first_commit = first_commit or time.monotonic()
    return first_commit


def delivery_faults(sent: list[int], received: list[int]) -> dict[str, int]:
    """How far `received` is from `sent` exactly once and in order: messages never received
    (lost), received more than once (duplicated), and received after a later one (out of order)."""
    seen: set[int] = set()
    duplicated = out_of_order = 0
    highest = -1
    for claim in received:
        if claim in seen:
            duplicated += 1
            continue
        seen.add(claim)
        if claim < highest:
            out_of_order += 1
        highest = max(highest, claim)
    return {"lost": len(set(sent) - seen), "duplicated": duplicated, "out_of_order": out_of_order}


NO_FAULTS = {"lost": 0, "duplicated": 0, "out_of_order": 0}


def test_delivery_faults_counts_each_kind() -> None:
    # The check the cluster test relies on must be able to fail (no cluster needed for this).
    assert delivery_faults([0, 1, 2, 3], [0, 1, 2, 3]) == NO_FAULTS
    assert delivery_faults([0, 1, 2, 3], [0, 1, 3]) == {**NO_FAULTS, "lost": 1}
    assert delivery_faults([0, 1, 2, 3], [0, 1, 1, 2, 3, 0]) == {**NO_FAULTS, "duplicated": 2}
    assert delivery_faults([0, 1, 2, 3], [0, 2, 1, 3]) == {**NO_FAULTS, "out_of_order": 1}


@pytest.mark.kafka_cluster  # the cluster's tests: `make test-clusters` (CI runs it), not `make test`
def test_a_node_killed_under_load_loses_and_repeats_nothing(cluster: EmbeddedCluster) -> None:
    test_started = time.monotonic()
    status = cluster.status()
    assert status.nodes_running == NODES and status.bootstrap is not None
    bootstrap = status.bootstrap
    assert bootstrap.count(",") == NODES - 1
    admin = AdminClient({"bootstrap.servers": bootstrap})
    assert len(metadata(admin).brokers) == NODES

    # apply: every topic of the namespace gets three replicas, two of which must be in sync.
    namespace = "t" + uuid.uuid4().hex[:12]
    assert choose_replication(NODES) == (3, 2)
    apply_paths(bootstrap, namespace, [SAMPLES])
    topic = names.queue_topic(namespace, QUEUE)
    md = metadata(admin)
    ours = [t for t in md.topics if t.startswith(f"kbroker.{namespace}.")]
    # Once apply returns, every node asked alone names every new topic (a node still learning
    # them would answer a client's first question as if they did not exist).
    for node in bootstrap.split(","):
        alone = AdminClient({"bootstrap.servers": node}).list_topics(timeout=10).topics
        assert not [t for t in ours if t not in alone], node
    assert topic in ours and len(ours) > 2
    for name in ours:
        for p in md.topics[name].partitions.values():
            assert len(p.replicas) == 3 and sorted(p.isrs) == [1, 2, 3], (name, p.id)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    assert admin.describe_configs([resource])[resource].result()["min.insync.replicas"].value == "2"

    broker = Broker(bootstrap, namespace)
    try:
        handle = broker.begin_dialog(EMP, EXP, CONTRACT)
        for i in range(MESSAGES):
            broker.send(handle, CLAIM, {"claim": i})
        got: list[int] = []
        receive_in_transactions(broker, BEFORE_KILL, got, time.monotonic() + 60)

        # Kill the leader of the partition holding the conversation, mid-stream.
        partition = partition_holding_messages(bootstrap, admin, topic)
        victim = metadata(admin).topics[topic].partitions[partition].leader
        group = admin.describe_consumer_groups([topic])[topic].result()
        roles = ["queue partition leader"] + (["group coordinator"] if group.coordinator.id == victim else [])
        assert cluster.kill_node(victim)
        killed_at = time.monotonic()
        assert cluster.status().nodes_running == NODES - 1

        first_commit = receive_in_transactions(broker, MESSAGES, got, killed_at + 90)
        assert first_commit is not None
        print(
            f"killed node {victim} ({', '.join(roles)}) with SIGKILL; first RECEIVE committed "
            f"{first_commit - killed_at:.1f} s later, all {MESSAGES} in "
            f"{time.monotonic() - killed_at:.1f} s"
        )
        # Anything still queued is a duplicate (or a stray): it counts against exactly once.
        got += [orjson.loads(m.body)["claim"] for m in broker.receive(QUEUE, top=100, wait=2)]
        faults = delivery_faults(list(range(MESSAGES)), got)
        print(f"sent {MESSAGES}, received {len(got)}: {faults}")
        assert faults == NO_FAULTS, got

        # The node comes back and rejoins every replica set of the namespace.
        restarted = time.monotonic()
        cluster.start_node(victim, wait=120)
        assert cluster.status().nodes_running == NODES
        answered = time.monotonic()
        wait_for(
            lambda: all(
                sorted(p.isrs) == [1, 2, 3] for name in ours for p in metadata(admin).topics[name].partitions.values()
            ),
            60,
            f"node {victim} back in every in-sync replica set",
            interval=0.5,
        )
        print(
            f"node {victim} answered {answered - restarted:.1f} s after its restart, back in "
            f"every in-sync replica set {time.monotonic() - answered:.1f} s later"
        )
        internal = metadata(admin).topics
        for name in ("__consumer_offsets", "__transaction_state"):
            assert all(len(p.replicas) == 3 for p in internal[name].partitions.values()), name
    finally:
        broker.close()

    # A new process sees nothing left over: every receive was committed exactly once.
    with Broker(bootstrap, namespace) as again:
        leftover = [orjson.loads(m.body)["claim"] for m in again.receive(QUEUE, top=100, wait=3)]
    assert delivery_faults(list(range(MESSAGES)), got + leftover) == NO_FAULTS, leftover
    print(f"test body took {time.monotonic() - test_started:.1f} s")


def coordinators(cluster: EmbeddedCluster, prefix: str) -> Counter[int]:
    """Node id -> how many transactional ids starting with `prefix` it coordinates (each running
    node answers ListTransactions with the transactions it coordinates)."""
    found: Counter[int] = Counter()
    for node in cluster.status().nodes:
        if node.running and node.port is not None:
            found[node.node_id] += sum(tid.startswith(prefix) for tid in list_transactions("127.0.0.1", node.port))
    return found


@pytest.mark.kafka_cluster
def test_the_transaction_coordinator_killed_during_commits(cluster: EmbeddedCluster, tmp_path: Path) -> None:
    """Reader processes commit in transactions; the node coordinating most of their transactional
    ids is killed with SIGKILL mid-run, then brought back. Every invariant count ends 0 and the
    readers run throughout; the test prints when the first commit after the kill came."""
    status = cluster.status()
    assert status.nodes_running == NODES and status.bootstrap is not None
    bootstrap = status.bootstrap
    run = start_fault_run(bootstrap, tmp_path, "c", (31, 32))
    namespace, sent, readers, per_conversation = run.namespace, run.sent, run.readers, run.per_conversation
    victim = None
    try:
        wait_for_commits(readers, 30, 120)
        by_node = coordinators(cluster, f"kbroker.{namespace}.")
        assert by_node, "no node coordinates the readers' transactions"
        victim, served = by_node.most_common(1)[0]
        assert cluster.kill_node(victim)
        killed_at = time.time()
        recovered_at = first_commit_after(readers, killed_at + 0.5, 120)
        replies = wait_for_all_replies(bootstrap, namespace, sent, readers, 150)
        all_done_at = time.time()
        assert all(r.running() for r in readers), "a reader process exited"
        print(
            f"\nkilled node {victim}, transaction coordinator of {served} of the readers' "
            f"{sum(by_node.values())} transactional ids: first commit {recovered_at - killed_at:.1f} s later, "
            f"every request answered {all_done_at - killed_at:.1f} s after the kill"
        )
        cluster.start_node(victim, wait=120)
        assert cluster.status().nodes_running == NODES
    finally:
        for r in readers:
            r.stop()
        if victim is not None and cluster.status().nodes_running < NODES:
            cluster.start_node(victim, wait=120)  # the next test of the module gets three nodes
    assert_no_violations(inv.check(sent, replies, commits(readers), per_conversation))


def leads_most(admin: AdminClient, prefixes: tuple[str, ...]) -> int:
    """The node leading the most partitions of the topics under `prefixes`."""
    led: Counter[int] = Counter()
    for name, t in metadata(admin).topics.items():
        if name.startswith(prefixes):
            led.update(p.leader for p in t.partitions.values())
    return led.most_common(1)[0][0]


@pytest.mark.kafka_cluster
@pytest.mark.timeout(300)
def test_group_holds_and_a_partitions_end_answer_once_the_holds_topics_leader_is_killed(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    """The node leading a namespace's holds topic is killed with SIGKILL. A consumer that only
    asks that partition's end (as a statement's hold does) learns the new leader, and SENDs that
    take their groups' holds carry on, each within 20 s (their bound is 30 s); then the node is
    brought back."""
    from tests.integration.test_routing import CLIENT as FROM
    from tests.integration.test_routing import CONTRACT as DIALOG
    from tests.integration.test_routing import REQUEST, setup_catalogs
    from tests.integration.test_routing import SERVER as TO

    status = cluster.status()
    assert status.nodes_running == NODES and status.bootstrap is not None
    bootstrap = status.bootstrap
    a, b = "ha" + uuid.uuid4().hex[:8], "hb" + uuid.uuid4().hex[:8]
    setup_catalogs(bootstrap, tmp_path, a, b)
    topic = names.holds_topic(a)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    ends = reading_consumer(bootstrap, "kb-probe-ends")
    ba = Broker(bootstrap, a)
    victim = None
    try:
        handles = [ba.begin_dialog(FROM, TO, DIALOG) for _ in range(4)]
        ids = [ba.send(h, REQUEST, {"i": i}) for i in range(2) for h in handles]  # the second takes the hold
        assert watermarks(ends, topic, 0, time.monotonic() + 10)[1] > 0, "no hold was written"
        victim = metadata(admin).topics[topic].partitions[0].leader
        assert cluster.kill_node(victim)
        killed = time.monotonic()
        low, high = watermarks(ends, topic, 0, killed + 30)
        asked = time.monotonic() - killed
        took = []
        for i in range(2, 4):
            for h in handles:
                started = time.monotonic()
                ids.append(ba.send(h, REQUEST, {"i": i}))
                took.append(time.monotonic() - started)
        print(f"\nkilled node {victim}: the end answered {asked:.1f} s later, SENDs took {max(took):.1f} s at most")
        assert high > low and asked < 20, f"the holds topic's end answered {asked:.1f} s after the kill"
        assert max(took) < 20 and len(set(ids)) == len(ids) == 16, took
        cluster.start_node(victim, wait=120)
        assert cluster.status().nodes_running == NODES
    finally:
        ba.close()
        ends.close()
        if victim is not None and cluster.status().nodes_running < NODES:
            cluster.start_node(victim, wait=120)  # the next test of the module gets three nodes


@pytest.mark.kafka_cluster
@pytest.mark.timeout(600)
def test_routing_the_workers_and_the_analytics_job_lose_nothing_when_a_node_is_killed(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    """Request and reply between two namespaces of the cluster, routed by a `kbroker worker` on
    each and answered by a replying process, while `kbroker analytics run` counts B's queue. The
    node leading most of their partitions is killed with SIGKILL mid-run and stays down: every
    request is answered once and in order, and the job's arrivals and receives are exact."""
    from tests.integration.test_analytics import JobProcess, totals
    from tests.integration.test_routing import CLIENT as FROM
    from tests.integration.test_routing import CONTRACT as DIALOG
    from tests.integration.test_routing import REQUEST, setup_catalogs
    from tests.integration.test_routing import SERVER as TO
    from tests.integration.test_routing_clusters import Replier, Replies, tally
    from tests.integration.test_worker import Worker

    status = cluster.status()
    assert status.nodes_running == NODES and status.bootstrap is not None
    bootstrap = status.bootstrap
    a, b = "ca" + uuid.uuid4().hex[:8], "cb" + uuid.uuid4().hex[:8]
    dialogs, rounds = 4, 6
    started = time.monotonic()
    setup_catalogs(bootstrap, tmp_path, a, b)
    workers = [Worker(bootstrap, a, tmp_path), Worker(bootstrap, b, tmp_path)]
    replier = Replier(bootstrap, b, tmp_path, 1)
    job = JobProcess(bootstrap, b, tmp_path, 1)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        for w in workers:
            w.wait_ready()
        ba = Broker(bootstrap, a)
        replies = Replies(bootstrap, a)
        handles = [ba.begin_dialog(FROM, TO, DIALOG) for _ in range(dialogs)]
        convs = [ba.endpoints.current(h).conversation_id for h in handles]
        sent: dict[str, list[str]] = {c: [] for c in convs}

        def send_round(i: int) -> None:
            for h, conv in zip(handles, convs):
                sent[conv].append(ba.send(h, REQUEST, {"i": i}))

        def replies_at_least(n: int, timeout: float, what: str) -> None:
            wait_for(
                lambda: replies.take() >= n,
                timeout,
                f"{n} replies {what} (have {len(replies.records)}; logs: "
                f"{[str(w.log) for w in workers]}, {replier.log}, {job.log})",
            )

        for i in range(3):
            send_round(i)
        replies_at_least(3 * dialogs, 180, "before the kill")
        wait_for(lambda: job.batches() >= 1, 240, f"the analytics job's first batch ({job.log})")

        victim = leads_most(admin, (names.prefix(a), names.prefix(b)))
        assert cluster.kill_node(victim)
        killed_at = time.monotonic()
        for i in range(3, rounds):
            send_round(i)
        replies_at_least(rounds * dialogs, 240, "after the kill")
        answered_in = time.monotonic() - killed_at
        time.sleep(3)  # anything more (a duplicate) would land now
        replies.take()
        counts = tally(sent, replies.records)
        print(
            f"\nkilled node {victim} (leading most of the two namespaces' partitions) {killed_at - started:.0f} s "
            f"into the run: every request answered "
            f"{answered_in:.1f} s later; {len(replies.records)} replies to {rounds * dialogs} requests, "
            f"lost {len(counts['lost'])}, duplicated {len(counts['duplicated'])}, "
            f"out of order {len(counts['out_of_order'])}"
        )
        assert (counts["lost"], counts["duplicated"], counts["out_of_order"], counts["unknown"]) == ([], [], [], []), (
            counts
        )
        want = rounds * dialogs
        seen = wait_for(
            lambda: (t := totals(bootstrap, b, "Q")) and t["arrivals"] == want and t["receives"] == want and t,
            180,
            f"the job's counts of B's queue reaching {want} ({job.log})",
            seen=lambda: totals(bootstrap, b, "Q"),
        )
        print(f"the job's counts exact {time.monotonic() - started:.0f} s into the run")
        time.sleep(5)  # a later batch counting anything twice would show now
        assert {k: totals(bootstrap, b, "Q")[k] for k in ("arrivals", "receives")} == {
            "arrivals": want,
            "receives": want,
        }, seen
        for w in workers:
            assert w.proc.poll() is None, w.log.read_text()[-3000:]
        assert replier.proc.poll() is None and job.proc.poll() is None, (replier.log, job.log)
        replies.close()
        ba.close()
    finally:
        job.stop()
        replier.stop()
        for w in workers:
            w.stop()
        # The module's last test: the node stays down, the fixture stops the cluster.
