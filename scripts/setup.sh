#!/usr/bin/env bash
# Creates .venv and installs the project with everything its tests and gates need (scripts/test.sh),
# plus the Prometheus server the autoscaler tests run for real. Safe to re-run. The demo installs
# only its own extra (scripts/demo.sh); the `test` extra holds all of it.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# torch is pinned (CPU build) in the `cpu` extra; `test` pulls `server` and `cpu`; `dev` has
# the gates' tools (ruff, mypy, import-linter).
.venv/bin/python -m pip install --quiet -e '.[test,dev]'
# The Helm v4 engine for the chart tests (helm lint / install). No helm binary is packaged
# for these machines; this wheel embeds the engine. It declares Python >= 3.12 but runs on 3.11.
.venv/bin/python -m pip install --quiet --ignore-requires-python 'helm-sdkpy==0.1.32'

# Prometheus (the autoscaler tests run it for real), shellcheck (e2e/run.sh is checked), and
# etcd and openssl for the real-apiserver tier (`pytest -m realapi`: it runs where a kube-apiserver is
# in $KUBEBUILDER_ASSETS or /usr/local/kubebuilder/bin, and skips with one line elsewhere).
missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# libfaketime: the real-apiserver tier's clock-step fault runs one operator replica under a
# shifted clock (tests/ha/test_leader_faults_realapi.py; skipped without it).
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
# The real-pods tier (`pytest -m pods`) runs pods where the node binaries (kubelet, kube-proxy, ...) are
# in the same directory, as root: then it needs a container runtime, CNI plugins, podman to build
# the images, debootstrap for their Debian base, iptables and busybox-static (the pause image).
assets="${KUBEBUILDER_ASSETS:-/usr/local/kubebuilder/bin}"
if [ -x "$assets/kubelet" ] && [ "$(id -u)" -eq 0 ]; then
    command -v containerd >/dev/null 2>&1 || missing+=(containerd)
    command -v runc >/dev/null 2>&1 || missing+=(runc)
    [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
    command -v podman >/dev/null 2>&1 || missing+=(podman)
    command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
    command -v iptables >/dev/null 2>&1 || missing+=(iptables)
    command -v conntrack >/dev/null 2>&1 || missing+=(conntrack)
    [ -x /bin/busybox ] || missing+=(busybox-static)
fi
if [ "${#missing[@]}" -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# vLLM's CPU build, in its own venv outside the repository, for the LLM integration test
# (tests/llm): about 1.5 min the first time, seconds when it is already there.
bash scripts/setup-vllm.sh >/dev/null
# The vLLM project's router (vllm-router), in a venv of its own, for the router's process test and
# bench/router_bench.py.
bash scripts/setup-router.sh >/dev/null
