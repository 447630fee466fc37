#!/usr/bin/env bash
# bench/peers/llamacpp_setup.sh — prepares the llama.cpp peer: private Python
# virtual environments with llama-cpp-python (built from its PyPI source, which
# compiles llama.cpp's CPU backend) and GGUF files converted from moerun
# checkpoints. Reusable by any tool that wants llama.cpp beside moerun (the
# timing script bench/peers/llamacpp_bench.py, a server comparison, ...).
#
#   bench/peers/llamacpp_setup.sh venv              # both builds (see below)
#   bench/peers/llamacpp_setup.sh gguf CKPT OUT.gguf [q8_0|q4_0|nvfp4|bf16]
#   bench/peers/llamacpp_setup.sh all               # venv + the real-shape set (real_set below)
#   bench/peers/llamacpp_setup.sh real              # the real-shape set only (needs the venvs)
#   bench/peers/llamacpp_setup.sh server            # llama.cpp's C++ llama-server (server() below)
#   bench/peers/llamacpp_setup.sh server-avx2       # the same built without AVX-512 (llama-server-avx2)
#
# Two builds, so that each moerun kernel path has a llama.cpp of the same ISA:
#   $PEERS/venv-native  llama.cpp compiled for this CPU (-march=native; on a CPU
#                       without AVX-512, a link to venv-avx2: the same build)
#   $PEERS/venv-avx2    llama.cpp compiled for AVX2 + FMA + F16C, no AVX-512
#                       (+ AVX-VNNI where the CPU has it: moerun's AVX2 level uses it)
# Each venv also has llama-cpp-python's [server] extra (python -m
# llama_cpp.server: an OpenAI-compatible server beside moerun's).
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
        if ! "$dir/bin/python" -c "import llama_cpp.server.app" 2>/dev/null; then
            echo "llamacpp_setup: $name: adding the [server] extra"
            CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS "$dir/bin/python" -m pip install --quiet --no-binary llama-cpp-python \
                "llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION" || die "pip could not install the [server] extra into $name"
        fi
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
        "llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION" || { rm -rf "$tmp"; die "building llama-cpp-python failed (see above)"; }
    "$tmp/bin/python" -c "import llama_cpp, llama_cpp.server.app" || { rm -rf "$tmp"; die "llama_cpp (or its server) does not import after the build"; }
    # a venv records its own path in its scripts: move by re-creating the launcher paths
    rm -rf "$dir"
    mv "$tmp" "$dir"
    sed -i "s#$tmp#$dir#g" "$dir"/bin/* 2>/dev/null || true
    echo "llamacpp_setup: $name ready"
}

venvs() {
    if grep -qw avx512f /proc/cpuinfo; then
        make_venv venv-native "-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
    elif [ ! -e "$PEERS/venv-native" ]; then # no AVX-512 here: the native build would be the AVX2 one
        mkdir -p "$PEERS"
        ln -s venv-avx2 "$PEERS/venv-native"
        echo "llamacpp_setup: this CPU has no AVX-512: venv-native is a link to venv-avx2 (one build)"
    fi
    # AVX-VNNI (VEX vpdpbusd: Intel cores since Alder Lake, Zen 5) where the CPU has it, as
    # moerun's AVX2 level takes it there; a build without it would handicap the peer
    local vnni=OFF
    if grep -qw avx_vnni /proc/cpuinfo; then vnni=ON; fi
    make_venv venv-avx2 "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=$vnni -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
}

gguf() { # ckpt out type: kept if OUT exists (the converter writes OUT.tmp and renames)
    local ckpt=$1 out=$2 type=${3:-q8_0}
    [ -f "$ckpt/config.json" ] || die "$ckpt: not a moerun/HF checkpoint folder (no config.json)"
    if [ -f "$out" ]; then echo "llamacpp_setup: $out exists, kept"; return 0; fi
    local py=$PEERS/venv-native/bin/python
    [ -x "$py" ] || py=$PEERS/venv-avx2/bin/python
    [ -x "$py" ] || die "no peer venv yet: run $0 venv first"
    "$py" "$ROOT/bench/peers/gguf_convert.py" "$ckpt" "$out" --type "$type"
}

# The real-shape MiniMax-M2 set of bench/README.md (2 layers, hidden 3072, 256
# experts of 1536, top-8, vocab 8192): moerun checkpoints made with gen-tiny
# under $CKPT (default: the folder that holds $PEERS, so PEERS=/work/ckpt/peers
# uses /work/ckpt/real2-fp8 and /work/ckpt/real2-nvfp4), GGUF files in $PEERS
# (real2-q8_0.gguf, real2-nvfp4.gguf, real2-q4_0.gguf).
real_set() {
    local C=${CKPT:-$(dirname "$PEERS")} M=${MOERUN:-$ROOT/build/moerun}
    local shape="--hidden 3072 --layers 2 --experts 256 --top-k 8 --expert-dim 1536 --heads 48 --kv-heads 8 --head-dim 128 --rotary-dim 64 --vocab 8192"
    for q in fp8 nvfp4; do
        [ -f "$C/real2-$q/config.json" ] && continue
        [ -x "$M" ] || die "no moerun binary at $M (make build) to generate $C/real2-$q"
        # shellcheck disable=SC2086
        # gen-tiny writes to a temporary name; renamed when complete
        rm -rf "$C/real2-$q.tmp.$$"
        "$M" gen-tiny "$C/real2-$q.tmp.$$" $shape --quant "$q" || { rm -rf "$C/real2-$q.tmp.$$"; die "gen-tiny $q failed"; }
        mv "$C/real2-$q.tmp.$$" "$C/real2-$q"
    done
    mkdir -p "$PEERS"
    gguf "$C/real2-fp8" "$PEERS/real2-q8_0.gguf" q8_0
    gguf "$C/real2-nvfp4" "$PEERS/real2-nvfp4.gguf" nvfp4
    gguf "$C/real2-nvfp4" "$PEERS/real2-q4_0.gguf" q4_0
}

# llama.cpp's own C++ server (llama-server: slots with continuous batching),
# built from the llama.cpp that llama-cpp-python $LLAMA_CPP_PYTHON_VERSION vendors (its
# PyPI source archive), so that it is the same llama.cpp as the venvs'. CPU
# flags: AVX2 + FMA + F16C, AVX-512 (F/VBMI/VNNI/BF16) where the CPU has
# avx512f, AVX-VNNI where it has avx_vnni; AMX off (moerun has no AMX path,
# and llama.cpp's AMX path crashed on q8_0 on a Sapphire Rapids host:
# bench/README.md). No web UI (nothing to download at build time); static
# libraries, so the binary runs from anywhere. Result:
# $PEERS/llama-server/bin/llama-server.
server() { # [avx2]: $PEERS/llama-server-avx2, AVX-512 off (beside moerun's AVX2 level)
    local name=llama-server
    if [ "${1:-}" = avx2 ]; then name=llama-server-avx2; fi
    local dir=$PEERS/$name
    if [ -x "$dir/bin/llama-server" ] && "$dir/bin/llama-server" --version >/dev/null 2>&1; then
        echo "llamacpp_setup: llama-server ready ($("$dir/bin/llama-server" --version 2>&1 | grep -m1 version))"
        return 0
    fi
    command -v cmake >/dev/null || die "cmake is needed to build llama-server"
    local py=$PEERS/venv-native/bin/python
    [ -x "$py" ] || py=$PY
    local tmp=$dir.tmp.$$ a512=OFF vnni=OFF
    rm -rf "$tmp"
    mkdir -p "$tmp/src"
    echo "llamacpp_setup: fetching llama-cpp-python $LLAMA_CPP_PYTHON_VERSION's source (llama.cpp vendored in it)"
    "$py" -m pip download --quiet --no-deps --no-binary :all: -d "$tmp/src" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" ||
        { rm -rf "$tmp"; die "pip could not download llama-cpp-python's source"; }
    tar xzf "$tmp"/src/llama_cpp_python-*.tar.gz -C "$tmp/src" || { rm -rf "$tmp"; die "cannot unpack the source archive"; }
    local L
    L=$(echo "$tmp"/src/llama_cpp_python-*/vendor/llama.cpp)
    [ -f "$L/tools/server/CMakeLists.txt" ] || { rm -rf "$tmp"; die "no tools/server in $L"; }
    if grep -qw avx512f /proc/cpuinfo && [ "$name" = llama-server ]; then a512=ON; fi
    if grep -qw avx_vnni /proc/cpuinfo; then vnni=ON; fi
    echo "llamacpp_setup: building $name (AVX-512 $a512, AVX-VNNI $vnni, AMX off); this takes minutes"
    cmake -S "$L" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
        -DGGML_F16C=ON -DGGML_AVX512=$a512 -DGGML_AVX512_VBMI=$a512 -DGGML_AVX512_VNNI=$a512 -DGGML_AVX512_BF16=$a512 \
        -DGGML_AVX_VNNI=$vnni -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >"$tmp/cmake.log" 2>&1 ||
        { tail -20 "$tmp/cmake.log"; rm -rf "$tmp"; die "configuring llama-server failed"; }
    cmake --build "$tmp/build" --target llama-server -j "$JOBS" >"$tmp/build.log" 2>&1 ||
        { tail -20 "$tmp/build.log"; rm -rf "$tmp"; die "building llama-server failed"; }
    mkdir -p "$tmp/out/bin"
    cp -a "$tmp/build/bin/." "$tmp/out/bin/"
    # what the build is for (llamacpp_bench.py --isa avx2 refuses a server without AVX512=OFF here)
    printf 'AVX512=%s AVX_VNNI=%s AMX=OFF\n' "$a512" "$vnni" >"$tmp/out/build-flags.txt"
    "$tmp/out/bin/llama-server" --version >/dev/null 2>&1 || { rm -rf "$tmp"; die "the built llama-server does not run"; }
    rm -rf "$dir"
    mv "$tmp/out" "$dir"
    rm -rf "$tmp"
    echo "llamacpp_setup: $name ready in $dir/bin"
}

cmd=${1:-all}
case "$cmd" in
venv) venvs ;;
gguf) [ $# -ge 3 ] || die "usage: $0 gguf CKPT OUT.gguf [q8_0|q4_0|nvfp4|bf16]"; gguf "$2" "$3" "${4:-q8_0}" ;;
real) real_set ;;
server) server ;;
server-avx2) server avx2 ;;
all) venvs; real_set ;;
*) die "unknown command $cmd (venv | gguf CKPT OUT [TYPE] | real | server | server-avx2 | all)" ;;
esac
