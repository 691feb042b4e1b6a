/* mpi/engine.c: libkiln_mpi.so, the message engine over Open MPI. libkiln opens it with dlopen
   when a program calls kiln_dist_init, so kiln without MPI still starts. It moves buffers only:
   the process group in libkiln (dist/group.c) owns tensors, deadlines and the arrival check. */
#include "../src/dist/engine.h"
#include <kiln/dtype.h>
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* MPI counts are ints: longer buffers go in pieces of at most this many elements. */
enum { PIECE = 1 << 30 };

static MPI_Op op_half[4], op_bhalf[4];   /* user reductions on f16 and bf16, per enum kiln_reduce_op */
static char library[MPI_MAX_LIBRARY_VERSION_STRING + 16];

static int fail(int rc, char *err, size_t n, const char *what) {
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  snprintf(err, n, "%s: %s", what, msg);
  return 1;
}

/* ---- f16 and bf16: reduced in f32, rounded to nearest even by the runtime's conversions ---- */
static float combine(int op, float a, float b) {
  switch (op) {
  case KILN_REDUCE_SUM: return a + b;
  case KILN_REDUCE_PROD: return a * b;
  case KILN_REDUCE_MAX: return (a != a || a > b) ? a : b;
  default: return (a != a || a < b) ? a : b;
  }
}
static inline void reduce16(int op, int bf, const uint16_t *a, uint16_t *b, int len) {
  for (int i = 0; i < len; i++)
    b[i] = bf ? kiln_f32_to_bf16(combine(op, kiln_bf16_to_f32(a[i]), kiln_bf16_to_f32(b[i])))
              : kiln_f32_to_f16(combine(op, kiln_f16_to_f32(a[i]), kiln_f16_to_f32(b[i])));
}
static void half_sum(void *a, void *b, int *len, MPI_Datatype *t) { (void)t; reduce16(KILN_REDUCE_SUM, 0, a, b, *len); }
static void half_max(void *a, void *b, int *len, MPI_Datatype *t) { (void)t; reduce16(KILN_REDUCE_MAX, 0, a, b, *len); }
static void half_min(void *a, void *b, int *len, MPI_Datatype *t) { (void)t; reduce16(KILN_REDUCE_MIN, 0, a, b, *len); }
static void half_prod(void *a, void *b, int *len, MPI_Datatype *t) { (void)t; reduce16(KILN_REDUCE_PROD, 0, a, b, *len); }
static void bhalf_sum(void *a, void *b, int *len, MPI_Datatype *t) { (void)t; reduce16(KILN_REDUCE_SUM, 1, a, b, *len); }
static void bhalf_max(void *a, void *b, int *len, MPI_Datatype *t) { (void)t; reduce16(KILN_REDUCE_MAX, 1, a, b, *len); }
static void bhalf_min(void *a, void *b, int *len, MPI_Datatype *t) { (void)t; reduce16(KILN_REDUCE_MIN, 1, a, b, *len); }
static void bhalf_prod(void *a, void *b, int *len, MPI_Datatype *t) { (void)t; reduce16(KILN_REDUCE_PROD, 1, a, b, *len); }

static MPI_Datatype mpi_type(int dtype) {
  switch (dtype) {
  case KILN_F32: return MPI_FLOAT;
  case KILN_F64: return MPI_DOUBLE;
  case KILN_F16: case KILN_BF16: return MPI_UINT16_T;
  case KILN_I64: return MPI_INT64_T;
  case KILN_I32: return MPI_INT32_T;
  default: return MPI_UINT8_T;   /* u8, bool */
  }
}

/* bool: sum and max are "any", prod and min are "all". */
static MPI_Op mpi_op(int dtype, int op) {
  if (dtype == KILN_F16) return op_half[op];
  if (dtype == KILN_BF16) return op_bhalf[op];
  if (dtype == KILN_BOOL) return op == KILN_REDUCE_SUM || op == KILN_REDUCE_MAX ? MPI_LOR : MPI_LAND;
  static const MPI_Op ops[] = {MPI_SUM, MPI_MAX, MPI_MIN, MPI_PROD};
  return ops[op];
}

static int init(int *rank, int *size, char *err, size_t n) {
  int provided = 0, rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS) return fail(rc, err, n, "MPI_Init_thread");
  /* Errors come back as codes, never as an abort of the process. */
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  MPI_Comm_size(MPI_COMM_WORLD, size);
  MPI_User_function *half[4] = {half_sum, half_max, half_min, half_prod};
  MPI_User_function *bhalf[4] = {bhalf_sum, bhalf_max, bhalf_min, bhalf_prod};
  for (int i = 0; i < 4; i++) {
    MPI_Op_create(half[i], 1, &op_half[i]);
    MPI_Op_create(bhalf[i], 1, &op_bhalf[i]);
  }
  int len = 0;
  MPI_Get_library_version(library, &len);
  char *nl = strchr(library, '\n');
  if (nl) *nl = 0;
  char *comma = strchr(library, ',');   /* "Open MPI v4.1.4, package: ..." */
  if (comma) *comma = 0;
  return 0;
}

static void finalize(void) {
  int done = 0;
  MPI_Finalized(&done);
  if (!done) MPI_Finalize();
}

static void abort_job(int code) { MPI_Abort(MPI_COMM_WORLD, code); }
static void *world(void) { return (void *)MPI_COMM_WORLD; }

static int comm_create(void *parent, const int *ranks, int n, void **out, char *err, size_t nerr) {
  MPI_Group pg, g;
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_group((MPI_Comm)parent, &pg);
  int rc = MPI_Group_incl(pg, n, ranks, &g);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_create((MPI_Comm)parent, g, &c);
  MPI_Group_free(&pg);
  if (rc != MPI_SUCCESS) return fail(rc, err, nerr, "MPI_Comm_create");
  MPI_Group_free(&g);
  if (c != MPI_COMM_NULL) MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  *out = c == MPI_COMM_NULL ? NULL : (void *)c;
  return 0;
}

static int comm_dup(void *comm, void **out, char *err, size_t n) {
  MPI_Comm c;
  int rc = MPI_Comm_dup((MPI_Comm)comm, &c);
  if (rc != MPI_SUCCESS) return fail(rc, err, n, "MPI_Comm_dup");
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  *out = (void *)c;
  return 0;
}

static void comm_free(void *comm) {
  MPI_Comm c = (MPI_Comm)comm;
  if (c != MPI_COMM_WORLD && c != MPI_COMM_NULL) MPI_Comm_free(&c);
}

static int all_reduce(void *comm, const void *in, void *out, int64_t count, int dtype, int op, char *err, size_t n) {
  size_t es = (size_t)kiln_dtype_size(dtype);
  for (int64_t at = 0; at < count || (count == 0 && at == 0); at += PIECE) {
    int c = (int)(count - at < PIECE ? count - at : PIECE);
    const void *src = in == out ? MPI_IN_PLACE : (const char *)in + (size_t)at * es;
    int rc = MPI_Allreduce(src, (char *)out + (size_t)at * es, c, mpi_type(dtype), mpi_op(dtype, op), (MPI_Comm)comm);
    if (rc != MPI_SUCCESS) return fail(rc, err, n, "MPI_Allreduce");
    if (count == 0) break;
  }
  return 0;
}

static int broadcast(void *comm, void *buf, int64_t count, int dtype, int root, char *err, size_t n) {
  size_t es = (size_t)kiln_dtype_size(dtype);
  for (int64_t at = 0; at < count; at += PIECE) {
    int c = (int)(count - at < PIECE ? count - at : PIECE);
    int rc = MPI_Bcast((char *)buf + (size_t)at * es, c, mpi_type(dtype), root, (MPI_Comm)comm);
    if (rc != MPI_SUCCESS) return fail(rc, err, n, "MPI_Bcast");
  }
  return 0;
}

static int too_long(int64_t count, char *err, size_t n) {
  if (count <= INT_MAX) return 0;
  snprintf(err, n, "%lld elements per rank is more than MPI's int count takes", (long long)count);
  return 1;
}

static int all_gather(void *comm, const void *in, void *out, int64_t count, int dtype, char *err, size_t n) {
  if (too_long(count, err, n)) return 1;
  int rc = MPI_Allgather(in, (int)count, mpi_type(dtype), out, (int)count, mpi_type(dtype), (MPI_Comm)comm);
  return rc != MPI_SUCCESS ? fail(rc, err, n, "MPI_Allgather") : 0;
}

static int reduce_scatter(void *comm, const void *in, void *out, int64_t count, int dtype, int op, char *err, size_t n) {
  if (too_long(count, err, n)) return 1;
  int rc = MPI_Reduce_scatter_block(in, out, (int)count, mpi_type(dtype), mpi_op(dtype, op), (MPI_Comm)comm);
  return rc != MPI_SUCCESS ? fail(rc, err, n, "MPI_Reduce_scatter_block") : 0;
}

static int barrier(void *comm, char *err, size_t n) {
  int rc = MPI_Barrier((MPI_Comm)comm);
  return rc != MPI_SUCCESS ? fail(rc, err, n, "MPI_Barrier") : 0;
}

static int send(void *comm, const void *buf, int64_t count, int dtype, int dst, int tag, char *err, size_t n) {
  size_t es = (size_t)kiln_dtype_size(dtype);
  for (int64_t at = 0; at < count || (count == 0 && at == 0); at += PIECE) {
    int c = (int)(count - at < PIECE ? count - at : PIECE);
    int rc = MPI_Send((const char *)buf + (size_t)at * es, c, mpi_type(dtype), dst, tag, (MPI_Comm)comm);
    if (rc != MPI_SUCCESS) return fail(rc, err, n, "MPI_Send");
    if (count == 0) break;
  }
  return 0;
}

static int recv(void *comm, void *buf, int64_t count, int dtype, int src, int tag, char *err, size_t n) {
  size_t es = (size_t)kiln_dtype_size(dtype);
  for (int64_t at = 0; at < count || (count == 0 && at == 0); at += PIECE) {
    int c = (int)(count - at < PIECE ? count - at : PIECE);
    MPI_Status st;
    int rc = MPI_Recv((char *)buf + (size_t)at * es, c, mpi_type(dtype), src, tag, (MPI_Comm)comm, &st);
    if (rc != MPI_SUCCESS) return fail(rc, err, n, "MPI_Recv");
    int got = 0;
    MPI_Get_count(&st, mpi_type(dtype), &got);
    if (got != c) {
      snprintf(err, n, "rank %d sent %d elements where %d were expected", src, got, c);
      return 1;
    }
    if (count == 0) break;
  }
  return 0;
}

static int isend_bytes(void *comm, const void *buf, int nbytes, int dst, int tag, void **req, char *err, size_t n) {
  MPI_Request *r = malloc(sizeof *r);
  if (!r) { snprintf(err, n, "out of memory"); return 1; }
  int rc = MPI_Isend(buf, nbytes, MPI_BYTE, dst, tag, (MPI_Comm)comm, r);
  if (rc != MPI_SUCCESS) { free(r); return fail(rc, err, n, "MPI_Isend"); }
  *req = r;
  return 0;
}

static int irecv_bytes(void *comm, void *buf, int nbytes, int src, int tag, void **req, char *err, size_t n) {
  MPI_Request *r = malloc(sizeof *r);
  if (!r) { snprintf(err, n, "out of memory"); return 1; }
  int rc = MPI_Irecv(buf, nbytes, MPI_BYTE, src, tag, (MPI_Comm)comm, r);
  if (rc != MPI_SUCCESS) { free(r); return fail(rc, err, n, "MPI_Irecv"); }
  *req = r;
  return 0;
}

static int test(void *req, int *done, char *err, size_t n) {
  MPI_Request *r = req;
  int rc = MPI_Test(r, done, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) return fail(rc, err, n, "MPI_Test");
  if (*done) free(r);
  return 0;
}

static void cancel(void *req) {
  MPI_Request *r = req;
  MPI_Cancel(r);
  MPI_Request_free(r);
  free(r);
}

static int raw_all_reduce(void *comm, void *buf, int64_t count, int dtype, char *err, size_t n) {
  if (too_long(count, err, n)) return 1;
  int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, mpi_type(dtype), mpi_op(dtype, KILN_REDUCE_SUM), (MPI_Comm)comm);
  return rc != MPI_SUCCESS ? fail(rc, err, n, "MPI_Allreduce") : 0;
}

static struct kiln_engine engine = {
  .version = KILN_ENGINE_VERSION, .name = library, .init = init, .finalize = finalize, .abort = abort_job,
  .world = world, .comm_create = comm_create, .comm_dup = comm_dup, .comm_free = comm_free,
  .all_reduce = all_reduce, .broadcast = broadcast, .all_gather = all_gather, .reduce_scatter = reduce_scatter,
  .barrier = barrier, .send = send, .recv = recv, .isend_bytes = isend_bytes, .irecv_bytes = irecv_bytes,
  .test = test, .cancel = cancel, .raw_all_reduce = raw_all_reduce,
};

__attribute__((visibility("default"))) const struct kiln_engine *kiln_engine_open(int version) {
  return version == KILN_ENGINE_VERSION ? &engine : NULL;
}
