#!/bin/sh
# scripts/process_pairs.py over a build whose quiver-bench-throughput fails for the CNN (and is the
# real one for the MLP): it exits 1, leaves --output as it was and puts the MLP's row in
# OUTPUT.partial.
# Arguments: the Python interpreter, the script and the real quiver-bench-throughput.
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/bench"
cat > "$dir/bench/quiver-bench-throughput" <<BENCH
#!/bin/sh
case "\$*" in *cnn*) echo "a failure for the CNN" >&2; exit 1 ;; esac
exec "$3" "\$@"
BENCH
chmod +x "$dir/bench/quiver-bench-throughput"
echo "an earlier run's table" > "$dir/pairs.md"
"$1" "$2" --build "$dir" --models mlp,cnn --batches 16 --runs 1 --seconds 0.2 --no-peer --output "$dir/pairs.md" \
  > /dev/null 2>&1
echo "exit $?"
echo "output: $(cat "$dir/pairs.md")"
echo "partial rows: $(grep -c '^| quiver | mlp | 16 |' "$dir/pairs.md.partial")"
