#!/usr/bin/env bash
# What the system tests need beyond the Python packages, installed by CI (never by a test):
# a one-node Slurm for tests/test_slurm.py (Debian's slurmctld, slurmd, slurm-client and munge), and
# Docker's engine, debootstrap and compose for tests/test_docker.py (Debian's docker.io, debootstrap and
# docker-compose, compose 1.29: Debian 12 packages no compose v2 plugin).
# Needs root and apt-get; anything already installed is left as it is.
set -euo pipefail
PACKAGES=(slurmctld slurmd slurm-client munge docker.io debootstrap docker-compose)
TOOLS=(slurmctld slurmd sbatch squeue scontrol scancel sinfo munged)
missing=()
for tool in "${TOOLS[@]}"; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || [ -x "/sbin/$tool" ] || missing+=("$tool")
done
# the image test runs Debian's docker by these paths (another `docker` on PATH is not Debian's engine)
for path in /usr/sbin/dockerd /usr/bin/docker /usr/sbin/debootstrap /usr/bin/docker-compose; do
    [ -x "$path" ] || missing+=("$path")
done
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "system tests: ${missing[*]} missing and this is not root with apt-get;" \
        "install ${PACKAGES[*]} yourself, or tests/test_slurm.py fails saying so" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"
