/* cuda/allocator.c: the caching device allocator's bookkeeping (see allocator.h). Plain C over a
   raw allocate/free pair, compiled into libkiln_cuda and into tests/c/test_cuda_allocator.c.
   A segment is one raw allocation, tiled by blocks linked in address order; free blocks sit in
   one sorted set per pool, ordered by (stream, size, address), so the first block at or after
   (stream, size) is the best fit; held blocks are found by address in a hash map. */
#include "allocator.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct block {
  char *ptr;
  int64_t size;
  uintptr_t stream;
  int pool;                   /* 0: small (<= 1 MiB), 1: large */
  int allocated;
  struct block *prev, *next;  /* neighbours in the segment, by address */
  uintptr_t *uses;            /* other streams that use the block (record_stream) */
  int nuses;
  void **events;              /* freed, pending: the events recorded on those streams at the free */
  int nevents;
};

struct free_set {
  struct block **v;
  int64_t n, cap;
};

/* Open addressing with linear probing; deletion shifts entries back, so there are no tombstones. */
struct ptr_map {
  struct block **slots;
  int64_t cap, n;             /* cap: a power of two */
};

struct kiln_caching_allocator {
  pthread_mutex_t lock;
  int device;
  struct kiln_alloc_backing backing;
  struct free_set free[2];
  struct ptr_map live;
  struct free_set pending;    /* freed blocks waiting for their events, in no order */
  struct kiln_cuda_memory stats;
};

/* ---- sizes ---- */

int64_t kiln_caching_round(int64_t nbytes) {
  if (nbytes < 0 || nbytes > INT64_MAX / 2) return -1;
  if (nbytes < KILN_ALLOC_ROUND) return KILN_ALLOC_ROUND;
  return (nbytes + KILN_ALLOC_ROUND - 1) / KILN_ALLOC_ROUND * KILN_ALLOC_ROUND;
}

int64_t kiln_caching_segment_size(int64_t size) {
  if (size <= KILN_ALLOC_SMALL) return KILN_ALLOC_SMALL_SEGMENT;
  if (size < KILN_ALLOC_MID) return KILN_ALLOC_MID_SEGMENT;
  return (size + KILN_ALLOC_LARGE_ROUND - 1) / KILN_ALLOC_LARGE_ROUND * KILN_ALLOC_LARGE_ROUND;
}

static int pool_of(int64_t size) { return size <= KILN_ALLOC_SMALL ? 0 : 1; }

/* Split off the rest of a block when it is worth keeping: any 512 bytes in the small pool, more
   than 1 MiB in the large one (smaller rests of a large block stay with it, as in PyTorch). */
static int worth_splitting(const struct block *b, int64_t size) {
  int64_t rest = b->size - size;
  return b->pool == 0 ? rest >= KILN_ALLOC_ROUND : rest > KILN_ALLOC_SMALL;
}

/* "1.50 GiB" */
static const char *human(char *buf, size_t n, int64_t bytes) {
  double v = (double)bytes;
  if (bytes >= (int64_t)1 << 30) snprintf(buf, n, "%.2f GiB", v / (double)(1 << 30));
  else if (bytes >= (int64_t)1 << 20) snprintf(buf, n, "%.1f MiB", v / (double)(1 << 20));
  else if (bytes >= 1024) snprintf(buf, n, "%.1f KiB", v / 1024.0);
  else snprintf(buf, n, "%lld bytes", (long long)bytes);
  return buf;
}

/* ---- free sets ---- */

static int block_before(const struct block *b, uintptr_t stream, int64_t size, const char *ptr) {
  if (b->stream != stream) return b->stream < stream;
  if (b->size != size) return b->size < size;
  return b->ptr < ptr;
}

static int64_t lower_bound(const struct free_set *s, uintptr_t stream, int64_t size, const char *ptr) {
  int64_t lo = 0, hi = s->n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (block_before(s->v[mid], stream, size, ptr)) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static int set_insert(struct free_set *s, struct block *b) {
  if (s->n == s->cap) {
    int64_t cap = s->cap ? s->cap * 2 : 64;
    struct block **v = realloc(s->v, sizeof *v * (size_t)cap);
    if (!v) return -1;
    s->v = v;
    s->cap = cap;
  }
  int64_t i = lower_bound(s, b->stream, b->size, b->ptr);
  memmove(s->v + i + 1, s->v + i, sizeof *s->v * (size_t)(s->n - i));
  s->v[i] = b;
  s->n++;
  return 0;
}

static void set_remove(struct free_set *s, struct block *b) {
  int64_t i = lower_bound(s, b->stream, b->size, b->ptr);
  if (i < s->n && s->v[i] == b) {
    memmove(s->v + i, s->v + i + 1, sizeof *s->v * (size_t)(s->n - i - 1));
    s->n--;
  }
}

/* The pending list: a plain array. */
static int set_insert_unsorted(struct free_set *s, struct block *b) {
  if (s->n == s->cap) {
    int64_t cap = s->cap ? s->cap * 2 : 16;
    struct block **v = realloc(s->v, sizeof *v * (size_t)cap);
    if (!v) return -1;
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n++] = b;
  return 0;
}

/* ---- the map of held blocks ---- */

static uint64_t ptr_hash(const void *p) {
  uint64_t x = (uint64_t)(uintptr_t)p >> 9;   /* blocks are 512-byte aligned within segments */
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

static int map_grow(struct ptr_map *m) {
  int64_t cap = m->cap ? m->cap * 2 : 256;
  struct block **slots = calloc((size_t)cap, sizeof *slots);
  if (!slots) return -1;
  for (int64_t i = 0; i < m->cap; i++) {
    struct block *b = m->slots[i];
    if (!b) continue;
    int64_t j = (int64_t)(ptr_hash(b->ptr) & (uint64_t)(cap - 1));
    while (slots[j]) j = (j + 1) & (cap - 1);
    slots[j] = b;
  }
  free(m->slots);
  m->slots = slots;
  m->cap = cap;
  return 0;
}

static int map_insert(struct ptr_map *m, struct block *b) {
  if ((m->n + 1) * 2 > m->cap && map_grow(m)) return -1;
  int64_t j = (int64_t)(ptr_hash(b->ptr) & (uint64_t)(m->cap - 1));
  while (m->slots[j]) j = (j + 1) & (m->cap - 1);
  m->slots[j] = b;
  m->n++;
  return 0;
}

static int64_t map_find(const struct ptr_map *m, const void *ptr) {
  if (!m->cap) return -1;
  int64_t j = (int64_t)(ptr_hash(ptr) & (uint64_t)(m->cap - 1));
  while (m->slots[j]) {
    if (m->slots[j]->ptr == ptr) return j;
    j = (j + 1) & (m->cap - 1);
  }
  return -1;
}

static void map_remove_at(struct ptr_map *m, int64_t j) {
  int64_t mask = m->cap - 1;
  m->slots[j] = NULL;
  m->n--;
  /* Move back every entry of the run after j that would no longer be found past the hole. */
  for (int64_t k = (j + 1) & mask; m->slots[k]; k = (k + 1) & mask) {
    int64_t home = (int64_t)(ptr_hash(m->slots[k]->ptr) & (uint64_t)mask);
    int64_t dist_k = (k - home) & mask, dist_j = (j - home) & mask;
    if (dist_j < dist_k) {
      m->slots[j] = m->slots[k];
      m->slots[k] = NULL;
      j = k;
    }
  }
}

/* ---- the allocator ---- */

struct kiln_caching_allocator *kiln_caching_new(int device, struct kiln_alloc_backing backing) {
  struct kiln_caching_allocator *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  pthread_mutex_init(&a->lock, NULL);
  a->device = device;
  a->backing = backing;
  return a;
}

static void note_peaks(struct kiln_cuda_memory *s) {
  if (s->allocated > s->peak_allocated) s->peak_allocated = s->allocated;
  if (s->reserved > s->peak_reserved) s->peak_reserved = s->reserved;
}

/* Release every free block that is a whole segment. Lock held. */
static int64_t release_cached(struct kiln_caching_allocator *a) {
  int64_t released = 0;
  for (int p = 0; p < 2; p++) {
    struct free_set *s = &a->free[p];
    int64_t keep = 0;
    for (int64_t i = 0; i < s->n; i++) {
      struct block *b = s->v[i];
      if (!b->prev && !b->next) {
        a->backing.raw_free(a->backing.ctx, b->ptr, b->size);
        a->stats.reserved -= b->size;
        a->stats.device_frees++;
        released += b->size;
        free(b);
      } else {
        s->v[keep++] = b;   /* order is kept: removing entries from a sorted array */
      }
    }
    s->n = keep;
  }
  return released;
}

static void put_back(struct kiln_caching_allocator *a, struct block *b);

/* Take back the pending blocks whose events have all completed (wait: wait for them). Lock held. */
static void collect_pending(struct kiln_caching_allocator *a, int wait) {
  struct free_set *s = &a->pending;
  int64_t keep = 0;
  for (int64_t i = 0; i < s->n; i++) {
    struct block *b = s->v[i];
    int left = 0;
    for (int k = 0; k < b->nevents; k++) {
      if (!b->events[k]) continue;
      if (wait) a->backing.event_wait(a->backing.ctx, b->events[k]);
      else if (!a->backing.event_done(a->backing.ctx, b->events[k])) { left++; continue; }
      b->events[k] = NULL;
    }
    if (left) {
      s->v[keep++] = b;
    } else {
      free(b->events);
      b->events = NULL;
      b->nevents = 0;
      put_back(a, b);
    }
  }
  s->n = keep;
}

int kiln_caching_alloc(struct kiln_caching_allocator *a, uintptr_t stream, int64_t nbytes, void **out, char *err,
                       size_t errlen) {
  char h1[32], h2[32], h3[32], h4[32], h5[32];
  *out = NULL;
  int64_t size = kiln_caching_round(nbytes);
  if (size < 0) {
    snprintf(err, errlen, "out of memory: cannot allocate %lld bytes on cuda:%d (a size no device has)",
             (long long)nbytes, a->device);
    return KILN_ERR_MEMORY;
  }
  int pool = pool_of(size);
  pthread_mutex_lock(&a->lock);
  a->stats.requests++;
  if (a->pending.n) collect_pending(a, 0);
  struct free_set *s = &a->free[pool];
  int64_t i = lower_bound(s, stream, size, NULL);
  struct block *b = i < s->n && s->v[i]->stream == stream ? s->v[i] : NULL;
  if (b) {
    set_remove(s, b);
    a->stats.cache_hits++;
  } else {
    int64_t seg = kiln_caching_segment_size(size);
    void *p = NULL;
    char raw_err[256] = "";
    int64_t released = 0;
    int rc = a->backing.raw_alloc(a->backing.ctx, seg, &p, raw_err, sizeof raw_err);
    if (rc) {
      /* Wait for the blocks other streams still use, give the cache back to the driver and try
         once more. */
      if (a->pending.n) collect_pending(a, 1);
      released = release_cached(a);
      a->stats.oom_retries++;
      raw_err[0] = 0;
      rc = a->backing.raw_alloc(a->backing.ctx, seg, &p, raw_err, sizeof raw_err);
    }
    b = rc ? NULL : calloc(1, sizeof *b);
    if (!b) {
      if (!rc) a->backing.raw_free(a->backing.ctx, p, seg);
      snprintf(err, errlen,
               "out of memory: cannot allocate %s (%lld bytes) on cuda:%d: the driver refused a %s segment (%s) after "
               "%s of cached blocks were given back; tensors hold %s, kiln has %s reserved",
               human(h1, sizeof h1, nbytes), (long long)nbytes, a->device, human(h2, sizeof h2, seg),
               rc ? (raw_err[0] ? raw_err : "no reason given") : "no host memory for its record",
               human(h3, sizeof h3, released), human(h4, sizeof h4, a->stats.allocated),
               human(h5, sizeof h5, a->stats.reserved));
      pthread_mutex_unlock(&a->lock);
      return KILN_ERR_MEMORY;
    }
    b->ptr = p;
    b->size = seg;
    b->stream = stream;
    b->pool = pool;
    a->stats.device_allocs++;
    a->stats.reserved += seg;
  }
  if (worth_splitting(b, size)) {
    struct block *rest = calloc(1, sizeof *rest);
    if (rest) {   /* without host memory for the record, the block simply stays whole */
      rest->ptr = b->ptr + size;
      rest->size = b->size - size;
      rest->stream = b->stream;
      rest->pool = b->pool;
      rest->prev = b;
      rest->next = b->next;
      if (b->next) b->next->prev = rest;
      b->next = rest;
      b->size = size;
      if (set_insert(&a->free[rest->pool], rest)) {   /* undo: merge the rest back */
        b->size += rest->size;
        b->next = rest->next;
        if (rest->next) rest->next->prev = b;
        free(rest);
      }
    }
  }
  if (map_insert(&a->live, b)) {
    /* No host memory to remember the block: put it back (merged with a free rest of its split,
       so that no two free blocks neighbour) and fail. */
    a->stats.allocated += b->size;   /* put_back takes it off again */
    put_back(a, b);
    snprintf(err, errlen, "out of memory: no host memory to record a block of %lld bytes on cuda:%d", (long long)size,
             a->device);
    pthread_mutex_unlock(&a->lock);
    return KILN_ERR_MEMORY;
  }
  b->allocated = 1;
  a->stats.allocated += b->size;
  note_peaks(&a->stats);
  *out = b->ptr;
  pthread_mutex_unlock(&a->lock);
  return KILN_OK;
}

/* Merge b's free neighbour nb into b (nb follows b). Lock held. */
static void absorb_next(struct kiln_caching_allocator *a, struct block *b) {
  struct block *nb = b->next;
  set_remove(&a->free[nb->pool], nb);
  b->size += nb->size;
  b->next = nb->next;
  if (nb->next) nb->next->prev = b;
  free(nb);
}

/* A block no tensor holds, back among the free ones: merged with free neighbours. Lock held. */
static void put_back(struct kiln_caching_allocator *a, struct block *b) {
  a->stats.allocated -= b->size;
  b->allocated = 0;
  if (b->next && !b->next->allocated) absorb_next(a, b);
  if (b->prev && !b->prev->allocated) {
    struct block *pb = b->prev;
    set_remove(&a->free[pb->pool], pb);
    pb->size += b->size;
    pb->next = b->next;
    if (b->next) b->next->prev = pb;
    free(b);
    b = pb;
  }
  if (set_insert(&a->free[b->pool], b)) {
    /* No host memory to list it: keep it out of the cache; it returns with its segment's
       neighbours or at destroy. The memory stays reserved, nothing is lost track of. */
    b->allocated = 1;
    a->stats.allocated += b->size;
  }
}

int kiln_caching_free(struct kiln_caching_allocator *a, void *ptr) {
  pthread_mutex_lock(&a->lock);
  int64_t j = map_find(&a->live, ptr);
  if (j < 0) {
    pthread_mutex_unlock(&a->lock);
    return -1;
  }
  struct block *b = a->live.slots[j];
  map_remove_at(&a->live, j);
  if (b->nuses) {
    /* Used on other streams: events there now; the block waits until they complete. */
    void **ev = malloc(sizeof *ev * (size_t)b->nuses);
    int n = 0;
    for (int k = 0; k < b->nuses; k++) {
      void *e = ev ? a->backing.event_record(a->backing.ctx, b->uses[k]) : NULL;
      if (!ev) continue;
      if (e) ev[n++] = e;
    }
    if (!ev) {   /* no host memory for the list: wait for those streams' work instead */
      for (int k = 0; k < b->nuses; k++) {
        void *e = a->backing.event_record(a->backing.ctx, b->uses[k]);
        if (e) a->backing.event_wait(a->backing.ctx, e);
      }
    }
    free(b->uses);
    b->uses = NULL;
    b->nuses = 0;
    if (n > 0 && set_insert_unsorted(&a->pending, b) == 0) {
      b->events = ev;
      b->nevents = n;
      pthread_mutex_unlock(&a->lock);
      return 0;
    }
    for (int k = 0; k < n; k++) a->backing.event_wait(a->backing.ctx, ev[k]);   /* could not list it: wait */
    free(ev);
  }
  put_back(a, b);
  pthread_mutex_unlock(&a->lock);
  return 0;
}

int kiln_caching_record_stream(struct kiln_caching_allocator *a, void *ptr, uintptr_t stream) {
  if (!a->backing.event_record || !a->backing.event_done || !a->backing.event_wait) return -2;
  pthread_mutex_lock(&a->lock);
  int64_t j = map_find(&a->live, ptr);
  int rc = 0;
  if (j < 0) {
    rc = -1;
  } else {
    struct block *b = a->live.slots[j];
    int seen = stream == b->stream;
    for (int k = 0; k < b->nuses && !seen; k++) seen = b->uses[k] == stream;
    if (!seen) {
      uintptr_t *u = realloc(b->uses, sizeof *u * (size_t)(b->nuses + 1));
      if (!u) {
        rc = -2;
      } else {
        u[b->nuses++] = stream;
        b->uses = u;
      }
    }
  }
  pthread_mutex_unlock(&a->lock);
  return rc;
}

void kiln_caching_forget_stream(struct kiln_caching_allocator *a, uintptr_t stream) {
  pthread_mutex_lock(&a->lock);
  for (int64_t j = 0; j < a->live.cap; j++) {
    struct block *b = a->live.slots[j];
    if (!b) continue;
    int n = 0;
    for (int k = 0; k < b->nuses; k++)
      if (b->uses[k] != stream) b->uses[n++] = b->uses[k];
    b->nuses = n;
  }
  pthread_mutex_unlock(&a->lock);
}

int64_t kiln_caching_pending(struct kiln_caching_allocator *a) {
  pthread_mutex_lock(&a->lock);
  if (a->pending.n) collect_pending(a, 0);
  int64_t n = a->pending.n;
  pthread_mutex_unlock(&a->lock);
  return n;
}

int64_t kiln_caching_block_size(struct kiln_caching_allocator *a, void *ptr) {
  pthread_mutex_lock(&a->lock);
  int64_t j = map_find(&a->live, ptr), size = j < 0 ? -1 : a->live.slots[j]->size;
  pthread_mutex_unlock(&a->lock);
  return size;
}

int64_t kiln_caching_empty(struct kiln_caching_allocator *a) {
  pthread_mutex_lock(&a->lock);
  if (a->pending.n) collect_pending(a, 0);
  int64_t released = release_cached(a);
  pthread_mutex_unlock(&a->lock);
  return released;
}

void kiln_caching_stats(struct kiln_caching_allocator *a, struct kiln_cuda_memory *out) {
  pthread_mutex_lock(&a->lock);
  if (a->pending.n) collect_pending(a, 0);
  *out = a->stats;
  pthread_mutex_unlock(&a->lock);
}

void kiln_caching_destroy(struct kiln_caching_allocator *a) {
  if (!a) return;
  if (a->pending.n) collect_pending(a, 1);   /* every pending block back among the free ones */
  /* Every block is either held (in the map) or free (in a set); segments start at heads. */
  for (int64_t i = 0; i < a->live.cap; i++)
    if (a->live.slots[i]) a->live.slots[i]->allocated = 1;
  struct block **all = NULL;
  int64_t n = a->live.n + a->free[0].n + a->free[1].n, k = 0;
  all = malloc(sizeof *all * (size_t)(n ? n : 1));
  if (all) {
    for (int64_t i = 0; i < a->live.cap; i++)
      if (a->live.slots[i]) all[k++] = a->live.slots[i];
    for (int p = 0; p < 2; p++)
      for (int64_t i = 0; i < a->free[p].n; i++) all[k++] = a->free[p].v[i];
    for (int64_t i = 0; i < k; i++) {
      struct block *b = all[i];
      if (b->prev) continue;
      int64_t seg = 0;
      for (struct block *c = b; c; c = c->next) seg += c->size;
      a->backing.raw_free(a->backing.ctx, b->ptr, seg);
    }
    for (int64_t i = 0; i < k; i++) {
      free(all[i]->uses);
      free(all[i]);
    }
    free(all);
  }
  free(a->pending.v);
  free(a->live.slots);
  free(a->free[0].v);
  free(a->free[1].v);
  pthread_mutex_destroy(&a->lock);
  free(a);
}

/* ---- invariants, for tests ---- */

#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); rc = -1; goto done; } while (0)

int kiln_caching_check(struct kiln_caching_allocator *a, char *err, size_t errlen) {
  int rc = 0;
  pthread_mutex_lock(&a->lock);
  int64_t allocated = 0, reserved = 0, live = 0;
  for (int64_t i = 0; i < a->live.cap; i++) {
    struct block *b = a->live.slots[i];
    if (!b) continue;
    live++;
    if (!b->allocated) BAD("held block %p is marked free", (void *)b->ptr);
    if (map_find(&a->live, b->ptr) != i) BAD("held block %p cannot be found by its address", (void *)b->ptr);
    allocated += b->size;
  }
  if (live != a->live.n) BAD("map counts %lld blocks, holds %lld", (long long)a->live.n, (long long)live);
  for (int64_t i = 0; i < a->pending.n; i++) {
    struct block *b = a->pending.v[i];
    if (!b->allocated) BAD("pending block %p is marked free", (void *)b->ptr);
    if (map_find(&a->live, b->ptr) >= 0) BAD("pending block %p is also held", (void *)b->ptr);
    if (b->nevents < 1) BAD("pending block %p waits for no event", (void *)b->ptr);
    allocated += b->size;
  }
  if (allocated != a->stats.allocated)
    BAD("held blocks add up to %lld bytes, statistics say %lld", (long long)allocated, (long long)a->stats.allocated);
  for (int p = 0; p < 2; p++) {
    const struct free_set *s = &a->free[p];
    for (int64_t i = 0; i < s->n; i++) {
      struct block *b = s->v[i];
      if (b->allocated) BAD("free block %p is marked held", (void *)b->ptr);
      if (b->pool != p) BAD("block %p of pool %d is in pool %d's free set", (void *)b->ptr, b->pool, p);
      if (i > 0 && !block_before(s->v[i - 1], b->stream, b->size, b->ptr)) BAD("free set %d is not sorted at %lld", p, (long long)i);
      if ((b->prev && !b->prev->allocated) || (b->next && !b->next->allocated))
        BAD("free block %p has a free neighbour (they should have merged)", (void *)b->ptr);
    }
  }
  /* Walk every segment from its head: blocks must tile it in address order. */
  for (int p = -2; p < 2; p++) {
    int64_t count = p == -2 ? a->pending.n : p < 0 ? a->live.cap : a->free[p].n;
    for (int64_t i = 0; i < count; i++) {
      struct block *b = p == -2 ? a->pending.v[i] : p < 0 ? a->live.slots[i] : a->free[p].v[i];
      if (!b || b->prev) continue;
      for (struct block *c = b; c; c = c->next) {
        if (c->size <= 0 || c->size % KILN_ALLOC_ROUND) BAD("block %p has size %lld", (void *)c->ptr, (long long)c->size);
        if (c->next && (c->next->prev != c || c->next->ptr != c->ptr + c->size))
          BAD("segment at %p: block %p is not followed by its neighbour", (void *)b->ptr, (void *)c->ptr);
        if (c->stream != b->stream || c->pool != b->pool) BAD("segment at %p mixes streams or pools", (void *)b->ptr);
        reserved += c->size;
      }
    }
  }
  if (reserved != a->stats.reserved)
    BAD("segments add up to %lld bytes, statistics say %lld reserved", (long long)reserved, (long long)a->stats.reserved);
done:
  pthread_mutex_unlock(&a->lock);
  return rc;
}
