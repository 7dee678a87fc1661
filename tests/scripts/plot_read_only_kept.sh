#!/bin/sh
# scripts/plot_learners.py asked to write over a read-only result (no write bit, so root is
# refused too): its exit status and message, and whether the file still holds what it held.
# Arguments: the Python interpreter, the script and the table to plot.
dir=$(mktemp -d) || exit 1
trap 'chmod -R u+w "$dir"; rm -rf "$dir"' EXIT
echo old > "$dir/plot_ro.svg"
chmod 444 "$dir/plot_ro.svg"
"$1" "$2" "$3" "$dir/plot_ro.svg" 2>&1
echo "exit $?"
if grep -qx old "$dir/plot_ro.svg"; then echo "the file is kept"; else echo "the file was replaced"; fi
