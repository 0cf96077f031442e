# The Redis tier, against redis-server processes the tests start themselves.
# Every test here runs the tier's background writer thread.
if(KCACHE_WITH_REDIS)
  kcache_test(redis_test SOURCES redis_test.cc LABELS redis concurrency TIMEOUT 300)
  target_link_libraries(redis_test PRIVATE PkgConfig::HIREDIS)
  kcache_test(redis_cluster_test SOURCES redis_cluster_test.cc LABELS redis concurrency TIMEOUT 300)
  target_link_libraries(redis_cluster_test PRIVATE PkgConfig::HIREDIS)
endif()
