# Disk tiers: fork() safety, map size, close-on-exec, read-only stores that
# are never written, entries of another format version.
if(KCACHE_WITH_LMDB)
  kcache_test(lmdb_fork_test SOURCES lmdb_fork_test.cc LABELS concurrency TIMEOUT 120)
  kcache_test(lmdb_map_resize_test SOURCES lmdb_map_resize_test.cc TIMEOUT 180)
  kcache_test(lmdb_cloexec_test SOURCES lmdb_cloexec_test.cc TIMEOUT 60)
endif()
kcache_test(readonly_no_write_test SOURCES readonly_no_write_test.cc TIMEOUT 120)
kcache_test(stale_format_test SOURCES stale_format_test.cc TIMEOUT 120)
target_link_libraries(stale_format_test PRIVATE PkgConfig::XXHASH)
# Damaged LMDB stores kept as regression fixtures (tests/fixtures/lmdb-damaged).
if(KCACHE_WITH_LMDB)
  kcache_test(lmdb_damaged_fixture_test SOURCES lmdb_damaged_fixture_test.cc TIMEOUT 300)
  target_compile_definitions(lmdb_damaged_fixture_test PRIVATE
    KCACHE_FIXTURES_DIR="${CMAKE_CURRENT_SOURCE_DIR}/fixtures")
endif()
