# GPU-kernel integrations: NVRTC (runs on the CPU, no GPU needed) and
# OpenCL (on whatever platform is installed; PoCL here).
#
# Each binary is one ctest entry, not one per test case: the fixtures
# compile their kernel corpus cold once per process, and a process per case
# would pay that cold compile (seconds) for every case.
function(kcache_gpu_test name)
  cmake_parse_arguments(A "" "TIMEOUT" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${CMAKE_CURRENT_SOURCE_DIR})
  target_compile_definitions(${name} PRIVATE ${KCACHE_DEFS})
  target_link_libraries(${name} PRIVATE kcache ${A_LIBS} GTest::gtest GTest::gtest_main)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${A_TIMEOUT} LABELS gpu)
endfunction()

if(KCACHE_WITH_NVRTC)
  kcache_gpu_test(nvrtc_test SOURCES nvrtc_test.cc LIBS kcache_nvrtc TIMEOUT 120)
endif()
if(KCACHE_WITH_OPENCL AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/opencl_test.cc)
  kcache_gpu_test(opencl_test SOURCES opencl_test.cc LIBS kcache_opencl TIMEOUT 180)
endif()
