#!/usr/bin/env bash
# Installs Debian's headless Chromium for the HTML tests when it is missing (root only).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "chromium is not installed and we are not root: the browser tests will be skipped" >&2
  exit 0
fi
echo "installing chromium (Debian package) for the HTML tests..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq chromium >/dev/null
