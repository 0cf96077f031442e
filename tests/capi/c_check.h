/* The checks of the C tests: each failed CHECK prints where and why
 * (with kcache_last_error()) and counts; main returns the count. */
#ifndef KCACHE_TESTS_C_CHECK_H
#define KCACHE_TESTS_C_CHECK_H

#include <stdio.h>

#include "kcache/kcache.h"

static int failures = 0;

#define CHECK(cond)                                                                                                  \
  do {                                                                                                               \
    if (!(cond)) {                                                                                                   \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, kcache_last_error()); \
      ++failures;                                                                                                    \
    }                                                                                                                \
  } while (0)

#define CHECK_EQ_INT(a, b)                                                                                         \
  do {                                                                                                             \
    long long a_ = (long long)(a), b_ = (long long)(b);                                                            \
    if (a_ != b_) {                                                                                                \
      fprintf(stderr, "%s:%d: %s == %lld, want %s == %lld (last error: %s)\n", __FILE__, __LINE__, #a, a_, #b, b_, \
              kcache_last_error());                                                                                \
      ++failures;                                                                                                  \
    }                                                                                                              \
  } while (0)

#endif
