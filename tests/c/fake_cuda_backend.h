/* fake_cuda_backend.h: the call counters of the fake CUDA device (fake_cuda_backend.c built with
   FAKE_CUDA_DEVICE), read by a test through dlsym(handle, "fake_cuda_counters"). */
#ifndef KILN_FAKE_CUDA_BACKEND_H
#define KILN_FAKE_CUDA_BACKEND_H
#include <stdint.h>

struct fake_cuda_counters {
  int64_t device_allocs, device_frees;
  int64_t copies_to_host, copies_from_host;            /* the waiting copies */
  int64_t async_copies_from_host, async_copies_untracked;
  int64_t host_allocs, host_frees, bad_host_frees;     /* pinned host memory, through the backend table */
  int64_t raw_host_allocs;                             /* the pinned cache asking for new blocks */
  int64_t events_recorded;
  int64_t synchronizes, empty_caches;
  int64_t device_ooms;                                 /* allocations refused ($FAKE_CUDA_CAPACITY) */
  int64_t streams_made, streams_freed, stream_switches, stream_waits, records_on_streams;
  int64_t events_made, events_freed, events_on_streams;
  int64_t gemm_calls, gemm_precision;                  /* GEMMs refused; the f32 matmul precision the last one read */
};
typedef struct fake_cuda_counters *(*fake_cuda_counters_fn)(void);

#endif
