# The C ABI, exercised from plain C (C11, -Wpedantic -Werror) so the header
# stays valid C and nothing C++ leaks through it.
if(TARGET kcache_capi)
  add_executable(c_test c_test.c)
  set_target_properties(c_test PROPERTIES C_STANDARD 11 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
  target_compile_options(c_test PRIVATE -Wpedantic -Werror)
  target_link_libraries(c_test PRIVATE kcache_capi Threads::Threads)
  add_test(NAME c_test COMMAND c_test)
  set_tests_properties(c_test PROPERTIES TIMEOUT 120)
endif()
