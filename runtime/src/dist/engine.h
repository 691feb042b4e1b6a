/* dist/engine.h: the table a message engine (libkiln_mpi.so) gives libkiln. The engine knows
   buffers, counts and dtypes, never tensors; every call blocks, and only the process group's
   communication thread makes them, one at a time. A call that fails returns non-zero and writes
   its reason into err. */
#ifndef KILN_DIST_ENGINE_H
#define KILN_DIST_ENGINE_H
#include <stddef.h>
#include <stdint.h>

#include <kiln/dist.h>

#define KILN_ENGINE_VERSION 1

struct kiln_engine {
  int version;
  const char *name;                                   /* "Open MPI v4.1.4", "NCCL 2.28.3" */
  int device_buffers;                                 /* 1: buffers are CUDA device memory (NCCL) */
  int native_mean;                                    /* 1: all_reduce and reduce_scatter take KILN_REDUCE_MEAN */
  int (*init)(int *rank, int *size, char *err, size_t n);
  void (*finalize)(void);
  void (*abort)(int code);
  void *(*world)(void);
  /* A communicator of parent's ranks listed in ranks (ascending), collective over parent: every
     rank of parent calls it; those not listed get NULL. */
  int (*comm_create)(void *parent, const int *ranks, int n, void **out, char *err, size_t nerr);
  int (*comm_dup)(void *comm, void **out, char *err, size_t n);
  void (*comm_free)(void *comm);
  /* in == out is in place. count is per rank for all_gather (out holds size * count) and for
     reduce_scatter (in holds size * count). */
  int (*all_reduce)(void *comm, const void *in, void *out, int64_t count, int dtype, int op, char *err, size_t n);
  int (*broadcast)(void *comm, void *buf, int64_t count, int dtype, int root, char *err, size_t n);
  int (*all_gather)(void *comm, const void *in, void *out, int64_t count, int dtype, char *err, size_t n);
  int (*reduce_scatter)(void *comm, const void *in, void *out, int64_t count, int dtype, int op, char *err, size_t n);
  int (*barrier)(void *comm, char *err, size_t n);
  int (*send)(void *comm, const void *buf, int64_t count, int dtype, int dst, int tag, char *err, size_t n);
  int (*recv)(void *comm, void *buf, int64_t count, int dtype, int src, int tag, char *err, size_t n);
  /* Small byte messages that do not wait, for the arrival check: *req is done when test says so
     (test frees it then); cancel gives up on one. */
  int (*isend_bytes)(void *comm, const void *buf, int nbytes, int dst, int tag, void **req, char *err, size_t n);
  int (*irecv_bytes)(void *comm, void *buf, int nbytes, int src, int tag, void **req, char *err, size_t n);
  int (*test)(void *req, int *done, char *err, size_t n);
  void (*cancel)(void *req);
  /* The library's own all-reduce, timed by bench/dist.lua as the peer (no arrival check). */
  int (*raw_all_reduce)(void *comm, void *buf, int64_t count, int dtype, char *err, size_t n);
  /* NCCL only (NULL for MPI): a new unique id (nbytes at id), made by a group's rank 0 and carried
     to the others by the MPI engine; and the communicator of rank of nranks on a CUDA device. */
  int (*unique_id)(void *id, int nbytes, char *err, size_t n);
  int (*comm_from_id)(const void *id, int nranks, int rank, int device, void **out, char *err, size_t n);
};

typedef const struct kiln_engine *(*kiln_engine_open_fn)(int version);

#endif
