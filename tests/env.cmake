# Faults and time injected through an Env (tests/fault_env.h): full,
# read-only and failing disks, slow syncs, lease expiry and temp-file ages
# on a clock the test moves.
kcache_test(env_fault_test SOURCES env_fault_test.cc TIMEOUT 120)
