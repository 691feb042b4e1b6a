/* cuda/allocator.h: the caching device allocator's bookkeeping, as plain host C over an abstract
   "raw allocate / raw free" (cudaMalloc and cudaFree in libkiln_cuda, a fake in the CI test).
   The scheme is PyTorch's: sizes round to 512 bytes; requests up to 1 MiB are carved out of 2 MiB
   segments, those up to 10 MiB out of 20 MiB segments, larger ones get a segment of their size
   rounded to 2 MiB; a free block is reused best-fit on the same stream and split when the rest is
   worth keeping; freed neighbours merge again; the driver is called only when nothing cached fits. */
#ifndef KILN_CUDA_ALLOCATOR_H
#define KILN_CUDA_ALLOCATOR_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include <kiln/kiln.h>

#define KILN_ALLOC_ROUND ((int64_t)512)                  /* every block is a multiple of this */
#define KILN_ALLOC_SMALL ((int64_t)1 << 20)              /* requests up to here use the small pool */
#define KILN_ALLOC_SMALL_SEGMENT ((int64_t)2 << 20)      /* ...carved out of 2 MiB segments */
#define KILN_ALLOC_MID ((int64_t)10 << 20)               /* requests below this share */
#define KILN_ALLOC_MID_SEGMENT ((int64_t)20 << 20)       /* ...20 MiB segments */
#define KILN_ALLOC_LARGE_ROUND ((int64_t)2 << 20)        /* larger segments round to 2 MiB */

struct kiln_alloc_backing {
  void *ctx;
  /* 0 and *out on success; non-zero with a message in err (e.g. the CUDA error) on failure. */
  int (*raw_alloc)(void *ctx, int64_t nbytes, void **out, char *err, size_t errlen);
  void (*raw_free)(void *ctx, void *ptr, int64_t nbytes);
  /* Blocks used on streams other than their own (kiln_caching_record_stream): an event recorded
     on stream now (NULL when the work queued there has already finished, e.g. after the backing
     fell back to waiting for it); whether an event has completed (then it is gone); and waiting
     for one (then it is gone). NULL when the backing has no streams. */
  void *(*event_record)(void *ctx, uintptr_t stream);
  int (*event_done)(void *ctx, void *event);
  void (*event_wait)(void *ctx, void *event);
};

struct kiln_caching_allocator;

/* The block size of a request: at least 512 bytes, a multiple of 512; -1 when it would overflow. */
int64_t kiln_caching_round(int64_t nbytes);
/* The segment the driver is asked for when no cached block fits a block of this size. */
int64_t kiln_caching_segment_size(int64_t block_size);

/* device: only for messages ("cuda:0"). NULL when the host is out of memory. */
struct kiln_caching_allocator *kiln_caching_new(int device, struct kiln_alloc_backing backing);
/* Gives every segment back, blocks still held included. */
void kiln_caching_destroy(struct kiln_caching_allocator *a);

/* A block of at least nbytes (0 is fine) for use on stream. On failure (the driver refused even
   after the cache was given back, once) returns KILN_ERR_MEMORY with a message in err naming the
   request and the memory in use and reserved. Thread-safe. */
int kiln_caching_alloc(struct kiln_caching_allocator *a, uintptr_t stream, int64_t nbytes, void **out, char *err,
                       size_t errlen);
/* Back to the cache (no driver call); -1 for a pointer this allocator did not hand out. A block
   that was used on other streams (kiln_caching_record_stream) waits, off every list, until the
   events recorded on those streams at the free have completed; each alloc, empty and stats call
   first takes back the blocks whose events are done, and out of memory waits for all of them
   before giving the cache back. */
int kiln_caching_free(struct kiln_caching_allocator *a, void *ptr);
/* Note that the block at ptr is used by work queued on stream (not its own): its memory is not
   reused by its own stream until that work is done. 0; -1 for an unknown pointer; -2 when the
   backing has no events or the host is out of memory. */
int kiln_caching_record_stream(struct kiln_caching_allocator *a, void *ptr, uintptr_t stream);
/* The stream is about to be destroyed, its queued work finished: live blocks no longer note it as
   a user (a later free would record an event on a dead stream). Thread-safe. */
void kiln_caching_forget_stream(struct kiln_caching_allocator *a, uintptr_t stream);
/* Blocks freed and waiting for other streams' work (for tests and statistics). */
int64_t kiln_caching_pending(struct kiln_caching_allocator *a);
/* The block size behind ptr, -1 when unknown. */
int64_t kiln_caching_block_size(struct kiln_caching_allocator *a, void *ptr);
/* Give every wholly free segment back to the driver; returns the bytes released. */
int64_t kiln_caching_empty(struct kiln_caching_allocator *a);
void kiln_caching_stats(struct kiln_caching_allocator *a, struct kiln_cuda_memory *out);
/* Checks every invariant (segments tile their memory, no two free neighbours, free sets sorted,
   statistics match the blocks); 0, or -1 with a description in err. For tests. */
int kiln_caching_check(struct kiln_caching_allocator *a, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
