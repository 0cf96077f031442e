# GPU-kernel integrations: NVRTC cold vs warm per kernel; OpenCL (PoCL) with
# kcache vs PoCL's own kernel cache vs no cache, in child processes.
if(KCACHE_WITH_NVRTC OR KCACHE_WITH_OPENCL)
  add_executable(kcache_bench_gpu ${CMAKE_CURRENT_LIST_DIR}/gpu_bench.cc)
  target_include_directories(kcache_bench_gpu PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests/integrations/gpu)
  target_compile_definitions(kcache_bench_gpu PRIVATE ${KCACHE_DEFS})
  target_link_libraries(kcache_bench_gpu PRIVATE kcache benchmark::benchmark)
  if(KCACHE_WITH_NVRTC)
    target_link_libraries(kcache_bench_gpu PRIVATE kcache_nvrtc)
  endif()
  if(KCACHE_WITH_OPENCL)
    target_link_libraries(kcache_bench_gpu PRIVATE kcache_opencl)
  endif()
endif()
