# Which LLVM the integration builds against (included from CMakeLists.txt).
#
#   KCACHE_LLVM_VERSION   a major version, 14 to 19; empty (the default): the
#                         newest of them installed.
#   LLVM_DIR              an LLVM CMake package folder of the caller's own
#                         (e.g. a private LLVM build); its major version must
#                         be KCACHE_LLVM_VERSION when that is set too.
#
# LLVM is looked for by folder (llvm-config-N --cmakedir, then the layouts
# of Debian/Ubuntu, Fedora and Homebrew), and checked by major version:
# find_package(LLVM 19) itself would refuse 19.1.7, since LLVM's version file
# asks for an exact major.minor. A requested version that is not there stops
# the configure; only the default may go without LLVM, with a warning.
#
# Sets LLVM_FOUND, LLVM_DIR and everything LLVM's package sets
# (LLVM_VERSION_MAJOR, LLVM_INCLUDE_DIRS, ...), or turns KCACHE_WITH_LLVM off.

set(KCACHE_LLVM_VERSIONS 19 18 17 16 15 14)  # newest first
set(KCACHE_LLVM_VERSION "" CACHE STRING "LLVM major version of the LLVM integration (14 to 19; empty: the newest installed)")

# The CMake package folder of LLVM major `v`, or empty.
function(_kcache_llvm_dir_of v out)
  find_program(_kcache_llvm_config_${v} NAMES llvm-config-${v} llvm-config${v}
               PATHS /usr/lib/llvm-${v}/bin /usr/lib64/llvm${v}/bin /opt/homebrew/opt/llvm@${v}/bin
                     /usr/local/opt/llvm@${v}/bin NO_CACHE)
  set(_dirs)
  if(_kcache_llvm_config_${v})
    execute_process(COMMAND ${_kcache_llvm_config_${v}} --cmakedir OUTPUT_VARIABLE _d
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
    if(_rc EQUAL 0)
      list(APPEND _dirs ${_d})
    endif()
  endif()
  list(APPEND _dirs /usr/lib/llvm-${v}/lib/cmake/llvm /usr/lib64/llvm${v}/lib/cmake/llvm
       /usr/lib/llvm${v}/lib/cmake/llvm /opt/homebrew/opt/llvm@${v}/lib/cmake/llvm
       /usr/local/opt/llvm@${v}/lib/cmake/llvm)
  foreach(d ${_dirs})
    if(EXISTS ${d}/LLVMConfig.cmake)
      set(${out} ${d} PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()

set(_kcache_llvm_wanted "${KCACHE_LLVM_VERSION}")
if(_kcache_llvm_wanted AND NOT _kcache_llvm_wanted IN_LIST KCACHE_LLVM_VERSIONS)
  message(FATAL_ERROR "KCACHE_LLVM_VERSION=${_kcache_llvm_wanted}: the LLVM integration builds against LLVM 14 to 19")
endif()

# A folder the caller named wins, unless it is the one this file chose on an
# earlier run (then KCACHE_LLVM_VERSION may have changed since).
set(_kcache_llvm_dir "")
if(LLVM_DIR AND EXISTS "${LLVM_DIR}/LLVMConfig.cmake" AND NOT LLVM_DIR STREQUAL "${_KCACHE_LLVM_DIR_CHOSEN}")
  set(_kcache_llvm_dir "${LLVM_DIR}")
elseif(_kcache_llvm_wanted)
  _kcache_llvm_dir_of(${_kcache_llvm_wanted} _kcache_llvm_dir)
  if(NOT _kcache_llvm_dir)
    message(FATAL_ERROR "KCACHE_LLVM_VERSION=${_kcache_llvm_wanted}: LLVM ${_kcache_llvm_wanted}'s CMake package was "
                        "not found (Debian: apt-get install llvm-${_kcache_llvm_wanted}-dev; or pass -DLLVM_DIR=...)")
  endif()
else()
  foreach(v ${KCACHE_LLVM_VERSIONS})
    _kcache_llvm_dir_of(${v} _kcache_llvm_dir)
    if(_kcache_llvm_dir)
      break()
    endif()
  endforeach()
endif()

if(NOT _kcache_llvm_dir)
  message(WARNING "no LLVM 14 to 19 found (Debian: apt-get install llvm-19-dev): KCACHE_WITH_LLVM off")
  set(KCACHE_WITH_LLVM OFF)
  return()
endif()

set(LLVM_DIR "${_kcache_llvm_dir}" CACHE PATH "LLVM's CMake package folder" FORCE)
set(_KCACHE_LLVM_DIR_CHOSEN "${_kcache_llvm_dir}" CACHE INTERNAL "")
find_package(LLVM CONFIG REQUIRED PATHS "${_kcache_llvm_dir}" NO_DEFAULT_PATH)
if(_kcache_llvm_wanted AND NOT LLVM_VERSION_MAJOR EQUAL _kcache_llvm_wanted)
  message(FATAL_ERROR "KCACHE_LLVM_VERSION=${_kcache_llvm_wanted}, but LLVM_DIR=${LLVM_DIR} is LLVM ${LLVM_PACKAGE_VERSION}")
endif()
if(NOT LLVM_VERSION_MAJOR IN_LIST KCACHE_LLVM_VERSIONS)
  message(FATAL_ERROR "LLVM ${LLVM_PACKAGE_VERSION} at ${LLVM_DIR}: the LLVM integration builds against LLVM 14 to 19")
endif()
message(STATUS "kcache: LLVM ${LLVM_PACKAGE_VERSION} from ${LLVM_DIR}")
