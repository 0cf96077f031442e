kcache_test(singleflight_test SOURCES singleflight_test.cc LABELS concurrency TIMEOUT 600)
kcache_test(batch_test SOURCES batch_test.cc LABELS concurrency)
kcache_test(cli_run_test SOURCES cli_run_test.cc LABELS concurrency)
add_dependencies(cli_run_test kcache_cli)
