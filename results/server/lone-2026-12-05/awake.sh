#!/usr/bin/env bash
# Runs "$@" with every CPU kept out of idle: one nice-19 busy loop pinned to each CPU, killed after.
# The servers and the client run at normal priority and preempt the loops when they wake.
pids=()
for c in $(seq 0 $(( $(nproc) - 1 ))); do taskset -c $c nice -n 19 bash -c 'while :; do :; done' & pids+=($!); done
"$@"; rc=$?
kill "${pids[@]}"; exit $rc
