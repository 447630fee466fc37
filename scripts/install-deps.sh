#!/usr/bin/env bash
# install-deps.sh — install the Debian packages moerun needs, if missing.
# Idempotent: does nothing (and needs no network) when all are present.
set -euo pipefail

PKGS=(build-essential cmake pkg-config libcmocka-dev libjansson-dev clang libclang-rt-14-dev libomp-dev
      libpcre2-dev libutf8proc-dev
      libmicrohttpd-dev libcurl4-openssl-dev gnuplot-nox curl python3-venv)
PKGS+=(jq) # tests/cli/chat_template.sh reads the chat goldens
PKGS+=(libopenmpi-dev openmpi-bin) # the mpi expert-parallel transport and its tests (mpirun)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
