#!/usr/bin/env bash
# Type-check the package with mypy (settings: [tool.mypy] in pyproject.toml).
# The repo root is the `codepost` package whatever folder it was cloned into, and the editable
# install reaches it through an import hook mypy cannot follow: mypy reads it through a link
# named `codepost` in a scratch folder, so it checks these files, not another copy.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
base=$(mktemp -d)
trap 'rm -rf "$base"' EXIT
ln -s "$ROOT" "$base/codepost"
cd "$base"  # paths in messages (and in the cache) read codepost/...
MYPYPATH=$base "$ROOT/.venv/bin/python" -m mypy --config-file "$ROOT/pyproject.toml" \
  --cache-dir "$ROOT/.mypy_cache" "$@"
