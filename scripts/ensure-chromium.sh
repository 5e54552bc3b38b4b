#!/usr/bin/env bash
# Installs Debian's headless Chromium for the HTML tests when it is missing (root only), saying so first.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "make test: chromium is not installed and we are not root: the browser tests will be skipped" >&2
  exit 0
fi
echo "make test: installing Debian's chromium package with apt-get (apt-get update, then apt-get install chromium), for the HTML tests in a headless browser" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq chromium >/dev/null
echo "make test: chromium installed" >&2
