/* kiln/memory.h: bytes held by tensor storages, counted per device type.
   The bindings read these fields directly and run a GC step when since_collect passes threshold. */
#ifndef KILN_MEMORY_H
#define KILN_MEMORY_H
#include <stdint.h>

struct kiln_memory_stats {
  int64_t live_bytes;     /* bytes in live storages */
  int64_t peak_bytes;     /* highest live_bytes so far */
  int64_t since_collect;  /* bytes allocated less bytes freed (not below 0) since kiln_memory_collected() */
  int64_t threshold;      /* when since_collect passes this, the bindings collect garbage */
  int64_t allocs;         /* storages allocated */
  int64_t frees;          /* storages freed */
};

/* The live statistics of a device type (KILN_CPU, KILN_CUDA); NULL for a bad value. */
struct kiln_memory_stats *kiln_memory_stats(int device_type);
/* Called after a garbage collection: resets since_collect on every device type. */
void kiln_memory_collected(void);
void kiln_memory_set_threshold(int device_type, int64_t bytes);
/* Freed CPU blocks of 32 MiB and more are kept for reuse (up to 1 GiB or a sixteenth of the
   memory): the bytes kept now, and giving them all back to the system. */
int64_t kiln_cpu_cached_bytes(void);
void kiln_cpu_empty_cache(void);

#endif
