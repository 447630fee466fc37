#!/usr/bin/env bash
# openai-venv.sh VENV — a private Python venv with the official `openai` and
# `anthropic` clients (PyPI) and `jsonschema` (the oracle of structured outputs), for the
# compatibility test tests/cli/serve_openai.sh. Made
# once and reused. Exit 77 (the tests' SKIP code) when Python's venv or pip,
# or the network to PyPI, is not there; any other failure is exit 1.
set -u
VENV=${1:?usage: openai-venv.sh VENV}
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3 || true)
if [ -z "$PY" ]; then echo "openai-venv: no python3 on this machine"; exit 77; fi
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import openai, anthropic, jsonschema' 2>/dev/null; then exit 0; fi
rm -rf "$VENV"
if ! "$PY" -m venv "$VENV" >"$VENV.log" 2>&1; then
    echo "openai-venv: '$PY -m venv' is not available (Debian: apt-get install python3-venv): $(tail -1 "$VENV.log")"
    rm -rf "$VENV"; exit 77
fi
if ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    echo "openai-venv: the venv has no pip"; rm -rf "$VENV"; exit 77
fi
if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check 'openai>=1.0' 'anthropic>=0.40' 'jsonschema>=4' >>"$VENV.log" 2>&1; then
    echo "openai-venv: pip could not install openai from PyPI (offline?): $(tail -1 "$VENV.log")"
    rm -rf "$VENV"; exit 77
fi
"$VENV/bin/python" -c 'import openai; print("openai-venv: openai", openai.__version__)'
