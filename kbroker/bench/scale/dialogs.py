"""`kbroker bench scale`, the dialog curve: N dialogs begun and left open, one ExpenseClaim on
each, then every message received; each side a child process, so its peak RSS is its own.

Per N: the sending child's rate (BEGIN DIALOG and one SEND per dialog, committed 1,000 at a
time) and peak RSS, and the receiving child's rate (RECEIVE TOP (1000) in a transaction of its
own, READERS threads, until all N are in; a RECEIVE returns one conversation group's messages,
here one dialog's one message, and creates the dialog's target endpoint) and peak RSS. What
grows with N is what kbroker keeps per open dialog: the endpoints it caches and writes.
"""

from __future__ import annotations

from typing import Any

from kbroker.bench.context import BenchContext
from kbroker.bench.scenarios.rss import PEAK_RSS, run_rss_child

BATCH = 1_000  # SENDs per transaction, and RECEIVE's TOP
READERS = 8  # the receiving child's reader threads

CHILD = (
    r"""
import json, resource, sys, time
mode, cluster, namespace, n = sys.argv[1:5]
n = int(n)
import kbroker
from kbroker.bench.common import CLAIM, CONTRACT, EMP, EXP, QUEUE, claim_body
broker = kbroker.connect(cluster, namespace)
body = claim_body(100)
done = 0
t0 = time.monotonic()
if mode == "send":
    while done < n:
        with broker.transaction() as tx:
            for _ in range(min(BATCH, n - done)):
                tx.send(broker.begin_dialog(EMP, EXP, CONTRACT), CLAIM, body)
                done += 1
else:
    # A RECEIVE returns one conversation group's messages, here one dialog's one message: the
    # readers a user would run, each in a transaction of its own (kbroker commits them together).
    import threading
    counted = threading.Lock()
    deadline = time.monotonic() + 60 + n / 50

    def read():
        global done
        while done < n and time.monotonic() < deadline:
            with broker.transaction() as tx:
                got = len(tx.receive(QUEUE, top=BATCH, wait=2))
            with counted:
                done += got
    threads = [threading.Thread(target=read) for _ in range(READERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
seconds = time.monotonic() - t0
""".replace("BATCH", str(BATCH)).replace("READERS", str(READERS))
    + PEAK_RSS
    + r"""
rss_kb = peak_rss_kb()
broker.close()
print(json.dumps({"peak_rss_kb": rss_kb, "done": done, "seconds": seconds}))
"""
)


def measure(ctx: BenchContext, n: int) -> dict[str, Any]:
    """One point of the dialog curve (see the module docstring)."""
    ns = ctx.fresh_namespace(f"scale-d{n}")
    out: dict[str, Any] = {"dialogs": n}
    for mode in ("send", "receive"):
        ctx.say(f"dialogs: {'beginning and sending on' if mode == 'send' else 'receiving from'} {n:,} dialogs")
        m = run_rss_child(CHILD, [ctx.cluster.bootstrap, ns, str(n)], mode, timeout=600 + n / 100)
        done, seconds = m["detail"]["done"], m["detail"]["seconds"]
        if done < n:
            raise RuntimeError(f"the {mode} child did {done:,} of {n:,} dialogs")
        out[mode] = {
            "msg_per_s": round(n / seconds, 1),
            "seconds": round(seconds, 1),
            "peak_rss_mb": round(m["value"], 1),
        }
    return out
