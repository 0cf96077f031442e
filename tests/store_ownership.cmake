# Disk stores another user could have written are refused; shared groups.
# Runs as root (it adds a user and setuid's into it) and skips otherwise.
kcache_test(store_ownership_test SOURCES store_ownership_test.cc TIMEOUT 120)
