// cache/defaults.h — Options as a Cache runs with them: the rule of
// kcache/options.h ("Zero and defaults") applied once, where the Cache
// takes its options, so no code after it tests for 0.
#pragma once

#include "kcache/cache.h"

namespace kcache {

// `o` with each 0 that means unset replaced by the field's default
// (lease_ttl_ms). The disk tier's limits are applied by the engines
// (effective_limits), the memory tier's by the tier.
Options with_defaults(Options o);

}  // namespace kcache
