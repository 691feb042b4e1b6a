/* cuda/pinned.c: the cache of page-locked host blocks (see pinned.h). Plain C over a backing,
   compiled into libkiln_cuda, into the fake backend of the CI tests and into
   tests/c/test_cuda_pinned.c. Blocks are few (a loader holds about prefetch x tensors of them), so
   they sit in one array searched linearly; each carries the events of the copies that read it. */
#include "pinned.h"
#include <kiln/kiln.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct pblock {
  char *ptr;
  int64_t size;
  int held;
  void **events;            /* copies that may still read the block */
  int nevents, capevents;
};

struct kiln_pinned_cache {
  pthread_mutex_t lock;
  struct kiln_pinned_backing backing;
  struct pblock *blocks;
  int64_t n, cap;
  struct kiln_pinned_stats stats;
};

int64_t kiln_pinned_round(int64_t nbytes) {
  if (nbytes < 0 || nbytes > INT64_MAX / 2) return -1;
  if (nbytes < KILN_PINNED_ROUND) return KILN_PINNED_ROUND;
  return (nbytes + KILN_PINNED_ROUND - 1) / KILN_PINNED_ROUND * KILN_PINNED_ROUND;
}

static const char *human(char *buf, size_t n, int64_t bytes) {
  double v = (double)bytes;
  if (bytes >= (int64_t)1 << 30) snprintf(buf, n, "%.2f GiB", v / (double)(1 << 30));
  else if (bytes >= (int64_t)1 << 20) snprintf(buf, n, "%.1f MiB", v / (double)(1 << 20));
  else if (bytes >= 1024) snprintf(buf, n, "%.1f KiB", v / 1024.0);
  else snprintf(buf, n, "%lld bytes", (long long)bytes);
  return buf;
}

struct kiln_pinned_cache *kiln_pinned_new(struct kiln_pinned_backing backing) {
  struct kiln_pinned_cache *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  pthread_mutex_init(&c->lock, NULL);
  c->backing = backing;
  return c;
}

/* Drop the events of b that have completed; 1 when none is left. Lock held. */
static int settle(struct kiln_pinned_cache *c, struct pblock *b) {
  int keep = 0;
  for (int i = 0; i < b->nevents; i++) {
    void *e = b->events[i];
    if (c->backing.event_query(c->backing.ctx, e) != 0) {
      c->backing.event_release(c->backing.ctx, e);
      c->stats.events_pending--;
    } else {
      b->events[keep++] = e;
    }
  }
  b->nevents = keep;
  return keep == 0;
}

/* Wait for every event of b. Lock held. */
static void drain(struct kiln_pinned_cache *c, struct pblock *b) {
  for (int i = 0; i < b->nevents; i++) {
    c->backing.event_wait(c->backing.ctx, b->events[i]);
    c->backing.event_release(c->backing.ctx, b->events[i]);
    c->stats.events_pending--;
    c->stats.waits++;
  }
  b->nevents = 0;
}

/* Give block i back to the driver (its copies finished) and remove it. Lock held. */
static void release_block(struct kiln_pinned_cache *c, int64_t i) {
  struct pblock *b = &c->blocks[i];
  drain(c, b);
  c->backing.raw_free(c->backing.ctx, b->ptr, b->size);
  c->stats.raw_frees++;
  c->stats.reserved -= b->size;
  free(b->events);
  c->blocks[i] = c->blocks[--c->n];
}

/* Every free block back to the driver; returns the bytes. Lock held. */
static int64_t release_free(struct kiln_pinned_cache *c) {
  int64_t released = 0;
  for (int64_t i = 0; i < c->n;) {
    if (!c->blocks[i].held) {
      released += c->blocks[i].size;
      release_block(c, i);
    } else {
      i++;
    }
  }
  return released;
}

int kiln_pinned_alloc(struct kiln_pinned_cache *c, int64_t nbytes, void **out, char *err, size_t errlen) {
  char h1[32], h2[32], h3[32], h4[32];
  *out = NULL;
  int64_t size = kiln_pinned_round(nbytes);
  if (size < 0) {
    snprintf(err, errlen, "out of pinned memory: cannot page-lock %lld bytes (a size no host has)", (long long)nbytes);
    return KILN_ERR_MEMORY;
  }
  pthread_mutex_lock(&c->lock);
  c->stats.requests++;
  /* the smallest free block of [size, 2 size] whose copies have all finished */
  int64_t best = -1;
  for (int64_t i = 0; i < c->n; i++) {
    struct pblock *b = &c->blocks[i];
    if (b->held || b->size < size || b->size > 2 * size) continue;
    if (best >= 0 && b->size >= c->blocks[best].size) continue;
    if (!settle(c, b)) {
      c->stats.skipped_busy++;
      continue;
    }
    best = i;
  }
  if (best >= 0) {
    struct pblock *b = &c->blocks[best];
    b->held = 1;
    c->stats.cache_hits++;
    c->stats.allocated += b->size;
    *out = b->ptr;
    pthread_mutex_unlock(&c->lock);
    return KILN_OK;
  }
  if (c->n == c->cap) {
    int64_t cap = c->cap ? c->cap * 2 : 16;
    struct pblock *v = realloc(c->blocks, sizeof *v * (size_t)cap);
    if (!v) {
      snprintf(err, errlen, "out of memory: no host memory to record a pinned block of %lld bytes", (long long)size);
      pthread_mutex_unlock(&c->lock);
      return KILN_ERR_MEMORY;
    }
    c->blocks = v;
    c->cap = cap;
  }
  void *p = NULL;
  char raw_err[256] = "";
  int64_t released = 0;
  int rc = c->backing.raw_alloc(c->backing.ctx, size, &p, raw_err, sizeof raw_err);
  if (rc) {
    /* Give the cache back (once its copies have finished) and try once more. */
    released = release_free(c);
    raw_err[0] = 0;
    rc = c->backing.raw_alloc(c->backing.ctx, size, &p, raw_err, sizeof raw_err);
  }
  if (rc) {
    snprintf(err, errlen,
             "out of pinned memory: cannot page-lock %s (%lld bytes): %s, after %s of cached pinned blocks were given "
             "back; pinned tensors hold %s, %s is page-locked in all",
             human(h1, sizeof h1, nbytes), (long long)nbytes, raw_err[0] ? raw_err : "the driver refused",
             human(h2, sizeof h2, released), human(h3, sizeof h3, c->stats.allocated),
             human(h4, sizeof h4, c->stats.reserved));
    pthread_mutex_unlock(&c->lock);
    return KILN_ERR_MEMORY;
  }
  c->blocks[c->n++] = (struct pblock){.ptr = p, .size = size, .held = 1};
  c->stats.raw_allocs++;
  c->stats.reserved += size;
  c->stats.allocated += size;
  *out = p;
  pthread_mutex_unlock(&c->lock);
  return KILN_OK;
}

/* The block holding ptr (its start or inside it), or -1. Lock held. */
static int64_t find(const struct kiln_pinned_cache *c, const void *ptr, int start_only) {
  const char *p = ptr;
  for (int64_t i = 0; i < c->n; i++) {
    const struct pblock *b = &c->blocks[i];
    if (start_only ? p == b->ptr : (p >= b->ptr && p < b->ptr + b->size)) return i;
  }
  return -1;
}

int kiln_pinned_free(struct kiln_pinned_cache *c, void *ptr) {
  pthread_mutex_lock(&c->lock);
  int64_t i = find(c, ptr, 1);
  if (i < 0 || !c->blocks[i].held) {
    pthread_mutex_unlock(&c->lock);
    return -1;
  }
  c->blocks[i].held = 0;
  c->stats.allocated -= c->blocks[i].size;
  settle(c, &c->blocks[i]);   /* forget what has finished already; the rest is checked at reuse */
  pthread_mutex_unlock(&c->lock);
  return 0;
}

int kiln_pinned_record(struct kiln_pinned_cache *c, const void *ptr, uintptr_t stream, char *err, size_t errlen) {
  pthread_mutex_lock(&c->lock);
  int64_t i = find(c, ptr, 0);
  if (i < 0 || !c->blocks[i].held) {
    pthread_mutex_unlock(&c->lock);
    return -1;
  }
  struct pblock *b = &c->blocks[i];
  settle(c, b);
  if (b->nevents == b->capevents) {
    int cap = b->capevents ? b->capevents * 2 : 4;
    void **v = realloc(b->events, sizeof *v * (size_t)cap);
    if (!v) {
      snprintf(err, errlen, "out of memory: no host memory to track a copy from pinned memory");
      pthread_mutex_unlock(&c->lock);
      return KILN_ERR_MEMORY;
    }
    b->events = v;
    b->capevents = cap;
  }
  void *e = NULL;
  int rc = c->backing.event_record(c->backing.ctx, stream, &e, err, errlen);
  if (rc) {
    pthread_mutex_unlock(&c->lock);
    return rc > 0 ? rc : KILN_ERR_DEVICE;
  }
  b->events[b->nevents++] = e;
  c->stats.events_recorded++;
  c->stats.events_pending++;
  pthread_mutex_unlock(&c->lock);
  return KILN_OK;
}

int kiln_pinned_contains(struct kiln_pinned_cache *c, const void *ptr) {
  pthread_mutex_lock(&c->lock);
  int64_t i = find(c, ptr, 0);
  int held = i >= 0 && c->blocks[i].held;
  pthread_mutex_unlock(&c->lock);
  return held;
}

int64_t kiln_pinned_empty(struct kiln_pinned_cache *c) {
  pthread_mutex_lock(&c->lock);
  int64_t released = release_free(c);
  pthread_mutex_unlock(&c->lock);
  return released;
}

void kiln_pinned_stats(struct kiln_pinned_cache *c, struct kiln_pinned_stats *out) {
  pthread_mutex_lock(&c->lock);
  *out = c->stats;
  pthread_mutex_unlock(&c->lock);
}

void kiln_pinned_destroy(struct kiln_pinned_cache *c) {
  if (!c) return;
  while (c->n > 0) release_block(c, c->n - 1);
  free(c->blocks);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); rc = -1; goto done; } while (0)

int kiln_pinned_check(struct kiln_pinned_cache *c, char *err, size_t errlen) {
  int rc = 0;
  pthread_mutex_lock(&c->lock);
  int64_t allocated = 0, reserved = 0, pending = 0;
  for (int64_t i = 0; i < c->n; i++) {
    const struct pblock *b = &c->blocks[i];
    if (b->size <= 0 || b->size % KILN_PINNED_ROUND) BAD("block %p has size %lld", (void *)b->ptr, (long long)b->size);
    if (b->nevents < 0 || b->nevents > b->capevents) BAD("block %p: %d events in room for %d", (void *)b->ptr, b->nevents, b->capevents);
    for (int64_t j = 0; j < i; j++) {
      const struct pblock *o = &c->blocks[j];
      if (b->ptr < o->ptr + o->size && o->ptr < b->ptr + b->size) BAD("blocks %p and %p overlap", (void *)b->ptr, (void *)o->ptr);
    }
    reserved += b->size;
    if (b->held) allocated += b->size;
    pending += b->nevents;
  }
  if (allocated != c->stats.allocated)
    BAD("held blocks add up to %lld bytes, statistics say %lld", (long long)allocated, (long long)c->stats.allocated);
  if (reserved != c->stats.reserved)
    BAD("blocks add up to %lld bytes, statistics say %lld reserved", (long long)reserved, (long long)c->stats.reserved);
  if (pending != c->stats.events_pending)
    BAD("blocks carry %lld events, statistics say %lld pending", (long long)pending, (long long)c->stats.events_pending);
done:
  pthread_mutex_unlock(&c->lock);
  return rc;
}
