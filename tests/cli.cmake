# The kcache command-line tool, one suite per group of commands, each
# running the real binary; and the library's manifest and JSON API it uses.
foreach(t cli_store_test cli_maintenance_test cli_explain_test cli_usage_test)
  kcache_test(${t} SOURCES ${t}.cc)
  add_dependencies(${t} kcache_cli)
endforeach()
kcache_test(cli_run_test SOURCES cli_run_test.cc LABELS concurrency)
add_dependencies(cli_run_test kcache_cli)
# KCACHE_REMOTE through the tool, against a real redis-server.
if(KCACHE_WITH_REDIS)
  kcache_test(cli_remote_test SOURCES cli_remote_test.cc LABELS redis)
  target_link_libraries(cli_remote_test PRIVATE PkgConfig::HIREDIS)
  add_dependencies(cli_remote_test kcache_cli)
endif()
kcache_test(manifest_test SOURCES manifest_test.cc)
