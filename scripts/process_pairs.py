#!/usr/bin/env python3
"""Two training processes of one thread each against one process of two threads.

Issue 4 starts from a measurement: two libtorch training processes with one thread each deliver
1.2-1.8x the samples/s of one process with two threads at batch 16-64. That is the idle capacity
multi-learner training is meant to take back. This script measures the same thing for Quiver
(quiver-bench-throughput, single-stream) and, when it was built, for libtorch (quiver-torch-peer),
side by side in one run, so the headroom left for in-process learners on this machine is a
number rather than an assumption.

Per model and batch, each run times:
  one  : one process, --threads 2 (all cores of a 2-core machine; the count is fixed at 2)
  pair : two processes started together, --threads 1 each; their samples/s are added
Each process times its own steps after a warm-up (Quiver: after its executor's profiling). A
process still timing after the other has finished runs alone for a while, faster, and lifts the
pair's sum, so Quiver's two processes wait after their warm-ups, start timing together and time
the same --seconds (--go-on-stdin --window), print their windows on the system's monotonic clock
(--windows); a pair whose two windows overlap for less than 90% of the longer one is left out
of the medians (shown in parentheses) unless every run's pair is. libtorch's peer neither waits
nor prints windows: a pair of it whose wall durations (warm-up included) differ by more than a
quarter is reported. The ratio pair / one is taken within a run, and the table gives medians over
runs. The one process's steps, and libtorch's pairs', are chosen so a window lasts about
--seconds.

Two independent processes share nothing (no averaging, no barrier): their ratio is the ceiling for
k = 2 learners x 1 thread against single-stream on the same machine.

  python3 scripts/process_pairs.py --build build/release --runs 5 --output pairs.md
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time

from arg_types import at_most, int_list_at_most, name_list, positive_float, positive_int  # scripts/arg_types.py

MOST_STEPS = 1000000  # quiver-bench-throughput's --steps takes at most this
from atomic_write import keep_partial, target_of, write_atomically  # scripts/atomic_write.py


class Engine:
    """One way of training a model: a command line per (model, batch, threads, steps) and a
    parser for the samples/s it prints."""

    def __init__(self, name, program, command, pattern, paired_flags=None):
        self.name, self.program, self.command, self.pattern = name, program, command, pattern
        # paired_flags(seconds): the flags that make a process wait for a line on stdin after its
        # warm-up and then time for `seconds`; None for an engine that cannot.
        self.paired_flags = paired_flags

    def start(self, model, batch, threads, steps, warmup, paired_seconds=None):
        """A process. With `paired_seconds` (and an engine that can) it waits after its warm-up for
        go() and then times a window of that many seconds, whatever its steps."""
        waits = paired_seconds is not None and self.paired_flags is not None
        argv = self.command(self.program, model, batch, threads, 1 if waits else steps, warmup)
        if waits:
            argv += self.paired_flags(paired_seconds)
        process = subprocess.Popen(argv, stdin=subprocess.PIPE if waits else None,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        process.waits, process.early = waits, ""  # early: its output read before the go
        return process

    def warmed_up(self, process):
        """Reads a waiting process's output up to its '# warmed up' line; False if it ended first."""
        for line in iter(process.stdout.readline, ""):
            process.early += line
            if line.startswith("# warmed up"):
                return True
        return False

    def go(self, process):
        process.stdin.write("go\n")
        process.stdin.flush()

    def finish(self, process):
        """The samples/s the process printed, and its timed window (start, end) on the monotonic
        clock, or None where the engine prints none."""
        out, err = process.communicate()
        out = process.early + out
        if process.returncode != 0:
            raise RuntimeError(f"{self.name}: {' '.join(process.args)} exited {process.returncode}: {err.strip()}")
        match = re.search(self.pattern, out, re.MULTILINE)
        if not match:
            raise RuntimeError(f"{self.name}: no samples/s in the output of {' '.join(process.args)}")
        window = re.search(r"^# timed window: .*: ([0-9.]+)-([0-9.]+) s on the steady clock$", out, re.MULTILINE)
        return float(match.group(1)), (float(window.group(1)), float(window.group(2))) if window else None


def overlap_fraction(a, b):
    """How much of the longer of two timed windows (start, end) the other one covers: 1.0 for the
    same window, 0.0 for disjoint ones."""
    longer = max(a[1] - a[0], b[1] - b[0])
    if longer <= 0:
        return 1.0
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0])) / longer


def quiver_engine(build):
    program = os.path.join(build, "bench", "quiver-bench-throughput")

    def command(program, model, batch, threads, steps, warmup):
        return [program, "--models", model, "--batches", str(batch), "--threads", str(threads), "--no-peer",
                "--warmup", str(warmup), "--steps", str(steps), "--runs", "1", "--windows"]
    # A table row: | model | batch | threads | samples/s | - | - |
    return Engine("quiver", program, command, r"^\| \w+ \| \d+ \| \d+ \| (\d+) \|",
                  lambda seconds: ["--go-on-stdin", "--window", str(max(1, round(1000 * seconds)))])


def torch_engine(build):
    program = os.path.join(build, "bench", "quiver-torch-peer")

    def command(program, model, batch, threads, steps, warmup):
        return [program, "--model", model, "--batch", str(batch), "--threads", str(threads),
                "--warmup", str(warmup), "--steps", str(steps), "--runs", "1"]
    return Engine("libtorch", program, command, r"median_samples_per_s=([0-9.]+)")


def one_process(engine, model, batch, threads, steps, warmup):
    return engine.finish(engine.start(model, batch, threads, steps, warmup))[0]


def process_pair(engine, model, batch, steps, warmup, seconds):
    """Two one-thread processes at once: (sum of samples/s, ratio of their wall durations, how much
    their timed windows overlap or None where the engine prints none). Both are waited on at once
    (a thread each), so each duration is its own; if one fails, the other is stopped."""
    begun = time.monotonic()
    processes = [engine.start(model, batch, 1, steps, warmup, paired_seconds=seconds) for _ in range(2)]
    # Quiver's processes time the same `seconds` from one go, given once both have warmed up (a
    # process that ended before is reported by its waiter below).
    ready = [engine.warmed_up(process) if process.waits else False for process in processes]
    for process, warm in zip(processes, ready):
        if warm:
            engine.go(process)
    results = [None, None]
    failures = []  # in the order they happened: the first is the cause, a later one may be our kill

    def wait(i):
        try:
            results[i] = (engine.finish(processes[i]), time.monotonic() - begun)
        except RuntimeError as error:
            results[i] = error
            failures.append(error)
            other = processes[1 - i]
            if other.poll() is None:  # its own waiter then reports it as stopped
                other.kill()

    waiters = [threading.Thread(target=wait, args=(i,)) for i in range(2)]
    for waiter in waiters:
        waiter.start()
    for waiter in waiters:
        waiter.join()
    if failures:
        raise failures[0]
    ((rate_a, window_a), seconds_a), ((rate_b, window_b), seconds_b) = results
    overlap = overlap_fraction(window_a, window_b) if window_a and window_b else None
    return rate_a + rate_b, max(seconds_a, seconds_b) / min(seconds_a, seconds_b), overlap


def main():
    parser = argparse.ArgumentParser(
        description="Samples/s of two one-thread training processes against one two-thread process, "
                    "for Quiver and (when built) libtorch, side by side.")
    parser.add_argument("--build", default="build/release", help="build folder (default build/release)")
    parser.add_argument("--models", type=name_list(["mlp", "cnn", "lstm"]), default=["mlp", "cnn", "lstm"],
                        help="comma-separated, of mlp,cnn,lstm (default all three)")
    # The limits quiver-bench-throughput takes (bench/bench_common.h): refused here, before any run,
    # rather than by the bench after earlier models' runs.
    parser.add_argument("--batches", type=int_list_at_most(60000), default=[16, 64],
                        help="batch sizes, each at most 60000 (default 16,64)")
    parser.add_argument("--runs", type=positive_int, default=5, help="runs; the table gives medians (default 5)")
    # quiver-bench-throughput's --window takes at most 600000 ms.
    parser.add_argument("--seconds", type=at_most(600.0, positive_float), default=2.0,
                        help="about how long each timed window lasts, at most 600 (default 2)")
    parser.add_argument("--warmup", type=at_most(1000000, positive_int), default=20,
                        help="warm-up steps per process, at most 1000000 (default 20)")
    parser.add_argument("--no-peer", action="store_true", help="measure Quiver only")
    parser.add_argument("--output", help="also write the table there (atomically; after a failed run, the rows "
                                          "measured before it to OUTPUT.partial)")
    args = parser.parse_args()

    engines = [quiver_engine(args.build)]
    if not os.access(engines[0].program, os.X_OK):
        sys.exit(f"process_pairs.py: {engines[0].program} not found: build the release preset first (--build)")
    if not args.no_peer:
        peer = torch_engine(args.build)
        if os.access(peer.program, os.X_OK):
            engines.append(peer)
        else:
            print(f"# no libtorch peer ({peer.program} not built: apt-get install libtorch-dev libopenblas-dev)")
    if args.output:
        try:
            target_of(args.output)
        except OSError as error:
            sys.exit(f"process_pairs.py: --output: {error}")

    print(f"# samples/s: one process x 2 threads vs two processes x 1 thread at once, median of {args.runs} runs, "
          f"~{args.seconds:g} s timed windows, {os.cpu_count()} cores")
    header = ("| engine | model | batch | one x 2 threads | two x 1 thread (sum) | two / one | "
              "two / one, each run |\n|---|---|---|---|---|---|---|\n")
    table = header
    print(header, end="", flush=True)
    uneven = []
    try:
        for model in args.models:
            for batch in args.batches:
                for engine in engines:
                    # Calibrate: a short run at two threads sets the step count of the timed windows.
                    rate = one_process(engine, model, batch, 2, 30, args.warmup)
                    steps = min(MOST_STEPS, max(30, int(args.seconds * rate / batch)))
                    pair_steps = max(30, steps // 2)  # one thread: about half the rate, the same window
                    ones, pairs, ratios, kept = [], [], [], []
                    for run in range(args.runs):
                        # Alternate which goes first, so a drift of the host hits both alike.
                        if run % 2 == 0:
                            one = one_process(engine, model, batch, 2, steps, args.warmup)
                            pair, spread, overlap = process_pair(engine, model, batch, pair_steps, args.warmup,
                                                                 args.seconds)
                        else:
                            pair, spread, overlap = process_pair(engine, model, batch, pair_steps, args.warmup,
                                                                 args.seconds)
                            one = one_process(engine, model, batch, 2, steps, args.warmup)
                        name = f"{engine.name} {model} b{batch} run {run + 1}"
                        if overlap is not None and overlap < 0.9:
                            uneven.append(f"{name}: timed windows overlap {100 * overlap:.0f}%, left out of the medians")
                        elif overlap is None and spread > 1.25:
                            uneven.append(f"{name}: durations {spread:.2f}x apart")
                        ones.append(one)
                        pairs.append(pair)
                        ratios.append(pair / one)
                        kept.append(overlap is None or overlap >= 0.9)
                    if not any(kept):  # every pair uneven: the medians of all, said so below
                        uneven.append(f"{engine.name} {model} b{batch}: no pair overlapped 90%; the medians take them all")
                        kept = [True] * len(kept)
                    pick = lambda values: [v for v, k in zip(values, kept) if k]
                    row = (f"| {engine.name} | {model} | {batch} | {statistics.median(pick(ones)):.0f} | "
                           f"{statistics.median(pick(pairs)):.0f} | **{statistics.median(pick(ratios)):.2f}** | "
                           f"{', '.join(f'{r:.2f}' if k else f'({r:.2f})' for r, k in zip(ratios, kept))} |\n")
                    table += row
                    print(row, end="", flush=True)
    except (RuntimeError, OSError) as error:
        # The rows measured before the failure are kept beside --output (which stays as it was).
        if args.output and table != header:
            keep_partial(args.output, table, "process_pairs.py", "the rows measured")
        sys.exit(f"process_pairs.py: {error}")
    for line in uneven:
        print(f"# uneven pair: {line}")
    if args.output:
        try:
            write_atomically(args.output, table)
        except OSError as error:
            sys.exit(f"process_pairs.py: --output: cannot write {args.output}: {error}")


if __name__ == "__main__":
    main()
