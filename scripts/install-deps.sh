#!/usr/bin/env bash
# Installs what Quiver needs to build, test and train on a fresh Debian 12 machine, all from
# Debian's packages. Optional: libtorch-dev + libopenblas-dev for the peer benchmark
# (QUIVER_WITH_TORCH=1), and the CUDA toolkit under /usr/local/cuda (not installed here).
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
packages=(build-essential cmake ninja-build pkg-config zlib1g-dev libeigen3-dev libdnnl-dev libtbb-dev
          libgtest-dev nlohmann-json3-dev dataset-fashion-mnist
          python3)  # python3: scripts/ (the trace summary, the learners plot)
if [ "${QUIVER_WITH_TORCH:-0}" = "1" ]; then packages+=(libtorch-dev libopenblas-dev); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
if [ -n "$SUDO" ] && ! command -v sudo > /dev/null; then
  echo "install-deps: not root and no sudo: run this as root, or install: ${missing[*]}" >&2
  exit 1
fi
$SUDO apt-get update
# Through env: sudo's env_reset would drop a variable set in front of it, and apt could then ask.
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
