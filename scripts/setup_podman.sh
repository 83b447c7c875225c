#!/usr/bin/env bash
# Starts podman's Docker-compatible API (runc, socket under .rollstream/podman/) and
# builds/imports the docker sandbox image from Debian packages when it is missing
# (about 30 s on an idle machine, cached under .rollstream/images/). Prints the
# address to use:  rollstream sandbox exec --backend docker -s sandbox.docker.base_url="<it>" -- ...
# Stop it again with: .venv/bin/python -m rollstream.launcher.podman down
set -euo pipefail
cd "$(dirname "$0")/.."
command -v podman >/dev/null && command -v mmdebstrap >/dev/null || scripts/setup_system.sh
.venv/bin/python -m rollstream.launcher.podman image "$@"
.venv/bin/python -m rollstream.launcher.podman up "$@"
