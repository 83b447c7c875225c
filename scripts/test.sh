#!/usr/bin/env bash
# Starts what the tests need (Kafka, PostgreSQL, the default task set), runs ruff
# and pytest, stops the services again and exits with pytest's status.
set -euo pipefail
cd "$(dirname "$0")/.."
RS=.venv/bin/rollstream
$RS kafka up
$RS postgres up
trap '$RS postgres down || true; $RS kafka down || true' EXIT
.venv/bin/ruff check .
.venv/bin/ruff format --check .
$RS tasks default
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
