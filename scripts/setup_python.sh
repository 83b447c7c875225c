#!/usr/bin/env bash
# Creates .venv, installs Rollstream with its dev extras and builds the docker exec helper.
# uv is used because it keeps a shared wheel cache (~/.cache/uv): torch's CUDA wheels (several
# GB, the only torch build PyPI serves for linux x86_64; it runs on the CPU) download once.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if [ ! -x .venv/bin/uv ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "uv>=0.4"
fi
.venv/bin/uv pip install --python .venv/bin/python --quiet -e ".[dev]"
# The docker backend's exec helper, a static binary built from sandboxes/helper/ (a worker
# builds it on first use too; this keeps that out of the first test or run).
.venv/bin/python -m sandboxes.docker_helper >/dev/null
