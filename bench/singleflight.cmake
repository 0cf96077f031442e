# Cross-process single-flight on versus off: 8 processes x 200 keys cold.
add_executable(kcache_bench_singleflight ${CMAKE_CURRENT_LIST_DIR}/singleflight_bench.cc)
target_link_libraries(kcache_bench_singleflight PRIVATE kcache benchmark::benchmark)
