/* memory.c: live bytes per device type, read by the bindings to pace garbage collection. */
#include "internal.h"

static struct kiln_memory_stats stats[KILN_DEVICE_TYPE_COUNT] = {
  [KILN_CPU] = {.threshold = 64ll << 20},
  [KILN_CUDA] = {.threshold = 1ll << 30},
};

KILN_API struct kiln_memory_stats *kiln_memory_stats(int device_type) {
  if (device_type < 0 || device_type >= KILN_DEVICE_TYPE_COUNT) return NULL;
  return &stats[device_type];
}

KILN_API void kiln_memory_collected(void) {
  for (int d = 0; d < KILN_DEVICE_TYPE_COUNT; d++) __atomic_store_n(&stats[d].since_collect, 0, __ATOMIC_RELAXED);
}

KILN_API void kiln_memory_set_threshold(int device_type, int64_t bytes) {
  if (device_type >= 0 && device_type < KILN_DEVICE_TYPE_COUNT && bytes > 0) stats[device_type].threshold = bytes;
}

void kiln_memory_count_alloc(int device_type, int64_t nbytes) {
  struct kiln_memory_stats *s = &stats[device_type];
  int64_t live = __atomic_add_fetch(&s->live_bytes, nbytes, __ATOMIC_RELAXED);
  __atomic_add_fetch(&s->since_collect, nbytes, __ATOMIC_RELAXED);
  __atomic_add_fetch(&s->allocs, 1, __ATOMIC_RELAXED);
  int64_t peak = __atomic_load_n(&s->peak_bytes, __ATOMIC_RELAXED);
  while (live > peak && !__atomic_compare_exchange_n(&s->peak_bytes, &peak, live, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
}

/* A free takes its bytes off since_collect as well (not below 0): what the runtime frees by itself
   (an op's temporaries, the autograd graph's saved tensors after backward) needs no collection;
   only what stays alive (tensors Lua no longer reaches but has not finalized) brings the next one.
   A training step that allocated 30 MB and freed most of it collected once a step before. */
void kiln_memory_count_free(int device_type, int64_t nbytes) {
  struct kiln_memory_stats *s = &stats[device_type];
  __atomic_sub_fetch(&s->live_bytes, nbytes, __ATOMIC_RELAXED);
  __atomic_add_fetch(&s->frees, 1, __ATOMIC_RELAXED);
  int64_t since = __atomic_load_n(&s->since_collect, __ATOMIC_RELAXED), next;
  do next = since > nbytes ? since - nbytes : 0;
  while (!__atomic_compare_exchange_n(&s->since_collect, &since, next, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}
