/* cuda/geometry.c: host-side index arithmetic of the CUDA kernels (see geometry.h). Plain C with
   no CUDA header, so tests/c/test_cuda_geometry.c compiles it on machines without CUDA. */
#include "geometry.h"
#include <limits.h>
#include <string.h>

void kiln_cuda_iter_build(struct kiln_cuda_iter *it, const struct kiln_tensor *out, int nin,
                          const struct kiln_tensor *const *in) {
  memset(it, 0, sizeof *it);
  int nops = nin + 1, nd = out->ndim;
  it->nops = nops;
  it->numel = out->numel;
  int64_t sizes[KILN_MAX_DIMS], strides[KILN_CUDA_MAX_OPERANDS][KILN_MAX_DIMS];
  for (int d = 0; d < nd; d++) sizes[d] = out->sizes[d];
  for (int k = 0; k < nops; k++) {
    const struct kiln_tensor *t = k == 0 ? out : in[k - 1];
    int lead = nd - t->ndim;
    for (int d = 0; d < nd; d++) {
      int64_t size = d < lead ? 1 : t->sizes[d - lead];
      strides[k][d] = d < lead || (size == 1 && sizes[d] != 1) ? 0 : t->strides[d - lead];
    }
  }
  /* Drop size-1 dims; merge dim d into the kept dim before it when every operand steps over
     the pair as over one dim. */
  int n = 0;
  for (int d = 0; d < nd; d++) {
    if (sizes[d] == 1) continue;
    if (n > 0) {
      int merge = 1;
      for (int k = 0; k < nops; k++)
        if (it->strides[k][n - 1] != strides[k][d] * sizes[d]) { merge = 0; break; }
      if (merge) {
        it->sizes[n - 1] *= sizes[d];
        for (int k = 0; k < nops; k++) it->strides[k][n - 1] = strides[k][d];
        continue;
      }
    }
    it->sizes[n] = sizes[d];
    for (int k = 0; k < nops; k++) it->strides[k][n] = strides[k][d];
    n++;
  }
  if (n == 0) {   /* a scalar, or only size-1 dims */
    it->sizes[0] = 1;
    n = 1;
  }
  it->ndim = n;
}

int kiln_cuda_iter_is_flat(const struct kiln_cuda_iter *it) {
  if (it->ndim != 1) return 0;
  for (int k = 0; k < it->nops; k++)
    if (it->strides[k][0] != 1 && it->sizes[0] != 1) return 0;
  return 1;
}

int kiln_cuda_iter_fits32(const struct kiln_cuda_iter *it) {
  if (it->numel > (int64_t)UINT32_MAX) return 0;
  for (int d = 0; d < it->ndim; d++)
    if (it->sizes[d] > (int64_t)UINT32_MAX) return 0;
  return 1;
}

struct kiln_cuda_launch kiln_cuda_launch_1d(int64_t n, int threads, int64_t max_blocks) {
  struct kiln_cuda_launch l = {0, threads > 0 ? threads : 1};
  if (n <= 0) return l;
  int64_t blocks = (n + l.threads - 1) / l.threads;
  if (max_blocks < 1) max_blocks = 1;
  if (max_blocks > INT_MAX) max_blocks = INT_MAX;   /* gridDim.x takes 2^31 - 1 */
  l.blocks = blocks < max_blocks ? blocks : max_blocks;
  return l;
}

int kiln_cuda_vector_width(int64_t n, int count, const uintptr_t *addr, const int *size) {
  int w = 16;
  for (int i = 0; i < count; i++) {
    if (size[i] < 1 || size[i] > 16) return 1;
    while (w > 1 && (w * size[i] > 16 || addr[i] % (uintptr_t)(w * size[i]) != 0)) w /= 2;
  }
  while (w > 1 && n < 2 * (int64_t)w) w /= 2;
  return w;
}

int64_t kiln_cuda_max_blocks(int sm_count, int threads) {
  if (sm_count < 1) sm_count = 1;
  if (threads < 1) threads = 1;
  int64_t per_sm = 2048 / threads;   /* resident threads per SM on sm_80 and later */
  if (per_sm < 1) per_sm = 1;
  return (int64_t)sm_count * per_sm * 4;
}

int kiln_cuda_gemm_layout(int64_t rows, int64_t cols, int64_t s0, int64_t s1, int64_t *ld) {
  /* Rows contiguous: column-major storage of X^T, (cols x rows) with leading dim s0. */
  if ((s1 == 1 || cols == 1) && s0 >= (cols > 1 ? cols : 1)) {
    *ld = s0 > 0 ? s0 : 1;
    if (rows == 1) *ld = cols > 1 ? cols : 1;   /* one row: any stride will do, cuBLAS wants ld >= cols */
    return 0;
  }
  /* Columns contiguous: column-major storage of X, (rows x cols) with leading dim s1. */
  if ((s0 == 1 || rows == 1) && s1 >= (rows > 1 ? rows : 1)) {
    *ld = s1 > 0 ? s1 : 1;
    if (cols == 1) *ld = rows > 1 ? rows : 1;
    return 1;
  }
  return -1;
}

static int fits(int64_t v) { return v >= 0 && v <= INT_MAX; }

int kiln_cuda_gemm_plan(const struct kiln_tensor *out, const struct kiln_tensor *a, const struct kiln_tensor *b,
                        struct kiln_cuda_gemm_plan *p) {
  memset(p, 0, sizeof *p);
  int64_t B = out->sizes[0], n = out->sizes[1], m = out->sizes[2], k = a->sizes[2];
  p->m = m;
  p->n = n;
  p->k = k;
  p->batch = B;
  /* cuBLAS A = kiln's b [k, m]: read as b^T (m x k). Rows of b contiguous -> op N on it. */
  int tb = kiln_cuda_gemm_layout(b->sizes[1], b->sizes[2], b->strides[1], b->strides[2], &p->lda);
  int ta = kiln_cuda_gemm_layout(a->sizes[1], a->sizes[2], a->strides[1], a->strides[2], &p->ldb);
  p->copy_a = tb < 0 || b->dtype != out->dtype;   /* cuBLAS's A */
  p->copy_b = ta < 0 || a->dtype != out->dtype;   /* cuBLAS's B */
  p->trans_a = tb > 0;
  p->trans_b = ta > 0;
  p->stride_a = b->sizes[0] > 1 ? b->strides[0] : 0;
  p->stride_b = a->sizes[0] > 1 ? a->strides[0] : 0;
  /* out rows must be contiguous (op N on out^T), with rows that do not overlap. */
  int64_t ldc;
  int tc = kiln_cuda_gemm_layout(n, m, out->strides[1], out->strides[2], &ldc);
  int64_t span = (n > 0 ? n - 1 : 0) * ldc + m;   /* elements one batch of out covers */
  p->copy_out = tc != 0 || (B > 1 && out->strides[0] < span);
  p->ldc = tc == 0 ? ldc : (m > 1 ? m : 1);
  p->stride_c = p->copy_out ? n * m : out->strides[0];
  if (!fits(m) || !fits(n) || !fits(k) || !fits(B) || !fits(p->lda) || !fits(p->ldb) || !fits(p->ldc)) return -1;
  return 0;
}

int kiln_cuda_pow2_threads(int64_t n, int lo, int hi) {
  int t = lo > 0 ? lo : 1;
  while (t < hi && t < n) t *= 2;
  return t < hi ? t : hi;
}

void kiln_cuda_reduce_plan(int ndim, const int64_t *sizes, int64_t mask, int64_t max_blocks,
                           struct kiln_cuda_reduce_plan *p) {
  memset(p, 0, sizeof *p);
  int n = 0;
  p->M = 1;
  p->R = 1;
  for (int d = 0; d < ndim; d++)
    if (!(mask & ((int64_t)1 << d))) { p->perm[n++] = d; p->M *= sizes[d]; }
  for (int d = 0; d < ndim; d++)
    if (mask & ((int64_t)1 << d)) { p->perm[n++] = d; p->R *= sizes[d]; }
  kiln_cuda_chunk_rows(p->M, p->R, max_blocks, &p->chunk, &p->nchunks, &p->threads);
}

void kiln_cuda_chunk_rows(int64_t M, int64_t R, int64_t max_blocks, int64_t *chunk, int64_t *nchunks, int *threads) {
  *threads = kiln_cuda_pow2_threads(R, 32, 256);
  *chunk = *nchunks = 0;
  if (R == 0 || M == 0) return;   /* no chunks: rows of nothing, or no rows */
  /* Enough elements per thread to pay for the block's tree; more chunks only while the rows
     alone leave the device idle. */
  int64_t per_block = (int64_t)*threads * 16;
  int64_t most = (R + per_block - 1) / per_block;
  int64_t want = max_blocks > M ? (max_blocks + M - 1) / M : 1;
  int64_t n = want < most ? want : most;
  if (n < 1) n = 1;
  *chunk = (R + n - 1) / n;
  *nchunks = (R + *chunk - 1) / *chunk;
}

void kiln_cuda_ln_grads_plan(int64_t rows, int64_t L, int64_t max_blocks, int64_t *tiles, int64_t *chunk, int64_t *nchunks) {
  *tiles = (L + 31) / 32;
  if (rows <= 0 || *tiles == 0) {
    *chunk = 0;
    *nchunks = 1;
    return;
  }
  int64_t want = max_blocks > *tiles ? (max_blocks + *tiles - 1) / *tiles : 1;
  int64_t most = (rows + 127) / 128;
  int64_t n = want < most ? want : most;
  if (n < 1) n = 1;
  *chunk = (rows + n - 1) / n;
  *nchunks = (rows + *chunk - 1) / *chunk;
}

void kiln_cuda_lines(int ndim, const int64_t *sizes, int dim, int64_t *outer, int64_t *D, int64_t *inner) {
  *outer = 1;
  *inner = 1;
  *D = ndim ? sizes[dim] : 1;
  for (int d = 0; d < dim; d++) *outer *= sizes[d];
  for (int d = dim + 1; d < ndim; d++) *inner *= sizes[d];
}

void kiln_cuda_index_geom_build(struct kiln_cuda_index_geom *g, int op, const struct kiln_tensor *written,
                                const struct kiln_tensor *index, const struct kiln_tensor *read, int dim) {
  memset(g, 0, sizeof *g);
  const struct kiln_tensor *walk = op == KILN_OP_INDEX_SELECT ? written : index;
  const struct kiln_tensor *indexed = op == KILN_OP_SCATTER_ADD ? written : read;
  g->ndim = walk->ndim;
  g->numel = walk->numel;
  g->indexed = op == KILN_OP_SCATTER_ADD ? 0 : 2;
  g->jump = indexed->ndim ? indexed->strides[dim] : 0;
  for (int d = 0; d < walk->ndim; d++) {
    g->sizes[d] = walk->sizes[d];
    g->strides[0][d] = written->strides[d];
    g->strides[2][d] = read->strides[d];
    if (op == KILN_OP_INDEX_SELECT) g->strides[1][d] = d == dim && index->ndim ? index->strides[0] : 0;
    else g->strides[1][d] = index->strides[d];
  }
  if (walk->ndim) g->strides[g->indexed][dim] = 0;
}
