# GPU-kernel integrations: NVRTC cold vs warm per kernel; OpenCL (PoCL) with
# kcache vs PoCL's own kernel cache vs no cache, in child processes.
if(KCACHE_WITH_NVRTC OR KCACHE_WITH_OPENCL)
  add_executable(kcache_bench_gpu ${CMAKE_CURRENT_LIST_DIR}/gpu_bench.cc)
  target_include_directories(kcache_bench_gpu PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests/integrations/gpu)
  target_compile_definitions(kcache_bench_gpu PRIVATE ${KCACHE_DEFS})
  target_link_libraries(kcache_bench_gpu PRIVATE kcache benchmark::benchmark)
  if(KCACHE_WITH_NVRTC)
    target_link_libraries(kcache_bench_gpu PRIVATE kcache_nvrtc)
    target_compile_definitions(kcache_bench_gpu PRIVATE KCACHE_BENCH_CUDA_INCLUDE="${NVRTC_INCLUDE_DIR}")
  endif()
  if(KCACHE_WITH_OPENCL)
    target_link_libraries(kcache_bench_gpu PRIVATE kcache_opencl)
  endif()
endif()

# Processes sharing a cold NVRTC start: one process's compile_all vs N
# started together on the same list (kcache_bench_nvrtc_coop).
if(KCACHE_WITH_NVRTC)
  add_executable(kcache_bench_nvrtc_coop ${CMAKE_CURRENT_LIST_DIR}/nvrtc_coop_bench.cc)
  target_compile_definitions(kcache_bench_nvrtc_coop PRIVATE ${KCACHE_DEFS})
  target_link_libraries(kcache_bench_nvrtc_coop PRIVATE kcache kcache_nvrtc)
endif()
