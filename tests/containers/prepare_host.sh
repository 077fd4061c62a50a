#!/usr/bin/env bash
# Lets this machine run the tests that need system packages: tests/test_containers.py needs
# podman with the runc runtime, and debootstrap to make the base image where no registry can
# be reached (tests/testkit/cluster.py makes it on first use); tests/test_spark.py needs a Java
# runtime for Spark (17, Spark 4's); tests/test_kubernetes_manifests.py needs kubectl (Debian's
# kubernetes-client) for `kubectl kustomize`. On Debian, as root, it installs what is missing and
# configures podman; elsewhere it says so and changes nothing, and those tests skip, which in
# CI (CI=true) fails the run: so does this script there, at once.
set -euo pipefail

cannot() {
    echo "prepare_host: $1: the tests that need it will skip" >&2
    if [ "${CI:-}" = true ]; then exit 1; fi
    exit 0
}

if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        cannot "no podman or debootstrap, and no apt-get as root"
    fi
    if ! { apt-get update -qq && apt-get install -y -qq podman runc debootstrap >/dev/null; }; then
        cannot "installing podman, runc and debootstrap failed"
    fi
fi

# kubectl renders deploy/kubernetes' kustomization offline (tests/test_kubernetes_manifests.py).
if ! command -v kubectl >/dev/null; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        cannot "no kubectl, and no apt-get as root"
    fi
    if ! { apt-get update -qq && apt-get install -y -qq kubernetes-client >/dev/null; }; then
        cannot "installing kubernetes-client failed"
    fi
fi

if ! command -v java >/dev/null; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        cannot "no java, and no apt-get as root"
    fi
    if ! { apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null; }; then
        cannot "installing openjdk-17-jre-headless failed"
    fi
fi

# runc rather than crun (which fails on hybrid cgroup hierarchies), cgroupfs rather than
# systemd (which a container or CI machine may lack), and no default ulimits (podman's
# exceed the hard limits of some machines).
conf=/etc/containers/containers.conf
if [ "$(id -u)" = 0 ] && [ ! -s "$conf" ]; then
    mkdir -p "$(dirname "$conf")"
    printf '[containers]\ndefault_ulimits = []\n\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n' > "$conf"
fi
