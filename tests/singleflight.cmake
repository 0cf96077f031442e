kcache_test(singleflight_test SOURCES singleflight_test.cc LABELS concurrency TIMEOUT 600)
kcache_test(batch_test SOURCES batch_test.cc LABELS concurrency)
kcache_test(flight_test SOURCES flight_test.cc LABELS concurrency)
