# Redis tier: remote hit latency against a local hit, pipelined multi-get
# throughput against one GET per key. Starts its own redis-server.
if(KCACHE_WITH_REDIS)
  add_executable(kcache_bench_redis ${CMAKE_CURRENT_LIST_DIR}/redis_bench.cc)
  target_include_directories(kcache_bench_redis PRIVATE ${PROJECT_SOURCE_DIR}/tests/support)
  target_compile_definitions(kcache_bench_redis PRIVATE ${KCACHE_DEFS})
  target_link_libraries(kcache_bench_redis PRIVATE kcache benchmark::benchmark PkgConfig::HIREDIS)
endif()
