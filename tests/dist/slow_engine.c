/* tests/dist/slow_engine.c: a message engine for tests only. It opens the real one
   ($KILN_SLOW_ENGINE_REAL, libkiln_mpi.so) and adds $KILN_SLOW_ENGINE_US microseconds before each
   all-reduce, as a slow network would: tests/dist/overlap.lua loads it through $KILN_MPI_LIB to
   show that DataParallel's buckets travel while backward runs. */
#include "dist/engine.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct kiln_engine slow;
static const struct kiln_engine *real;
static long delay_us;

static int slow_all_reduce(void *comm, const void *in, void *out, int64_t count, int dtype, int op, char *err, size_t n) {
  struct timespec ts = {delay_us / 1000000, (delay_us % 1000000) * 1000};
  nanosleep(&ts, NULL);
  return real->all_reduce(comm, in, out, count, dtype, op, err, n);
}

__attribute__((visibility("default"))) const struct kiln_engine *kiln_engine_open(int version) {
  const char *path = getenv("KILN_SLOW_ENGINE_REAL");
  const char *us = getenv("KILN_SLOW_ENGINE_US");
  void *h = path ? dlopen(path, RTLD_NOW | RTLD_GLOBAL) : NULL;
  if (!h) { fprintf(stderr, "slow_engine: cannot open $KILN_SLOW_ENGINE_REAL (%s)\n", path ? dlerror() : "unset"); return NULL; }
  kiln_engine_open_fn open_fn;
  void *sym = dlsym(h, "kiln_engine_open");
  memcpy(&open_fn, &sym, sizeof open_fn);
  real = open_fn ? open_fn(version) : NULL;
  if (!real) return NULL;
  slow = *real;
  slow.all_reduce = slow_all_reduce;
  delay_us = us ? atol(us) : 10000;
  return &slow;
}
