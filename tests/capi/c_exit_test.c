/* The C ABI at a process's end and on re-entry, from plain C:
 *   - kcache_flush: 2000 puts, kcache_flush, then SIGKILL: all 2000 on disk;
 *   - a child that puts, kcache_flush()es and _exit()s keeps every entry;
 *   - a child that exit()s without flush or close keeps them (the exit
 *     handler);
 *   - a child with "sync_commit" = "1" that _exit()s without flush keeps
 *     them;
 *   - a compile callback asking for its own key, and a second kcache_begin
 *     of an owned key, get KCACHE_INVALID_ARGUMENT at once (never a wait).
 * Each case runs in a child of fork(); the re-entry cases under alarm(), so
 * a hang is reported as one. KCACHE_TEST_TRIALS sets the trials per exit case
 * (default 5). */
#define _POSIX_C_SOURCE 200809L

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "c_check.h"
#include "kcache/kcache.h"

#define PER_CHILD 20

static void key_of(int i, kcache_key* k) {
  kcache_key_builder* b = kcache_key_builder_new("c-exit");
  kcache_key_add_i64(b, "i", i);
  kcache_key_builder_finish(b, k);
  kcache_key_builder_free(b);
}

static void obj_of(int i, char* buf, size_t size) {
  size_t j;
  for (j = 0; j < size; ++j) buf[j] = (char)((j * 7u + (unsigned)i) & 0xff);
}

static kcache_cache* open_cache(const char* dir, const char* engine, int memory, int sync) {
  kcache_options* o = kcache_options_new();
  kcache_cache* c = NULL;
  kcache_options_set(o, "env", "0");
  kcache_options_set(o, "dir", dir);
  kcache_options_set(o, "engine", engine);
  kcache_options_set(o, "log", "error");
  if (!memory) kcache_options_set(o, "memory", "0");
  if (sync) CHECK(kcache_options_set(o, "sync_commit", "1") == KCACHE_OK);
  CHECK(kcache_open(o, &c) == KCACHE_OK);
  kcache_options_free(o);
  return c;
}

static int put_range(kcache_cache* c, int first, int n) {
  char obj[512];
  int i, ok = 0;
  for (i = first; i < first + n; ++i) {
    kcache_key k;
    kcache_artifact a;
    key_of(i, &k);
    obj_of(i, obj, sizeof obj);
    a.name = "obj";
    a.data = obj;
    a.size = sizeof obj;
    ok += kcache_put(c, &k, &a, 1) == KCACHE_OK;
  }
  return ok;
}

/* Entries [first, first + n) a fresh cache without a memory tier finds with
 * the right bytes. */
static int count_on_disk(const char* dir, const char* engine, int first, int n) {
  kcache_cache* c = open_cache(dir, engine, 0, 0);
  char want[512];
  int i, found = 0;
  for (i = first; i < first + n; ++i) {
    kcache_key k;
    kcache_entry* e = NULL;
    const void* data;
    size_t size;
    key_of(i, &k);
    obj_of(i, want, sizeof want);
    if (kcache_get(c, &k, &e) == KCACHE_OK && kcache_entry_artifact(e, "obj", &data, &size) == KCACHE_OK &&
        size == sizeof want && memcmp(data, want, size) == 0)
      ++found;
    kcache_entry_free(e);
  }
  kcache_close(c);
  return found;
}

static int trials(void) {
  const char* t = getenv("KCACHE_TEST_TRIALS");
  int n = t ? atoi(t) : 0;
  return n > 0 ? n : 5;
}

enum way { FLUSH_THEN_UNDERSCORE_EXIT, EXIT_WITHOUT_FLUSH, SYNC_THEN_UNDERSCORE_EXIT, FLUSH_THEN_SIGKILL };
static const char* way_name[] = {"kcache_flush then _exit", "exit without flush", "sync_commit then _exit",
                                 "kcache_flush then SIGKILL"};

/* A child that puts n entries and ends `way`; the number the parent finds. */
static int child_trial(const char* dir, const char* engine, enum way w, int first, int n) {
  int st = 0;
  pid_t pid = fork();
  if (pid == 0) {
    kcache_cache* c = open_cache(dir, engine, 1, w == SYNC_THEN_UNDERSCORE_EXIT);
    if (put_range(c, first, n) != n) _exit(3);
    switch (w) {
      case FLUSH_THEN_UNDERSCORE_EXIT:
        if (kcache_flush(c) != KCACHE_OK) _exit(4);
        _exit(0);
      case EXIT_WITHOUT_FLUSH:
        exit(0); /* never closed: the exit handler flushes it */
      case SYNC_THEN_UNDERSCORE_EXIT:
        _exit(0);
      case FLUSH_THEN_SIGKILL:
        if (kcache_flush(c) != KCACHE_OK) _exit(4);
        kill(getpid(), SIGKILL);
        _exit(5);
    }
    _exit(6);
  }
  waitpid(pid, &st, 0);
  if (w == FLUSH_THEN_SIGKILL)
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  else
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  return count_on_disk(dir, engine, first, n);
}

static void test_exit_ways(const char* root, const char* engine) {
  char dir[400];
  int w, t, n = trials();
  for (w = FLUSH_THEN_UNDERSCORE_EXIT; w <= SYNC_THEN_UNDERSCORE_EXIT; ++w) {
    int lost = 0;
    snprintf(dir, sizeof dir, "%s/%s-way%d", root, engine, w);
    for (t = 0; t < n; ++t) lost += PER_CHILD - child_trial(dir, engine, (enum way)w, t * PER_CHILD, PER_CHILD);
    if (lost) fprintf(stderr, "%s, %s: %d of %d entries lost\n", engine, way_name[w], lost, n * PER_CHILD);
    CHECK(lost == 0);
  }
}

/* Without the flush, 768 of 2000 puts were on disk after the SIGKILL (the
 * rest still queued for the committer). The files engine writes a file and
 * a sync per entry: 500 there keep the suite short. */
static void test_flush_then_sigkill(const char* root, const char* engine, int n) {
  char dir[400];
  int found;
  snprintf(dir, sizeof dir, "%s/%s-sigkill", root, engine);
  found = child_trial(dir, engine, FLUSH_THEN_SIGKILL, 0, n);
  if (found != n) fprintf(stderr, "%s, %s: %d of %d on disk\n", engine, way_name[FLUSH_THEN_SIGKILL], found, n);
  CHECK(found == n);
  CHECK(kcache_flush(NULL) == KCACHE_INVALID_ARGUMENT);
  CHECK(strlen(kcache_last_error()) > 0);
}

/* ---- re-entry ---------------------------------------------------------- */

struct reentry {
  kcache_cache* c;
  int inner_rc;   /* what the nested call returned */
  int inner_runs; /* compiles of the nested call */
  int use_begin;  /* nested call: kcache_begin instead of kcache_get_or_compile */
  char inner_error[256];
};

static int inner_compile(void* user, kcache_artifacts* out) {
  struct reentry* r = (struct reentry*)user;
  ++r->inner_runs;
  return kcache_artifacts_add(out, "obj", "inner", 5) == KCACHE_OK ? 0 : 1;
}

static int outer_compile(void* user, kcache_artifacts* out) {
  struct reentry* r = (struct reentry*)user;
  kcache_key_builder* b = kcache_key_builder_new("c-reentry");
  kcache_key_add_i64(b, "i", 1);
  if (r->use_begin) {
    kcache_flight* f = NULL;
    r->inner_rc = kcache_begin(r->c, b, &f);
    if (f) kcache_flight_free(f);
  } else {
    kcache_entry* e = NULL;
    r->inner_rc = kcache_get_or_compile_built(r->c, b, inner_compile, r, &e, NULL);
    kcache_entry_free(e);
  }
  snprintf(r->inner_error, sizeof r->inner_error, "%s", kcache_last_error());
  kcache_key_builder_free(b);
  return kcache_artifacts_add(out, "obj", "outer", 5) == KCACHE_OK ? 0 : 1;
}

/* In a child under alarm(): 0 when every check passed. */
static int reentry_child(const char* dir, int use_begin) {
  struct reentry r;
  kcache_key_builder* b = kcache_key_builder_new("c-reentry");
  kcache_entry* e = NULL;
  const void* data;
  size_t size;
  int rc;
  memset(&r, 0, sizeof r);
  r.use_begin = use_begin;
  r.c = open_cache(dir, "files", 1, 0);
  kcache_key_add_i64(b, "i", 1);
  alarm(30);
  rc = kcache_get_or_compile_built(r.c, b, outer_compile, &r, &e, NULL);
  if (rc != KCACHE_OK) return 1;
  if (r.inner_rc != KCACHE_INVALID_ARGUMENT || r.inner_runs != 0) return 2;
  if (strstr(r.inner_error, "re-entrant") == NULL) return 3;
  if (kcache_entry_artifact(e, "obj", &data, &size) != KCACHE_OK || size != 5 || memcmp(data, "outer", 5) != 0)
    return 4;
  kcache_entry_free(e);
  kcache_key_builder_free(b);
  kcache_close(r.c);
  return 0;
}

static int begin_twice_child(const char* dir) {
  kcache_cache* c = open_cache(dir, "files", 1, 0);
  kcache_key_builder* b = kcache_key_builder_new("c-reentry");
  kcache_flight *f = NULL, *g = NULL;
  kcache_artifact a;
  kcache_key_add_i64(b, "i", 2);
  alarm(30);
  if (kcache_begin(c, b, &f) != KCACHE_OK || !kcache_flight_owner(f)) return 1;
  if (kcache_begin(c, b, &g) != KCACHE_INVALID_ARGUMENT || g != NULL) return 2;
  if (strstr(kcache_last_error(), "re-entrant") == NULL) return 3;
  a.name = "obj";
  a.data = "first";
  a.size = 5;
  if (kcache_flight_commit(f, &a, 1, NULL) != KCACHE_OK) return 4;
  kcache_flight_free(f);
  if (kcache_begin(c, b, &g) != KCACHE_OK || !kcache_flight_hit(g)) return 5;
  kcache_flight_free(g);
  kcache_key_builder_free(b);
  kcache_close(c);
  return 0;
}

static void expect_child_ok(const char* what, int which, const char* dir) {
  int st = 0;
  pid_t pid = fork();
  if (pid == 0) _exit(which == 2 ? begin_twice_child(dir) : reentry_child(dir, which));
  waitpid(pid, &st, 0);
  if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
    fprintf(stderr, "%s: hung (killed after 30 s)\n", what);
  else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    fprintf(stderr, "%s: child status %d\n", what, st);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_reentry(const char* root) {
  char dir[400];
  snprintf(dir, sizeof dir, "%s/reentry-goc", root);
  expect_child_ok("get_or_compile inside its own compile", 0, dir);
  snprintf(dir, sizeof dir, "%s/reentry-begin-in-compile", root);
  expect_child_ok("kcache_begin inside the key's compile", 1, dir);
  snprintf(dir, sizeof dir, "%s/reentry-begin-twice", root);
  expect_child_ok("kcache_begin twice in one thread", 2, dir);
}

int main(void) {
  char root[] = "/tmp/kcache-c-exit-test-XXXXXX";
  char cmd[600];
  if (!mkdtemp(root)) {
    perror("mkdtemp");
    return 2;
  }
  if (strstr(kcache_features(), "lmdb")) {
    test_exit_ways(root, "lmdb");
    test_flush_then_sigkill(root, "lmdb", 2000);
  }
  test_exit_ways(root, "files");
  test_flush_then_sigkill(root, "files", 500);
  test_reentry(root);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
  if (failures) {
    fprintf(stderr, "c_exit_test: %d check(s) failed\n", failures);
    return 1;
  }
  printf("c_exit_test: all checks passed\n");
  return 0;
}
