#!/usr/bin/env bash
# soak-serve.sh [BUILD] — the long soak of `moerun serve`: 10,000 streaming
# requests at concurrency 128 (tests/cli/serve_soak.sh runs 2,000 at 64 in
# `make test`). Several minutes on the tiny model.
set -euo pipefail
BUILD=${1:-build}
SOAK_REQUESTS=${SOAK_REQUESTS:-10000} SOAK_CONCURRENCY=${SOAK_CONCURRENCY:-128} \
    bash tests/cli/serve_soak.sh "$BUILD/moerun" tests/data "$BUILD/soak_serve"
