# Disk-tier robustness: many processes, SIGKILL, corruption, full and
# read-only file systems, eviction under contention, put cost.
kcache_test(disk_multiprocess_test SOURCES disk_multiprocess_test.cc LABELS concurrency TIMEOUT 120)
kcache_test(disk_sigkill_test SOURCES disk_sigkill_test.cc LABELS concurrency TIMEOUT 300)
kcache_test(disk_corruption_test SOURCES disk_corruption_test.cc TIMEOUT 240)
kcache_test(disk_regression_test SOURCES disk_regression_test.cc LABELS concurrency TIMEOUT 120)
kcache_test(disk_eviction_multiprocess_test SOURCES disk_eviction_multiprocess_test.cc LABELS concurrency TIMEOUT 120)
kcache_test(disk_put_cost_test SOURCES disk_put_cost_test.cc TIMEOUT 120)
kcache_test(files_stray_temp_test SOURCES files_stray_temp_test.cc TIMEOUT 120)
kcache_test(disk_full_fs_test SOURCES disk_full_fs_test.cc TIMEOUT 120)
