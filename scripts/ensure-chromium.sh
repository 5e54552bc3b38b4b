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
# apt verifies the package lists with gpgv through apt-key, whose search for gpgv (`command -v gpgv
# >/dev/null`, run as apt's unprivileged user) fails where that user may not open /dev/null (seen in a
# sandbox): "gpgv, gpgv2 or gpgv1 required for verification, but neither seems installed". Given the
# binary's path, apt-key only tests that it is executable.
apt_options=()
if gpgv=$(command -v gpgv); then
  apt_options=(-o "Apt::Key::gpgvcommand=$gpgv")
fi
apt-get "${apt_options[@]}" update -qq >/dev/null
apt-get "${apt_options[@]}" install -y -qq chromium >/dev/null
echo "make test: chromium installed" >&2
