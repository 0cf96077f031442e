/* A C client of the installed libkcache.so, built with the flags of
 * `pkg-config --cflags --libs kcache` (scripts/install_check.sh): opens a
 * cache in a fresh folder, compiles one entry through kcache_get_or_compile,
 * then reopens the folder and reads the same bytes back from disk without
 * compiling. Exits 0 when every check holds. */
#define _POSIX_C_SOURCE 200809L

#include <kcache/kcache.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

static void check(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "consumer (C): FAILED: %s (last error: %s)\n", what, kcache_last_error());
    ++failures;
  }
}

/* An "object file" with every byte value, NULs included. */
static unsigned char object[4096];

static int compile(void* user_data, kcache_artifacts* out) {
  int* compiles = (int*)user_data;
  ++*compiles;
  return kcache_artifacts_add(out, "obj", object, sizeof object) == KCACHE_OK ? 0 : 1;
}

/* One kcache_get_or_compile on a freshly opened cache; returns its source,
 * or -1 when the call failed or the bytes were wrong. */
static int request(const char* dir, const kcache_key_builder* key, int* compiles) {
  kcache_options* options = kcache_options_new();
  kcache_cache* cache = NULL;
  kcache_entry* entry = NULL;
  const void* data = NULL;
  size_t size = 0;
  int source = -1;
  check(options != NULL, "options");
  if (!options) return -1;
  check(kcache_options_set(options, "dir", dir) == KCACHE_OK, "option dir");
  check(kcache_options_set(options, "env", "0") == KCACHE_OK, "option env");
  check(kcache_open(options, &cache) == KCACHE_OK, "kcache_open");
  kcache_options_free(options);
  if (!cache) return -1;
  check(kcache_get_or_compile_built(cache, key, compile, compiles, &entry, &source) == KCACHE_OK,
        "kcache_get_or_compile_built");
  if (entry) {
    check(kcache_entry_artifact(entry, "obj", &data, &size) == KCACHE_OK, "artifact obj");
    if (!data || size != sizeof object || memcmp(data, object, size) != 0) {
      check(0, "artifact bytes");
      source = -1;
    }
  } else {
    source = -1;
  }
  kcache_entry_free(entry);
  kcache_close(cache);
  return source;
}

int main(void) {
  char dir[] = "/tmp/kcache-consumer-c-XXXXXX";
  char rm[64];
  kcache_key_builder* key;
  int compiles = 0;
  size_t i;
  for (i = 0; i < sizeof object; ++i) object[i] = (unsigned char)((i * 37u + 11u) & 0xffu);
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  key = kcache_key_builder_new("consumer-c/1");
  check(key != NULL, "key builder");
  if (!key) return 1;
  check(kcache_key_add_string(key, "source", "kernel void k() {}") == KCACHE_OK, "key source");
  check(kcache_key_add_u64(key, "opt", 2) == KCACHE_OK, "key opt");

  check(request(dir, key, &compiles) == KCACHE_SOURCE_COMPILED, "first request compiled");
  check(request(dir, key, &compiles) == KCACHE_SOURCE_DISK, "request after reopening from disk");
  check(compiles == 1, "one compile in all");
  kcache_key_builder_free(key);

  snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
  if (system(rm) != 0) fprintf(stderr, "consumer (C): could not remove %s\n", dir);
  if (failures) return 1;
  printf("consumer (C): kcache %s (%s): compiled once, then a disk hit\nconsumer (C): ok\n", kcache_version(),
         kcache_features());
  return 0;
}
