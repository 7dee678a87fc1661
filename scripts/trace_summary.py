#!/usr/bin/env python3
"""Summarise a Quiver Chrome trace (quiver-train --trace FILE): per step, the wall time from the
first op's start to the last op's end, the busy time per thread, and the ops that ran side by side
(overlapping in time), with their granted threads. A learner group's trace is summarised per
learner and step (a learner's share of the SMA pass, "sma round", or its "sma absorb", counts as
one of its ops in that round); --feeder sums up instead how long the training loop waited for
each round's batches (the "next batches" events) against the rounds' length, the learners' steps
without their SMA work.

usage: scripts/trace_summary.py TRACE.json [--step N] [--feeder]
"""
import argparse
import json
import math
import signal
import statistics
import sys


def feeder_summary(events):
    waits = sorted(e["dur"] for e in events if e.get("cat") == "feeder")
    if not waits:
        print("no feeder events: a trace of quiver-train --learners has them")
        return 1
    rounds = {}
    for e in events:
        if e["pid"] >= 2 and e.get("cat") != "sync":  # a learner's op: the round's steps, over every learner
            begin, end = rounds.get(e["args"]["step"], (e["ts"], e["ts"] + e["dur"]))
            rounds[e["args"]["step"]] = (min(begin, e["ts"]), max(end, e["ts"] + e["dur"]))
    spans = sorted(end - begin for begin, end in rounds.values())
    nearest_rank = lambda values, q: values[max(0, math.ceil(q * len(values)) - 1)]  # values sorted
    print(f"feeder: {len(waits)} hand-overs of a round's batches; wait median {statistics.median(waits):g} us, "
          f"90th percentile {nearest_rank(waits, 0.9):g} us, max {waits[-1]:g} us, total {sum(waits):g} us")
    if spans:
        print(f"rounds: {len(spans)}; learners' steps span median {statistics.median(spans):g} us a round; "
              f"the feeder's waits are {100.0 * sum(waits) / max(1, sum(spans)):.2f}% of that time")
    return 0


def number(value):
    """A finite JSON number that a double holds (Python reads a 400-digit integer exactly, and
    math.isfinite of it overflows)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def complete(event):
    """A complete-duration op event with the fields the summaries read: numbers (not booleans) for
    pid, tid, ts, dur and args.step, and a name."""
    return (isinstance(event, dict) and event.get("ph") == "X" and isinstance(event.get("name"), str) and
            all(number(event.get(key)) for key in ("pid", "tid", "ts", "dur")) and
            isinstance(event.get("args"), dict) and number(event["args"].get("step")))


def shown(name):
    """An op's name on one line: control characters (a newline in a node's name) as escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


def main(argv):
    parser = argparse.ArgumentParser(prog="trace_summary.py", description=__doc__.strip().split("\n\n")[0])
    parser.add_argument("trace", help="a trace written by quiver-train --trace")
    parser.add_argument("--step", type=int, help="summarise this step only")
    parser.add_argument("--feeder", action="store_true", help="the feeder's waits (a learner group's trace)")
    args = parser.parse_args(argv[1:])
    try:
        with open(args.trace) as f:
            listed = json.load(f)["traceEvents"]
        if not isinstance(listed, list):
            raise TypeError("traceEvents is not a list")
        events = [e for e in listed if complete(e)]
        for e in events:  # as doubles, as Chrome reads them: sums of huge times overflow to inf, not an error
            e["ts"], e["dur"] = float(e["ts"]), float(e["dur"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as error:  # RecursionError: nesting too deep
        print(f"trace_summary: {args.trace}: not a readable Chrome trace ({error})", file=sys.stderr)
        return 1
    skipped = sum(1 for e in listed if isinstance(e, dict) and e.get("ph") == "X") - len(events)
    if skipped:
        print(f"trace_summary: skipped {skipped} event(s) without pid, tid, ts, dur or args.step "
              "(not written by Quiver?)", file=sys.stderr)
    if args.feeder:
        return feeder_summary(events)
    if not events:
        print(f"trace_summary: {args.trace}: no op events to summarise", file=sys.stderr)
        return 1
    only = args.step
    if only is not None and all(e["args"]["step"] != only for e in events):
        print(f"trace_summary: {args.trace}: no step {only} in the trace", file=sys.stderr)
        return 1
    steps = {}
    for e in events:
        steps.setdefault((e["pid"], e["args"]["step"]), []).append(e)
    for pid, step in sorted(steps):
        if only is not None and step != only:
            continue
        ops = sorted(steps[(pid, step)], key=lambda e: e["ts"])
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
        threads = ", ".join(f"thread {t}: {us:g} us" for t, us in sorted(busy.items()))
        who = f"learner {pid - 2}, " if pid >= 2 else ""
        print(f"{who}step {step}: {end - begin:g} us wall, {len(ops)} ops; busy {threads}")
        for overlap, a, b in sorted(pairs, key=lambda p: -p[0])[:8]:
            print(f"  {overlap:6g} us side by side: {shown(a['name'])} ({a['args'].get('granted_threads', '?')} thr, "
                  f"thread {a['tid']}) | {shown(b['name'])} ({b['args'].get('granted_threads', '?')} thr, thread {b['tid']})")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly
    sys.exit(main(sys.argv))
