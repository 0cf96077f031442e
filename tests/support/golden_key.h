// The fixed input whose key is pinned by key_test (golden value) and printed
// by key_print in child processes with other environments.
#pragma once
#include "kcache/key.h"

inline kcache::Expected<kcache::KeyInfo> golden_key() {
  kcache::KeyBuilder b("kcache-test/1");
  b.add_bytes("ir", "define i32 @f() { ret i32 42 }")
      .add_string("triple", "x86_64-pc-linux-gnu")
      .add_string("cpu", "skylake")
      .add_list("features", {"+avx2", "+fma"})
      .add_u64("opt_level", 2)
      .add_i64("offset", -7)
      .add_bool("fast_math", false)
      .add_map("options", {{"b", "2"}, {"a", "1"}})
      .add_digest("stage0", kcache::hash_bytes("front end output"));
  return b.finish();
}
