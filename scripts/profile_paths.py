#!/usr/bin/env python
"""kbroker's side of the send and request-reply benchmarks, alone in a process, for a profiler:
the runs behind docs/benchmarks.md's flame graphs ("Thirteenth round").

    .venv/bin/kbroker broker start --port 19300 --data-dir /tmp/profile-broker
    py-spy record --rate 100 --format flamegraph -o /tmp/flame-rr.svg -- \\
        .venv/bin/python scripts/profile_paths.py request-reply --bootstrap 127.0.0.1:19300
    .venv/bin/python scripts/profile_paths.py send --bootstrap 127.0.0.1:19300 --cprofile /tmp/send.prof

The same code the bench times (kbroker/bench/scenarios/send.py:KBrokerSender,
kbroker/bench/scenarios/reply.py:measure_request_reply), the same sizes unless given, on a fresh
namespace whose topics are deleted at the end. Prints the side's figures as JSON.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import sys

from kbroker.bench.common import claim_body
from kbroker.bench.context import BenchContext
from kbroker.bench.harness import samples_dir
from kbroker.bench.params import Params
from kbroker.bench.progress import Reporter
from kbroker.bench.scenarios.reply import measure_request_reply
from kbroker.bench.scenarios.send import KBrokerSender
from kbroker.core.cluster import Cluster


def run(path: str, ctx: BenchContext) -> dict:
    if path == "request-reply":
        return measure_request_reply(ctx, "kbroker")
    p = ctx.params
    sender = KBrokerSender(ctx, ctx.fresh_namespace("profile"), p.conversations, claim_body(p.body_bytes))
    try:
        return sender.run(p.messages, pipelined=path == "send-pipelined")
    finally:
        sender.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", choices=("send", "send-pipelined", "request-reply"))
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--messages", type=int, default=Params.messages)
    ap.add_argument("--conversations", type=int, default=Params.conversations)
    ap.add_argument("--cprofile", metavar="FILE", help="also write cProfile's statistics of the run to FILE")
    args = ap.parse_args()
    params = Params(repeat=1, messages=args.messages, conversations=args.conversations)
    ctx = BenchContext(Cluster(args.bootstrap), params, Reporter(), samples_dir(), "external")
    profile = cProfile.Profile() if args.cprofile else None
    try:
        if profile is not None:
            profile.enable()
        out = run(args.path, ctx)
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.cprofile)
    finally:
        ctx.cleanup()
    json.dump({"path": args.path, "messages": args.messages, **out}, sys.stdout, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
