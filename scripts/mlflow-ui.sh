#!/usr/bin/env bash
# MLflow's UI over a run's MLflow store (report_to: [mlflow]):
#   bash scripts/mlflow-ui.sh runs/post-train [--port 5000] [any other `mlflow ui` option]
# codepost installs mlflow-skinny, the client with its SQLite store, which has no UI. The full
# mlflow of the same release has it, but wants pyarrow<26, older than the stack's pin: so it
# goes into a virtualenv of its own (once: about 2 minutes, 850 MB), which reads the run's store
# as the client wrote it (the same release: the same store schema, no migration).
set -euo pipefail
RUN=${1:?usage: bash scripts/mlflow-ui.sh RUN_FOLDER [mlflow ui options]}
shift
VERSION=3.17.2 # the client's (mlflow-skinny in pyproject.toml)
CACHE=${CODEPOST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/codepost}
VENV=$CACHE/mlflow-ui-$VERSION
STORE=$RUN/tracking/mlflow.db
if [ ! -f "$STORE" ]; then
  echo "mlflow-ui: no MLflow store at $STORE (a run with report_to: [mlflow] and no" \
    "MLFLOW_TRACKING_URI writes it there)" >&2
  exit 2
fi
if [ ! -f "$VENV/installed" ]; then
  echo "mlflow-ui: installing mlflow $VERSION with its UI into $VENV (once)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "mlflow==$VERSION"
  touch "$VENV/installed"
fi
exec "$VENV/bin/mlflow" ui --backend-store-uri "sqlite:///$(realpath "$STORE")" "$@"
