#!/usr/bin/env bash
# The main job, set-up included (idempotent): the whole post-training pipeline on its embedded
# default (SmolLM2-135M on the CPU with vLLM; SFT, GRPO and DPO on MBPP training problems;
# greedy pass@1 on HumanEval after every stage) as a Prefect flow, with no server to start.
# Run again, it resumes after the last finished stage. Pass `--config file.yaml` or
# `--run-dir DIR` to change it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/codepost run "$@"
