# The remote policy tier over two transports (a real redis-server started by
# the tests, and the in-process fault transport), and the bound on what a
# hung, paused, dead or refusing remote costs one compile.
if(KCACHE_WITH_REDIS)
  kcache_test(remote_suite_test SOURCES remote_suite_test.cc LABELS redis concurrency TIMEOUT 300)
  target_link_libraries(remote_suite_test PRIVATE PkgConfig::HIREDIS)
  kcache_test(remote_budget_test SOURCES remote_budget_test.cc LABELS redis TIMEOUT 300)
  target_link_libraries(remote_budget_test PRIVATE PkgConfig::HIREDIS)
endif()
