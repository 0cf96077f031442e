# Thin wrapper over CMake. `make demo` and `make test` first install any
# missing system packages (scripts/install-deps.sh). CMAKE_FLAGS passes
# options to CMake, e.g. CMAKE_FLAGS=-DKCACHE_WERROR=ON.
BUILD ?= build
JOBS  ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test bench sanitize install-check clean

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	@bash scripts/demo.sh $(BUILD)

test: build
	@cd $(BUILD) && ctest -j $(JOBS) --output-on-failure --timeout 600

bench: build
	@bash scripts/bench.sh $(BUILD)

# Installs the build into a temporary prefix and builds and runs a C++ client
# (find_package) and a C client (pkg-config) against it.
install-check: build
	@bash scripts/install_check.sh $(BUILD)

# AddressSanitizer + UndefinedBehaviorSanitizer on the whole core suite, and
# ThreadSanitizer on the concurrency tests.
sanitize: deps
	@bash scripts/sanitize.sh

clean:
	rm -rf $(BUILD) build-asan build-tsan
