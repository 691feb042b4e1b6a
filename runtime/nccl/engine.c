/* nccl/engine.c: libkiln_nccl.so, the message engine for CUDA tensors over NCCL. libkiln opens it
   (dist/group.c) on a group's first collective of a CUDA tensor; the group's MPI engine carries
   the NCCL unique id from the group's rank 0 to the others. Every call runs on the engine's own
   stream of the device and waits for it, so that the calls block as the engine table says; the
   caller has waited for the device's work that made the buffers. */
#include "../src/dist/engine.h"
#include <cuda_runtime.h>
#include <kiln/dtype.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct comm {
  ncclComm_t nccl;
  cudaStream_t stream;
  int device;
};

static char name[64];

static int nccl_fail(ncclResult_t r, char *err, size_t n, const char *what) {
  snprintf(err, n, "%s: %s", what, ncclGetErrorString(r));
  return 1;
}

static int cuda_fail(cudaError_t r, char *err, size_t n, const char *what) {
  snprintf(err, n, "%s: %s", what, cudaGetErrorString(r));
  return 1;
}

static ncclDataType_t nccl_type(int dtype) {
  switch (dtype) {
  case KILN_F32: return ncclFloat32;
  case KILN_F64: return ncclFloat64;
  case KILN_F16: return ncclFloat16;
  case KILN_BF16: return ncclBfloat16;
  case KILN_I64: return ncclInt64;
  case KILN_I32: return ncclInt32;
  default: return ncclUint8;   /* u8, bool */
  }
}

/* bool: sum and max are "any", prod and min "all" (on 0/1 bytes) */
static ncclRedOp_t nccl_op(int dtype, int op) {
  if (dtype == KILN_BOOL) return op == KILN_REDUCE_SUM || op == KILN_REDUCE_MAX ? ncclMax : ncclMin;
  switch (op) {
  case KILN_REDUCE_MAX: return ncclMax;
  case KILN_REDUCE_MIN: return ncclMin;
  case KILN_REDUCE_PROD: return ncclProd;
  case KILN_REDUCE_MEAN: return ncclAvg;
  default: return ncclSum;
  }
}

/* Run the call queued on c's stream to its end. */
static int finish(struct comm *c, ncclResult_t r, char *err, size_t n, const char *what) {
  if (r != ncclSuccess) return nccl_fail(r, err, n, what);
  cudaError_t e = cudaStreamSynchronize(c->stream);
  return e != cudaSuccess ? cuda_fail(e, err, n, what) : 0;
}

static int unique_id(void *id, int nbytes, char *err, size_t n) {
  if (nbytes < (int)sizeof(ncclUniqueId)) { snprintf(err, n, "ncclGetUniqueId: %d bytes are too few", nbytes); return 1; }
  ncclUniqueId u;
  ncclResult_t r = ncclGetUniqueId(&u);
  if (r != ncclSuccess) return nccl_fail(r, err, n, "ncclGetUniqueId");
  memcpy(id, &u, sizeof u);
  return 0;
}

static int comm_from_id(const void *id, int nranks, int rank, int device, void **out, char *err, size_t n) {
  struct comm *c = calloc(1, sizeof *c);
  if (!c) { snprintf(err, n, "out of memory"); return 1; }
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) { free(c); return cuda_fail(e, err, n, "cuda device for NCCL"); }
  ncclUniqueId u;
  memcpy(&u, id, sizeof u);
  ncclResult_t r = ncclCommInitRank(&c->nccl, nranks, u, rank);
  if (r != ncclSuccess) { cudaStreamDestroy(c->stream); free(c); return nccl_fail(r, err, n, "ncclCommInitRank"); }
  c->device = device;
  *out = c;
  return 0;
}

static void comm_free(void *comm) {
  struct comm *c = comm;
  if (!c) return;
  ncclCommDestroy(c->nccl);
  cudaStreamDestroy(c->stream);
  free(c);
}

static int all_reduce(void *comm, const void *in, void *out, int64_t count, int dtype, int op, char *err, size_t n) {
  struct comm *c = comm;
  cudaSetDevice(c->device);
  return finish(c, ncclAllReduce(in, out, (size_t)count, nccl_type(dtype), nccl_op(dtype, op), c->nccl, c->stream), err, n,
                "ncclAllReduce");
}

static int broadcast(void *comm, void *buf, int64_t count, int dtype, int root, char *err, size_t n) {
  struct comm *c = comm;
  cudaSetDevice(c->device);
  return finish(c, ncclBroadcast(buf, buf, (size_t)count, nccl_type(dtype), root, c->nccl, c->stream), err, n, "ncclBroadcast");
}

static int all_gather(void *comm, const void *in, void *out, int64_t count, int dtype, char *err, size_t n) {
  struct comm *c = comm;
  cudaSetDevice(c->device);
  return finish(c, ncclAllGather(in, out, (size_t)count, nccl_type(dtype), c->nccl, c->stream), err, n, "ncclAllGather");
}

static int reduce_scatter(void *comm, const void *in, void *out, int64_t count, int dtype, int op, char *err, size_t n) {
  struct comm *c = comm;
  cudaSetDevice(c->device);
  return finish(c, ncclReduceScatter(in, out, (size_t)count, nccl_type(dtype), nccl_op(dtype, op), c->nccl, c->stream), err, n,
                "ncclReduceScatter");
}

static int send(void *comm, const void *buf, int64_t count, int dtype, int dst, int tag, char *err, size_t n) {
  (void)tag;   /* NCCL matches sends and receives by order between two ranks */
  struct comm *c = comm;
  cudaSetDevice(c->device);
  return finish(c, ncclSend(buf, (size_t)count, nccl_type(dtype), dst, c->nccl, c->stream), err, n, "ncclSend");
}

static int recv(void *comm, void *buf, int64_t count, int dtype, int src, int tag, char *err, size_t n) {
  (void)tag;
  struct comm *c = comm;
  cudaSetDevice(c->device);
  return finish(c, ncclRecv(buf, (size_t)count, nccl_type(dtype), src, c->nccl, c->stream), err, n, "ncclRecv");
}

static int raw_all_reduce(void *comm, void *buf, int64_t count, int dtype, char *err, size_t n) {
  return all_reduce(comm, buf, buf, count, dtype, KILN_REDUCE_SUM, err, n);
}

static struct kiln_engine engine = {
  .version = KILN_ENGINE_VERSION, .name = name, .device_buffers = 1, .native_mean = 1,
  .comm_free = comm_free, .all_reduce = all_reduce, .broadcast = broadcast, .all_gather = all_gather,
  .reduce_scatter = reduce_scatter, .send = send, .recv = recv, .raw_all_reduce = raw_all_reduce,
  .unique_id = unique_id, .comm_from_id = comm_from_id,
};

__attribute__((visibility("default"))) const struct kiln_engine *kiln_engine_open(int version) {
  if (version != KILN_ENGINE_VERSION) return NULL;
  int v = 0;
  ncclGetVersion(&v);
  snprintf(name, sizeof name, "NCCL %d.%d.%d", v / 10000, (v / 100) % 100, v % 100);
  return &engine;
}
