#!/bin/bash
# Starts this host's Slurm daemons: munged with the cluster's key (mounted read-only at
# /run/hvdplus-slurm/munge.key; munged wants it owned by its user and readable by no one
# else), then slurmctld on the controller ("controller") or slurmd on a compute node ("node").
set -euo pipefail

install -o munge -g munge -m 400 /run/hvdplus-slurm/munge.key /etc/munge/munge.key
install -d -o munge -g munge -m 755 /run/munge
runuser -u munge -- /usr/sbin/munged
case "$1" in
    controller) /usr/sbin/slurmctld ;;
    node) /usr/sbin/slurmd ;;
    *) echo "usage: hvdplus-slurm-start controller|node, not '$1'" >&2; exit 2 ;;
esac
