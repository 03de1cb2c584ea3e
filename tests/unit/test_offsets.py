"""Out-of-order offset tracking: nothing completed is redelivered after a hand-over, nothing
incomplete is skipped, and the metadata stays within Kafka's limit."""

from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.core.receive.offsets import METADATA_LIMIT, PartitionOffsets, decode_completed, encode_completed


@given(st.integers(0, 10**12), st.sets(st.integers(1, 10**6), max_size=300))
def test_metadata_round_trips(base, deltas):
    completed = {base + d for d in deltas}
    assert decode_completed(base, encode_completed(base, sorted(completed))) == completed


@given(st.text(max_size=200))
def test_foreign_metadata_means_nothing_completed(junk):
    # Metadata written by another client (or damaged) must never make us skip a record.
    assert decode_completed(0, junk) == set() or junk.startswith("kb1:")


@settings(max_examples=300)
@given(
    gaps=st.lists(st.integers(1, 3), min_size=1, max_size=120),
    order=st.randoms(use_true_random=False),
    done_fraction=st.floats(0, 1),
)
def test_handover_skips_exactly_the_completed(gaps, order, done_fraction):
    # Offsets with gaps, as transaction markers and compaction leave them.
    offsets, o = [], 5
    for g in gaps:
        o += g
        offsets.append(o)
    first = PartitionOffsets(committed=offsets[0])
    for off in offsets:
        first.fetched(off)
    done = set(order.sample(offsets, int(len(offsets) * done_fraction)))
    for off in order.sample(sorted(done), len(done)):  # complete in random order
        first.complete(off)
    pos, meta = first.commit_position()

    incomplete = [x for x in offsets if x not in done]
    assert pos == (min(incomplete) if incomplete else offsets[-1] + 1)

    # The next owner starts at `pos` and re-reads every offset >= pos.
    second = PartitionOffsets(committed=pos, metadata=meta)
    redelivered = [x for x in offsets if x >= pos and not second.already_done(x)]
    assert set(redelivered) == set(incomplete), "lost or duplicated across the hand-over"


def test_commit_position_moves_over_gaps_and_metadata_shrinks():
    t = PartitionOffsets(committed=10)
    for off in (10, 12, 15):
        t.fetched(off)
    t.complete(12)
    pos, meta = t.commit_position()
    assert pos == 10 and decode_completed(10, meta) == {12}
    t.complete(10)
    pos, meta = t.commit_position()
    assert pos == 15 and meta == ""
    t.complete(15)
    assert t.commit_position() == (16, "")


def test_metadata_room_is_back_pressure_before_the_limit():
    import random

    rng = random.Random(7)
    t = PartitionOffsets(committed=0)
    t.fetched(0)  # the oldest record stays incomplete: every later completion must be listed
    off, n = 0, 0
    while t.metadata_room() and n < 100_000:
        off += rng.randint(1, 5000)  # random gaps compress badly: the worst case
        t.fetched(off)
        t.complete(off)
        n += 1
    _, meta = t.commit_position()
    assert n < 100_000, "metadata never filled up"
    assert len(meta) < METADATA_LIMIT
    assert n > 500  # it holds a useful number of completions before pushing back


# Completions one example may pile up: random gaps of 8 or more fill the metadata well before
# this, and beyond it an example with tiny gaps (compressing to nothing) only costs time.
MOST_COMPLETIONS = 12_000


# Runs that fill the metadata come in every few examples (one "complete" step adds up to 600
# completions); more or longer runs only slow the unit suite, whose runs are meant to take seconds.
@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["complete", "reopen", "commit", "room"]), st.integers(0, 10**9), st.integers(1, 4000)
        ),
        min_size=50,
        max_size=150,
    ),
    st.integers(1, 60),
)
def test_metadata_room_never_says_yes_past_the_limit(ops, batch):
    # metadata_room() measures the encoding only now and then; whenever it answers yes, the
    # commit metadata of that moment must still fit Kafka's limit.
    import random

    t = PartitionOffsets(committed=0)
    t.fetched(0)  # pins the low water, so completions pile up above it
    high, done = 0, []
    changes = 0  # "complete" and "reopen" steps so far
    fits_at: int | None = None  # `changes` when the metadata last fitted
    for op, seed, gap in ops:
        rng = random.Random(seed)
        if op == "complete":  # a batch of completions with random gaps (compress badly)
            for _ in range(min(batch * 10, MOST_COMPLETIONS - len(done))):
                high += rng.randint(1, gap)
                t.fetched(high)
                t.complete(high)
                done.append(high)
            changes += 1
        elif op == "reopen" and done:
            t.reopen(done.pop(rng.randrange(len(done))))
            changes += 1
        elif op == "commit":
            t.commit_position()
        if t.metadata_room():
            pos = t.low_water()
            if fits_at == changes:
                continue  # nothing completed or reopened since it last fitted: same metadata
            above = [o for o in done if o > pos]
            assert len(encode_completed(pos, above)) < METADATA_LIMIT
            fits_at = changes


def test_an_abort_after_a_later_commit_keeps_its_completed_offsets_in_the_metadata():
    """A transaction computed its commit at a higher position, pruning the completed offsets
    below it, then aborted: the position falls back, and offsets another transaction completed
    and committed meanwhile must still be listed above it. Forgotten, the next owner delivered
    them again (a duplicate under rebalances). Fails on the code that pruned at the position."""
    t = PartitionOffsets(committed=0)
    for off in range(10):
        t.fetched(off)
    for off in (5, 6):  # one transaction completes 5 and 6 and commits
        t.complete(off)
    t.commit_position()
    for off in (5, 6):
        t.settled(off)
    failing = (0, 1, 2, 3, 4, 7, 8, 9)
    for off in failing:  # another completes the rest, computes its commit at 10, and aborts
        t.complete(off)
    assert t.commit_position()[0] == 10
    for off in failing:
        t.reopen(off)
    pos, meta = t.commit_position()
    assert pos == 0 and decode_completed(pos, meta) == {5, 6}


@settings(max_examples=300)
@given(
    st.lists(st.tuples(st.sets(st.integers(0, 39), min_size=1, max_size=6), st.booleans()), max_size=40),
    st.randoms(use_true_random=False),
)
def test_handover_after_any_commits_and_aborts_redelivers_exactly_the_uncommitted(transactions, rng):
    """Transactions over one partition, each completing some offsets and computing its commit,
    then committing or aborting (with others' commits computed in between): at any hand-over
    the next owner redelivers exactly the offsets no committed transaction completed."""
    t = PartitionOffsets(committed=0)
    for off in range(40):
        t.fetched(off)
    committed: set[int] = set()
    open_ones: list[tuple[list[int], bool]] = []
    for wanted, commits in transactions:
        offs = [o for o in sorted(wanted) if o not in committed and not any(o in w for w, _ in open_ones)]
        for o in offs:
            t.complete(o)
        t.commit_position()
        open_ones.append((offs, commits))
        if rng.random() < 0.5:  # end an open transaction, not necessarily the latest
            offs_done, ok = open_ones.pop(rng.randrange(len(open_ones)))
            for o in offs_done:
                (t.settled if ok else t.reopen)(o)
            if ok:
                committed |= set(offs_done)
    for offs_done, _ in open_ones:  # the rest abort
        for o in offs_done:
            t.reopen(o)
    pos, meta = t.commit_position()
    second = PartitionOffsets(committed=pos, metadata=meta)
    redelivered = {x for x in range(40) if x >= pos and not second.already_done(x)}
    assert redelivered == set(range(40)) - committed
