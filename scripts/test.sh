#!/usr/bin/env bash
# Set up (idempotent), type-check, and run the whole test suite, Docker sandbox tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/typecheck.sh
exec .venv/bin/python -m pytest "$@"
