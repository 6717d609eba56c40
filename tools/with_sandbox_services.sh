#!/usr/bin/env bash
# Run a command with the sandbox backends' system services in place, then clean up:
#  - bubblewrap (the `process` backend): installed with apt-get when missing and running as root;
#  - a Docker engine (the `docker` backend): docker.io installed the same way, dockerd started
#    (vfs storage, no iptables, no bridge) when none answers, and stopped again afterwards;
#  - the sandbox image, built locally with `textgym sandbox build-image` when an engine answers.
# Without root, missing pieces are reported and the docker tests skip (unless TEXTGYM_REQUIRE_DOCKER=1).
# Usage: tools/with_sandbox_services.sh PYTHON_BIN_DIR CMD [ARGS...]
set -uo pipefail
BIN="$1"; shift

as_root() { [ "$(id -u)" -eq 0 ]; }
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v dockerd >/dev/null || missing+=(docker.io)
if [ ${#missing[@]} -gt 0 ]; then
    if as_root && command -v apt-get >/dev/null; then
        echo "installing ${missing[*]} (apt-get)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
            || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1; } \
            || echo "warning: could not install ${missing[*]}"
    else
        echo "warning: ${missing[*]} missing; install with: sudo apt-get install -y ${missing[*]}"
    fi
fi

DOCKERD_PID=""
cleanup() {
    if [ -n "$DOCKERD_PID" ]; then
        kill "$DOCKERD_PID" 2>/dev/null
        wait "$DOCKERD_PID" 2>/dev/null
    fi
}
trap cleanup EXIT
if command -v docker >/dev/null && ! docker info >/dev/null 2>&1 && as_root && command -v dockerd >/dev/null; then
    log="$(mktemp -t textgym-dockerd.XXXXXX.log)"
    dockerd --storage-driver=vfs --iptables=false --bridge=none >"$log" 2>&1 &
    DOCKERD_PID=$!
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "warning: dockerd did not start:"; tail -5 "$log"; }
fi
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    "$BIN/textgym" sandbox build-image || echo "warning: sandbox image build failed"
fi
"$@"
