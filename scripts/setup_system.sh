#!/usr/bin/env bash
# Installs the Debian packages the tests need when they are missing: bubblewrap
# (default sandbox), PostgreSQL (second event-store backend), podman + runc (the
# Docker-compatible API for the docker backend), mmdebstrap (its root filesystem), gcc and
# libc6-dev (the docker backend's static exec helper, sandboxes/helper/),
# Java and Maven (Kafka from Maven Central), Chromium (the run report's headless browser test),
# Prometheus (scrapes `rollstream monitor` in the tests).
set -euo pipefail
need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
[ -x /usr/lib/postgresql/15/bin/initdb ] || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v podman >/dev/null || need+=(podman runc fuse-overlayfs slirp4netns uidmap)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v gcc >/dev/null && [ -f "$(gcc -print-file-name=libc.a)" ] || need+=(gcc libc6-dev)
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need+=(maven)
command -v prometheus >/dev/null || need+=(prometheus)
command -v chromium >/dev/null || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
