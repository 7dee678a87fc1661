#!/usr/bin/env python3
"""Summarise a Quiver Chrome trace (quiver-train --trace FILE): per step, the wall time from the
first op's start to the last op's end, the busy time per thread, and the ops that ran side by side
(overlapping in time), with their granted threads.

usage: scripts/trace_summary.py TRACE.json [--step N]
"""
import argparse
import json
import sys


def main(argv):
    parser = argparse.ArgumentParser(prog="trace_summary.py", description=__doc__.strip().split("\n\n")[0])
    parser.add_argument("trace", help="a trace written by quiver-train --trace")
    parser.add_argument("--step", type=int, help="summarise this step only")
    args = parser.parse_args(argv[1:])
    try:
        with open(args.trace) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"trace_summary: {args.trace}: not a readable Chrome trace ({error})", file=sys.stderr)
        return 1
    only = args.step
    steps = {}
    for e in events:
        steps.setdefault(e["args"]["step"], []).append(e)
    for step in sorted(steps):
        if only is not None and step != only:
            continue
        ops = sorted(steps[step], key=lambda e: e["ts"])
        begin = ops[0]["ts"]
        end = max(e["ts"] + e["dur"] for e in ops)
        busy = {}
        for e in ops:
            busy[e["tid"]] = busy.get(e["tid"], 0) + e["dur"]
        pairs = []
        for i, a in enumerate(ops):
            for b in ops[i + 1:]:
                if b["ts"] >= a["ts"] + a["dur"]:
                    continue
                overlap = min(a["ts"] + a["dur"], b["ts"] + b["dur"]) - b["ts"]
                if overlap > 0:
                    pairs.append((overlap, a, b))
        threads = ", ".join(f"thread {t}: {us} us" for t, us in sorted(busy.items()))
        print(f"step {step}: {end - begin} us wall, {len(ops)} ops; busy {threads}")
        for overlap, a, b in sorted(pairs, key=lambda p: -p[0])[:8]:
            print(f"  {overlap:6d} us side by side: {a['name']} ({a['args']['granted_threads']} thr, thread {a['tid']})"
                  f" | {b['name']} ({b['args']['granted_threads']} thr, thread {b['tid']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
