#!/usr/bin/env bash
# bench/peers/llamacpp_setup.sh — prepares the llama.cpp peer: private Python
# virtual environments with llama-cpp-python (built from its PyPI source, which
# compiles llama.cpp's CPU backend) and GGUF files converted from moerun
# checkpoints. Reusable by any tool that wants llama.cpp beside moerun (the
# timing script bench/peers/llamacpp_bench.py, a server comparison, ...).
#
#   bench/peers/llamacpp_setup.sh venv              # both builds (see below)
#   bench/peers/llamacpp_setup.sh gguf CKPT OUT.gguf [TYPE]   # convert one checkpoint
#   bench/peers/llamacpp_setup.sh all               # venv + the real-shape set (README)
#
# Two builds, so that each moerun kernel path has a llama.cpp of the same ISA:
#   $PEERS/venv-native  llama.cpp compiled for this CPU (-march=native: AVX-512 here)
#   $PEERS/venv-avx2    llama.cpp compiled for AVX2 + FMA + F16C, no AVX-512
# PEERS defaults to build/peers (ignored by git). Every step is idempotent: a
# finished venv or GGUF file is kept (delete it to redo it); a failed step
# leaves nothing half-written (builds go to a temporary folder, GGUF files to
# a temporary name, both renamed at the end).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PEERS=${PEERS:-$ROOT/build/peers}
LLAMA_CPP_PYTHON_VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
GGUF_VERSION=${GGUF_VERSION:-0.19.0}
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}

die() { echo "llamacpp_setup: $*" >&2; exit 1; }

make_venv() { # name cmake_args
    local name=$1 args=$2 dir=$PEERS/$1
    if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "import llama_cpp, gguf, numpy" 2>/dev/null; then
        echo "llamacpp_setup: $name ready ($("$dir/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)'))"
        return 0
    fi
    local tmp=$dir.tmp.$$
    rm -rf "$tmp"
    mkdir -p "$PEERS"
    echo "llamacpp_setup: building $name (llama-cpp-python $LLAMA_CPP_PYTHON_VERSION, CMAKE_ARGS=$args); this compiles llama.cpp and takes minutes"
    "$PY" -m venv "$tmp" || die "cannot create a virtual environment with $PY (Debian: apt-get install python3-venv)"
    "$tmp/bin/python" -m pip install --quiet --upgrade pip >/dev/null
    "$tmp/bin/python" -m pip install --quiet "numpy<3" "gguf==$GGUF_VERSION" || { rm -rf "$tmp"; die "pip could not install numpy and gguf"; }
    CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
        "$tmp/bin/python" -m pip install --no-cache-dir --no-binary llama-cpp-python \
        "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" || { rm -rf "$tmp"; die "building llama-cpp-python failed (see above)"; }
    "$tmp/bin/python" -c "import llama_cpp" || { rm -rf "$tmp"; die "llama_cpp does not import after the build"; }
    # a venv records its own path in its scripts: move by re-creating the launcher paths
    rm -rf "$dir"
    mv "$tmp" "$dir"
    sed -i "s#$tmp#$dir#g" "$dir"/bin/* 2>/dev/null || true
    echo "llamacpp_setup: $name ready"
}

cmd=${1:-all}
case "$cmd" in
venv)
    make_venv venv-native "-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
    make_venv venv-avx2 "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
    ;;
*) die "unknown command $cmd (venv | gguf CKPT OUT [TYPE] | all)" ;;
esac
