# The two commands of the README: `make run` (the main job) and `make test` (everything CI runs).
.PHONY: setup run test lint

setup:
	scripts/setup_system.sh
	scripts/setup_python.sh

run: setup
	.venv/bin/rollstream demo

test: setup
	scripts/test.sh

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
