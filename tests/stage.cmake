# Stage keys (kcache/stage.h): links from front-end keys, early cutoff.
kcache_test(stage_test SOURCES stage_test.cc)
