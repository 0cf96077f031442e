#!/usr/bin/env bash
# ASan+UBSan build of the core suite, then TSan on the tests labelled
# `concurrency`. Integrations (LLVM, CUDA, OpenCL) are left out: their
# libraries are not built with sanitizers.
set -euo pipefail
JOBS=$(nproc)
common=(-DKCACHE_WITH_LLVM=OFF -DKCACHE_WITH_NVRTC=OFF -DKCACHE_WITH_OPENCL=OFF
        -DKCACHE_BUILD_BENCH=OFF -DKCACHE_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Debug -DKCACHE_WERROR=ON)

cmake -S . -B build-asan "${common[@]}" -DKCACHE_SANITIZE=address,undefined >/dev/null
cmake --build build-asan -j "$JOBS"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
   ctest -j "$JOBS" --output-on-failure --timeout 900)

cmake -S . -B build-tsan "${common[@]}" -DKCACHE_SANITIZE=thread >/dev/null
cmake --build build-tsan -j "$JOBS"
(cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
   ctest -j "$JOBS" -L concurrency --output-on-failure --timeout 900)
