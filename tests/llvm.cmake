# LLVM integration tests (real LLVM 14: ORC, MCJIT), only when it was found.
if(KCACHE_WITH_LLVM AND TARGET kcache_llvm)
  kcache_test(llvm_test SOURCES llvm_test.cc LABELS "llvm;concurrency" TIMEOUT 600)
  target_link_libraries(llvm_test PRIVATE kcache_llvm)
endif()
