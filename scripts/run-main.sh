#!/usr/bin/env bash
# run-main.sh — the main job of `make run`, on the built-in tiny default model.
set -euo pipefail
BUILD=${1:-build}
M="$BUILD/moerun"
"$M" version
