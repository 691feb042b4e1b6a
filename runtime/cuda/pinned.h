/* cuda/pinned.h: the cache of page-locked host blocks, as plain host C over an abstract backing
   (cudaHostAlloc, cudaFreeHost and CUDA events in libkiln_cuda; fakes in the CI tests).
   A block handed out backs one CPU storage. Every asynchronous copy from a block records an event
   on the stream that reads it; a freed block goes back to the cache with its events, and is handed
   out again (or given back to the driver) only once all of them have completed, so host memory is
   never rewritten while a copy still reads it. Sizes round up to 4 KiB; a request reuses the
   smallest free block of at least its size and at most twice it. */
#ifndef KILN_CUDA_PINNED_H
#define KILN_CUDA_PINNED_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_PINNED_ROUND ((int64_t)4096)   /* every block is a multiple of this */

struct kiln_pinned_backing {
  void *ctx;
  /* 0 and *out on success; non-zero with a message in err on failure. */
  int (*raw_alloc)(void *ctx, int64_t nbytes, void **out, char *err, size_t errlen);
  void (*raw_free)(void *ctx, void *ptr, int64_t nbytes);
  /* An event recorded now on stream (after the work queued there): 0, or non-zero with err. */
  int (*event_record)(void *ctx, uintptr_t stream, void **event, char *err, size_t errlen);
  /* 1 when the event has completed, 0 while it is pending, -1 on error (counted as completed:
     nothing can be waited for any more). */
  int (*event_query)(void *ctx, void *event);
  void (*event_wait)(void *ctx, void *event);      /* the host waits until it has completed */
  void (*event_release)(void *ctx, void *event);
};

struct kiln_pinned_stats {
  int64_t allocated;        /* bytes in blocks that storages hold now */
  int64_t reserved;         /* bytes page-locked (held and cached) */
  int64_t requests;         /* allocations asked of the cache */
  int64_t cache_hits;       /* served from a cached block */
  int64_t raw_allocs, raw_frees;
  int64_t events_recorded;  /* copies tracked */
  int64_t events_pending;   /* of those, not yet seen completed */
  int64_t waits;            /* times the host waited on an event (empty, destroy, out of memory) */
  int64_t skipped_busy;     /* free blocks that fitted but were still read by a copy */
};

struct kiln_pinned_cache;

int64_t kiln_pinned_round(int64_t nbytes);
/* NULL when the host is out of memory. */
struct kiln_pinned_cache *kiln_pinned_new(struct kiln_pinned_backing backing);
/* Waits for every event and gives every block back, held ones included. */
void kiln_pinned_destroy(struct kiln_pinned_cache *c);

/* A block of at least nbytes (0 is fine). When the driver refuses, the cached blocks are given
   back (after their copies finish) and the request tried once more; then KILN_ERR_MEMORY with a
   message in err naming the request and the pinned memory held and cached. Thread-safe. */
int kiln_pinned_alloc(struct kiln_pinned_cache *c, int64_t nbytes, void **out, char *err, size_t errlen);
/* Back to the cache, pending copies and all; -1 for a pointer the cache did not hand out. */
int kiln_pinned_free(struct kiln_pinned_cache *c, void *ptr);
/* Track a copy queued on stream that reads from ptr (anywhere inside a held block): 0; -1 when
   ptr lies in no held block (the caller must wait for the copy itself); a positive status with
   err when no event could be recorded (likewise). */
int kiln_pinned_record(struct kiln_pinned_cache *c, const void *ptr, uintptr_t stream, char *err, size_t errlen);
/* 1 when ptr lies inside a held block. */
int kiln_pinned_contains(struct kiln_pinned_cache *c, const void *ptr);
/* Give every free block back (waiting for the copies still reading it); returns the bytes. */
int64_t kiln_pinned_empty(struct kiln_pinned_cache *c);
void kiln_pinned_stats(struct kiln_pinned_cache *c, struct kiln_pinned_stats *out);
/* Every invariant (statistics match the blocks, sizes rounded, pending counts); 0, or -1 with err. */
int kiln_pinned_check(struct kiln_pinned_cache *c, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
