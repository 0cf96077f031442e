# Core benchmarks: tier hit/put latency, key hashing, compression, each next
# to a baseline measured in the same run (memcpy, llvm::localCache).
add_executable(kcache_bench_core ${CMAKE_CURRENT_LIST_DIR}/core_bench.cc)
target_include_directories(kcache_bench_core PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_compile_definitions(kcache_bench_core PRIVATE ${KCACHE_DEFS})
target_link_libraries(kcache_bench_core PRIVATE kcache benchmark::benchmark)

if(KCACHE_WITH_LLVM)
  # llvm::localCache is the baseline for disk hits. libLLVM has no RTTI, so
  # the one file that includes LLVM headers is built to match.
  add_library(kcache_bench_llvm STATIC ${CMAKE_CURRENT_LIST_DIR}/llvm_file_cache.cc)
  target_include_directories(kcache_bench_llvm SYSTEM PRIVATE ${LLVM_INCLUDE_DIRS})
  target_include_directories(kcache_bench_llvm PRIVATE ${PROJECT_SOURCE_DIR}/include)
  separate_arguments(_llvm_defs NATIVE_COMMAND "${LLVM_DEFINITIONS}")
  target_compile_definitions(kcache_bench_llvm PRIVATE ${_llvm_defs})
  target_compile_options(kcache_bench_llvm PRIVATE -fno-rtti)
  if(TARGET LLVM)
    target_link_libraries(kcache_bench_llvm PUBLIC LLVM)
  else()
    target_link_libraries(kcache_bench_llvm PUBLIC LLVMSupport)
  endif()
  target_link_libraries(kcache_bench_core PRIVATE kcache_bench_llvm)
  target_compile_definitions(kcache_bench_core PRIVATE KCACHE_BENCH_HAVE_LLVM=1)

  # A realistic PTX artifact for the compression benchmarks: CUDA's libdevice
  # bitcode compiled to PTX by LLVM's own NVPTX backend.
  find_file(KCACHE_BENCH_LIBDEVICE libdevice.10.bc
            HINTS $ENV{CUDA_HOME}/nvvm/libdevice /usr/local/cuda/nvvm/libdevice NO_DEFAULT_PATH)
  find_program(KCACHE_BENCH_LLC llc HINTS ${LLVM_TOOLS_BINARY_DIR} NO_DEFAULT_PATH)
  if(KCACHE_BENCH_LIBDEVICE AND KCACHE_BENCH_LLC)
    set(_ptx ${CMAKE_CURRENT_BINARY_DIR}/sample.ptx)
    add_custom_command(OUTPUT ${_ptx}
      COMMAND ${KCACHE_BENCH_LLC} -march=nvptx64 -mcpu=sm_80 -O2 ${KCACHE_BENCH_LIBDEVICE} -o ${_ptx}
      DEPENDS ${KCACHE_BENCH_LIBDEVICE}
      COMMENT "Generating the PTX sample for the compression benchmarks")
    add_custom_target(kcache_bench_ptx DEPENDS ${_ptx})
    add_dependencies(kcache_bench_core kcache_bench_ptx)
    target_compile_definitions(kcache_bench_core PRIVATE KCACHE_BENCH_PTX="${_ptx}")
  endif()
else()
  target_compile_definitions(kcache_bench_core PRIVATE KCACHE_BENCH_HAVE_LLVM=0)
endif()
