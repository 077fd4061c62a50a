#!/bin/bash
# The container's start: its own ssh host keys, the job's key pair installed for the user
# hvd (mounted read-only at /run/hvdplus/job_key and job_key.pub: ssh wants the private key
# owned by its user and readable by no one else), the ssh server running (mpirun in
# another container starts ranks here through it), then the command, as hvd.
set -euo pipefail

ssh-keygen -A >/dev/null
keys=/run/hvdplus
if [ -f "$keys/job_key" ]; then
    install -o hvd -g hvd -m 600 "$keys/job_key" /home/hvd/.ssh/id_ed25519
    install -o hvd -g hvd -m 600 "$keys/job_key.pub" /home/hvd/.ssh/authorized_keys
fi
/usr/sbin/sshd

exec runuser -u hvd -- "$@"
