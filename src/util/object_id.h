// The loaded object (the executable or a shared library) that holds an
// address, and what identifies its build.
#pragma once

#include <string>

namespace kcache::util {

// GNU build id of the loaded object whose segments hold `addr`, as hex;
// empty when it has none or no loaded object holds `addr`.
std::string build_id_at(const void* addr);

// The path of the loaded object whose segments hold `addr` ("" when none
// does; /proc/self/exe for the executable).
std::string object_path_at(const void* addr);

}  // namespace kcache::util
