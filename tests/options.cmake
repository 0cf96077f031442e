# Options by name, their precedence, the policy gate, and the disk store spec.
kcache_test(options_test SOURCES options_test.cc)
