#!/bin/sh
# Runs "$@" pinned to one CPU, the first this shell may use: a program that reads its cores from
# its affinity then has exactly one, whatever the machine.
cpu=$(taskset -pc $$ | sed 's/.*: //; s/[,-].*//') || exit 1
exec taskset -c "$cpu" "$@"
