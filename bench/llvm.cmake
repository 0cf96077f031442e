# LLVM JIT cold versus warm (bench/llvm_bench.cc), on the demo's kernel
# language (examples/jit/kernels.cc, compiled in here because bench/ is
# configured before examples/).
if(KCACHE_WITH_LLVM AND TARGET kcache_llvm)
  add_executable(kcache_bench_llvm_jit ${CMAKE_CURRENT_LIST_DIR}/llvm_bench.cc
                 ${PROJECT_SOURCE_DIR}/examples/jit/kernels.cc)
  target_include_directories(kcache_bench_llvm_jit PRIVATE ${PROJECT_SOURCE_DIR}/examples/jit)
  target_link_libraries(kcache_bench_llvm_jit PRIVATE kcache_llvm kcache benchmark::benchmark)
endif()

# A real C code base (Lua 5.4, 32 translation units as bitcode) through
# make_cached_lljit: scripts/lua_bench.sh fetches and builds it, then runs this.
if(KCACHE_WITH_LLVM AND TARGET kcache_llvm)
  add_executable(kcache_bench_lua_jit ${CMAKE_CURRENT_LIST_DIR}/lua_jit_bench.cc)
  target_link_libraries(kcache_bench_lua_jit PRIVATE kcache_llvm kcache)
endif()
