# Why did it miss: readable values, private components and labels in keys
# and entries; the miss report and its renderings; the miss journal shared
# by processes and its reader; the nearest entry; the explain log line;
# `kcache misses` and `kcache explain` from the journal.
kcache_test(explain_key_test SOURCES explain_key_test.cc)
target_compile_definitions(explain_key_test PRIVATE GOLDEN_KEY_HEX="${KCACHE_GOLDEN_KEY}")
kcache_test(explain_report_test SOURCES explain_report_test.cc)
kcache_test(explain_journal_test SOURCES explain_journal_test.cc LABELS concurrency)
kcache_test(explain_cli_test SOURCES explain_cli_test.cc)
add_dependencies(explain_cli_test kcache_cli)
