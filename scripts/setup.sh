#!/usr/bin/env bash
# Installs what parity needs to build and test, from Debian packages (Debian 12 or
# later, Ubuntu 24.04). Run as root or with sudo available. Does nothing when
# everything is already installed.
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config
          libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libfmt-dev
          libgtest-dev libgmock-dev)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup.sh: run as root (missing: ${missing[*]})" >&2; exit 1; }
  sudo=sudo
fi
echo "setup.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
