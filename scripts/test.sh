#!/usr/bin/env bash
# Starts what the tests need (Kafka, PostgreSQL, the default task set), runs ruff,
# builds the documentation site (--strict: a broken link or any warning fails) and
# runs pytest, stops the services again and exits with pytest's status.
set -euo pipefail
cd "$(dirname "$0")/.."
RS=.venv/bin/rollstream
$RS kafka up
$RS postgres up
trap '$RS postgres down || true; $RS kafka down || true' EXIT
.venv/bin/ruff check .
.venv/bin/ruff format --check .
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet  # the variable hides a banner about MkDocs 2
$RS tasks default
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
