#!/usr/bin/env bash
# Installs the Debian packages the testbed needs, only those that are missing.
# Idempotent: a second run installs nothing and takes well under a second.
# chromium: the headless browser the `testbed watch` tests open TensorBoard in.
set -euo pipefail
pkgs=(gnuradio python3-uhd dataset-fashion-mnist python3-venv chromium)
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing Debian packages: ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "error: need root (or sudo) to apt-get install ${missing[*]}" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >/dev/null
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
