/* cuda/geometry.h: the index arithmetic of the CUDA kernels, as plain C that CI tests on the CPU:
   strided N-d iteration (operands broadcast to the output's shape and coalesced as the CPU engine
   does), 1-d launch geometry, and how cuBLAS (column-major) reads kiln's row-major GEMM operands. */
#ifndef KILN_CUDA_GEOMETRY_H
#define KILN_CUDA_GEOMETRY_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
#include <kiln/kiln.h>
#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#define KILN_HD __host__ __device__ __forceinline__
#else
#define KILN_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum { KILN_CUDA_MAX_OPERANDS = 4 };   /* the output and up to three inputs */

/* Passed by value to the kernels (328 bytes of kernel parameters). Operand 0 is the output. */
struct kiln_cuda_iter {
  int32_t ndim;                                          /* >= 1 */
  int32_t nops;
  int64_t numel;
  int64_t sizes[KILN_MAX_DIMS];                          /* the last dim varies fastest */
  int64_t strides[KILN_CUDA_MAX_OPERANDS][KILN_MAX_DIMS];/* in elements; 0 where an operand broadcasts */
};

/* out and nin inputs (each broadcastable to out's shape): drop size-1 dims and merge dims that
   are contiguous with each other in every operand, exactly as cpu/elementwise.c plans its loops. */
void kiln_cuda_iter_build(struct kiln_cuda_iter *it, const struct kiln_tensor *out, int nin,
                          const struct kiln_tensor *const *in);
/* 1 when the iteration is one dim in which every operand has stride 1: flat loops over pointers. */
int kiln_cuda_iter_is_flat(const struct kiln_cuda_iter *it);
/* 1 when 32-bit unsigned arithmetic can index every element (faster division on the device). */
int kiln_cuda_iter_fits32(const struct kiln_cuda_iter *it);

/* The element offsets (from each operand's first element) of linear index i, counted row-major
   over the coalesced sizes. The kernels call these very functions. */
#define KILN_CUDA_ITER_OFFSETS(name, index_t)                                             \
  KILN_HD void name(const struct kiln_cuda_iter *it, index_t i, int64_t *off) {           \
    for (int k = 0; k < KILN_CUDA_MAX_OPERANDS; k++) off[k] = 0;                          \
    for (int d = it->ndim - 1; d >= 0; d--) {                                             \
      index_t size = (index_t)it->sizes[d];                                               \
      index_t q = i / size, r = i - q * size;                                             \
      for (int k = 0; k < KILN_CUDA_MAX_OPERANDS; k++) off[k] += (int64_t)r * it->strides[k][d]; \
      i = q;                                                                              \
    }                                                                                     \
  }
KILN_CUDA_ITER_OFFSETS(kiln_cuda_iter_offsets, int64_t)
KILN_CUDA_ITER_OFFSETS(kiln_cuda_iter_offsets32, uint32_t)

/* A 1-d grid whose threads stride over n items: blocks = ceil(n / threads), at most max_blocks
   (then each thread takes several items), 0 when n is 0. */
struct kiln_cuda_launch {
  int64_t blocks;
  int threads;
};
struct kiln_cuda_launch kiln_cuda_launch_1d(int64_t n, int threads, int64_t max_blocks);
/* The elements per vector load and store of a flat elementwise kernel: the largest width w in
   1, 2, 4, ... with w * size[i] <= 16 bytes for every operand and every address a multiple of
   w * size[i], so that each thread moves whole aligned 16-byte (or narrower) words; 1 when n < 2w
   would leave no whole vectors worth the second kernel. count operands, addr[i] their first
   element, size[i] their element size. */
int kiln_cuda_vector_width(int64_t n, int count, const uintptr_t *addr, const int *size);
/* The blocks that keep every SM full for a few waves. */
int64_t kiln_cuda_max_blocks(int sm_count, int threads);

/* A cuBLAS call for row-major out[B,n,m] = alpha * a[B,n,k] @ b[B,k,m] + beta * out. cuBLAS is
   column-major, and a row-major matrix read column-major is its transpose, so the call computes
   out^T = b^T @ a^T: cuBLAS's A is kiln's b and its B is kiln's a. */
struct kiln_cuda_gemm_plan {
  int trans_a, trans_b;               /* cuBLAS ops: 0 = N, 1 = T */
  int64_t m, n, k;                    /* cuBLAS m = kiln's m (columns of out), n = kiln's n (rows) */
  int64_t lda, ldb, ldc;
  int64_t stride_a, stride_b, stride_c;   /* batch strides in elements (0 broadcasts) */
  int64_t batch;
  /* Operands cuBLAS cannot read in place: copy them to a contiguous buffer first (then plan
     again). copy_out: compute into a contiguous buffer, then copy into out. */
  int copy_a, copy_b, copy_out;
};
/* How cuBLAS reads row-major matrix X[rows, cols] with element strides (s0, s1): 0 (op N, on the
   stored X^T) when rows are contiguous, 1 (op T) when columns are, -1 when neither; *ld is the
   leading dimension. */
int kiln_cuda_gemm_layout(int64_t rows, int64_t cols, int64_t s0, int64_t s1, int64_t *ld);
/* Fills plan for 3-d out, a, b; non-zero when a size does not fit cuBLAS's 32-bit arguments. */
int kiln_cuda_gemm_plan(const struct kiln_tensor *out, const struct kiln_tensor *a, const struct kiln_tensor *b,
                        struct kiln_cuda_gemm_plan *plan);

/* A reduction (reduce.cu): the input permuted to [kept dims..., reduced dims...] (each group in
   its original order) and copied into rows [M, R]; each row cut into nchunks chunks of `chunk`
   elements (the last may be shorter), one block of `threads` (a power of two, 32 to 256) per
   chunk; a second kernel folds each row's chunks in order. R = 0: no chunks. */
struct kiln_cuda_reduce_plan {
  int perm[KILN_MAX_DIMS];
  int64_t M, R, chunk, nchunks;
  int threads;
};
/* mask: the reduced dims (bit d for dim d); max_blocks: what keeps the device busy. */
void kiln_cuda_reduce_plan(int ndim, const int64_t *sizes, int64_t mask, int64_t max_blocks,
                           struct kiln_cuda_reduce_plan *p);

/* M rows of R elements each cut into *nchunks chunks of *chunk elements (the last may be shorter)
   for blocks of *threads threads (a power of two, 32 to 256): at least 16 elements a thread, and
   more chunks than one a row only while M rows leave fewer than max_blocks blocks. R = 0 or M = 0:
   no chunks. The reductions' and batch norm's rule. */
void kiln_cuda_chunk_rows(int64_t M, int64_t R, int64_t max_blocks, int64_t *chunk, int64_t *nchunks, int *threads);

/* Layer norm's weight and bias grads (norm.cu): the L columns in tiles of 32, the rows in
   *nchunks chunks of *chunk rows (at least 128 a chunk; more chunks only while the tiles leave
   fewer than max_blocks blocks); no rows: one empty chunk. */
void kiln_cuda_ln_grads_plan(int64_t rows, int64_t L, int64_t max_blocks, int64_t *tiles, int64_t *chunk, int64_t *nchunks);

/* A tensor seen as [outer, D, inner] around dim (softmax, log_softmax, nll_loss over dim 1). */
void kiln_cuda_lines(int ndim, const int64_t *sizes, int dim, int64_t *outer, int64_t *D, int64_t *inner);

/* The smallest power of two >= n, clamped to [lo, hi] (block sizes for tree reductions). */
int kiln_cuda_pow2_threads(int64_t n, int lo, int hi);

/* index_select, gather and scatter_add (index.cu): a walk over a shape (index_select: the output;
   gather, scatter_add: the index) with three operands: 0 the written tensor, 1 the index, 2 the
   read tensor. The indexed operand (index_select, gather: 2; scatter_add: 0) has stride 0 along
   dim; its element is at offset + index * jump. */
struct kiln_cuda_index_geom {
  int32_t ndim, indexed;
  int64_t numel, jump;
  int64_t sizes[KILN_MAX_DIMS];
  int64_t strides[3][KILN_MAX_DIMS];
};
/* op: KILN_OP_INDEX_SELECT (out, a, index), KILN_OP_GATHER (out, a, index) or
   KILN_OP_SCATTER_ADD (target a, index, src); dim as the call carries it. */
void kiln_cuda_index_geom_build(struct kiln_cuda_index_geom *g, int op, const struct kiln_tensor *written,
                                const struct kiln_tensor *index, const struct kiln_tensor *read, int dim);
KILN_HD void kiln_cuda_index_offsets(const struct kiln_cuda_index_geom *g, int64_t i, int64_t *off) {
  off[0] = off[1] = off[2] = 0;
  for (int d = g->ndim - 1; d >= 0; d--) {
    int64_t q = i / g->sizes[d], r = i - q * g->sizes[d];
    off[0] += r * g->strides[0][d];
    off[1] += r * g->strides[1][d];
    off[2] += r * g->strides[2][d];
    i = q;
  }
}

#ifdef __cplusplus
}
#endif
#endif
