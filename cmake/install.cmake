# Install rules of the package: public headers, the CMake package
# (kcacheConfig.cmake, its version file and one targets file per export set)
# and kcache.pc for the C ABI. The libraries and the tool install themselves
# where they are defined (src/, tools/). Included from the top CMakeLists.txt
# after every target exists.
include(CMakePackageConfigHelpers)

set(KCACHE_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/kcache)

# Names usable the same way when kcache is part of another build
# (add_subdirectory) as when it is installed (find_package).
set(_kcache_aliases kcache:kcache kcache_capi:c kcache_cli:cli kcache_llvm:llvm kcache_nvrtc:nvrtc
                    kcache_opencl:opencl)
foreach(pair ${_kcache_aliases})
  string(REPLACE ":" ";" pair ${pair})
  list(GET pair 0 _target)
  list(GET pair 1 _name)
  if(TARGET ${_target})
    get_target_property(_type ${_target} TYPE)
    if(_type STREQUAL "EXECUTABLE")
      add_executable(kcache::${_name} ALIAS ${_target})
    else()
      add_library(kcache::${_name} ALIAS ${_target})
    endif()
  endif()
endforeach()

# Public headers: the core's always, an integration's only when it is built.
# KCACHE_PUBLIC_HEADERS (full paths) is what a host gets; tests/headers
# compiles each of them as C++17.
file(GLOB KCACHE_PUBLIC_HEADERS ${PROJECT_SOURCE_DIR}/include/kcache/*.h)
set(_kcache_optional_headers llvm.h:kcache_llvm llvm_compat.h:kcache_llvm llvm_file_cache.h:kcache_llvm nvrtc.h:kcache_nvrtc opencl.h:kcache_opencl
                             redis.h:kcache_tier_redis kcache.h:kcache_capi)
foreach(pair ${_kcache_optional_headers})
  string(REPLACE ":" ";" pair ${pair})
  list(GET pair 0 _header)
  list(GET pair 1 _target)
  if(NOT TARGET ${_target})
    list(REMOVE_ITEM KCACHE_PUBLIC_HEADERS ${PROJECT_SOURCE_DIR}/include/kcache/${_header})
  endif()
endforeach()
install(FILES ${KCACHE_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kcache)

# One targets file per export set, so that a client of the core needs none of
# the integrations' dependencies.
install(EXPORT kcache NAMESPACE kcache:: FILE kcache-targets.cmake DESTINATION ${KCACHE_INSTALL_CMAKEDIR})
set(KCACHE_PACKAGE_COMPONENTS)
foreach(c llvm nvrtc opencl)
  if(TARGET kcache_${c})
    install(EXPORT kcache_${c} NAMESPACE kcache:: FILE kcache-${c}-targets.cmake
            DESTINATION ${KCACHE_INSTALL_CMAKEDIR})
    list(APPEND KCACHE_PACKAGE_COMPONENTS ${c})
  endif()
endforeach()

# What kcacheConfig.cmake needs to find the dependencies again.
# kcache::llvm records the LLVM it was built with: its version and folder.
set(KCACHE_LLVM_VERSION "")
set(KCACHE_LLVM_MAJOR "")
set(KCACHE_LLVM_DIR "")
if(TARGET kcache_llvm)
  set(KCACHE_LLVM_VERSION ${LLVM_PACKAGE_VERSION})
  set(KCACHE_LLVM_MAJOR ${LLVM_VERSION_MAJOR})
  set(KCACHE_LLVM_DIR ${LLVM_DIR})
endif()
set(KCACHE_NVRTC_LIBRARY "")
if(TARGET kcache_nvrtc)
  set(KCACHE_NVRTC_LIBRARY ${NVRTC_LIBRARY})
endif()
set(KCACHE_HAS_REDIS OFF)
if(TARGET kcache_tier_redis)
  set(KCACHE_HAS_REDIS ON)
endif()
# Where the FileCache drop-in's source is installed (src/integrations/llvm).
set(KCACHE_DATADIR ${CMAKE_INSTALL_DATADIR}/kcache)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/kcacheConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/cmake/kcacheConfig.cmake
                              INSTALL_DESTINATION ${KCACHE_INSTALL_CMAKEDIR}
                              PATH_VARS KCACHE_DATADIR)
# 0.x: a minor version may change the API; 1.x and later: the major version.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(_kcache_compat SameMinorVersion)
else()
  set(_kcache_compat SameMajorVersion)
endif()
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/kcacheConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY ${_kcache_compat})
install(FILES ${PROJECT_BINARY_DIR}/cmake/kcacheConfig.cmake ${PROJECT_BINARY_DIR}/cmake/kcacheConfigVersion.cmake
        DESTINATION ${KCACHE_INSTALL_CMAKEDIR})

# pkg-config, for the C ABI only (libkcache.so holds the whole C++ core). The
# prefix is found from the .pc file's own folder, so `cmake --install
# --prefix` anywhere gives a working file.
if(TARGET kcache_capi)
  set(_pc_dir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
  file(RELATIVE_PATH KCACHE_PC_TO_PREFIX /prefix/${_pc_dir} /prefix)
  string(REGEX REPLACE "/$" "" KCACHE_PC_TO_PREFIX "${KCACHE_PC_TO_PREFIX}")
  configure_file(${CMAKE_CURRENT_LIST_DIR}/kcache.pc.in ${PROJECT_BINARY_DIR}/cmake/kcache.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/cmake/kcache.pc DESTINATION ${_pc_dir})
endif()
