kcache_test(cli_test SOURCES cli_test.cc)
add_dependencies(cli_test kcache_cli)
