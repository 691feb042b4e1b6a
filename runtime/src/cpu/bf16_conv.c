/* cpu/bf16_conv.c: 2-d convolution of bf16 tensors (what autocast's conv2d runs on the CPU).
   A chunk of images at a time: im2col into bf16 columns, then the products by the bf16 GEMM of
   cpu/bf16_gemm.c (f32 accumulation; converted to f32 and sgemm where the CPU lacks AVX512-BF16),
   each result rounded to bf16 once. Backward: grad weight accumulates over the chunks in f32 and
   is rounded at the end; grad input is col2im in f32, then rounded; grad bias is summed in double.
   The chunks run in kiln's pool, each GEMM alone on its worker. */
#include "cpu.h"
#include "convert.h"
#include "nn_calls.h"
#include "blocked_pool.h"
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

enum { CHUNK_BYTES = 512 << 10 };   /* bf16 columns of about this size: their f32 grad (twice it) stays in L2 */

struct cg {
  int64_t N, C, H, W, O, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, G, Cg, Og, K, P, nb;
};

static void cg_init(struct cg *g, const int64_t *ints, int64_t N, int64_t C, int64_t H, int64_t W,
                    const struct kiln_tensor *w, int64_t O, int64_t OH, int64_t OW) {
  g->N = N; g->C = C; g->H = H; g->W = W; g->O = O; g->OH = OH; g->OW = OW;
  g->kh = w->sizes[2]; g->kw = w->sizes[3];
  g->sh = ints[0]; g->sw = ints[1]; g->ph = ints[2]; g->pw = ints[3]; g->dh = ints[4]; g->dw = ints[5];
  g->G = ints[6]; g->Cg = C / g->G; g->Og = O / g->G;
  g->K = g->Cg * g->kh * g->kw;
  g->P = OH * OW;
  int64_t per = g->K * g->P * 2;
  g->nb = per > 0 ? CHUNK_BYTES / per : N;
  /* and no more than a sixteenth of the batch where that still gives 256 columns or more: the
     pool's threads share the chunks evenly, and a chunk's output and its f32 products stay in L2
     (the CNN's first layer under autocast, Zen 5: 7.9-8.1 ms a step against 9.1-9.8 at 1 thread,
     4.4-4.6 against 5.7-6.0 at 2) */
  int64_t part = (N + KILN_CONV_PARTS - 1) / KILN_CONV_PARTS;
  if (g->nb > part && part * g->P >= 256) g->nb = part;
  if (g->nb < 1) g->nb = 1;
  if (g->nb > N) g->nb = N;
}

/* Output columns [lo, hi) of kernel column kj whose input column is inside the image. */
static void cols_of(const struct cg *g, int64_t kj, int64_t *lo, int64_t *hi) {
  int64_t off = kj * g->dw - g->pw;
  int64_t a = off >= 0 ? 0 : (-off + g->sw - 1) / g->sw;
  int64_t b = g->W - 1 - off < 0 ? 0 : (g->W - 1 - off) / g->sw + 1;
  if (b > g->OW) b = g->OW;
  if (a > b) a = b;
  *lo = a; *hi = b;
}

/* col [K, nb*P] (bf16) from images n0.. of x [N,C,H,W], channels c0..c0+Cg-1. */
/* d[0, OW) = s[ow + off] for ow in [lo, hi), zero elsewhere: AVX-512 masked moves, 32 at a time. */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void copy_row_avx512(uint16_t *d, const uint16_t *s, int64_t off, int64_t lo, int64_t hi, int64_t OW) {
  for (int64_t ow = 0; ow < OW; ow += 32) {
    int64_t a = lo > ow ? lo : ow, b = hi < ow + 32 ? hi : ow + 32, n = OW - ow < 32 ? OW - ow : 32;
    __mmask32 all = n >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << n) - 1);
    __m512i v = _mm512_setzero_si512();
    if (b > a) {
      __mmask32 m = (__mmask32)((((uint64_t)1 << (b - a)) - 1) << (a - ow));
      v = _mm512_maskz_loadu_epi16(m, s + ow + off);   /* lanes outside m are not read */
    }
    if (n >= 32) _mm512_storeu_si512(d + ow, v);   /* unmasked when whole: Zen's masked stores are slow */
    else _mm512_mask_storeu_epi16(d + ow, all, v);
  }
}

/* The columns of a stride-1, unpadded, undilated convolution whose output rows are short (OW
   divides 32: the CNN's second conv has 8): R = 32 / OW output rows are 32 consecutive values of a
   column row, and their inputs lie within (R - 1) * W + OW <= 64 values of the plane, so each 32
   come from two masked loads and one two-source permute (vpermt2w) instead of R short moves. */
static int rows_by_permute(const struct cg *g) {
  if (g->sh != 1 || g->sw != 1 || g->dh != 1 || g->dw != 1 || g->ph != 0 || g->pw != 0 || g->OW < 1 || 32 % g->OW)
    return 0;
  int64_t R = 32 / g->OW;
  return g->P % 32 == 0 && (R - 1) * g->W + g->OW <= 64;
}
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void im2col_permute(const struct cg *g, const uint16_t *restrict x, int64_t n0, int64_t nb, int64_t c0,
                           uint16_t *restrict col) {
  int64_t ld = nb * g->P, R = 32 / g->OW, span = (R - 1) * g->W + g->OW;
  uint16_t at[32];
  for (int l = 0; l < 32; l++) at[l] = (uint16_t)((l / g->OW) * g->W + l % g->OW);
  __m512i idx = _mm512_loadu_si512(at);
  __mmask32 mlo = span >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << span) - 1);
  __mmask32 mhi = span > 32 ? (__mmask32)((((uint64_t)1 << (span - 32)) - 1)) : 0;   /* lanes past span are not read */
  for (int64_t c = 0; c < g->Cg; c++)
    for (int64_t ki = 0; ki < g->kh; ki++)
      for (int64_t kj = 0; kj < g->kw; kj++) {
        uint16_t *restrict row = col + ((c * g->kh + ki) * g->kw + kj) * ld;
        for (int64_t i = 0; i < nb; i++) {
          const uint16_t *base = x + ((n0 + i) * g->C + c0 + c) * g->H * g->W + ki * g->W + kj;
          for (int64_t q = 0; q < g->P / 32; q++) {
            const uint16_t *src = base + q * R * g->W;
            __m512i lo = _mm512_maskz_loadu_epi16(mlo, src), hi = _mm512_maskz_loadu_epi16(mhi, src + 32);
            _mm512_storeu_si512(row + i * g->P + q * 32, _mm512_permutex2var_epi16(lo, idx, hi));
          }
        }
      }
}

/* Rows of the columns are short (8 values in the benchmark's second conv): a loop beats memcpy,
   which gcc would otherwise put in its place. */
__attribute__((optimize("no-tree-loop-distribute-patterns")))
static void im2col_bf16(const struct cg *g, const uint16_t *restrict x, int64_t n0, int64_t nb, int64_t c0,
                        uint16_t *restrict col) {
  int64_t ld = nb * g->P;
  int fast = kiln_cpu_has("avx512bw");
  if (fast && rows_by_permute(g)) { im2col_permute(g, x, n0, nb, c0, col); return; }
  for (int64_t c = 0; c < g->Cg; c++)
    for (int64_t ki = 0; ki < g->kh; ki++)
      for (int64_t kj = 0; kj < g->kw; kj++) {
        uint16_t *restrict row = col + ((c * g->kh + ki) * g->kw + kj) * ld;
        int64_t lo, hi, off = kj * g->dw - g->pw;
        cols_of(g, kj, &lo, &hi);
        for (int64_t i = 0; i < nb; i++) {
          const uint16_t *plane = x + ((n0 + i) * g->C + c0 + c) * g->H * g->W;
          for (int64_t oh = 0; oh < g->OH; oh++) {
            uint16_t *restrict d = row + i * g->P + oh * g->OW;
            int64_t ih = oh * g->sh - g->ph + ki * g->dh;
            if (ih < 0 || ih >= g->H) { for (int64_t ow = 0; ow < g->OW; ow++) d[ow] = 0; continue; }
            const uint16_t *restrict s = plane + ih * g->W;
            if (g->sw == 1 && lo == 0 && hi == g->OW && (g->OW & 7) == 0) {   /* whole rows, 8 values a move */
              for (int64_t ow = 0; ow < g->OW; ow += 8) memcpy(d + ow, s + ow + off, 16);
              continue;
            }
            if (g->sw == 1 && fast) { copy_row_avx512(d, s, off, lo, hi, g->OW); continue; }
            for (int64_t ow = 0; ow < lo; ow++) d[ow] = 0;
            if (g->sw == 1) for (int64_t ow = lo; ow < hi; ow++) d[ow] = s[ow + off];
            else for (int64_t ow = lo; ow < hi; ow++) d[ow] = s[ow * g->sw + off];
            for (int64_t ow = hi; ow < g->OW; ow++) d[ow] = 0;
          }
        }
      }
}

/* The adjoint: add col [K, nb*P] (f32) into gx [nb, C, H, W] (f32, the chunk's images), channels c0... */
static void col2im_f32acc(const struct cg *g, const float *restrict col, int64_t nb, int64_t c0, float *restrict gx) {
  int64_t ld = nb * g->P;
  for (int64_t c = 0; c < g->Cg; c++)
    for (int64_t ki = 0; ki < g->kh; ki++)
      for (int64_t kj = 0; kj < g->kw; kj++) {
        const float *row = col + ((c * g->kh + ki) * g->kw + kj) * ld;
        int64_t lo, hi, off = kj * g->dw - g->pw;
        cols_of(g, kj, &lo, &hi);
        for (int64_t i = 0; i < nb; i++) {
          float *plane = gx + (i * g->C + c0 + c) * g->H * g->W;
          for (int64_t oh = 0; oh < g->OH; oh++) {
            int64_t ih = oh * g->sh - g->ph + ki * g->dh;
            if (ih < 0 || ih >= g->H) continue;
            const float *s = row + i * g->P + oh * g->OW;
            float *d = plane + ih * g->W;
            for (int64_t ow = lo; ow < hi; ow++) d[ow * g->sw + off] += s[ow];
          }
        }
      }
}

static void round_bf16(uint16_t *o, const float *s, int64_t n) {
  for (int64_t i = 0; i < n; i++) o[i] = convert_f32_to_bf16(s[i]);
}

static int dtype_ok(const char *op, const struct kiln_tensor *t) {
  if (t->dtype == KILN_BF16) return KILN_OK;
  return kiln_fail(KILN_ERR_DTYPE, "%s: bf16 kernel given %s %s", op, kiln_dtype_name(t->dtype), kiln_shape_string(t));
}

/* ---- forward: the chunks of images in kiln's pool, each chunk's GEMM on its worker alone ---- */

struct fwd_job {
  const struct cg *g;
  const uint16_t *x, *w, *b;
  uint16_t *y;
  const struct kiln_tensor *input;
  int failed;
  struct kiln_pool_fuse *fuse;   /* conv2d_relu_max_pool2d: y is a chunk's own, pooled from there (below) */
};
static void fused_pool_chunk(const struct kiln_pool_fuse *f, const struct cg *g, int64_t n0, int64_t nb, const uint16_t *y);
static void fused_gyc(const struct kiln_pool_fuse *f, const struct cg *g, int64_t n0, int64_t nb, uint16_t *gyc);

static void fwd_chunks(void *ctx, int64_t begin, int64_t end) {
  struct fwd_job *j = ctx;
  const struct cg *g = j->g;
  uint16_t *col = malloc(sizeof(uint16_t) * (size_t)(g->K * g->nb * g->P) + 64);
  float *tmp = malloc(sizeof(float) * (size_t)(g->Og * g->nb * g->P) + 64);
  uint16_t *ybuf = j->fuse ? malloc(sizeof(uint16_t) * (size_t)(g->nb * g->O * g->P) + 64) : NULL;
  if (!col || !tmp || (j->fuse && !ybuf)) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); free(col); free(tmp); free(ybuf); return; }
  for (int64_t ch = begin; ch < end; ch++) {
    int64_t n0 = ch * g->nb, nb = g->N - n0 < g->nb ? g->N - n0 : g->nb, ld = nb * g->P;
    for (int64_t gi = 0; gi < g->G; gi++) {
      im2col_bf16(g, j->x, n0, nb, gi * g->Cg, col);
      if (kiln_cpu_gemm_bf16_f32(g->Og, ld, g->K, 1.0f, j->w + gi * g->Og * g->K, g->K, 1, col, ld, 1, 0.0f, tmp, ld, 1)) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        goto out;
      }
      for (int64_t o = 0; o < g->Og; o++) {
        float bias = j->b ? convert_bf16_to_f32(j->b[gi * g->Og + o]) : 0.0f;
        for (int64_t i = 0; i < nb; i++) {
          uint16_t *yo = (ybuf ? ybuf + (i * g->O + gi * g->Og + o) * g->P : j->y + ((n0 + i) * g->O + gi * g->Og + o) * g->P);
          const float *t = tmp + o * ld + i * g->P;
          for (int64_t q = 0; q < g->P; q++) yo[q] = convert_f32_to_bf16(t[q] + bias);
        }
      }
    }
    if (ybuf) fused_pool_chunk(j->fuse, g, n0, nb, ybuf);
  }
out:
  free(col); free(tmp); free(ybuf);
}

/* The choice's view of a convolution (cpu/onednn.c): kiln's 16 fixed batch parts. */
static void conv_job(struct kiln_conv_job *cj, const struct cg *g, const void *x, const void *w) {
  memset(cj, 0, sizeof *cj);
  cj->dtype = KILN_BF16; cj->N = g->N; cj->C = g->C; cj->H = g->H; cj->W = g->W; cj->O = g->O; cj->OH = g->OH;
  cj->OW = g->OW; cj->kh = g->kh; cj->kw = g->kw; cj->sh = g->sh; cj->sw = g->sw; cj->ph = g->ph; cj->pw = g->pw;
  cj->dh = g->dh; cj->dw = g->dw; cj->G = g->G; cj->parts = g->N < KILN_CONV_PARTS ? g->N : KILN_CONV_PARTS;
  cj->x = x; cj->w = w;
  if (kiln_cpu_winograd_takes(cj)) cj->winograd = kiln_cpu_winograd_run;   /* f32 arithmetic, bf16 at its edges */
}

static int forward_columns(void *ctx) {
  struct fwd_job *j = ctx;
  j->failed = 0;
  kiln_parallel_for((j->g->N + j->g->nb - 1) / j->g->nb, 1, fwd_chunks, j);
  if (j->failed) return kiln_fail(KILN_ERR_MEMORY, "conv2d: out of memory for the bf16 columns (input %s)", kiln_shape_string(j->input));
  return KILN_OK;
}

int cpu_conv2d_bf16(const struct kiln_call *c) {
  struct kiln_tensor *y = c->out;
  if (dtype_ok("conv2d", c->in[0])) return kiln_error_code();
  if (y->numel == 0) return KILN_OK;
  struct kiln_tensor *x = kiln_cpu_contiguous(c->in[0]), *w = kiln_cpu_contiguous(c->in[1]);
  struct kiln_tensor *b = c->in[2] ? kiln_cpu_contiguous(c->in[2]) : NULL;
  int rc = KILN_OK;
  if (!x || !w || (c->in[2] && !b)) { rc = kiln_error_code(); goto done; }
  struct cg g;
  cg_init(&g, c->ints, x->sizes[0], x->sizes[1], x->sizes[2], x->sizes[3], w, y->sizes[1], y->sizes[2], y->sizes[3]);
  struct fwd_job j = {.g = &g, .x = kiln_tensor_data(x), .w = kiln_tensor_data(w), .b = b ? kiln_tensor_data(b) : NULL,
                      .y = kiln_tensor_data(y), .input = x};
  struct kiln_conv_job cj;
  conv_job(&cj, &g, j.x, j.w);
  cj.bias = j.b; cj.y = j.y; cj.im2col = forward_columns; cj.ctx = &j;
  rc = kiln_cpu_conv_run(&cj);   /* oneDNN's bf16 kernels, or the columns below (cpu/onednn.c) */
done:
  kiln_tensor_release(x); kiln_tensor_release(w); kiln_tensor_release(b);
  return rc;
}

/* ---- backward: parts of the chunks in the pool; grad weight in one f32 partial per part, added in
   part order, so that the result does not depend on the thread count ---- */

enum { PARTS = 16 };

struct bwd_job {
  const struct cg *g;
  const uint16_t *gy, *x, *w, *bias;
  uint16_t *gx;            /* NULL when not wanted */
  float *partials;         /* [parts][K][O]: grad weight transposed, or NULL */
  int64_t nchunks, parts;
  int failed;
  const struct kiln_pool_fuse *fuse;   /* conv2d_relu_max_pool2d: gy from the pooled grad (below) */
};

static void bwd_parts(void *ctx, int64_t begin, int64_t end) {
  struct bwd_job *j = ctx;
  const struct cg *g = j->g;
  int64_t HW = g->H * g->W;
  uint16_t *col = malloc(sizeof(uint16_t) * (size_t)(g->K * g->nb * g->P) + 64);
  uint16_t *gyc = malloc(sizeof(uint16_t) * (size_t)(g->Og * g->nb * g->P) + 64);
  float *colg = j->gx ? malloc(sizeof(float) * (size_t)(g->K * g->nb * g->P) + 64) : NULL;
  float *gxf = j->gx ? malloc(sizeof(float) * (size_t)(g->nb * g->C * HW) + 64) : NULL;
  if (!col || !gyc || (j->gx && (!colg || !gxf))) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); goto out; }
  for (int64_t t = begin; t < end; t++) {
    float *partial = j->partials ? j->partials + t * g->K * g->O : NULL;
    for (int64_t ch = t * j->nchunks / j->parts, ch1 = (t + 1) * j->nchunks / j->parts; ch < ch1; ch++) {
      int first = ch == t * j->nchunks / j->parts;
      int64_t n0 = ch * g->nb, nb = g->N - n0 < g->nb ? g->N - n0 : g->nb, ld = nb * g->P;
      if (j->gx) memset(gxf, 0, sizeof(float) * (size_t)(nb * g->C * HW));
      for (int64_t gi = 0; gi < g->G; gi++) {
        if (j->fuse) fused_gyc(j->fuse, g, n0, nb, gyc);   /* one group */
        else
          for (int64_t i = 0; i < nb; i++)   /* this group's grad output of the chunk: gyc [Og, nb*P] */
            for (int64_t o = 0; o < g->Og; o++)
              memcpy(gyc + o * ld + i * g->P, j->gy + ((n0 + i) * g->O + gi * g->Og + o) * g->P,
                     sizeof(uint16_t) * (size_t)g->P);
        if (partial) {
          /* gw^T [K, O] (this group's columns) = col [K, ld] @ gyc^T [ld, Og]: the small operand is packed */
          im2col_bf16(g, j->x, n0, nb, gi * g->Cg, col);
          if (kiln_cpu_gemm_bf16_f32(g->K, g->Og, ld, 1.0f, col, ld, 1, gyc, 1, ld, first ? 0.0f : 1.0f,
                                     partial + gi * g->Og, g->O, 1)) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); goto out; }
        }
        if (j->gx) {
          if (kiln_cpu_gemm_bf16_f32(g->K, ld, g->Og, 1.0f, j->w + gi * g->Og * g->K, 1, g->K, gyc, ld, 1, 0.0f, colg, ld, 1)) {
            __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
            goto out;
          }
          col2im_f32acc(g, colg, nb, gi * g->Cg, gxf);
        }
      }
      if (j->gx) {
        if (j->bias)
          for (int64_t i = 0; i < nb; i++)
            for (int64_t chn = 0; chn < g->C; chn++) {
              float bv = convert_bf16_to_f32(j->bias[chn]);
              float *p = gxf + (i * g->C + chn) * HW;
              for (int64_t q = 0; q < HW; q++) p[q] += bv;
            }
        round_bf16(j->gx + n0 * g->C * HW, gxf, nb * g->C * HW);
      }
    }
  }
out:
  free(col); free(gyc); free(colg); free(gxf);
}

static int backward_columns(void *ctx) {
  struct bwd_job *j = ctx;
  j->failed = 0;
  kiln_parallel_for(j->parts, 1, bwd_parts, j);
  if (j->failed) return kiln_fail(KILN_ERR_MEMORY, "conv2d_backward: out of memory for the bf16 columns");
  return KILN_OK;
}

/* The backward's sums over the batch, by output channel over the pool (each channel's sums in the
   same order whatever the threads): the weights' grad from the parts' partials (oneDNN's [parts][O,
   K], or the columns' [parts][K, O], transposed), rounded once; the bias's grad from gy, sixteen f32
   lanes per image (so that the loop vectorises) added in double. */
struct bf16_sums {
  const struct cg *g;
  const uint16_t *gy;
  uint16_t *gw, *gb;
  float *partials;
  int64_t parts;
  int transposed;
};
static void sum_weights(void *ctx, int64_t o0, int64_t o1) {
  const struct bf16_sums *s = ctx;
  int64_t K = s->g->K, O = s->g->O, KO = K * O;
  float *p = s->partials;   /* the parts added into part 0, part by part (rows of it, vectorised) */
  if (!s->transposed) {
    for (int64_t t = 1; t < s->parts; t++)
      for (int64_t e = o0 * K; e < o1 * K; e++) p[e] += p[t * KO + e];
    for (int64_t e = o0 * K; e < o1 * K; e++) s->gw[e] = convert_f32_to_bf16(p[e]);
    return;
  }
  for (int64_t kk = 0; kk < K; kk++) {
    for (int64_t t = 1; t < s->parts; t++)
      for (int64_t o = o0; o < o1; o++) p[kk * O + o] += p[t * KO + kk * O + o];
    for (int64_t o = o0; o < o1; o++) s->gw[o * K + kk] = convert_f32_to_bf16(p[kk * O + o]);
  }
}
static void sum_bias(void *ctx, int64_t o0, int64_t o1) {
  const struct bf16_sums *s = ctx;
  const struct cg *g = s->g;
  for (int64_t o = o0; o < o1; o++) {
    double sum = 0;
    for (int64_t n = 0; n < g->N; n++) {
      const uint16_t *p = s->gy + (n * g->O + o) * g->P;
      float lane[16] = {0};
      int64_t q = 0;
      for (; q + 16 <= g->P; q += 16)
        for (int l = 0; l < 16; l++) lane[l] += convert_bf16_to_f32(p[q + l]);
      for (; q < g->P; q++) lane[0] += convert_bf16_to_f32(p[q]);
      for (int l = 0; l < 16; l++) sum += lane[l];
    }
    s->gb[o] = convert_f32_to_bf16((float)sum);
  }
}

/* ---- conv2d, relu and 2x2 max pooling as one call (bf16) ----
   As cpu/conv.c's f32 form, with the bits of the three bf16 ops (relu on the bits and max pooling
   as cpu/elementwise.c and cpu/bf16_pool.c do them: a NaN quieted, the first maximum or the last
   NaN, the grad at a window's pick as its scatter rounds it: -0 as +0, a NaN quieted; the bias grad
   in sixteen f32 lanes a plane, added in double), in the layout the three ops' convolution runs in:
   oneDNN's blocked one (nChw16c, sixteen bf16 channels a position) where oneDNN convolves, or
   kiln's columns (a chunk's NCHW planes) where they do (the one-channel first layer under the
   auto rule). Planes of even width only (cpu/bf16_pool.c's vector case), one group. */
#if defined(__AVX512BW__)

/* columns, forward: relu and the 2x2 max of a plane (W = 2 OW), as cpu/bf16_pool.c's max2x2_plane */
static void relu_pool_plane(const uint16_t *x, int64_t H, int64_t OH, int64_t OW, int64_t W, uint16_t *y, uint8_t *code) {
  for (int64_t oh = 0; oh < OH; oh++) {
    for (int64_t ow = 0; ow < OW; ow += 16) {
      int64_t n = OW - ow < 16 ? OW - ow : 16, o = oh * OW + ow;
      __mmask16 m16 = (__mmask16)((1u << n) - 1);
      int whole = o + 16 <= OH * OW;
      __m512 cand[4];
      kiln_max2x2_load_bf16(x, H, W, oh, ow, n, whole, cand);
      for (int k = 0; k < 4; k++) cand[k] = kiln_relu_bf16(cand[k]);
      __m512i rank;
      __m512 best = kiln_max2x2_pick(cand, &rank);
      __m256i yv = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(best), 16));
      __m128i cv = _mm512_cvtepi32_epi8(kiln_pool_code(best, rank));
      if (whole) { _mm256_storeu_si256((void *)(y + o), yv); _mm_storeu_si128((void *)(code + o), cv); }
      else { _mm256_mask_storeu_epi16(y + o, m16, yv); _mm_mask_storeu_epi8(code + o, m16, cv); }
    }
  }
}

/* columns, backward: a plane's grad from the pooled grad and the codes, each element written once,
   as cpu/bf16_pool.c's max2x2_back_plane */
static void relu_pool_back_plane(const uint16_t *gy, const uint8_t *code, int64_t H, int64_t OH, int64_t OW, int64_t W,
                                 uint16_t *gx) {
  const __m512i one = _mm512_set1_epi32(1), two = _mm512_set1_epi32(2), four = _mm512_set1_epi32(4);
  for (int64_t oh = 0; oh < OH; oh++) {
    for (int64_t ow = 0; ow < OW; ow += 16) {
      int64_t n = OW - ow < 16 ? OW - ow : 16, o = oh * OW + ow;
      __mmask16 m16 = (__mmask16)((1u << n) - 1);
      int whole = o + 16 <= OH * OW;
      __m512i g = _mm512_cvtepu16_epi32(whole ? _mm256_loadu_si256((const void *)(gy + o)) : _mm256_maskz_loadu_epi16(m16, gy + o));
      __m512i r = _mm512_cvtepu8_epi32(whole ? _mm_loadu_si128((const void *)(code + o)) : _mm_maskz_loadu_epi8(m16, code + o));
      g = _mm512_maskz_mov_epi32(_mm512_cmpneq_epi32_mask(r, four), kiln_scatter_bf16(g));
      kiln_max2x2_put_bf16(gx, H, W, OW, oh, ow, n, g, _mm512_test_epi32_mask(r, one), _mm512_cmpge_epi32_mask(r, two));
    }
  }
  if (H > 2 * OH) memset(gx + 2 * OH * W, 0, sizeof(uint16_t) * (size_t)((H - 2 * OH) * W));
}

/* The bias grad's lanes of a plane of P, as sum_bias: value q in lane q % 16, the last P % 16 in lane 0 */
static void plane_lanes(const uint16_t *p, int64_t P, float *lanes) {
  __m512 acc = _mm512_setzero_ps();
  int64_t q = 0;
  for (; q + 16 <= P; q += 16)
    acc = _mm512_add_ps(acc, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(p + q))), 16)));
  _mm512_storeu_ps(lanes, acc);
  for (; q < P; q++) lanes[0] += convert_bf16_to_f32(p[q]);
}

static void fused_pool_chunk(const struct kiln_pool_fuse *f, const struct cg *g, int64_t n0, int64_t nb, const uint16_t *y) {
  int64_t PP = f->PH * f->PW;
  for (int64_t i = 0; i < nb; i++)
    for (int64_t o = 0; o < g->O; o++)
      relu_pool_plane(y + (i * g->O + o) * g->P, g->OH, f->PH, f->PW, g->OW, (uint16_t *)f->y + ((n0 + i) * g->O + o) * PP,
                      f->codes + ((n0 + i) * g->O + o) * PP);
}

static void fused_gyc(const struct kiln_pool_fuse *f, const struct cg *g, int64_t n0, int64_t nb, uint16_t *gyc) {
  int64_t PP = f->PH * f->PW, ld = nb * g->P;
  for (int64_t i = 0; i < nb; i++)
    for (int64_t o = 0; o < g->O; o++) {
      uint16_t *plane = gyc + o * ld + i * g->P;
      int64_t at = ((n0 + i) * g->O + o) * PP;
      relu_pool_back_plane((const uint16_t *)f->gp + at, f->codes + at, g->OH, f->PH, f->PW, g->OW, plane);
      if (f->lanes) plane_lanes(plane, g->P, f->lanes + ((n0 + i) * g->O + o) * 16);
    }
}

/* oneDNN's blocked layout: cpu/blocked_pool.h's passes in bf16 */
static void blocked_epilogue(void *ctx, int64_t n0, int64_t nb, const void *blocked) {
  kiln_blocked_pool_epilogue(1, ctx, n0, nb, blocked);
}
static void blocked_prologue(void *ctx, int64_t n0, int64_t nb, void *blocked) {
  kiln_blocked_pool_prologue(1, ctx, n0, nb, blocked);
}
#else
static void fused_pool_chunk(const struct kiln_pool_fuse *f, const struct cg *g, int64_t n0, int64_t nb, const uint16_t *y) {
  (void)f; (void)g; (void)n0; (void)nb; (void)y;
}
static void fused_gyc(const struct kiln_pool_fuse *f, const struct cg *g, int64_t n0, int64_t nb, uint16_t *gyc) {
  (void)f; (void)g; (void)n0; (void)nb; (void)gyc;
}
static void blocked_prologue(void *ctx, int64_t n0, int64_t nb, void *blocked) {
  (void)ctx; (void)n0; (void)nb; (void)blocked;
}
#endif

/* The backward; f: conv2d_relu_max_pool2d's (no gy: each chunk's or part's is made from the pooled
   grad, and the bias grad's lanes with it), else NULL. */
static int backward_bf16(const struct kiln_call *c, struct kiln_pool_fuse *f) {
  const struct kiln_conv_grads *out = c->extra;
  if (!f && dtype_ok("conv2d_backward", c->in[0])) return kiln_error_code();
  struct kiln_tensor *gy = f ? NULL : kiln_cpu_contiguous(c->in[0]), *x = NULL, *w = kiln_cpu_contiguous(c->in[2]), *bias = NULL;
  float *partials = NULL, *onednn_partials = NULL;
  int rc = KILN_OK;
  if ((!f && !gy) || !w) { rc = kiln_error_code(); goto done; }
  if ((out->gw || f) && c->in[1] && !(x = kiln_cpu_contiguous(c->in[1]))) { rc = kiln_error_code(); goto done; }
  if (!f && out->gx && c->in[3] && !(bias = kiln_cpu_contiguous(c->in[3]))) { rc = kiln_error_code(); goto done; }
  const struct kiln_tensor *xs = out->gx ? out->gx : x;
  struct cg g;
  cg_init(&g, c->ints, f ? xs->sizes[0] : gy->sizes[0], w->sizes[1] * c->ints[6], xs ? xs->sizes[2] : 0, xs ? xs->sizes[3] : 0, w,
          f ? w->sizes[0] : gy->sizes[1], f ? c->ints[KILN_CONV_INTS] : gy->sizes[2], f ? c->ints[KILN_CONV_INTS + 1] : gy->sizes[3]);
  /* fused, the bias grad alone: the weight grad's pass makes gy (its sum unused) */
  int want_gw = (out->gw || (f && !out->gx)) && x && g.N > 0 && g.P > 0, want_gx = out->gx && out->gx->numel > 0;
  int64_t HW = g.H * g.W, nchunks = g.N > 0 ? (g.N + g.nb - 1) / g.nb : 0;
  struct bwd_job j = {.g = &g, .gy = gy ? kiln_tensor_data(gy) : NULL, .x = x ? kiln_tensor_data(x) : NULL, .w = kiln_tensor_data(w),
                      .bias = bias ? kiln_tensor_data(bias) : NULL, .gx = want_gx ? kiln_tensor_data(out->gx) : NULL,
                      .nchunks = nchunks, .parts = nchunks < PARTS ? nchunks : PARTS, .fuse = f && f->columns ? f : NULL};
  if (want_gw) {
    partials = malloc(sizeof(float) * (size_t)(j.parts * g.K * g.O) + 64);
    if (!partials) { rc = kiln_fail(KILN_ERR_MEMORY, "conv2d_backward: out of memory for the grad-weight partials"); goto done; }
    j.partials = partials;
  }
  struct kiln_conv_job cj;
  conv_job(&cj, &g, j.x, j.w);
  if (f && f->columns) {   /* as the forward ran: the columns */
    if ((j.gx || j.partials) && (rc = backward_columns(&j))) goto done;
  } else if (g.P > 0 && (j.gx || j.partials) && !j.bias) {   /* oneDNN's bf16 kernels, or the columns (cpu/onednn.c) */
    cj.gy = j.gy; cj.gx = j.gx;
    if (want_gw && !(cj.partials = onednn_partials = malloc(sizeof(float) * (size_t)(cj.parts * g.K * g.O) + 64))) {
      rc = kiln_fail(KILN_ERR_MEMORY, "conv2d_backward: out of memory for the grad-weight partials");
      goto done;
    }
    cj.im2col = backward_columns; cj.ctx = &j;
    if (f) { cj.im2col = NULL; cj.prologue = blocked_prologue; cj.ctx = f; }
    if ((rc = kiln_cpu_conv_run(&cj)) == 1 && f)
      rc = kiln_fail(KILN_ERR_UNSUPPORTED, "conv2d_relu_max_pool2d backward: oneDNN no longer takes the shape of its forward");
    if (rc) goto done;
  } else if (g.P > 0 && (j.gx || j.partials) && (rc = backward_columns(&j))) {   /* conv_transpose2d's forward */
    goto done;
  }
  if (want_gx && g.P == 0) {   /* an empty output: grad input is the bias alone */
    for (int64_t i = 0; i < out->gx->numel; i++) j.gx[i] = j.bias ? j.bias[(i / HW) % g.C] : 0;
  }
  if (out->gw) {
    /* oneDNN's or Winograd's partials [parts][O][K] (Winograd's summed into the first), else the columns' [parts][K][O] */
    int theirs = cj.ran_onednn || cj.partials_summed;
    if (want_gw && (theirs || partials)) {   /* gw [O, K] from the partials, added in part order */
      struct bf16_sums sj = {.g = &g, .gy = j.gy, .gw = kiln_tensor_data(out->gw), .partials = theirs ? onednn_partials : partials,
                             .parts = cj.partials_summed ? 1 : cj.ran_onednn ? cj.parts : j.parts, .transposed = !theirs};
      kiln_parallel_for(g.O, 8, sum_weights, &sj);
    } else {
      kiln_cpu_fill(out->gw, 0);
    }
  }
  if (out->gb && f) {   /* the lanes of each image in order, in double, as sum_bias */
    uint16_t *gb = kiln_tensor_data(out->gb);
    for (int64_t o = 0; o < g.O; o++) {
      double sum = 0;
      for (int64_t n = 0; n < g.N; n++)
        for (int l = 0; l < 16; l++) sum += f->lanes[(n * g.O + o) * 16 + l];
      gb[o] = convert_f32_to_bf16((float)sum);
    }
  } else if (out->gb) {
    struct bf16_sums sj = {.g = &g, .gy = j.gy, .gb = kiln_tensor_data(out->gb)};
    kiln_parallel_for(g.O, 8, sum_bias, &sj);
  }
done:
  free(partials);
  free(onednn_partials);
  kiln_tensor_release(gy); kiln_tensor_release(x); kiln_tensor_release(w); kiln_tensor_release(bias);
  return rc;
}

int cpu_conv2d_backward_bf16(const struct kiln_call *c) { return backward_bf16(c, NULL); }

int cpu_conv2d_relu_pool_bf16(const struct kiln_call *c) {
  struct kiln_conv_pool *cp = (struct kiln_conv_pool *)c->extra;
  cp->taken = 0;
#if defined(__AVX512BW__)
  struct kiln_tensor *y = c->out;
  int64_t OH = c->ints[KILN_CONV_INTS], OW = c->ints[KILN_CONV_INTS + 1];
  /* even planes (the pooling's vector case), one group */
  if (y->numel == 0 || (OW & 1) || c->ints[6] != 1) return KILN_OK;
  struct kiln_tensor *x = kiln_cpu_contiguous(c->in[0]), *w = kiln_cpu_contiguous(c->in[1]);
  struct kiln_tensor *b = c->in[2] ? kiln_cpu_contiguous(c->in[2]) : NULL;
  int rc = KILN_OK;
  if (!x || !w || (c->in[2] && !b)) { rc = kiln_error_code(); goto done; }
  struct cg g;
  cg_init(&g, c->ints, x->sizes[0], x->sizes[1], x->sizes[2], x->sizes[3], w, y->sizes[1], OH, OW);
  struct kiln_pool_fuse f = {.O = g.O, .OH = OH, .OW = OW, .PH = y->sizes[2], .PW = y->sizes[3], .y = kiln_tensor_data(y)};
  struct kiln_conv_job cj;
  conv_job(&cj, &g, kiln_tensor_data(x), kiln_tensor_data(w));
  int way = kiln_cpu_conv_fused_way(&cj, cp->input_grad);   /* where the three ops' convolution would run */
  if (way < 0) goto done;
  f.columns = way == 1;
  int64_t ncodes = g.N * (f.columns ? g.O : (g.O + 15) / 16 * 16) * f.PH * f.PW;
  if (!(cp->codes = kiln_tensor_empty(1, &ncodes, KILN_U8, y->device))) { rc = kiln_error_code(); goto done; }
  f.codes = kiln_tensor_data(cp->codes);
  if (f.columns) {
    struct fwd_job j = {.g = &g, .x = kiln_tensor_data(x), .w = kiln_tensor_data(w), .b = b ? kiln_tensor_data(b) : NULL,
                        .input = x, .fuse = &f};
    rc = forward_columns(&j);
    cp->taken = rc == KILN_OK;
  } else {
    cj.bias = b ? kiln_tensor_data(b) : NULL; cj.epilogue = blocked_epilogue; cj.ctx = &f;
    rc = kiln_cpu_conv_run(&cj);
    if (rc == 1) rc = KILN_OK;
    else cp->taken = rc == KILN_OK;
  }
  cp->layout = f.columns;
  if (!cp->taken) { kiln_tensor_release(cp->codes); cp->codes = NULL; }
done:
  kiln_tensor_release(x); kiln_tensor_release(w); kiln_tensor_release(b);
  return rc;
#else
  return KILN_OK;   /* not taken below avx512 */
#endif
}

int cpu_conv2d_relu_pool_backward_bf16(const struct kiln_call *c) {
#if defined(__AVX512BW__)
  const struct kiln_conv_grads *out = c->extra;
  struct kiln_tensor *gp = kiln_cpu_contiguous(c->in[0]);
  if (!gp) return kiln_error_code();
  int64_t N = gp->sizes[0], O = gp->sizes[1];
  struct kiln_pool_fuse f = {.columns = (int)c->ints[KILN_CONV_INTS + 2], .O = O, .OH = c->ints[KILN_CONV_INTS],
                        .OW = c->ints[KILN_CONV_INTS + 1], .PH = gp->sizes[2], .PW = gp->sizes[3], .gp = kiln_tensor_data(gp),
                        .codes = kiln_tensor_data(c->in[3])};
  int rc = KILN_OK;
  if (out->gb && !(f.lanes = malloc(sizeof(float) * (size_t)(N * O * 16) + 64)))
    rc = kiln_fail(KILN_ERR_MEMORY, "conv2d_relu_max_pool2d backward: out of memory for the bias grad");
  if (!rc) rc = backward_bf16(c, &f);
  free(f.lanes);
  kiln_tensor_release(gp);
  return rc;
#else
  (void)c;
  return kiln_fail(KILN_ERR_UNSUPPORTED, "conv2d_relu_max_pool2d backward: no fused kernel at this instruction-set level");
#endif
}
