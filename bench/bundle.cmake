# Bundle benchmarks: open time by entry count, and bundle hits against LMDB
# hits of the same entries in the same run.
add_executable(kcache_bench_bundle ${CMAKE_CURRENT_LIST_DIR}/bundle_bench.cc)
target_include_directories(kcache_bench_bundle PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_compile_definitions(kcache_bench_bundle PRIVATE ${KCACHE_DEFS})
target_link_libraries(kcache_bench_bundle PRIVATE kcache benchmark::benchmark)
