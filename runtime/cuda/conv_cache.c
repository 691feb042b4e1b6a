/* cuda/conv_cache.c: convolution shape keys, the algorithm table and the growing workspace (see
   conv_cache.h). An open-addressing hash table under one mutex: lookups happen once per conv
   call, far from the kernels' cost. */
#include "conv_cache.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

void kiln_conv_key_make(struct kiln_conv_key *k, int pass, int dtype, int device, int benchmark, const int64_t x[4],
                        const int64_t w[4], const int64_t y[4], const int64_t ints[7]) {
  memset(k, 0, sizeof *k);
  k->pass = pass; k->dtype = dtype; k->device = device; k->benchmark = benchmark ? 1 : 0;
  k->n = x[0]; k->c = x[1]; k->h = x[2]; k->w = x[3];
  k->o = w[0]; k->kh = w[2]; k->kw = w[3];
  k->oh = y[2]; k->ow = y[3];
  k->sh = ints[0]; k->sw = ints[1]; k->ph = ints[2]; k->pw = ints[3]; k->dh = ints[4]; k->dw = ints[5];
  k->groups = ints[6];
}

int kiln_conv_api_parse(const char *value) {
  if (!value || !*value || strcmp(value, "graph") == 0) return KILN_CONV_API_GRAPH;
  if (strcmp(value, "legacy") == 0) return KILN_CONV_API_LEGACY;
  return -1;
}

int kiln_conv_key_equal(const struct kiln_conv_key *a, const struct kiln_conv_key *b) {
  return memcmp(a, b, sizeof *a) == 0;
}

uint64_t kiln_conv_key_hash(const struct kiln_conv_key *k) {   /* FNV-1a over the key's bytes */
  const unsigned char *p = (const unsigned char *)k;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof *k; i++) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

struct slot {
  int used;
  struct kiln_conv_key key;
  struct kiln_conv_choice choice;
};

struct kiln_conv_cache {
  pthread_mutex_t lock;
  struct slot *slots;
  size_t cap, count;   /* cap a power of two, count <= cap / 2 */
};

struct kiln_conv_cache *kiln_conv_cache_new(void) {
  struct kiln_conv_cache *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->cap = 64;
  c->slots = calloc(c->cap, sizeof *c->slots);
  if (!c->slots) { free(c); return NULL; }
  pthread_mutex_init(&c->lock, NULL);
  return c;
}

void kiln_conv_cache_free(struct kiln_conv_cache *c) {
  if (!c) return;
  pthread_mutex_destroy(&c->lock);
  free(c->slots);
  free(c);
}

/* The slot holding k, or the empty one where it would go. */
static struct slot *find(struct slot *slots, size_t cap, const struct kiln_conv_key *k) {
  size_t i = (size_t)kiln_conv_key_hash(k) & (cap - 1);
  while (slots[i].used && !kiln_conv_key_equal(&slots[i].key, k)) i = (i + 1) & (cap - 1);
  return &slots[i];
}

int kiln_conv_cache_get(struct kiln_conv_cache *c, const struct kiln_conv_key *k, struct kiln_conv_choice *out) {
  pthread_mutex_lock(&c->lock);
  struct slot *s = find(c->slots, c->cap, k);
  int hit = s->used;
  if (hit) *out = s->choice;
  pthread_mutex_unlock(&c->lock);
  return hit;
}

int kiln_conv_cache_put(struct kiln_conv_cache *c, const struct kiln_conv_key *k, const struct kiln_conv_choice *choice) {
  int rc = 0;
  pthread_mutex_lock(&c->lock);
  if ((c->count + 1) * 2 > c->cap) {   /* rehash into twice the slots */
    size_t cap = c->cap * 2;
    struct slot *slots = calloc(cap, sizeof *slots);
    if (!slots) {
      rc = -1;
      goto done;
    }
    for (size_t i = 0; i < c->cap; i++)
      if (c->slots[i].used) *find(slots, cap, &c->slots[i].key) = c->slots[i];
    free(c->slots);
    c->slots = slots;
    c->cap = cap;
  }
  struct slot *s = find(c->slots, c->cap, k);
  if (!s->used) {
    s->used = 1;
    s->key = *k;
    s->choice = *choice;
    c->count++;
  }
done:
  pthread_mutex_unlock(&c->lock);
  return rc;
}

int64_t kiln_conv_cache_count(struct kiln_conv_cache *c) {
  pthread_mutex_lock(&c->lock);
  int64_t n = (int64_t)c->count;
  pthread_mutex_unlock(&c->lock);
  return n;
}

int kiln_conv_workspace_reserve(struct kiln_conv_workspace *ws, size_t need) {
  if (need <= ws->bytes) return 0;
  const size_t MIB = (size_t)1 << 20;
  /* rounded up to whole MiB, unless that would wrap around (the allocation then fails) */
  size_t bytes = need > SIZE_MAX - (MIB - 1) ? need : (need + MIB - 1) / MIB * MIB;
  void *p = NULL;
  int rc = ws->alloc(ws->ctx, bytes, &p);
  if (rc) return rc;
  if (ws->ptr) ws->free(ws->ctx, ws->ptr);
  ws->ptr = p;
  ws->bytes = bytes;
  return 0;
}

void kiln_conv_workspace_release(struct kiln_conv_workspace *ws) {
  if (ws->ptr) ws->free(ws->ctx, ws->ptr);
  ws->ptr = NULL;
  ws->bytes = 0;
}
