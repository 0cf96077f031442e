// Private: a MissReport written into an object a caller is writing
// (kcache/explain.h's to_json is this on its own), for the tool's commands
// that add members of their own (`kcache explain`, `kcache misses`).
#pragma once

#include <functional>

#include "kcache/explain.h"
#include "util/json.h"

namespace kcache {

// Writes {"key":K, <context's members>, "label":..., ..., "other_namespaces":{...}}:
// the members of to_json(r), with those `context` writes (when set) after
// "key".
void write_miss_report(util::JsonWriter& w, const MissReport& r,
                       const std::function<void(util::JsonWriter&)>& context = nullptr);

}  // namespace kcache
