/* cuda/norm.cu: batch, layer and group norm on CUDA, forward and backward, with cpu/norm.c's
   semantics (norm.cuh). Layer and group norm: one block per row, its threads striding over the
   elements, the sums (in double) through the block's fixed tree, the mean first and then the
   squared deviations from it. Batch norm: each channel cut into chunks of its N * S elements (as
   the reductions cut rows), one block a chunk: a pass of partial sums, a pass of partial squared
   deviations from the mean folded from them, and a pass writing y; every block of a channel folds
   its partials in the same order (fold_chunks), the channel's first moves the running stats.
   The weight and bias grads of layer norm (32 columns by a chunk of rows a block) and of group norm
   (a chunk of a channel a block) go through partial sums per chunk, each column's or channel's
   then added in order. Everything is deterministic: no atomics. */
#include "kernels.cuh"
#include "norm.cuh"
#include "nn_calls.h"

using namespace kiln_norm;
using namespace kiln_k;

enum { NORM_THREADS = 256 };

/* ---- batch norm ---- */

struct bn_geom {
  int64_t N, C, S;
};

/* Block b of a pass takes chunk b % nchunks of channel b / nchunks: [k0, k1) (batch norm, and
   group norm's param grads). */
struct bn_chunk {
  int64_t c, p, k0, k1;
};
__device__ __forceinline__ struct bn_chunk bn_chunk_of(int64_t b, int64_t chunk, int64_t nchunks, int64_t per) {
  struct bn_chunk h;
  h.c = b / nchunks;
  h.p = b % nchunks;
  h.k0 = h.p * chunk;
  h.k1 = h.k0 + chunk < per ? h.k0 + chunk : per;
  return h;
}

/* The chunks of each of C channels' per elements (geometry.c's rule, as the reductions'; no
   elements is one empty chunk, so that the statistics and param grads are still written). */
struct chunk_plan {
  int64_t chunk, nchunks;
  int threads;
};
static struct chunk_plan channel_chunks(const struct cuda_device *dev, int64_t C, int64_t per) {
  struct chunk_plan p;
  kiln_cuda_chunk_rows(C, per, kiln_cuda_max_blocks(dev->sm_count, NORM_THREADS), &p.chunk, &p.nchunks, &p.threads);
  if (p.nchunks == 0) p.nchunks = 1;
  return p;
}

/* The batch statistics, chunk by chunk: without sums, each chunk's sum of x; with them (the
   first pass's partials), each chunk's sum of squared deviations from the channel's mean. */
template <class T>
__global__ void bn_stats_kernel(const T *x, struct bn_geom g, int64_t chunk, int64_t nchunks, const double *sums,
                                double *out) {
  extern __shared__ double red[];
  int64_t per = g.N * g.S;
  for (int64_t b = blockIdx.x; b < g.C * nchunks; b += gridDim.x) {
    struct bn_chunk h = bn_chunk_of(b, chunk, nchunks, per);
    double v = 0;
    if (!sums) {
      bn_walk(h.c, g.C, g.S, h.k0 + threadIdx.x, h.k1, blockDim.x, [&](int64_t at) { v += (double)x[at]; });
    } else {
      double m = bn_mean(fold_chunks(sums, h.c, g.C, nchunks), (double)per);
      bn_walk(h.c, g.C, g.S, h.k0 + threadIdx.x, h.k1, blockDim.x, [&](int64_t at) {
        double d = (double)x[at] - m;
        v += d * d;
      });
    }
    v = block_sum(v, red);
    if (threadIdx.x == 0) out[h.p * g.C + h.c] = v;
  }
}

/* y of each chunk from the channel's statistics: folded from the partials (batch stats; the
   channel's first chunk saves mean and invstd and moves the running stats) or the running stats. */
template <class T>
__global__ void bn_apply_kernel(const T *x, const T *w, const T *b_, T *y, T *mean, T *invstd, T *rm, int64_t rms, T *rv,
                                int64_t rvs, struct bn_geom g, int64_t chunk, int64_t nchunks, const double *sums,
                                const double *sqs, int update, double eps, double momentum) {
  int64_t per = g.N * g.S;
  double M = (double)per;
  for (int64_t b = blockIdx.x; b < g.C * nchunks; b += gridDim.x) {
    struct bn_chunk h = bn_chunk_of(b, chunk, nchunks, per);
    int64_t c = h.c;
    bool first = h.p == 0 && threadIdx.x == 0;
    double m, is;
    if (sums) {
      m = bn_mean(fold_chunks(sums, c, g.C, nchunks), M);
      is = bn_batch_invstd<T>(m, fold_chunks(sqs, c, g.C, nchunks), M, eps, update && first, momentum, rm + c * rms, rv + c * rvs);
    } else {
      m = (double)rm[c * rms];
      is = bn_running_invstd<T>(rv + c * rvs, eps);
    }
    if (first) {
      mean[c] = (T)m;
      invstd[c] = (T)is;
    }
    T scale, shift;
    bn_affine<T>(m, is, w, b_, c, &scale, &shift);
    bn_walk(c, g.C, g.S, h.k0 + threadIdx.x, h.k1, blockDim.x, [&](int64_t at) { y[at] = x[at] * scale + shift; });
  }
}

/* The grad's sums, chunk by chunk: of gy, and of gy * (x - mean). */
template <class T>
__global__ void bn_grad_sums_kernel(const T *gy, const T *x, const T *mean, struct bn_geom g, int64_t chunk, int64_t nchunks,
                                    double *sg, double *sgx) {
  extern __shared__ double red[];
  int64_t per = g.N * g.S;
  for (int64_t b = blockIdx.x; b < g.C * nchunks; b += gridDim.x) {
    struct bn_chunk h = bn_chunk_of(b, chunk, nchunks, per);
    double m = (double)mean[h.c], a = 0, d = 0;
    bn_walk(h.c, g.C, g.S, h.k0 + threadIdx.x, h.k1, blockDim.x, [&](int64_t at) {
      double v = (double)gy[at];
      a += v;
      d += v * ((double)x[at] - m);
    });
    a = block_sum(a, red);
    d = block_sum(d, red);
    if (threadIdx.x == 0) {
      sg[h.p * g.C + h.c] = a;
      sgx[h.p * g.C + h.c] = d;
    }
  }
}

/* gx of each chunk from the channel's folded sums; the channel's first chunk writes gw and gb. */
template <class T>
__global__ void bn_grad_apply_kernel(const T *gy, const T *x, const T *w, const T *mean, const T *invstd, T *gx, T *gw,
                                     T *gb, struct bn_geom g, int64_t chunk, int64_t nchunks, const double *sgp,
                                     const double *sgxp, int batch_stats) {
  int64_t per = g.N * g.S;
  for (int64_t b = blockIdx.x; b < g.C * nchunks; b += gridDim.x) {
    struct bn_chunk h = bn_chunk_of(b, chunk, nchunks, per);
    int64_t c = h.c;
    double m = (double)mean[c], is = (double)invstd[c];
    double sg = fold_chunks(sgp, c, g.C, nchunks), sgx = fold_chunks(sgxp, c, g.C, nchunks);
    if (h.p == 0 && threadIdx.x == 0) {
      if (gw) gw[c] = (T)(sgx * is);
      if (gb) gb[c] = (T)sg;
    }
    if (!gx) continue;
    double k[3];
    bn_backward_coefs(batch_stats, m, is, w ? (double)w[c] : 1.0, sg, sgx, (double)per, k);
    T t1 = (T)k[0], t2 = (T)k[1], t3 = (T)k[2];
    bn_walk(c, g.C, g.S, h.k0 + threadIdx.x, h.k1, blockDim.x, [&](int64_t at) { gx[at] = t1 * gy[at] + t2 * x[at] + t3; });
  }
}

static struct bn_geom bn_geom_of(const struct kiln_tensor *x) {
  struct bn_geom g = {x->sizes[0], x->ndim > 1 ? x->sizes[1] : 1, 1};
  for (int d = 2; d < x->ndim; d++) g.S *= x->sizes[d];
  return g;
}

/* ---- layer and group norm ---- */

template <class T>
__global__ void row_norm_kernel(const T *x, const T *w, const T *b, T *y, T *mean, T *invstd, struct rn_geom g, double eps) {
  extern __shared__ double red[];   /* blockDim.x */
  for (int64_t r = blockIdx.x; r < g.rows; r += gridDim.x) {
    const T *xr = x + r * g.L;
    double s = 0;
    for (int64_t i = threadIdx.x; i < g.L; i += blockDim.x) s += (double)xr[i];
    double m = rn_mean(block_sum(s, red), g.L);
    double q = 0;
    for (int64_t i = threadIdx.x; i < g.L; i += blockDim.x) {
      double d = (double)xr[i] - m;
      q += d * d;
    }
    double is = rn_invstd(block_sum(q, red), g.L, eps);
    if (threadIdx.x == 0) {
      mean[r] = (T)m;
      invstd[r] = (T)is;
    }
    for (int64_t i = threadIdx.x; i < g.L; i += blockDim.x) y[r * g.L + i] = rn_forward_element<T>(xr[i], g, r, i, m, is, w, b);
  }
}

template <class T>
__global__ void row_norm_backward_kernel(const T *gy, const T *x, const T *w, const T *mean, const T *invstd, T *gx,
                                         struct rn_geom g) {
  extern __shared__ double red[];
  for (int64_t r = blockIdx.x; r < g.rows; r += gridDim.x) {
    const T *xr = x + r * g.L, *gr = gy + r * g.L;
    double m = (double)mean[r], is = (double)invstd[r];
    double a = 0, bs = 0;
    for (int64_t i = threadIdx.x; i < g.L; i += blockDim.x) {
      double gw = (double)gr[i] * (w ? (double)w[rn_channel(g, r, i)] : 1.0);
      a += gw;
      bs += gw * ((double)xr[i] - m);
    }
    a = block_sum(a, red);
    bs = block_sum(bs, red);
    double k2, k3;
    rn_backward_coefs(m, is, a, bs, g.L, &k2, &k3);
    T t2 = (T)k2, t3 = (T)k3;
    for (int64_t i = threadIdx.x; i < g.L; i += blockDim.x)
      gx[r * g.L + i] = rn_backward_element<T>(gr[i], xr[i], g, r, i, is, w, t2, t3);
  }
}

enum { LN_COLS = 32, LN_LANES = 8 };   /* ln_grads_partial_kernel's block: 32 columns x 8 row lanes */

/* Layer norm's param grads, partial sums: block (tile, chunk) takes 32 columns of a chunk of rows,
   lane r of a column the chunk's rows r, r + 8, ...; the 8 lanes meet in a fixed tree. */
template <class T>
__global__ void ln_grads_partial_kernel(const T *x, const T *gy, const T *mean, const T *invstd, int64_t rows, int64_t L,
                                        int64_t tiles, int64_t chunk, int64_t nchunks, double *pw, double *pb) {
  __shared__ double sw[LN_LANES][LN_COLS], sb[LN_LANES][LN_COLS];
  int lane = threadIdx.x % LN_COLS, rl = threadIdx.x / LN_COLS;
  for (int64_t blk = blockIdx.x; blk < tiles * nchunks; blk += gridDim.x) {
    int64_t p = blk / tiles, j = (blk % tiles) * LN_COLS + lane;
    int64_t r0 = p * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
    double w = 0, b = 0;
    if (j < L) ln_param_partial<T>(x, gy, mean, invstd, L, j, r0 + rl, r1, LN_LANES, &w, &b);
    sw[rl][lane] = w;
    sb[rl][lane] = b;
    __syncthreads();
    for (int s = LN_LANES / 2; s > 0; s >>= 1) {
      if (rl < s) {
        sw[rl][lane] += sw[rl + s][lane];
        sb[rl][lane] += sb[rl + s][lane];
      }
      __syncthreads();
    }
    if (rl == 0 && j < L) {
      pw[p * L + j] = sw[0][lane];
      pb[p * L + j] = sb[0][lane];
    }
    __syncthreads();
  }
}

/* Group norm's param grads, partial sums: block (channel, chunk) takes a chunk of the channel's
   N * S elements, its threads striding, then the block's tree. */
template <class T>
__global__ void gn_grads_partial_kernel(const T *x, const T *gy, const T *mean, const T *invstd, struct rn_geom g,
                                        int64_t chunk, int64_t nchunks, double *pw, double *pb) {
  extern __shared__ double red[];
  int64_t per = g.rows / g.G * g.S;   /* the channel's elements in the batch */
  for (int64_t blk = blockIdx.x; blk < g.C * nchunks; blk += gridDim.x) {
    struct bn_chunk h = bn_chunk_of(blk, chunk, nchunks, per);
    double sw = 0, sb = 0;
    for (int64_t k = h.k0 + threadIdx.x; k < h.k1; k += blockDim.x) {
      int64_t at;
      sw += gn_weight_term<T>(x, gy, mean, invstd, g, h.c, k, &at);
      sb += (double)gy[at];
    }
    sw = block_sum(sw, red);
    sb = block_sum(sb, red);
    if (threadIdx.x == 0) {
      pw[h.p * g.C + h.c] = sw;
      pb[h.p * g.C + h.c] = sb;
    }
  }
}

/* The param grads: each column's (channel's) chunks added in order. */
template <class T>
__global__ void fold_param_grads_kernel(const double *pw, const double *pb, int64_t n, int64_t nchunks, T *gw, T *gb) {
  KILN_GRID_LOOP(j, n) {
    if (gw) gw[j] = (T)fold_chunks(pw, j, n, nchunks);
    if (gb) gb[j] = (T)fold_chunks(pb, j, n, nchunks);
  }
}

static int float_only(const char *op, const struct kiln_tensor *t) {
  if (t->dtype == KILN_F32 || t->dtype == KILN_F64) return KILN_OK;
  return cuda_fail(KILN_ERR_DTYPE, "%s: %s tensors are not supported on cuda (f32 or f64; got %s)", op,
                   kiln_dtype_name(t->dtype), kiln_shape_string(t));
}

/* Contiguous copies (or retained references) of the tensors a kernel reads; NULL stays NULL. */
static int contiguous_inputs(int n, const struct kiln_tensor *const *in, int dtype, struct kiln_tensor **out, const char *op) {
  for (int k = 0; k < n; k++) out[k] = NULL;
  for (int k = 0; k < n; k++)
    if (in[k] && !(out[k] = cuda_contiguous_as(in[k], dtype, op))) return kiln_error_code();
  return KILN_OK;
}
static void release_all(int n, struct kiln_tensor **t) {
  for (int k = 0; k < n; k++) kiln_tensor_release(t[k]);
}

template <class T> static const T *ptr(const struct kiln_tensor *t) { return t ? (const T *)kiln_tensor_data(t) : NULL; }
template <class T> static T *mptr(struct kiln_tensor *t) { return t ? (T *)kiln_tensor_data(t) : NULL; }

template <class T>
static int row_norm_launch(struct cuda_device *dev, const struct kiln_call *c, struct kiln_tensor *const *in,
                           const struct rn_geom &g, const char *op) {
  const struct kiln_norm_stats *st = (const struct kiln_norm_stats *)c->extra;
  int threads = kiln_cuda_pow2_threads(g.L, 32, NORM_THREADS);
  row_norm_kernel<T><<<blocks_for(dev, g.rows, threads), threads, sizeof(double) * threads, dev->stream>>>(
      ptr<T>(in[0]), ptr<T>(in[1]), ptr<T>(in[2]), mptr<T>(c->out), mptr<T>(st->mean), mptr<T>(st->invstd), g, c->scalar[0]);
  return cuda_launched(op, "row_norm_kernel");
}

extern "C" int cuda_row_norm(const struct kiln_call *c) {
  const char *op = kiln_op_name(c->op);
  const struct kiln_tensor *x = c->in[0];
  struct cuda_device *dev = cuda_device_enter(x->device.index, op);
  if (!dev) return kiln_error_code();
  if (float_only(op, x)) return kiln_error_code();
  struct rn_geom g = rn_geom_of(c->op, c->ints[0], x->ndim, x->sizes, x->numel);
  if (g.rows == 0) return KILN_OK;
  struct kiln_tensor *in[3];
  int rc = contiguous_inputs(3, c->in, x->dtype, in, op);
  if (!rc) rc = x->dtype == KILN_F32 ? row_norm_launch<float>(dev, c, in, g, op) : row_norm_launch<double>(dev, c, in, g, op);
  release_all(3, in);
  return rc;
}

template <class T>
static int row_norm_backward_launch(struct cuda_device *dev, const struct kiln_norm_grads *gr, struct kiln_tensor *const *in,
                                    const struct rn_geom &g, const char *op) {
  const T *gy = ptr<T>(in[0]), *x = ptr<T>(in[1]), *w = ptr<T>(in[2]), *mean = ptr<T>(in[3]), *invstd = ptr<T>(in[4]);
  int rc = KILN_OK;
  if (gr->gx && g.rows > 0 && g.L > 0) {
    int threads = kiln_cuda_pow2_threads(g.L, 32, NORM_THREADS);
    row_norm_backward_kernel<T><<<blocks_for(dev, g.rows, threads), threads, sizeof(double) * threads, dev->stream>>>(
        gy, x, w, mean, invstd, mptr<T>(gr->gx), g);
    rc = cuda_launched(op, "row_norm_backward_kernel");
  }
  if (rc || !(gr->gw || gr->gb)) return rc;
  int64_t n = g.group ? g.C : g.L, chunk, nchunks, tiles = 0;
  if (n == 0) return KILN_OK;
  int threads = NORM_THREADS;
  if (g.group) {
    struct chunk_plan pl = channel_chunks(dev, g.C, g.rows / g.G * g.S);
    chunk = pl.chunk;
    nchunks = pl.nchunks;
    threads = pl.threads;
  } else {
    kiln_cuda_ln_grads_plan(g.rows, g.L, kiln_cuda_max_blocks(dev->sm_count, LN_COLS * LN_LANES), &tiles, &chunk, &nchunks);
  }
  struct kiln_tensor *scratch = cuda_scratch((int64_t)sizeof(double) * 2 * nchunks * n, in[1]->device);
  if (!scratch) return kiln_error_code();
  double *pw = (double *)kiln_tensor_data(scratch), *pb = pw + nchunks * n;
  if (g.group) {
    gn_grads_partial_kernel<T><<<blocks_for(dev, g.C * nchunks, threads), threads, sizeof(double) * threads, dev->stream>>>(
        x, gy, mean, invstd, g, chunk, nchunks, pw, pb);
  } else {
    ln_grads_partial_kernel<T><<<blocks_for(dev, tiles * nchunks, LN_COLS * LN_LANES), LN_COLS * LN_LANES, 0, dev->stream>>>(
        x, gy, mean, invstd, g.rows, g.L, tiles, chunk, nchunks, pw, pb);
  }
  rc = cuda_launched(op, g.group ? "gn_grads_partial_kernel" : "ln_grads_partial_kernel");
  if (!rc) {
    struct kiln_cuda_launch l = grid_for(dev, n);
    fold_param_grads_kernel<T><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(pw, pb, n, nchunks, mptr<T>(gr->gw),
                                                                                   mptr<T>(gr->gb));
    rc = cuda_launched(op, "fold_param_grads_kernel");
  }
  kiln_tensor_release(scratch);
  return rc;
}

extern "C" int cuda_row_norm_backward(const struct kiln_call *c) {
  const char *op = kiln_op_name(c->op);
  const struct kiln_norm_grads *gr = (const struct kiln_norm_grads *)c->extra;
  const struct kiln_tensor *x = c->in[1];
  struct cuda_device *dev = cuda_device_enter(x->device.index, op);
  if (!dev) return kiln_error_code();
  if (float_only(op, x)) return kiln_error_code();
  struct rn_geom g = rn_geom_of(c->op, c->ints[0], x->ndim, x->sizes, x->numel);
  const struct kiln_tensor *src[5] = {c->in[0], c->in[1], c->in[2], gr->mean, gr->invstd};
  struct kiln_tensor *in[5];
  int rc = contiguous_inputs(5, src, x->dtype, in, op);
  if (!rc)
    rc = x->dtype == KILN_F32 ? row_norm_backward_launch<float>(dev, gr, in, g, op)
                              : row_norm_backward_launch<double>(dev, gr, in, g, op);
  release_all(5, in);
  return rc;
}

template <class T>
static int batch_norm_launch(struct cuda_device *dev, const struct kiln_call *c, struct kiln_tensor *const *in,
                             const struct bn_geom &g, const char *op) {
  const struct kiln_norm_stats *st = (const struct kiln_norm_stats *)c->extra;
  struct chunk_plan pl = channel_chunks(dev, g.C, g.N * g.S);
  int64_t nb = g.C * pl.nchunks;
  unsigned blocks = blocks_for(dev, nb, pl.threads);
  size_t shared = sizeof(double) * pl.threads;
  int batch_stats = (int)c->ints[0];
  struct kiln_tensor *scratch = NULL;
  double *sums = NULL, *sqs = NULL;
  if (batch_stats) {
    scratch = cuda_scratch((int64_t)sizeof(double) * 2 * nb, in[0]->device);
    if (!scratch) return kiln_error_code();
    sums = (double *)kiln_tensor_data(scratch);
    sqs = sums + nb;
    bn_stats_kernel<T><<<blocks, pl.threads, shared, dev->stream>>>(ptr<T>(in[0]), g, pl.chunk, pl.nchunks, NULL, sums);
    bn_stats_kernel<T><<<blocks, pl.threads, shared, dev->stream>>>(ptr<T>(in[0]), g, pl.chunk, pl.nchunks, sums, sqs);
  }
  bn_apply_kernel<T><<<blocks, pl.threads, 0, dev->stream>>>(
      ptr<T>(in[0]), ptr<T>(in[1]), ptr<T>(in[2]), mptr<T>(c->out), mptr<T>(st->mean), mptr<T>(st->invstd),
      mptr<T>(st->running_mean), st->running_mean ? st->running_mean->strides[0] : 0, mptr<T>(st->running_var),
      st->running_var ? st->running_var->strides[0] : 0, g, pl.chunk, pl.nchunks, sums, sqs, (int)c->ints[1],
      c->scalar[0], c->scalar[1]);
  int rc = cuda_launched(op, "bn_apply_kernel");
  kiln_tensor_release(scratch);
  return rc;
}

extern "C" int cuda_batch_norm(const struct kiln_call *c) {
  const char *op = "batch_norm";
  const struct kiln_tensor *x = c->in[0];
  const struct kiln_norm_stats *st = (const struct kiln_norm_stats *)c->extra;
  struct cuda_device *dev = cuda_device_enter(x->device.index, op);
  if (!dev) return kiln_error_code();
  if (float_only(op, x)) return kiln_error_code();
  if (!c->ints[0] && !(st->running_mean && st->running_var))
    return cuda_fail(KILN_ERR_ARGUMENT, "%s: normalising with the running stats needs them", op);
  struct bn_geom g = bn_geom_of(x);
  if (g.C == 0) return KILN_OK;
  struct kiln_tensor *in[3];
  int rc = contiguous_inputs(3, c->in, x->dtype, in, op);
  if (!rc) rc = x->dtype == KILN_F32 ? batch_norm_launch<float>(dev, c, in, g, op) : batch_norm_launch<double>(dev, c, in, g, op);
  release_all(3, in);
  return rc;
}

template <class T>
static int batch_norm_backward_launch(struct cuda_device *dev, const struct kiln_call *c, struct kiln_tensor *const *in,
                                      const struct bn_geom &g, const char *op) {
  const struct kiln_norm_grads *gr = (const struct kiln_norm_grads *)c->extra;
  struct chunk_plan pl = channel_chunks(dev, g.C, g.N * g.S);
  int64_t nb = g.C * pl.nchunks;
  unsigned blocks = blocks_for(dev, nb, pl.threads);
  struct kiln_tensor *scratch = cuda_scratch((int64_t)sizeof(double) * 2 * nb, in[1]->device);
  if (!scratch) return kiln_error_code();
  double *sg = (double *)kiln_tensor_data(scratch), *sgx = sg + nb;
  bn_grad_sums_kernel<T><<<blocks, pl.threads, sizeof(double) * pl.threads, dev->stream>>>(
      ptr<T>(in[0]), ptr<T>(in[1]), ptr<T>(in[3]), g, pl.chunk, pl.nchunks, sg, sgx);
  bn_grad_apply_kernel<T><<<blocks, pl.threads, 0, dev->stream>>>(
      ptr<T>(in[0]), ptr<T>(in[1]), ptr<T>(in[2]), ptr<T>(in[3]), ptr<T>(in[4]), mptr<T>(gr->gx), mptr<T>(gr->gw),
      mptr<T>(gr->gb), g, pl.chunk, pl.nchunks, sg, sgx, (int)c->ints[0]);
  int rc = cuda_launched(op, "bn_grad_apply_kernel");
  kiln_tensor_release(scratch);
  return rc;
}

extern "C" int cuda_batch_norm_backward(const struct kiln_call *c) {
  const char *op = "batch_norm_backward";
  const struct kiln_norm_grads *gr = (const struct kiln_norm_grads *)c->extra;
  const struct kiln_tensor *x = c->in[1];
  struct cuda_device *dev = cuda_device_enter(x->device.index, op);
  if (!dev) return kiln_error_code();
  if (float_only(op, x)) return kiln_error_code();
  struct bn_geom g = bn_geom_of(x);
  if (g.C == 0 || !(gr->gx || gr->gw || gr->gb)) return KILN_OK;
  const struct kiln_tensor *src[5] = {c->in[0], c->in[1], c->in[2], gr->mean, gr->invstd};
  struct kiln_tensor *in[5];
  int rc = contiguous_inputs(5, src, x->dtype, in, op);
  if (!rc)
    rc = x->dtype == KILN_F32 ? batch_norm_backward_launch<float>(dev, c, in, g, op)
                              : batch_norm_backward_launch<double>(dev, c, in, g, op);
  release_all(5, in);
  return rc;
}
