# Bundles: round trips, selections and marks across processes, signatures,
# damaged and truncated bundles, read-only mounts, the C ABI.
kcache_test(bundle_test SOURCES bundle_test.cc TIMEOUT 300)
target_link_libraries(bundle_test PRIVATE PkgConfig::XXHASH kcache_capi)
kcache_test(bundle_damage_test SOURCES bundle_damage_test.cc TIMEOUT 600)
target_link_libraries(bundle_damage_test PRIVATE PkgConfig::XXHASH)
kcache_test(bundle_readonly_fs_test SOURCES bundle_readonly_fs_test.cc TIMEOUT 120)
target_link_libraries(bundle_readonly_fs_test PRIVATE PkgConfig::XXHASH)
kcache_test(bundle_cli_test SOURCES bundle_cli_test.cc TIMEOUT 120)
add_dependencies(bundle_cli_test kcache_cli)
