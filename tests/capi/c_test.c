/* The C ABI, used from plain C: keys, put/get, get_or_compile with a C
 * callback (once per key across threads, persisted across reopen), failed
 * compiles, errors as codes, on both disk engines; every function given each
 * kind of bad argument (NULL pointers, bad names), with the return code and
 * kcache_last_error() agreeing after each call. */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "c_check.h"
#include "kcache/kcache.h"

/* A compile callback: the artifacts of "kernel" number `n`. */
struct job {
  int n;
  int fail;     /* non-zero: report a failed compile */
  int sleep_ms; /* widen the window for concurrent callers */
  pthread_mutex_t mu;
  int calls; /* GUARDED_BY(mu) */
};

static void make_obj(int n, unsigned char* buf, size_t size) {
  size_t i;
  for (i = 0; i < size; ++i) buf[i] = (unsigned char)((i * 31u + (unsigned)n) & 0xff); /* includes NULs */
}

static int compile(void* user, kcache_artifacts* out) {
  struct job* j = (struct job*)user;
  unsigned char obj[3000];
  char sig[32];
  pthread_mutex_lock(&j->mu);
  ++j->calls;
  pthread_mutex_unlock(&j->mu);
  if (j->sleep_ms) {
    struct timespec ts;
    ts.tv_sec = 0;
    ts.tv_nsec = (long)j->sleep_ms * 1000000L;
    nanosleep(&ts, NULL);
  }
  if (j->fail) return j->fail;
  make_obj(j->n, obj, sizeof obj);
  snprintf(sig, sizeof sig, "kernel_%d", j->n);
  if (kcache_artifacts_add(out, "obj", obj, sizeof obj) != KCACHE_OK) return 1;
  if (kcache_artifacts_add(out, "sig", sig, strlen(sig)) != KCACHE_OK) return 1;
  return 0;
}

static void job_init(struct job* j, int n) {
  memset(j, 0, sizeof *j);
  j->n = n;
  pthread_mutex_init(&j->mu, NULL);
}

static int entry_is(const kcache_entry* e, int n) {
  unsigned char want[3000];
  char sig[32];
  const void* data;
  size_t size;
  make_obj(n, want, sizeof want);
  snprintf(sig, sizeof sig, "kernel_%d", n);
  if (kcache_entry_artifact(e, "obj", &data, &size) != KCACHE_OK) return 0;
  if (size != sizeof want || memcmp(data, want, size) != 0) return 0;
  if (kcache_entry_artifact(e, "sig", &data, &size) != KCACHE_OK) return 0;
  return size == strlen(sig) && memcmp(data, sig, size) == 0;
}

static kcache_key key_for(int n) {
  kcache_key k;
  kcache_key_builder* b = kcache_key_builder_new("c_test/1");
  CHECK(b != NULL);
  CHECK_EQ_INT(kcache_key_add_u64(b, "n", (uint64_t)n), KCACHE_OK);
  CHECK_EQ_INT(kcache_key_add_string(b, "target", "x86_64"), KCACHE_OK);
  CHECK_EQ_INT(kcache_key_builder_finish(b, &k), KCACHE_OK);
  kcache_key_builder_free(b);
  return k;
}

static kcache_cache* open_cache(const char* dir, const char* engine) {
  kcache_cache* c = NULL;
  kcache_options* o = kcache_options_new();
  CHECK(o != NULL);
  CHECK_EQ_INT(kcache_options_set(o, "env", "0"), KCACHE_OK);
  CHECK_EQ_INT(kcache_options_set(o, "dir", dir), KCACHE_OK);
  CHECK_EQ_INT(kcache_options_set(o, "engine", engine), KCACHE_OK);
  CHECK_EQ_INT(kcache_options_set(o, "producer", "c_test"), KCACHE_OK);
  CHECK_EQ_INT(kcache_open(o, &c), KCACHE_OK);
  kcache_options_free(o);
  CHECK(c != NULL);
  return c;
}

static void test_keys(void) {
  kcache_key a, b, c, back;
  char hex[33];
  kcache_key_builder* kb;
  /* Order of add calls does not matter; values do. */
  kcache_key_builder* x = kcache_key_builder_new("ns/1");
  kcache_key_builder* y = kcache_key_builder_new("ns/1");
  CHECK_EQ_INT(kcache_key_add_bytes(x, "ir", "\0ir", 3), KCACHE_OK);
  CHECK_EQ_INT(kcache_key_add_bool(x, "fast", 1), KCACHE_OK);
  CHECK_EQ_INT(kcache_key_add_i64(x, "opt", -3), KCACHE_OK);
  CHECK_EQ_INT(kcache_key_add_i64(y, "opt", -3), KCACHE_OK);
  CHECK_EQ_INT(kcache_key_add_bool(y, "fast", 1), KCACHE_OK);
  CHECK_EQ_INT(kcache_key_add_bytes(y, "ir", "\0ir", 3), KCACHE_OK);
  CHECK_EQ_INT(kcache_key_builder_finish(x, &a), KCACHE_OK);
  CHECK_EQ_INT(kcache_key_builder_finish(y, &b), KCACHE_OK);
  CHECK(memcmp(&a, &b, sizeof a) == 0);
  CHECK_EQ_INT(kcache_key_add_digest(y, "prev", &a), KCACHE_OK);
  CHECK_EQ_INT(kcache_key_builder_finish(y, &c), KCACHE_OK);
  CHECK(memcmp(&a, &c, sizeof a) != 0);
  kcache_key_builder_free(x);
  kcache_key_builder_free(y);

  kcache_key_to_hex(&a, hex);
  CHECK_EQ_INT(strlen(hex), 32);
  CHECK_EQ_INT(kcache_key_from_hex(hex, &back), KCACHE_OK);
  CHECK(memcmp(&a, &back, sizeof a) == 0);
  CHECK_EQ_INT(kcache_key_from_hex("not hex", &back), KCACHE_INVALID_ARGUMENT);
  CHECK(strlen(kcache_last_error()) > 0);

  /* A component name used twice is refused at finish. */
  kb = kcache_key_builder_new("ns/1");
  CHECK_EQ_INT(kcache_key_add_u64(kb, "n", 1), KCACHE_OK);
  CHECK_EQ_INT(kcache_key_add_u64(kb, "n", 2), KCACHE_OK);
  CHECK_EQ_INT(kcache_key_builder_finish(kb, &a), KCACHE_INVALID_ARGUMENT);
  kcache_key_builder_free(kb);

  /* hash_bytes is the key of nothing but those bytes: deterministic. */
  kcache_hash_bytes("abc", 3, &a);
  kcache_hash_bytes("abc", 3, &b);
  kcache_hash_bytes("abd", 3, &c);
  CHECK(memcmp(&a, &b, sizeof a) == 0);
  CHECK(memcmp(&a, &c, sizeof a) != 0);
}

static void test_errors_and_version(void) {
  kcache_options* o = kcache_options_new();
  CHECK(strlen(kcache_version()) > 0);
  CHECK(strstr(kcache_features(), "files") != NULL);
  CHECK(strcmp(kcache_code_name(KCACHE_OK), "ok") == 0);
  CHECK(strcmp(kcache_code_name(KCACHE_CORRUPT), "corrupt") == 0);
  CHECK(strcmp(kcache_code_name(99), "unknown") == 0);
  CHECK_EQ_INT(kcache_options_set(o, "colour", "blue"), KCACHE_INVALID_ARGUMENT);
  CHECK(strstr(kcache_last_error(), "colour") != NULL);
  CHECK_EQ_INT(kcache_options_set(o, "engine", "bdb"), KCACHE_INVALID_ARGUMENT);
  CHECK_EQ_INT(kcache_options_set(o, "max_size", "lots"), KCACHE_INVALID_ARGUMENT);
  CHECK_EQ_INT(kcache_options_set(o, "max_size", "64M"), KCACHE_OK);
  CHECK_EQ_INT(kcache_options_set(o, "read_only", "maybe"), KCACHE_INVALID_ARGUMENT);
  CHECK_EQ_INT(kcache_options_set(NULL, "dir", "/tmp"), KCACHE_INVALID_ARGUMENT);
  kcache_options_free(o);
  CHECK_EQ_INT(kcache_open(NULL, NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_EQ_INT(kcache_get(NULL, NULL, NULL), KCACHE_INVALID_ARGUMENT);
  kcache_close(NULL);
  kcache_free(NULL);
}

struct thread_arg {
  kcache_cache* c;
  kcache_key key;
  struct job* job;
  int ok;
};

static void* racer(void* p) {
  struct thread_arg* a = (struct thread_arg*)p;
  kcache_entry* e = NULL;
  a->ok = kcache_get_or_compile(a->c, &a->key, compile, a->job, &e, NULL) == KCACHE_OK && entry_is(e, a->job->n);
  kcache_entry_free(e);
  return NULL;
}

static void test_engine(const char* root, const char* engine) {
  char dir[512];
  kcache_cache* c;
  kcache_entry* e = NULL;
  kcache_key k1 = key_for(1), k2 = key_for(2), k3 = key_for(3), k4 = key_for(4), got;
  struct job j1, j2, jfail, jrace;
  int source = -1, i;
  char* stats;
  const char* name;
  const void* data;
  size_t size;
  kcache_artifact arts[2];
  pthread_t th[8];
  struct thread_arg ta[8];

  snprintf(dir, sizeof dir, "%s/%s", root, engine);
  c = open_cache(dir, engine);
  job_init(&j1, 1);
  job_init(&j2, 2);
  job_init(&jfail, 3);
  jfail.fail = 7;
  job_init(&jrace, 4);
  jrace.sleep_ms = 50;

  /* A miss. */
  CHECK_EQ_INT(kcache_get(c, &k1, &e), KCACHE_NOT_FOUND);
  CHECK(e == NULL);

  /* Compile once; the second call is a memory hit. */
  CHECK_EQ_INT(kcache_get_or_compile(c, &k1, compile, &j1, &e, &source), KCACHE_OK);
  CHECK_EQ_INT(source, KCACHE_SOURCE_COMPILED);
  CHECK(e != NULL && entry_is(e, 1));
  kcache_entry_key(e, &got);
  CHECK(memcmp(&got, &k1, sizeof got) == 0);
  kcache_entry_free(e);
  CHECK_EQ_INT(kcache_get_or_compile(c, &k1, compile, &j1, &e, &source), KCACHE_OK);
  CHECK_EQ_INT(source, KCACHE_SOURCE_MEMORY);
  CHECK(entry_is(e, 1));
  CHECK_EQ_INT(kcache_entry_artifact_count(e), 2);
  CHECK_EQ_INT(kcache_entry_artifact(e, "ptx", &data, &size), KCACHE_NOT_FOUND);
  CHECK(data == NULL && size == 0);
  CHECK_EQ_INT(kcache_entry_artifact_at(e, 5, &name, &data, &size), KCACHE_NOT_FOUND);
  kcache_entry_free(e);
  CHECK_EQ_INT(j1.calls, 1);

  /* A failed compile is reported and stores nothing. */
  CHECK_EQ_INT(kcache_get_or_compile(c, &k3, compile, &jfail, &e, &source), KCACHE_COMPILE_FAILED);
  CHECK(e == NULL);
  CHECK(strstr(kcache_last_error(), "7") != NULL);
  CHECK_EQ_INT(kcache_get(c, &k3, &e), KCACHE_NOT_FOUND);

  /* put, then get with artifacts enumerated in order. */
  arts[0].name = "ptx";
  arts[0].data = "\0ptx";
  arts[0].size = 4;
  arts[1].name = "meta";
  arts[1].data = "";
  arts[1].size = 0;
  CHECK_EQ_INT(kcache_put(c, &k2, arts, 2), KCACHE_OK);
  CHECK_EQ_INT(kcache_get(c, &k2, &e), KCACHE_OK);
  CHECK_EQ_INT(kcache_entry_artifact_count(e), 2);
  for (i = 0; i < 2 && e; ++i) {
    const void* d2;
    size_t s2;
    CHECK_EQ_INT(kcache_entry_artifact_at(e, (size_t)i, &name, &data, &size), KCACHE_OK);
    CHECK_EQ_INT(kcache_entry_artifact(e, name, &d2, &s2), KCACHE_OK);
    CHECK(d2 == data && s2 == size);
  }
  CHECK_EQ_INT(kcache_entry_artifact(e, "ptx", &data, &size), KCACHE_OK);
  CHECK(size == 4 && memcmp(data, "\0ptx", 4) == 0);
  kcache_entry_free(e);
  arts[1].name = "ptx";
  CHECK_EQ_INT(kcache_put(c, &k3, arts, 2), KCACHE_INVALID_ARGUMENT); /* duplicate name */

  /* Eight threads, one key: one compile, everyone gets it. */
  for (i = 0; i < 8; ++i) {
    ta[i].c = c;
    ta[i].key = k4;
    ta[i].job = &jrace;
    ta[i].ok = 0;
    CHECK_EQ_INT(pthread_create(&th[i], NULL, racer, &ta[i]), 0);
  }
  for (i = 0; i < 8; ++i) {
    pthread_join(th[i], NULL);
    CHECK(ta[i].ok);
  }
  CHECK_EQ_INT(jrace.calls, 1);

  stats = kcache_stats_json(c);
  CHECK(stats != NULL);
  if (stats) {
    CHECK(strstr(stats, "\"compiles\":3") != NULL); /* k1, the failed k3, k4 */
    CHECK(strstr(stats, "\"compile_failures\":1") != NULL);
    CHECK(strstr(stats, engine) != NULL);
  }
  kcache_free(stats);
  kcache_close(c);

  /* Reopened (a new process would see the same): a disk hit, no compile. */
  c = open_cache(dir, engine);
  CHECK_EQ_INT(kcache_get_or_compile(c, &k1, compile, &j1, &e, &source), KCACHE_OK);
  CHECK_EQ_INT(source, KCACHE_SOURCE_DISK);
  CHECK(entry_is(e, 1));
  CHECK_EQ_INT(j1.calls, 1);
  kcache_entry_free(e);

  /* A builder-keyed compile stores under the builder's key. */
  {
    kcache_key_builder* b = kcache_key_builder_new("c_test/1");
    kcache_key bk;
    kcache_key_add_u64(b, "n", 2);
    kcache_key_add_string(b, "target", "x86_64");
    kcache_key_add_string(b, "opt", "-O3");
    CHECK_EQ_INT(kcache_key_builder_finish(b, &bk), KCACHE_OK);
    CHECK_EQ_INT(kcache_get_or_compile_built(c, b, compile, &j2, &e, &source), KCACHE_OK);
    CHECK_EQ_INT(source, KCACHE_SOURCE_COMPILED);
    kcache_entry_key(e, &got);
    CHECK(memcmp(&got, &bk, sizeof got) == 0);
    CHECK(entry_is(e, 2));
    kcache_entry_free(e);
    CHECK_EQ_INT(kcache_get(c, &bk, &e), KCACHE_OK);
    kcache_entry_free(e);
    kcache_key_builder_free(b);
  }
  kcache_close(c);
}

/* A failing call sets a message, a succeeding one clears it. */
#define CHECK_FAILS(call, code)             \
  do {                                      \
    CHECK_EQ_INT((call), (code));           \
    CHECK(strlen(kcache_last_error()) > 0); \
  } while (0)
#define CHECK_OK(call)                       \
  do {                                       \
    CHECK_EQ_INT((call), KCACHE_OK);         \
    CHECK(strlen(kcache_last_error()) == 0); \
  } while (0)

/* Callbacks that misuse the artifact sink. */
static int add_empty_name(void* user, kcache_artifacts* out) {
  (void)user;
  CHECK_FAILS(kcache_artifacts_add(out, "", "x", 1), KCACHE_INVALID_ARGUMENT);
  CHECK(strstr(kcache_last_error(), "1 to 255") != NULL);
  return 0; /* ignores the refusal */
}
static int add_twice(void* user, kcache_artifacts* out) {
  (void)user;
  CHECK_OK(kcache_artifacts_add(out, "obj", "a", 1));
  CHECK_FAILS(kcache_artifacts_add(out, "obj", "b", 1), KCACHE_INVALID_ARGUMENT);
  CHECK(strstr(kcache_last_error(), "twice") != NULL);
  return 0;
}
static int add_bad_pointers(void* user, kcache_artifacts* out) {
  char long_name[300];
  (void)user;
  memset(long_name, 'n', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = '\0';
  CHECK_FAILS(kcache_artifacts_add(NULL, "obj", "a", 1), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_artifacts_add(out, NULL, "a", 1), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_artifacts_add(out, "obj", NULL, 1), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_artifacts_add(out, long_name, "a", 1), KCACHE_INVALID_ARGUMENT);
  return 0;
}
/* A callback whose nested calls fail but which adds everything it meant to:
 * the outer call succeeds and the message of the nested failure is gone. */
static int nested_failure(void* user, kcache_artifacts* out) {
  kcache_entry* e = NULL;
  kcache_key k;
  memset(&k, 0x5a, sizeof k);
  CHECK_FAILS(kcache_get((kcache_cache*)user, &k, &e), KCACHE_NOT_FOUND);
  CHECK(e == NULL);
  CHECK_OK(kcache_artifacts_add(out, "obj", NULL, 0)); /* empty artifact: NULL data is allowed */
  CHECK_FAILS(kcache_key_from_hex("zz", &k), KCACHE_INVALID_ARGUMENT);
  return 0;
}

static void test_bad_arguments(const char* root) {
  char dir[512], hex[33];
  kcache_cache* c = NULL;
  kcache_options* o = kcache_options_new();
  kcache_key_builder* b = kcache_key_builder_new("bad/1");
  kcache_entry* e = NULL;
  kcache_key k, got;
  kcache_artifact arts[2];
  const void* data = NULL;
  const char* name = NULL;
  size_t size = 0;
  int source = -1;
  char* json;
  struct job j;
  job_init(&j, 7);
  memset(&k, 0x11, sizeof k);

  /* Keys and digests. */
  CHECK_FAILS(kcache_key_to_hex(NULL, hex), KCACHE_INVALID_ARGUMENT);
  CHECK_EQ_INT(hex[0], '\0');
  CHECK_FAILS(kcache_key_to_hex(&k, NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_OK(kcache_key_to_hex(&k, hex));
  CHECK(strcmp(hex, "11111111111111111111111111111111") == 0);
  CHECK_FAILS(kcache_key_from_hex(NULL, &k), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_from_hex(hex, NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_from_hex("1111", &got), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_from_hex("111111111111111111111111111111111", &got), KCACHE_INVALID_ARGUMENT);
  CHECK_OK(kcache_key_from_hex(hex, &got));
  CHECK(memcmp(&k, &got, sizeof k) == 0);
  CHECK_FAILS(kcache_hash_bytes(NULL, 3, &got), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_hash_bytes("abc", 3, NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_OK(kcache_hash_bytes(NULL, 0, &got));

  /* Key builders. */
  CHECK(kcache_key_builder_new(NULL) == NULL);
  CHECK(strlen(kcache_last_error()) > 0);
  kcache_key_builder_free(b);
  b = kcache_key_builder_new("bad/1");
  CHECK(b != NULL);
  CHECK(strlen(kcache_last_error()) == 0);
  CHECK_FAILS(kcache_key_add_bytes(NULL, "n", "a", 1), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_add_bytes(b, NULL, "a", 1), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_add_bytes(b, "n", NULL, 1), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_add_string(b, "s", NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_add_string(NULL, "s", "v"), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_add_u64(NULL, "u", 1), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_add_u64(b, NULL, 1), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_add_i64(NULL, "i", 1), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_add_bool(b, NULL, 1), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_add_digest(b, "d", NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_add_digest(NULL, "d", &k), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_add_file(b, "f", NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_add_file(NULL, "f", "/dev/null"), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_builder_finish(NULL, &got), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_builder_finish(b, NULL), KCACHE_INVALID_ARGUMENT);
  /* Nothing above was added: the builder is still good. */
  CHECK_OK(kcache_key_add_u64(b, "n", 1));
  CHECK_OK(kcache_key_builder_finish(b, &got));
  CHECK_OK(kcache_key_add_string(b, "", "empty name"));
  CHECK_FAILS(kcache_key_builder_finish(b, &got), KCACHE_INVALID_ARGUMENT);

  /* Options and open. */
  CHECK_FAILS(kcache_options_set(o, NULL, "1"), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_options_set(o, "dir", NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_open(o, NULL), KCACHE_INVALID_ARGUMENT);
  snprintf(dir, sizeof dir, "%s/bad-args", root);
  CHECK_OK(kcache_options_set(o, "env", "0"));
  CHECK_OK(kcache_options_set(o, "dir", dir));
  CHECK_OK(kcache_open(o, &c));
  kcache_options_free(o);

  /* The cache. */
  CHECK_FAILS(kcache_get(NULL, &k, &e), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_get(c, NULL, &e), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_get(c, &k, NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_get(c, &k, &e), KCACHE_NOT_FOUND);
  CHECK(e == NULL);
  arts[0].name = "obj";
  arts[0].data = "abc";
  arts[0].size = 3;
  arts[1] = arts[0];
  CHECK_FAILS(kcache_put(NULL, &k, arts, 1), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_put(c, NULL, arts, 1), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_put(c, &k, NULL, 1), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_put(c, &k, arts, 2), KCACHE_INVALID_ARGUMENT); /* "obj" twice */
  CHECK(strstr(kcache_last_error(), "twice") != NULL);
  arts[1].name = "";
  CHECK_FAILS(kcache_put(c, &k, arts, 2), KCACHE_INVALID_ARGUMENT);
  arts[1].name = NULL;
  CHECK_FAILS(kcache_put(c, &k, arts, 2), KCACHE_INVALID_ARGUMENT);
  arts[1].name = "sig";
  arts[1].data = NULL;
  CHECK_FAILS(kcache_put(c, &k, arts, 2), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_get(c, &k, &e), KCACHE_NOT_FOUND); /* none of those stored anything */
  CHECK_OK(kcache_put(c, &k, NULL, 0));                 /* an entry of no artifacts */

  CHECK_FAILS(kcache_get_or_compile(NULL, &k, compile, &j, &e, &source), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_get_or_compile(c, NULL, compile, &j, &e, &source), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_get_or_compile(c, &k, NULL, &j, &e, &source), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_get_or_compile(c, &k, compile, &j, NULL, &source), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_get_or_compile_built(NULL, b, compile, &j, &e, NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_get_or_compile_built(c, NULL, compile, &j, &e, NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_get_or_compile_built(c, b, NULL, &j, &e, NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_get_or_compile_built(c, b, compile, &j, NULL, NULL), KCACHE_INVALID_ARGUMENT);
  /* The builder holds an empty component name: refused before compiling. */
  CHECK_FAILS(kcache_get_or_compile_built(c, b, compile, &j, &e, NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_EQ_INT(j.calls, 0);

  /* Callbacks that ignore a refused add: the call fails, nothing is stored. */
  k.bytes[0] = 0x21;
  CHECK_FAILS(kcache_get_or_compile(c, &k, add_empty_name, NULL, &e, &source), KCACHE_INVALID_ARGUMENT);
  CHECK(e == NULL);
  CHECK(strstr(kcache_last_error(), "kcache_artifacts_add") != NULL);
  CHECK_FAILS(kcache_get(c, &k, &e), KCACHE_NOT_FOUND);
  k.bytes[0] = 0x22;
  CHECK_FAILS(kcache_get_or_compile(c, &k, add_twice, NULL, &e, &source), KCACHE_INVALID_ARGUMENT);
  CHECK(e == NULL);
  CHECK_FAILS(kcache_get(c, &k, &e), KCACHE_NOT_FOUND);
  k.bytes[0] = 0x23;
  CHECK_FAILS(kcache_get_or_compile(c, &k, add_bad_pointers, NULL, &e, &source), KCACHE_INVALID_ARGUMENT);
  CHECK(e == NULL);
  /* Nested failures that the callback rightly ignores: OK, no message. */
  k.bytes[0] = 0x24;
  CHECK_OK(kcache_get_or_compile(c, &k, nested_failure, c, &e, &source));
  CHECK(e != NULL);
  CHECK_EQ_INT(source, KCACHE_SOURCE_COMPILED);

  /* Entries. */
  CHECK_FAILS(kcache_entry_artifact(NULL, "obj", &data, &size), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_entry_artifact(e, NULL, &data, &size), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_entry_artifact(e, "obj", NULL, &size), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_entry_artifact(e, "obj", &data, NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_entry_artifact(e, "none", &data, &size), KCACHE_NOT_FOUND);
  CHECK_OK(kcache_entry_artifact(e, "obj", &data, &size));
  CHECK_EQ_INT(size, 0);
  CHECK_EQ_INT(kcache_entry_artifact_count(NULL), 0);
  CHECK_EQ_INT(kcache_entry_artifact_count(e), 1);
  CHECK_FAILS(kcache_entry_artifact_at(NULL, 0, &name, &data, &size), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_entry_artifact_at(e, 0, NULL, &data, &size), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_entry_artifact_at(e, 0, &name, NULL, &size), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_entry_artifact_at(e, 0, &name, &data, NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_entry_artifact_at(e, 1, &name, &data, &size), KCACHE_NOT_FOUND);
  CHECK_OK(kcache_entry_artifact_at(e, 0, &name, &data, &size));
  CHECK(strcmp(name, "obj") == 0);
  CHECK_FAILS(kcache_entry_key(NULL, &got), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_entry_key(e, NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_OK(kcache_entry_key(e, &got));
  CHECK(memcmp(&k, &got, sizeof k) == 0);
  kcache_entry_free(e);

  CHECK(kcache_stats_json(NULL) == NULL);
  CHECK(strlen(kcache_last_error()) > 0);
  json = kcache_stats_json(c);
  CHECK(json != NULL);
  CHECK(strlen(kcache_last_error()) == 0);
  kcache_free(json);

  /* NULL is fine for every free function. */
  kcache_entry_free(NULL);
  kcache_key_builder_free(NULL);
  kcache_options_free(NULL);
  kcache_key_builder_free(b);
  kcache_close(c);
}

/* Flights: the caller compiles between kcache_begin and kcache_flight_commit. */
/* Every option of the library is reachable by name, values read back in
 * the form they are set, and one precedence holds: the program's settings,
 * then KCACHE_* on top (unless "env" is "0"). */
static int exists(const char* path) {
  FILE* f = fopen(path, "r");
  if (f) fclose(f);
  return f != NULL;
}

static void test_options_pipeline(const char* root) {
  static const char* names[] = {"remote",     "remote_secret_file", "shared_group", "bundles",      "bundle_trust",
                                "explain",    "recompile",          "miss_journal", "lease_ttl_ms", "wait_bound_ms",
                                "durability", "max_entries",        "log"};
  static const char* values[] = {"redis://127.0.0.1:1",
                                 "/nonexistent/secret",
                                 "",
                                 "a.kcb:b.kcb",
                                 "k.pub",
                                 "1",
                                 "1",
                                 "10",
                                 "2000",
                                 "0",
                                 "full",
                                 "500",
                                 "error"};
  kcache_options* o = kcache_options_new();
  char* v = NULL;
  char from_program[512], from_env[512], path[600];
  size_t i;
  kcache_cache* c = NULL;
  kcache_key k;
  kcache_artifact art;
  for (i = 0; i < sizeof names / sizeof names[0]; ++i) {
    CHECK_EQ_INT(kcache_options_set(o, names[i], values[i]), KCACHE_OK);
    CHECK_EQ_INT(kcache_options_get(o, names[i], &v), KCACHE_OK);
    CHECK(v != NULL && strcmp(v, values[i]) == 0);
    kcache_free(v);
    v = NULL;
  }
  CHECK_EQ_INT(kcache_options_set(o, "max_size", "1536K"), KCACHE_OK);
  CHECK_EQ_INT(kcache_options_get(o, "max_size", &v), KCACHE_OK);
  CHECK(v != NULL && strcmp(v, "1536K") == 0);
  kcache_free(v);
  CHECK_EQ_INT(kcache_options_set(o, "lease_ttl_ms", "soon"), KCACHE_INVALID_ARGUMENT);
  CHECK(strstr(kcache_last_error(), "lease_ttl_ms") != NULL);
  CHECK_EQ_INT(kcache_options_get(o, "colour", &v), KCACHE_INVALID_ARGUMENT);
  kcache_options_free(o);

  /* KCACHE_DIR beats the program's "dir"; with "env" "0" the program's wins. */
  snprintf(from_program, sizeof from_program, "%s/program", root);
  snprintf(from_env, sizeof from_env, "%s/env", root);
  CHECK(kcache_hash_bytes("k", 1, &k) == KCACHE_OK);
  art.name = "obj";
  art.data = "x";
  art.size = 1;
  setenv("KCACHE_DIR", from_env, 1);
  o = kcache_options_new();
  CHECK_OK(kcache_options_set(o, "dir", from_program));
  CHECK_OK(kcache_options_set(o, "engine", "files"));
  CHECK_OK(kcache_open(o, &c));
  CHECK_OK(kcache_put(c, &k, &art, 1));
  kcache_close(c);
  snprintf(path, sizeof path, "%s/files", from_env);
  CHECK(exists(path));
  snprintf(path, sizeof path, "%s/files", from_program);
  CHECK(!exists(path));
  CHECK_OK(kcache_options_set(o, "env", "0"));
  CHECK_OK(kcache_open(o, &c));
  CHECK_OK(kcache_put(c, &k, &art, 1));
  kcache_close(c);
  CHECK(exists(path));
  unsetenv("KCACHE_DIR");
  kcache_options_free(o);
}

static void test_flights(const char* root) {
  char dir[512];
  kcache_cache* c;
  kcache_key_builder* b = kcache_key_builder_new("flight/1");
  kcache_flight* f = NULL;
  kcache_flight* g = NULL;
  kcache_entry* e = NULL;
  kcache_artifact a;
  const void* data = NULL;
  size_t size = 0;
  int source = -1;
  snprintf(dir, sizeof dir, "%s/flights", root);
  c = open_cache(dir, "files");
  CHECK(b != NULL);
  CHECK_EQ_INT(kcache_key_add_string(b, "src", "kernel"), KCACHE_OK);

  CHECK_FAILS(kcache_begin(NULL, b, &f), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_begin(c, NULL, &f), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_begin(c, b, NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_EQ_INT(kcache_flight_hit(NULL), 0);
  CHECK_EQ_INT(kcache_flight_owner(NULL), 0);
  CHECK_FAILS(kcache_flight_entry(NULL, &e, NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_flight_commit(NULL, &a, 1, NULL), KCACHE_INVALID_ARGUMENT);
  kcache_flight_abandon(NULL);
  kcache_flight_free(NULL);

  /* The owner: no entry yet; a bad artifact name abandons. */
  CHECK_OK(kcache_begin(c, b, &f));
  CHECK_EQ_INT(kcache_flight_owner(f), 1);
  CHECK_EQ_INT(kcache_flight_hit(f), 0);
  CHECK_FAILS(kcache_flight_entry(f, &e, &source), KCACHE_NOT_FOUND);
  CHECK_FAILS(kcache_flight_commit(f, NULL, 1, NULL), KCACHE_INVALID_ARGUMENT);
  a.name = "";
  a.data = "x";
  a.size = 1;
  CHECK_FAILS(kcache_flight_commit(f, &a, 1, NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_EQ_INT(kcache_flight_owner(f), 0);
  kcache_flight_free(f);

  /* Own it again, commit, then a second begin hits. */
  CHECK_OK(kcache_begin(c, b, &f));
  CHECK_EQ_INT(kcache_flight_owner(f), 1);
  a.name = "obj";
  a.data = "compiled bytes";
  a.size = 14;
  CHECK_OK(kcache_flight_commit(f, &a, 1, &e));
  CHECK(e != NULL);
  kcache_entry_free(e);
  e = NULL;
  CHECK_FAILS(kcache_flight_commit(f, &a, 1, NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_OK(kcache_flight_entry(f, &e, &source));
  CHECK_EQ_INT(source, KCACHE_SOURCE_COMPILED);
  kcache_entry_free(e);
  e = NULL;
  CHECK_OK(kcache_begin(c, b, &g));
  CHECK_EQ_INT(kcache_flight_hit(g), 1);
  CHECK_EQ_INT(kcache_flight_owner(g), 0);
  CHECK_OK(kcache_flight_entry(g, &e, &source));
  CHECK_EQ_INT(source, KCACHE_SOURCE_MEMORY);
  CHECK_OK(kcache_entry_artifact(e, "obj", &data, &size));
  CHECK(size == 14 && memcmp(data, "compiled bytes", 14) == 0);
  kcache_entry_free(e);
  kcache_flight_free(g);
  kcache_flight_free(f);
  kcache_key_builder_free(b);
  kcache_close(c);
}

/* A label and a private component: the token never reaches the store's
 * files (manifest, journal), the label does; a private name that names no
 * component is refused. */
static void test_label_and_private(const char* root) {
  char dir[512], cmd[1200];
  kcache_cache* c;
  kcache_options* o = kcache_options_new();
  kcache_key_builder* b = kcache_key_builder_new("label/1");
  kcache_flight* f = NULL;
  kcache_artifact a;
  kcache_key k;
  snprintf(dir, sizeof dir, "%s/label", root);
  CHECK(o != NULL && b != NULL);
  CHECK_OK(kcache_options_set(o, "env", "0"));
  CHECK_OK(kcache_options_set(o, "dir", dir));
  CHECK_OK(kcache_options_set(o, "engine", "files"));
  CHECK_OK(kcache_options_set(o, "compression", "none"));
  CHECK_OK(kcache_options_set(o, "memory_size", "0"));
  CHECK_OK(kcache_options_set(o, "sync_commit", "1"));
  CHECK_OK(kcache_open(o, &c));
  kcache_options_free(o);

  CHECK_FAILS(kcache_key_set_label(NULL, "x"), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_set_label(b, NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_FAILS(kcache_key_mark_private(b, NULL), KCACHE_INVALID_ARGUMENT);
  CHECK_OK(kcache_key_add_string(b, "src", "kernel body"));
  CHECK_OK(kcache_key_mark_private(b, "user_token"));
  /* Marked before it exists: refused at finish until it is added. */
  CHECK_FAILS(kcache_key_builder_finish(b, &k), KCACHE_INVALID_ARGUMENT);
  CHECK(strstr(kcache_last_error(), "user_token") != NULL);
  CHECK_OK(kcache_key_add_string(b, "user_token", "tok-5ecret-7731"));
  CHECK_OK(kcache_key_set_label(b, "saxpy_kernel_label"));
  CHECK_OK(kcache_key_builder_finish(b, &k));

  CHECK_OK(kcache_begin(c, b, &f));
  CHECK_EQ_INT(kcache_flight_owner(f), 1);
  a.name = "obj";
  a.data = "compiled bytes";
  a.size = 14;
  CHECK_OK(kcache_flight_commit(f, &a, 1, NULL));
  kcache_flight_free(f);
  kcache_key_builder_free(b);
  CHECK_OK(kcache_flush(c));
  kcache_close(c);

  snprintf(cmd, sizeof cmd, "grep -rqa 'saxpy_kernel_label' '%s'", dir);
  CHECK_EQ_INT(system(cmd), 0);
  snprintf(cmd, sizeof cmd, "grep -rqa 'tok-5ecret-7731' '%s'", dir);
  CHECK(system(cmd) != 0);
}

int main(void) {
  char root[] = "/tmp/kcache-c-test-XXXXXX";
  char cmd[600];
  if (!mkdtemp(root)) {
    perror("mkdtemp");
    return 2;
  }
  test_keys();
  test_errors_and_version();
  test_bad_arguments(root);
  test_flights(root);
  test_label_and_private(root);
  test_options_pipeline(root);
  if (strstr(kcache_features(), "lmdb")) test_engine(root, "lmdb");
  test_engine(root, "files");
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
  if (failures) {
    fprintf(stderr, "c_test: %d check(s) failed\n", failures);
    return 1;
  }
  printf("c_test: all checks passed\n");
  return 0;
}
