# moerun — the two set-up commands (README.md): `make run` and `make test`.
# Both install missing Debian packages, configure and build first.
BUILD ?= build
JOBS ?= $(shell nproc)
MAKEFLAGS += --no-print-directory
CMAKE_FLAGS ?=

.PHONY: all deps build run test asan fuzz clean install uninstall

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

# The main job on the built-in tiny default model.
run: build
	@bash scripts/run-main.sh $(BUILD)

# A test without its own TIMEOUT is stopped (and fails) after TEST_TIMEOUT seconds: a hang costs
# minutes, not the CI run (the slowest test takes ~2 minutes under ASan).
TEST_TIMEOUT ?= 900
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout $(TEST_TIMEOUT)

# ASan + UBSan build of the whole suite (CI runs this too).
asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOERUN_SANITIZE=ON >/dev/null
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS) --timeout $(TEST_TIMEOUT)

# libFuzzer run of every fuzz target (safetensors header, tokenizer), each bounded (FUZZ_SECONDS).
FUZZ_SECONDS ?= 60
fuzz: deps
	bash scripts/fuzz.sh $(FUZZ_SECONDS)

# The library (static + shared), the public headers, the CLI and moerun.pc
# under PREFIX (default /usr/local); DESTDIR stages a package.
PREFIX ?= /usr/local
install: build
	DESTDIR="$(DESTDIR)" cmake --install $(BUILD) --prefix "$(PREFIX)"

# Removes what the last `make install` wrote (CMake's install_manifest.txt).
uninstall:
	@test -f $(BUILD)/install_manifest.txt || { echo "no $(BUILD)/install_manifest.txt: nothing installed from $(BUILD)"; exit 1; }
	xargs -d '\n' rm -f -- < $(BUILD)/install_manifest.txt

clean:
	rm -rf $(BUILD) build-asan build-fuzz
