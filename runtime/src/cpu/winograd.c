/* cpu/winograd.c: f32 convolutions of 5x5 and 3x3 kernels (stride 1, no dilation, one group) by
   Winograd's minimal filtering, F(2x2, 5x5) and F(4x4, 3x3): both on 6x6 tiles of the input, with
   the interpolation points 0, 1, -1, 2, -2 and infinity. A tile's 36 products over the channels are
   36 matrix products over the whole batch, [tiles, C] x [C, O], where a direct convolution makes
   r*r*m*m per output tile: 2.78x fewer multiplications for 5x5 and 4x for 3x3. The price is
   rounding: the transforms' coefficients (up to 5 on the input, 1/24 on the weights, 8 on the
   output) lose a few bits, about 1e-6 to 1e-5 of the output's size against 1e-7 for a direct sum
   (docs/cpu.md has the measured figures).

   Every transform works on sixteen channels at once (a zmm), so the layouts keep channels last:
   the input as [tile element 36][tile][C], the products as [36][tile][O], the weights as
   [36][C][O]. Output and output grad pass through oneDNN's nChw16c (sixteen channels a position),
   which is what the fused convolution-relu-pool layer's epilogue and prologue read and write
   (cpu/blocked_pool.h), so that layer runs here as it runs on oneDNN.

   Backward: the output grad's transform is A g A^T; the input grad is B [U^T M'] B^T added into
   the tiles' overlapping places, the weight grad G^T [V^T M'] G, one product per tile element over
   all the batch's tiles. No partial sums by part: each element of every result is made by the same
   operations in the same order at any thread count (the threads share out images and tile
   elements, never a sum). The batch goes in chunks of whole parts when its buffers would pass
   CHUNK_BYTES; the weight grad's products then add chunk by chunk, in order.

   Compiled at every level, taken at the avx512 level only (kiln_cpu_winograd_takes). */
#include "cpu.h"
#include "convert.h"
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
#include "bf16x16.h"
#include "transpose16.h"
#include <immintrin.h>

enum { ALPHA = 6, TE = 36, PLANE_BYTES = 16 << 20, PART_BYTES = 64 << 20 };

/* B^T, A^T and G for the points 0, 1, -1, 2, -2, infinity; B^T's rows scaled to integers (by 4, 6,
   6, 24, 24, 1) and G's by the inverse, so that the products U V are unchanged */
static const float BT[6][6] = {{4, 0, -5, 0, 1, 0},  {0, 4, 4, -1, -1, 0}, {0, -4, 4, 1, -1, 0},
                               {0, -2, -1, 2, 1, 0}, {0, 2, -1, -2, 1, 0}, {0, 4, 0, -5, 0, 1}};
static const float AT2[2][6] = {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 1}};
static const float AT4[4][6] = {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}};
static const float G5[6][5] = {{1.0f / 4, 0, 0, 0, 0},
                               {1.0f / 6, 1.0f / 6, 1.0f / 6, 1.0f / 6, 1.0f / 6},
                               {1.0f / 6, -1.0f / 6, 1.0f / 6, -1.0f / 6, 1.0f / 6},
                               {1.0f / 24, 1.0f / 12, 1.0f / 6, 1.0f / 3, 2.0f / 3},
                               {1.0f / 24, -1.0f / 12, 1.0f / 6, -1.0f / 3, 2.0f / 3},
                               {0, 0, 0, 0, 1}};
static const float G3[6][3] = {{1.0f / 4, 0, 0},           {1.0f / 6, 1.0f / 6, 1.0f / 6}, {1.0f / 6, -1.0f / 6, 1.0f / 6},
                               {1.0f / 24, 1.0f / 12, 1.0f / 6}, {1.0f / 24, -1.0f / 12, 1.0f / 6}, {0, 0, 1}};

#define INLINE static inline __attribute__((always_inline))

/* sum_k coef[k * cs] * in[k * is], k < n, with the coefficients known when this is compiled: zero
   terms vanish, +-1 are an add or a subtract */
INLINE __m512 comb(const float *coef, int cs, int n, const __m512 *in, int is) {
  __m512 acc = _mm512_setzero_ps();
  int any = 0;
#pragma GCC unroll 8
  for (int k = 0; k < n; k++) {
    float c = coef[k * cs];
    if (c == 0) continue;
    __m512 v = in[k * is];
    if (!any) acc = c == 1 ? v : c == -1 ? _mm512_sub_ps(acc, v) : _mm512_mul_ps(_mm512_set1_ps(c), v);
    else acc = c == 1 ? _mm512_add_ps(acc, v) : c == -1 ? _mm512_sub_ps(acc, v) : _mm512_fmadd_ps(_mm512_set1_ps(c), v, acc);
    any = 1;
  }
  return acc;
}

/* out [ro][co] = L X R^T for X [ri][ci], L(i, k) = l[i * l0 + k * l1], R(j, q) = r[j * r0 + q * r1] */
INLINE void sandwich(__m512 *out, const __m512 *x, int ri, int ci, int ro, int co, const float *l, int l0, int l1,
                     const float *r, int r0, int r1) {
  __m512 t[ALPHA * ALPHA];
#pragma GCC unroll 8
  for (int i = 0; i < ro; i++)
#pragma GCC unroll 8
    for (int q = 0; q < ci; q++) t[i * ci + q] = comb(l + i * l0, l1, ri, x + q, ci);
#pragma GCC unroll 8
  for (int i = 0; i < ro; i++)
#pragma GCC unroll 8
    for (int j = 0; j < co; j++) out[i * co + j] = comb(r + j * r0, r1, ci, t + i * ci, 1);
}

struct wjob {
  struct kiln_conv_job *c;
  int m, r;                      /* F(m x m, r x r) */
  int64_t TH, TW, TT;            /* tiles per image: rows, columns, all */
  int64_t Cp, Op, Hp, Wp;        /* channels rounded up to 16; the zero-padded input plane */
  int64_t n0, T;                 /* the part being run: its first image, its tiles */
  int64_t VS, MS;                /* V's and M's planes (one per tile element) apart, in floats */
  float *U, *UT;                 /* [36][US] and [36][UTS]: the weights as kiln's GEMM panels of U [Cp][Op] and U^T */
  int64_t US, UTS;
  float *V, *M, *dU;             /* a part's [36][T][Cp] and [36][T][Op]; [parts][36][Cp][Op] */
  int64_t folded;                /* the parts' weight grads added into part 0's so far (atomic) */
  int failed, nonfinite;         /* out of memory; an infinity or NaN in the input or the weights */
  int bf;                        /* a bf16 job: x, w, bias, y, gy and gx in bf16, widened on the way in
                                    and rounded once on the way out; the weight grad in f32 */
};

/* whether elements [i0, i0 + n) of p (f32, or bf16 when bf) hold an infinity or a NaN (all exponent bits set) */
static int any_nonfinite(const void *p, int bf, int64_t i0, int64_t n) {
  uint32_t bad = 0;
  if (bf) {
    const uint16_t *u = (const uint16_t *)p + i0;
    for (int64_t i = 0; i < n; i++) bad |= (u[i] & 0x7f80u) == 0x7f80u;
  } else {
    const uint32_t *u = (const uint32_t *)p + i0;
    for (int64_t i = 0; i < n; i++) bad |= (u[i] & 0x7f800000u) == 0x7f800000u;
  }
  return bad != 0;
}

/* a blocked buffer of n f32 values <-> the same n values in bf16 at its start, in place (rounded,
   front to back; widened, back to front: neither overwrites what it has yet to read) */
static void blocked_round(float *blk, int64_t n) {
  uint16_t *o = (uint16_t *)blk;
  for (int64_t i = 0; i < n; i += 16) {
    __m512 v = _mm512_load_ps(blk + i);
    _mm256_storeu_si256((__m256i *)(o + i), kiln_bf16x16_round(v));
  }
}
static void blocked_widen(float *blk, int64_t n) {
  const uint16_t *h = (const uint16_t *)blk;
  for (int64_t i = n - 16; i >= 0; i -= 16) _mm512_store_ps(blk + i, kiln_bf16x16_load(0xffff, h + i));
}

static int64_t part_begin(const struct kiln_conv_job *c, int64_t t) { return t * c->N / c->parts; }
static void fail(struct wjob *j) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); }

/* c = op(a) op(b) + beta c, one thread: kiln's GEMM where it takes the shape, else the BLAS */
static void gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb,
                 float beta, float *c, int64_t ldc) {
  if (kiln_cpu_sgemm_here(m, n, k)) kiln_cpu_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
  else kiln_sgemm(ta, tb, (int)m, (int)n, (int)k, 1.0f, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* ---- the weights: U = G w G^T, and the weight grad G^T dU G ---- */

INLINE void weights_body(struct wjob *j, int r, const float *G, int64_t begin, int64_t end) {
  const struct kiln_conv_job *c = j->c;
  const float *w = c->w;
  const uint16_t *wb = c->w;
  int64_t C = c->C, O = c->O, rr = r * r;
  for (int64_t ch = begin; ch < end; ch++)
    for (int64_t o0 = 0; o0 < O; o0 += 16) {
      float lanes[25][16] __attribute__((aligned(64)));
      memset(lanes, 0, sizeof lanes);
      for (int64_t o = o0; o < O && o < o0 + 16; o++)
        for (int e = 0; e < rr; e++)
          lanes[e][o - o0] = j->bf ? convert_bf16_to_f32(wb[(o * C + ch) * rr + e]) : w[(o * C + ch) * rr + e];
      __m512 x[25], u[TE];
      for (int e = 0; e < rr; e++) x[e] = _mm512_load_ps(lanes[e]);
      sandwich(u, x, r, r, ALPHA, ALPHA, G, r, 1, G, r, 1);
      /* U's panel o0 / 64, row ch; U^T's panel ch / 64, rows o0.. (a lane a row) */
      for (int e = 0; e < TE; e++) _mm512_storeu_ps(j->U + e * j->US + (o0 / 64 * j->Cp + ch) * 64 + o0 % 64, u[e]);
      if (j->UT)
        for (int e = 0; e < TE; e++) {
          float l[16] __attribute__((aligned(64)));
          _mm512_store_ps(l, u[e]);
          float *t = j->UT + e * j->UTS + (ch / 64 * j->Op + o0) * 64 + ch % 64;
          for (int q = 0; q < 16; q++) t[q * 64] = l[q];
        }
    }
}
static void weights_in(void *ctx, int64_t begin, int64_t end) {
  struct wjob *j = ctx;
  if (j->r == 5) weights_body(j, 5, &G5[0][0], begin, end);
  else weights_body(j, 3, &G3[0][0], begin, end);
}

INLINE void grad_weights_body(struct wjob *j, int r, const float *G, float *gw, int64_t begin, int64_t end) {
  const struct kiln_conv_job *c = j->c;
  int64_t C = c->C, O = c->O, rr = r * r;
  for (int64_t ch = begin; ch < end; ch++)
    for (int64_t o0 = 0; o0 < O; o0 += 16) {
      __m512 du[TE], x[25];
      float lanes[25][16] __attribute__((aligned(64)));
      for (int e = 0; e < TE; e++) du[e] = _mm512_loadu_ps(j->dU + (e * j->Cp + ch) * j->Op + o0);
      sandwich(x, du, ALPHA, ALPHA, r, r, G, 1, r, G, 1, r);
      for (int e = 0; e < rr; e++) _mm512_store_ps(lanes[e], x[e]);
      for (int64_t o = o0; o < O && o < o0 + 16; o++)
        for (int e = 0; e < rr; e++) gw[(o * C + ch) * rr + e] = lanes[e][o - o0];
    }
}
struct gw_out { struct wjob *j; float *gw; };
static void weights_out(void *ctx, int64_t begin, int64_t end) {
  struct gw_out *g = ctx;
  if (g->j->r == 5) grad_weights_body(g->j, 5, &G5[0][0], g->gw, begin, end);
  else grad_weights_body(g->j, 3, &G3[0][0], g->gw, begin, end);
}

/* ---- the input: the zero-padded plane with channels last, then V = B^T d B a tile ---- */

/* Channel rows <-> channels-last vectors, sixteen by sixteen, transposed in registers; the rows'
   elements are f32, or bf16 when bf (widened on the way in, rounded on the way out). rows_in: nr
   rows (the rest zeros) of nc elements, from element at of base, rows rs apart -> nc vectors of
   sixteen lanes at dst, ds apart. rows_out: nc vectors at src, ss apart -> nr rows of nc elements
   from element at of base, rows ds apart. */
static inline void rows_in(int bf, const void *base, int64_t at, int64_t rs, int64_t nr, int64_t nc, float *dst, int64_t ds) {
  __mmask16 mask = (__mmask16)((1u << nc) - 1);
  __m512 v[16];
  for (int r = 0; r < 16; r++)
    v[r] = r >= nr ? _mm512_setzero_ps()
           : bf    ? kiln_bf16x16_load(mask, (const uint16_t *)base + at + r * rs)
                   : _mm512_maskz_loadu_ps(mask, (const float *)base + at + r * rs);
  transpose16(v);
  for (int64_t q = 0; q < nc; q++) _mm512_storeu_ps(dst + q * ds, v[q]);
}
static inline void rows_out(int bf, const float *src, int64_t ss, int64_t nc, void *base, int64_t at, int64_t ds, int64_t nr) {
  __mmask16 mask = (__mmask16)((1u << nc) - 1);
  __m512 v[16];
  for (int q = 0; q < 16; q++) v[q] = q < nc ? _mm512_loadu_ps(src + q * ss) : _mm512_setzero_ps();
  transpose16(v);
  for (int64_t r = 0; r < 16 && r < nr; r++)
    if (bf) _mm256_mask_storeu_epi16((uint16_t *)base + at + r * ds, mask, kiln_bf16x16_round(v[r]));
    else _mm512_mask_storeu_ps((float *)base + at + r * ds, mask, v[r]);
}
static int64_t upto16(int64_t n) { return n < 16 ? n : 16; }

static void plane_in(const struct wjob *j, int64_t n, float *xt) {
  const struct kiln_conv_job *c = j->c;
  int64_t C = c->C, H = c->H, W = c->W, Cp = j->Cp, Wp = j->Wp;
  memset(xt, 0, sizeof(float) * (size_t)(j->Hp * Wp * Cp));
  for (int64_t c0 = 0; c0 < C; c0 += 16)
    for (int64_t h = 0; h < H; h++)
      for (int64_t w0 = 0; w0 < W; w0 += 16)
        rows_in(j->bf, c->x, ((n * C + c0) * H + h) * W + w0, H * W, upto16(C - c0), upto16(W - w0),
                xt + ((h + c->ph) * Wp + w0 + c->pw) * Cp + c0, Cp);
}

INLINE void input_tiles(const struct wjob *j, int m, int64_t n, const float *xt) {
  int64_t Cp = j->Cp, Wp = j->Wp, t0 = (n - j->n0) * j->TT;
  for (int64_t ty = 0; ty < j->TH; ty++)
    for (int64_t tx = 0; tx < j->TW; tx++)
      for (int64_t cb = 0; cb < Cp; cb += 16) {
        __m512 d[TE], v[TE];
        const float *p = xt + (ty * m * Wp + tx * m) * Cp + cb;
        for (int a = 0; a < ALPHA; a++)
          for (int b = 0; b < ALPHA; b++) d[a * ALPHA + b] = _mm512_loadu_ps(p + (a * Wp + b) * Cp);
        sandwich(v, d, ALPHA, ALPHA, ALPHA, ALPHA, &BT[0][0], 6, 1, &BT[0][0], 6, 1);
        float *q = j->V + (t0 + ty * j->TW + tx) * Cp + cb;
        for (int e = 0; e < TE; e++) _mm512_storeu_ps(q + e * j->VS, v[e]);
      }
}

/* ---- the output: y = A^T M A a tile, plus the bias, into the blocked layout ---- */

INLINE void output_tiles(const struct wjob *j, int m, const float *AT, int64_t n, float *blk) {
  const struct kiln_conv_job *c = j->c;
  int64_t Op = j->Op, OH = c->OH, OW = c->OW, t0 = (n - j->n0) * j->TT;
  for (int64_t o0 = 0; o0 < Op; o0 += 16) {
    __m512 bias = _mm512_setzero_ps();
    __mmask16 bm = (__mmask16)(c->O - o0 >= 16 ? 0xffff : (1u << (c->O - o0)) - 1);
    if (c->bias) bias = j->bf ? kiln_bf16x16_load(bm, (const uint16_t *)c->bias + o0) : _mm512_maskz_loadu_ps(bm, (const float *)c->bias + o0);
    float *out = blk + o0 * OH * OW;
    for (int64_t ty = 0; ty < j->TH; ty++)
      for (int64_t tx = 0; tx < j->TW; tx++) {
        __m512 mm[TE], y[16];
        const float *q = j->M + (t0 + ty * j->TW + tx) * Op + o0;
        for (int e = 0; e < TE; e++) mm[e] = _mm512_loadu_ps(q + e * j->MS);
        sandwich(y, mm, ALPHA, ALPHA, m, m, AT, 6, 1, AT, 6, 1);
        for (int a = 0; a < m; a++)
          for (int b = 0; b < m; b++) {
            int64_t oy = ty * m + a, ox = tx * m + b;
            if (oy < OH && ox < OW) _mm512_store_ps(out + (oy * OW + ox) * 16, _mm512_add_ps(y[a * m + b], bias));
          }
      }
  }
}

/* ---- backward: M' = A g A^T a tile, from the blocked output grad ---- */

INLINE void grad_tiles(const struct wjob *j, int m, const float *AT, int64_t n, const float *blk) {
  const struct kiln_conv_job *c = j->c;
  int64_t Op = j->Op, OH = c->OH, OW = c->OW, t0 = (n - j->n0) * j->TT;
  for (int64_t o0 = 0; o0 < Op; o0 += 16) {
    const float *g = blk + o0 * OH * OW;
    for (int64_t ty = 0; ty < j->TH; ty++)
      for (int64_t tx = 0; tx < j->TW; tx++) {
        __m512 gv[16], mm[TE];
        for (int a = 0; a < m; a++)
          for (int b = 0; b < m; b++) {
            int64_t oy = ty * m + a, ox = tx * m + b;
            gv[a * m + b] = oy < OH && ox < OW ? _mm512_load_ps(g + (oy * OW + ox) * 16) : _mm512_setzero_ps();
          }
        sandwich(mm, gv, m, m, ALPHA, ALPHA, AT, 1, 6, AT, 1, 6);
        float *q = j->M + (t0 + ty * j->TW + tx) * Op + o0;
        for (int e = 0; e < TE; e++) _mm512_storeu_ps(q + e * j->MS, mm[e]);
      }
  }
}

/* the input grad of image n: B dV B^T a tile, added into the padded plane, then to NCHW */
INLINE void input_grad_tiles(const struct wjob *j, int m, int64_t n, float *xt) {
  const struct kiln_conv_job *c = j->c;
  int64_t Cp = j->Cp, Wp = j->Wp, t0 = (n - j->n0) * j->TT;
  memset(xt, 0, sizeof(float) * (size_t)(j->Hp * Wp * Cp));
  for (int64_t ty = 0; ty < j->TH; ty++)
    for (int64_t tx = 0; tx < j->TW; tx++)
      for (int64_t cb = 0; cb < Cp; cb += 16) {
        __m512 dv[TE], d[TE];
        const float *q = j->V + (t0 + ty * j->TW + tx) * Cp + cb;
        for (int e = 0; e < TE; e++) dv[e] = _mm512_loadu_ps(q + e * j->VS);
        sandwich(d, dv, ALPHA, ALPHA, ALPHA, ALPHA, &BT[0][0], 1, 6, &BT[0][0], 1, 6);
        float *p = xt + (ty * m * Wp + tx * m) * Cp + cb;
        for (int a = 0; a < ALPHA; a++)
          for (int b = 0; b < ALPHA; b++) {
            float *s = p + (a * Wp + b) * Cp;
            _mm512_storeu_ps(s, _mm512_add_ps(_mm512_loadu_ps(s), d[a * ALPHA + b]));
          }
      }
  /* the plane's channels back to NCHW rows, sixteen columns at a time */
  int64_t C = c->C, H = c->H, W = c->W;
  for (int64_t c0 = 0; c0 < C; c0 += 16)
    for (int64_t h = 0; h < H; h++)
      for (int64_t w0 = 0; w0 < W; w0 += 16)
        rows_out(j->bf, xt + ((h + c->ph) * Wp + w0 + c->pw) * Cp + c0, Cp, upto16(W - w0), c->gx,
                 ((n * C + c0) * H + h) * W + w0, H * W, C - c0);
}

/* ---- the passes, a part at a time (parts: c->parts, as every convolution path cuts the batch) ----
   A thread takes a part through every step, its tiles' V and M in its own buffers (in L2 for the
   benchmark CNN: 4 images of 16 tiles, 0.9 MB), the transformed weights U shared. */

static size_t blk_floats(const struct wjob *j, int64_t nb) { return (size_t)(nb * j->Op * j->c->OH * j->c->OW); }
static int64_t most_images(const struct kiln_conv_job *c) { return (c->N + c->parts - 1) / c->parts; }

/* blocked [nb][Op/16][OH][OW][16] <-> NCHW (elements from image n0 on; bf16 for a bf16 job), the
   padded channels zero */
static void to_blocked(const struct wjob *j, const void *src, int64_t n0, int64_t nb, float *blk) {
  int64_t O = j->c->O, P = j->c->OH * j->c->OW, Op = j->Op;
  for (int64_t i = 0; i < nb; i++)
    for (int64_t o0 = 0; o0 < Op; o0 += 16)
      for (int64_t p0 = 0; p0 < P; p0 += 16)
        rows_in(j->bf, src, ((n0 + i) * O + o0) * P + p0, P, O - o0, upto16(P - p0), blk + (i * Op + o0) * P + p0 * 16, 16);
}
static void from_blocked(const struct wjob *j, const float *blk, int64_t n0, int64_t nb, void *dst) {
  int64_t O = j->c->O, P = j->c->OH * j->c->OW, Op = j->Op;
  for (int64_t i = 0; i < nb; i++)
    for (int64_t o0 = 0; o0 < Op; o0 += 16)
      for (int64_t p0 = 0; p0 < P; p0 += 16)
        rows_out(j->bf, blk + (i * Op + o0) * P + p0 * 16, 16, upto16(P - p0), dst, ((n0 + i) * O + o0) * P + p0, P, O - o0);
}

/* a thread's buffers: its part's V and M (with its own plane strides), the padded plane, the blocked output */
struct wbuf { struct wjob w; float *xt, *blk; void *mem; };

static int wbuf_init(struct wbuf *b, const struct wjob *j) {
  b->w = *j;
  int64_t tiles = most_images(j->c) * j->TT;
  b->w.VS = tiles * j->Cp + 16 * 3;   /* planes a few lines more than a power of two apart: a tile's 36 */
  b->w.MS = tiles * j->Op + 16 * 5;   /* elements, read or written together, would share a cache set */
  size_t v = (size_t)(TE * b->w.VS), m = (size_t)(TE * b->w.MS), x = (size_t)(j->Hp * j->Wp * j->Cp), k = blk_floats(j, most_images(j->c));
  if (!(b->mem = kiln_cpu_scratch(sizeof(float) * (v + m + x + k + 64)))) return -1;
  b->w.V = b->mem;
  b->w.M = b->w.V + ((v + 15) & ~(size_t)15);
  b->xt = b->w.M + ((m + 15) & ~(size_t)15);
  b->blk = b->xt + ((x + 15) & ~(size_t)15);
  return 0;
}

static void forward_parts(void *ctx, int64_t begin, int64_t end) {
  struct wjob *j = ctx;
  struct kiln_conv_job *c = j->c;
  struct wbuf b;
  if (wbuf_init(&b, j)) { fail(j); return; }
  struct wjob *w = &b.w;
  for (int64_t t = begin; t < end; t++) {
    int64_t n0 = part_begin(c, t), nb = part_begin(c, t + 1) - n0;
    if (nb == 0) continue;
    w->n0 = n0;
    w->T = nb * j->TT;
    for (int64_t n = n0; n < n0 + nb; n++)
      if (any_nonfinite(c->x, j->bf, n * c->C * c->H * c->W, c->C * c->H * c->W)) {
        __atomic_store_n(&j->nonfinite, 1, __ATOMIC_RELAXED);
        free(b.mem);
        return;
      }
    for (int64_t n = n0; n < n0 + nb; n++) {
      plane_in(w, n, b.xt);
      if (j->m == 2) input_tiles(w, 2, n, b.xt);
      else input_tiles(w, 4, n, b.xt);
    }
    for (int64_t e = 0; e < TE; e++)
      kiln_cpu_sgemm_panels(KILN_BLAS_NO_TRANS, w->T, j->Op, j->Cp, 1.0f, w->V + e * w->VS, j->Cp, j->U + e * j->US, 0.0f,
                            w->M + e * w->MS, j->Op);
    for (int64_t n = n0; n < n0 + nb; n++) {
      float *o = b.blk + blk_floats(j, n - n0);
      if (j->m == 2) output_tiles(w, 2, &AT2[0][0], n, o);
      else output_tiles(w, 4, &AT4[0][0], n, o);
    }
    if (c->epilogue) {   /* a bf16 layer's epilogue reads bf16 lanes */
      if (j->bf) blocked_round(b.blk, (int64_t)blk_floats(j, nb));
      c->epilogue(c->ctx, n0, nb, b.blk);
    } else {
      from_blocked(j, b.blk, n0, nb, c->y);
    }
  }
  free(b.mem);
}

static void backward_parts(void *ctx, int64_t begin, int64_t end) {
  struct wjob *j = ctx;
  struct kiln_conv_job *c = j->c;
  struct wbuf b;
  if (wbuf_init(&b, j)) { fail(j); return; }
  struct wjob *w = &b.w;
  int64_t us = TE * j->Cp * j->Op;
  for (int64_t t = begin; t < end; t++) {
    int64_t n0 = part_begin(c, t), nb = part_begin(c, t + 1) - n0;
    float *dU = c->partials ? j->dU + t * us : NULL;
    if (nb == 0) {
      if (dU) memset(dU, 0, sizeof(float) * (size_t)us);
    } else {
      w->n0 = n0;
      w->T = nb * j->TT;
      if (c->prologue) {   /* a bf16 layer's prologue writes bf16 lanes */
        c->prologue(c->ctx, n0, nb, b.blk);
        if (j->bf) blocked_widen(b.blk, (int64_t)blk_floats(j, nb));
      } else {
        to_blocked(j, c->gy, n0, nb, b.blk);
      }
      for (int64_t n = n0; n < n0 + nb; n++) {
        const float *g = b.blk + blk_floats(j, n - n0);
        if (j->m == 2) grad_tiles(w, 2, &AT2[0][0], n, g);
        else grad_tiles(w, 4, &AT4[0][0], n, g);
        if (dU) {
          plane_in(w, n, b.xt);
          if (j->m == 2) input_tiles(w, 2, n, b.xt);
          else input_tiles(w, 4, n, b.xt);
        }
      }
      for (int64_t e = 0; e < TE; e++) {   /* the weight grad's product (reading V), then the input grad's, into V */
        float *V = w->V + e * w->VS, *M = w->M + e * w->MS;
        /* M' is the panel itself where O fills one (64 columns) */
        if (dU && j->Op == 64 && w->T <= KILN_SGEMM_PANEL_K)
          kiln_cpu_sgemm_panels(KILN_BLAS_TRANS, j->Cp, j->Op, w->T, 1.0f, V, j->Cp, M, 0.0f, dU + e * j->Cp * j->Op, j->Op);
        else if (dU)
          gemm(KILN_BLAS_TRANS, KILN_BLAS_NO_TRANS, j->Cp, j->Op, w->T, V, j->Cp, M, j->Op, 0, dU + e * j->Cp * j->Op, j->Op);
        if (c->gx) kiln_cpu_sgemm_panels(KILN_BLAS_NO_TRANS, w->T, j->Cp, j->Op, 1.0f, M, j->Op, j->UT + e * j->UTS, 0.0f, V, j->Cp);
      }
      if (c->gx)
        for (int64_t n = n0; n < n0 + nb; n++) {
          if (j->m == 2) input_grad_tiles(w, 2, n, b.xt);
          else input_grad_tiles(w, 4, n, b.xt);
        }
    }
    /* the next part of the weight grad's sum while this one is in cache: part t is added where
       parts 0..t-1 already are (in this thread, or in another before it); else at the join */
    if (dU && __atomic_load_n(&j->folded, __ATOMIC_ACQUIRE) == t) {
      if (t > 0) kiln_add_into(j->dU, dU, us);
      __atomic_store_n(&j->folded, t + 1, __ATOMIC_RELEASE);
    }
  }
  free(b.mem);
}

/* the parts' weight grads not added as they went, into part 0's, in part order */
static void sum_parts(void *ctx, int64_t begin, int64_t end) {
  const struct wjob *j = ctx;
  int64_t us = TE * j->Cp * j->Op;
  for (int64_t i0 = begin; i0 < end; i0 += 1024) {
    int64_t n = end - i0 < 1024 ? end - i0 : 1024;
    for (int64_t t = j->folded; t < j->c->parts; t++) kiln_add_into(j->dU + i0, j->dU + t * us + i0, n);
  }
}

int kiln_cpu_winograd_takes(const struct kiln_conv_job *c) {
  if ((c->dtype != KILN_F32 && c->dtype != KILN_BF16) || c->G != 1 || c->sh != 1 || c->sw != 1 || c->dh != 1 || c->dw != 1) return 0;
  if (c->kh != c->kw || (c->kh != 5 && c->kh != 3) || c->C < 16 || c->O < 16 || c->N <= 0) return 0;
  if (c->C > KILN_SGEMM_PANEL_K || c->O > KILN_SGEMM_PANEL_K) return 0;   /* the products' k: one panel block */
  if (c->OH <= 0 || c->OW <= 0) return 0;
  int m = c->kh == 5 ? 2 : 4;
  int64_t Hp = (c->OH + m - 1) / m * m + c->kh - 1, Wp = (c->OW + m - 1) / m * m + c->kw - 1;
  double Cp = (double)((c->C + 15) / 16 * 16), Op = (double)((c->O + 15) / 16 * 16);
  double tiles = (double)most_images(c) * (double)((c->OH + m - 1) / m) * (double)((c->OW + m - 1) / m);
  /* a thread's buffers: the padded plane, and its part's tiles' V and M (large images in large
     parts are left to the other paths rather than take hundreds of MB a thread) */
  return (double)Hp * (double)Wp * Cp * 4 <= PLANE_BYTES && tiles * TE * (Cp + Op) * 4 <= PART_BYTES;
}

int kiln_cpu_winograd_run(struct kiln_conv_job *c) {
  struct wjob j;
  memset(&j, 0, sizeof j);
  j.c = c;
  j.r = (int)c->kh;
  j.m = j.r == 5 ? 2 : 4;
  j.TH = (c->OH + j.m - 1) / j.m;
  j.TW = (c->OW + j.m - 1) / j.m;
  j.TT = j.TH * j.TW;
  j.Cp = (c->C + 15) / 16 * 16;
  j.Op = (c->O + 15) / 16 * 16;
  j.Hp = j.TH * j.m + j.r - 1;
  j.Wp = j.TW * j.m + j.r - 1;
  j.bf = c->dtype == KILN_BF16;
  int forward = c->y || c->epilogue, gw = !forward && c->partials, gx = !forward && c->gx;
  /* an infinity or a NaN in the forward's weights or input: not taken (1), for the other paths' results
     (a tile's transforms would spread it to the tile's every output, and make inf - inf a NaN) */
  if (forward && any_nonfinite(c->w, j.bf, 0, c->O * c->C * c->kh * c->kw)) return 1;
  j.US = (j.Op + 63) / 64 * j.Cp * 64;
  j.UTS = (j.Cp + 63) / 64 * j.Op * 64;
  size_t ub = sizeof(float) * (size_t)(TE * j.US), utb = gx ? sizeof(float) * (size_t)(TE * j.UTS) : 0;
  size_t db = gw ? sizeof(float) * (size_t)(TE * j.Cp * j.Op * c->parts) : 0;
  int rc = KILN_OK;
  j.U = forward || gx ? kiln_cpu_alloc(ub) : NULL;
  j.UT = gx ? kiln_cpu_alloc(utb) : NULL;
  j.dU = gw ? kiln_cpu_alloc(db) : NULL;
  if ((!j.U && (forward || gx)) || (gx && !j.UT) || (gw && !j.dU)) {
    rc = kiln_fail(KILN_ERR_MEMORY, "conv2d%s: out of memory for the Winograd buffers (%.1f MB)", forward ? "" : "_backward",
                   (double)(ub + utb + db) / 1e6);
    goto done;
  }
  if (j.U) {   /* zeros past C and O, and in the panels' columns past O */
    memset(j.U, 0, ub);
    if (j.UT) memset(j.UT, 0, utb);
    kiln_parallel_for(c->C, 4, weights_in, &j);
  }
  kiln_parallel_for(c->parts, 1, forward ? forward_parts : backward_parts, &j);
  if (j.nonfinite && !j.failed) {
    rc = 1;
    goto done;
  }
  if (j.failed) {
    rc = kiln_fail(KILN_ERR_MEMORY, "conv2d%s: out of memory for a Winograd tile buffer", forward ? "" : "_backward");
    goto done;
  }
  if (gw) {
    if (j.folded < c->parts) kiln_parallel_for(TE * j.Cp * j.Op, 16384, sum_parts, &j);
    struct gw_out g = {&j, c->gw ? (float *)c->gw : (float *)c->partials};
    kiln_parallel_for(c->C, 4, weights_out, &g);
    c->partials_summed = 1;
  }
done:
  if (j.U) kiln_cpu_free(j.U, ub);
  if (j.UT) kiln_cpu_free(j.UT, utb);
  if (j.dU) kiln_cpu_free(j.dU, db);
  return rc;
}

#else
int kiln_cpu_winograd_takes(const struct kiln_conv_job *c) { (void)c; return 0; }
int kiln_cpu_winograd_run(struct kiln_conv_job *c) {
  (void)c;
  return kiln_fail(KILN_ERR_UNSUPPORTED, "conv2d: no Winograd kernels at this instruction-set level");
}
#endif
