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

# ThinLTO links through llvm::lto::LTO with llvm::localCache and with
# kcache::llvm::localCache (bench/thinlto_bench.cc), over the ThinLTO
# bitcode the tests make (tests/integrations/llvm/CMakeLists.txt).
get_property(_thinlto_objects GLOBAL PROPERTY KCACHE_THINLTO_OBJECTS)
if(KCACHE_WITH_LLVM AND TARGET kcache_llvm AND TARGET llvm_thinlto_inputs AND TARGET LLVM AND NOT KCACHE_LLVM_STATIC)
  add_executable(kcache_bench_thinlto ${CMAKE_CURRENT_LIST_DIR}/thinlto_bench.cc)
  target_include_directories(kcache_bench_thinlto PRIVATE ${PROJECT_SOURCE_DIR}/tests/integrations/llvm)
  string(REPLACE ";" ":" _thinlto_list "${_thinlto_objects}")
  target_compile_definitions(kcache_bench_thinlto PRIVATE KCACHE_THINLTO_INPUTS="${_thinlto_list}")
  target_link_libraries(kcache_bench_thinlto PRIVATE kcache_llvm kcache)
  add_dependencies(kcache_bench_thinlto llvm_thinlto_inputs)
endif()

# A real C code base (one bitcode file per translation unit) JIT-ed by a
# plain LLJIT and by make_cached_lljit + BitcodeLoader (no cache, cold,
# warm): scripts/llvm_codebase_bench.sh makes the bitcode, then runs this.
if(KCACHE_WITH_LLVM AND TARGET kcache_llvm)
  add_executable(kcache_bench_llvm_codebase ${CMAKE_CURRENT_LIST_DIR}/llvm_codebase_bench.cc)
  target_include_directories(kcache_bench_llvm_codebase PRIVATE ${PROJECT_SOURCE_DIR}/examples/jit)
  target_link_libraries(kcache_bench_llvm_codebase PRIVATE kcache_llvm kcache)
endif()
