#!/usr/bin/env python3
"""One-epoch test accuracy of the bundled models over many seeds, Quiver and libtorch side by side.

Issue 2 asks for a test accuracy after one epoch of the bundled recipe (SGD lr 0.01, momentum 0.9,
batch 64) "with a fixed seed". One seed's end-of-epoch accuracy swings by 2-3 points with the data
order, so this script shows the whole distribution: for every model and seed it runs

  quiver : quiver-train --model M --seed S --threads T --epochs 1 --quiet [--policy P]
  torch  : quiver-torch-peer --model M --batch 64 --threads T --data DIR --epochs 1 --seed S
           (only when it was built; --init names the peer's layer init, Quiver's default is
           he_uniform)

and prints, per model and engine, the seeds' accuracies, their median, mean and the median of
the first three seeds. --output writes every run as CSV (atomically); when a run fails, the runs
before it go to OUTPUT.partial and OUTPUT is left as it was.

  python3 scripts/accuracy_seeds.py --build build/release --seeds 1-20 --output seeds.csv
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

from arg_types import name_list, positive_int  # scripts/arg_types.py
from atomic_write import keep_partial, target_of, write_atomically  # scripts/atomic_write.py

MODELS = ("mlp", "cnn", "lstm")
MOST_SEEDS = 10000


def seed_range(text):
    match = re.fullmatch(r"(\d+)(?:-(\d+))?", text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected a seed or a range FIRST-LAST, got '{text}'")
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) else first
    if last < first:
        raise argparse.ArgumentTypeError(f"empty seed range '{text}'")
    if last >= 2 ** 63:  # quiver-train's --seed takes 0 to 2^63 - 1
        raise argparse.ArgumentTypeError(f"seeds go up to {2 ** 63 - 1}, got '{text}'")
    if last - first + 1 > MOST_SEEDS:  # each seed is an epoch's training per model and engine
        raise argparse.ArgumentTypeError(f"at most {MOST_SEEDS} seeds, got {last - first + 1} in '{text}'")
    return list(range(first, last + 1))


def run(command, pattern, scale):
    """Runs one training and returns the test accuracy in percent; a failure names the command."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"'{' '.join(command)}' exited {done.returncode}: {done.stderr.strip()[-500:]}")
    found = re.findall(pattern, done.stdout)
    if not found:
        raise RuntimeError(f"'{' '.join(command)}' printed no test accuracy")
    return float(found[-1]) * scale


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build/release", help="the build folder (build/release)")
    parser.add_argument("--models", type=name_list(MODELS), default=list(MODELS), help="mlp,cnn,lstm")
    parser.add_argument("--seeds", type=seed_range, default=seed_range("1-3"), help="N or FIRST-LAST (1-3)")
    parser.add_argument("--threads", type=positive_int, default=2, help="threads per training (2)")
    # auto's grants change the GEMMs' last bits with its profiles; serial is the same on every run.
    parser.add_argument("--policy", choices=("auto", "serial", "intra"), default="auto",
                        help="quiver-train's executor policy (auto)")
    # An empty QUIVER_DATA_DIR is unset, as quiver-train reads it.
    parser.add_argument("--data", default=os.environ.get("QUIVER_DATA_DIR") or "/usr/share/datasets/fashion-mnist",
                        help="the Fashion-MNIST directory (default: $QUIVER_DATA_DIR, else the package's; "
                             "here %(default)s)")
    parser.add_argument("--init", choices=("he_uniform", "torch_default"), default="he_uniform",
                        help="the libtorch peer's layer init (he_uniform, Quiver's default)")
    parser.add_argument("--no-peer", action="store_true", help="skip libtorch even when it was built")
    parser.add_argument("--output", help="write every run as CSV (after a failed run, the runs before it to OUTPUT.partial)")
    args = parser.parse_args()

    train = os.path.join(args.build, "quiver-train")
    peer = os.path.join(args.build, "bench", "quiver-torch-peer")
    if not os.access(train, os.X_OK):
        parser.exit(1, f"accuracy_seeds.py: --build: {train} is missing (build the release preset first)\n")
    if args.output:  # checked before hours of training, not after
        try:
            target_of(args.output)
        except OSError as error:
            parser.exit(1, f"accuracy_seeds.py: --output: {error}\n")
    engines = {"quiver": lambda model, seed: run(
        [train, "--model", model, "--seed", str(seed), "--threads", str(args.threads), "--epochs", "1",
         "--data", args.data, "--quiet", "--policy", args.policy], r"test accuracy ([0-9.]+)%", 1.0)}
    if not args.no_peer and os.access(peer, os.X_OK):
        engines[f"torch_{args.init}"] = lambda model, seed: run(
            [peer, "--model", model, "--batch", "64", "--threads", str(args.threads), "--data", args.data,
             "--epochs", "1", "--seed", str(seed), "--init", args.init], r"test_accuracy=([0-9.]+)", 100.0)

    rows = ["model,engine,seed,test_accuracy"]
    try:
        for model in args.models:
            for engine, train_once in engines.items():
                accuracies = []
                for seed in args.seeds:
                    accuracies.append(train_once(model, seed))
                    rows.append(f"{model},{engine},{seed},{accuracies[-1]:.2f}")
                    print(f"{model} {engine} seed {seed}: {accuracies[-1]:.2f}%", flush=True)
                first_three = statistics.median(accuracies[:3])
                print(f"{model} {engine}: median {statistics.median(accuracies):.2f}%, mean "
                      f"{statistics.fmean(accuracies):.2f}%, min {min(accuracies):.2f}%, max {max(accuracies):.2f}%, "
                      f"median of the first {min(3, len(accuracies))} seeds {first_three:.2f}% "
                      f"({len(accuracies)} seeds)", flush=True)
    except (RuntimeError, OSError) as error:
        print(f"accuracy_seeds.py: {error}", file=sys.stderr)
        if args.output and len(rows) > 1:  # the runs that finished are kept, beside --output, not over it
            keep_partial(args.output, "\n".join(rows) + "\n", "accuracy_seeds.py", f"the {len(rows) - 1} runs")
        return 1
    if args.output:
        try:
            write_atomically(args.output, "\n".join(rows) + "\n")
        except OSError as error:
            print(f"accuracy_seeds.py: --output: {error}; the runs were:\n" + "\n".join(rows), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
