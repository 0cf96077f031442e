# What a miss costs for "why did it miss": the journal append, and the
# KCACHE_EXPLAIN comparison with the store's entries.
add_executable(kcache_bench_explain ${CMAKE_CURRENT_LIST_DIR}/explain_bench.cc)
target_include_directories(kcache_bench_explain PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_compile_definitions(kcache_bench_explain PRIVATE ${KCACHE_DEFS})
target_link_libraries(kcache_bench_explain PRIVATE kcache benchmark::benchmark)
