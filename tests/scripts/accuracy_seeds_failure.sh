#!/bin/sh
# scripts/accuracy_seeds.py over a build whose quiver-train fails at the second seed: it exits 1,
# leaves --output as it was and puts the first seed's run in OUTPUT.partial.
# Arguments: the Python interpreter and the script.
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
cat > "$dir/quiver-train" <<'TRAIN'
#!/bin/sh
case "$*" in *"--seed 2 "*) echo "a failure at seed 2" >&2; exit 3 ;; esac
echo "epoch 1: test accuracy 85.12%"
TRAIN
chmod +x "$dir/quiver-train"
echo "an earlier run's results" > "$dir/seeds.csv"
"$1" "$2" --build "$dir" --models mlp --seeds 1-2 --no-peer --output "$dir/seeds.csv"
echo "exit $?"
echo "output: $(cat "$dir/seeds.csv")"
echo "partial: $(tr '\n' ' ' < "$dir/seeds.csv.partial")"
