/* cpu/big_blocks.c: the CPU's memory, with a small cache of large blocks. glibc serves a block
   above its mmap threshold (32 MiB at most) from a fresh mapping and unmaps it when freed, so a
   training loop that allocates the same large buffers every step (an RNN's gates over a long
   sequence, a wide batch's activations) has the kernel zero and fault them in again every step.
   Freed blocks of at least KILN_BIG_BLOCK bytes are kept here instead, up to a budget (1 GiB or a
   sixteenth of the machine's memory, whichever is less), and reused for a request of the same
   size rounded up to 2 MiB; the least recently freed goes first when the budget is full, and all
   go back when an allocation fails. */
#include "cpu.h"
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

enum { SLOTS = 16 };

static struct {
  pthread_mutex_t lock;
  struct { void *p; size_t n; uint64_t freed_at; } slot[SLOTS];   /* n == 0: empty */
  size_t bytes, budget;
  uint64_t clock;
  int64_t hits;
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

static size_t budget(void) {   /* lock held */
  if (!cache.budget) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t ram = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)4 << 30;
    cache.budget = ram / 16 < ((size_t)1 << 30) ? ram / 16 : (size_t)1 << 30;
  }
  return cache.budget;
}

/* The size a request is served with: 64-byte multiples, large ones rounded to 2 MiB so that
   requests that differ a little share blocks. */
static size_t rounded(size_t nbytes) {
  size_t n = nbytes ? nbytes : 1;
  if (n >= KILN_BIG_BLOCK) return (n + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
  return (n + 63) & ~(size_t)63;
}

static void drop(int i) {   /* lock held */
  free(cache.slot[i].p);
  cache.bytes -= cache.slot[i].n;
  cache.slot[i].p = NULL;
  cache.slot[i].n = 0;
}

void *kiln_cpu_alloc(size_t nbytes) {
  size_t n = rounded(nbytes);
  if (n >= KILN_BIG_BLOCK) {
    pthread_mutex_lock(&cache.lock);
    int best = -1;   /* a block of exactly this size (then kiln_cpu_free's size is the block's) */
    for (int i = 0; i < SLOTS && best < 0; i++)
      if (cache.slot[i].n == n) best = i;
    void *p = NULL;
    if (best >= 0) {
      p = cache.slot[best].p;
      cache.bytes -= cache.slot[best].n;
      cache.slot[best].p = NULL;
      cache.slot[best].n = 0;
      cache.hits++;
    }
    pthread_mutex_unlock(&cache.lock);
    if (p) return p;
  }
  void *p = kiln_cpu_scratch(n);
  if (!p) {   /* what the cache holds may be what is missing */
    kiln_cpu_trim();
    p = kiln_cpu_scratch(n);
  }
  return p;
}

void kiln_cpu_free(void *p, size_t nbytes) {
  if (!p) return;
  size_t n = rounded(nbytes);
  if (n < KILN_BIG_BLOCK) { free(p); return; }
  pthread_mutex_lock(&cache.lock);
  if (n > budget()) { pthread_mutex_unlock(&cache.lock); free(p); return; }
  for (;;) {   /* make room: an empty slot and the budget */
    int empty = -1, oldest = -1;
    for (int i = 0; i < SLOTS; i++) {
      if (!cache.slot[i].n) { if (empty < 0) empty = i; continue; }
      if (oldest < 0 || cache.slot[i].freed_at < cache.slot[oldest].freed_at) oldest = i;
    }
    if (empty >= 0 && cache.bytes + n <= cache.budget) {
      cache.slot[empty].p = p;
      cache.slot[empty].n = n;
      cache.slot[empty].freed_at = ++cache.clock;
      cache.bytes += n;
      break;
    }
    drop(oldest);   /* the cache is not empty here: either no slot is free or it holds bytes */
  }
  pthread_mutex_unlock(&cache.lock);
}

void kiln_cpu_trim(void) {
  pthread_mutex_lock(&cache.lock);
  for (int i = 0; i < SLOTS; i++)
    if (cache.slot[i].n) drop(i);
  pthread_mutex_unlock(&cache.lock);
}

void kiln_cpu_cache_info(size_t *bytes, int *blocks, int64_t *hits) {
  pthread_mutex_lock(&cache.lock);
  int k = 0;
  for (int i = 0; i < SLOTS; i++) k += cache.slot[i].n != 0;
  if (bytes) *bytes = cache.bytes;
  if (blocks) *blocks = k;
  if (hits) *hits = cache.hits;
  pthread_mutex_unlock(&cache.lock);
}

void kiln_cpu_set_cache_budget(size_t bytes) {
  pthread_mutex_lock(&cache.lock);
  cache.budget = bytes ? bytes : 1;
  while (cache.bytes > cache.budget) {   /* the least recently freed first */
    int oldest = -1;
    for (int i = 0; i < SLOTS; i++)
      if (cache.slot[i].n && (oldest < 0 || cache.slot[i].freed_at < cache.slot[oldest].freed_at)) oldest = i;
    drop(oldest);
  }
  pthread_mutex_unlock(&cache.lock);
}

KILN_API int64_t kiln_cpu_cached_bytes(void) {
  size_t bytes;
  kiln_cpu_cache_info(&bytes, NULL, NULL);
  return (int64_t)bytes;
}

KILN_API void kiln_cpu_empty_cache(void) { kiln_cpu_trim(); }
