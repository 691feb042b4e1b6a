/* cpu/sgemm.c: kiln's own f32 GEMM at the avx512 and avx2 levels. op(B) is packed into panels of
   64 columns (four zmm) by up to KC rows, zero-padded (or, when it is one block of rows end to
   end of at most 1 MB, read where it lies: sgemm_drive); a micro-kernel keeps MR x 4 accumulators
   (MR = 6 rows of op(A), each element broadcast: from where it lies, or for a transposed A from a
   tile's rows packed first) and streams the panel from L1/L2, as the persistent recurrent path's
   products do. Each element of C is one sum over k in order, in blocks of KC added to C in order,
   whatever the threads and the part of C a thread computes: f32 products do not depend on the
   thread count. Measured on Zen 5 (1 thread, GFLOP/s, this kernel against OpenBLAS 0.3.21's
   Cooperlake (AVX-512) and Haswell (AVX2) kernels): 197-234 against 151-214 and 98-113 on the
   MLP's, CNN's and char-LM's products and 1024^3; at 2 threads 317-398 against 270-380. A product
   of one row (a vector times a matrix) is the BLAS's: packing the matrix would read it twice. The
   avx2 level's kernel (below) is the same scheme at 32 bytes. */
#include "cpu.h"
#include "convert.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Whether the f32 product [m, k] x [k, n] runs here rather than in the BLAS, decided once per
   product (before the pool splits it, so that the choice does not depend on the threads):
   KILN_SGEMM=kiln or blas forces it; else at the avx512 and avx2 levels when C has 2 rows or more
   and 16 columns or more (a narrower C fills a panel's vectors too thinly). */
int kiln_cpu_sgemm_here(int64_t m, int64_t n, int64_t k) {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  static int mode = -1;   /* 0 BLAS, 1 kiln, 2 by the shape */
  if (mode < 0) {
    const char *e = getenv("KILN_SGEMM");
    mode = e && strcmp(e, "kiln") == 0 ? 1 : e && strcmp(e, "blas") == 0 ? 0 : 2;
  }
  (void)k;
  return mode == 1 || (mode == 2 && m >= 2 && n >= 16);
#else
  (void)m; (void)n; (void)k;
  return 0;
#endif
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>

enum { MR = 6 };   /* rows of op(A) a tile, at both levels */

/* The calling thread's panels, kept between calls (each pool thread packs its own; at most a
   block of k by 64 columns, 512 KB at the avx512 level, or a short k's panels, 1 MB): a fresh one
   per call would be mapped and faulted in each time. A thread-specific key frees it when the thread ends (the pool's threads
   end when it is resized). */
static __thread float *panel_buf;
static __thread size_t panel_bytes;
static pthread_key_t panel_key;
static pthread_once_t panel_once = PTHREAD_ONCE_INIT;
static int panel_key_ok;

static void panel_key_make(void) { panel_key_ok = pthread_key_create(&panel_key, free) == 0; }

static float *panel_for(size_t bytes) {
  if (bytes > panel_bytes) {
    pthread_once(&panel_once, panel_key_make);
    if (!panel_key_ok) return NULL;   /* no key, no buffer that could leak: the BLAS does it */
    free(panel_buf);
    panel_buf = kiln_cpu_scratch(bytes);
    panel_bytes = panel_buf ? bytes : 0;
    pthread_setspecific(panel_key, panel_buf);
  }
  return panel_buf;
}

/* Element i of an f32 or (BF) bf16 operand, widened to f32; 8 of them from i on. */
static inline __attribute__((always_inline)) float ld1(const void *x, int64_t i, const int BF) {
  return BF ? convert_bf16_to_f32(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}
static inline __attribute__((always_inline)) __m256 ld8(const void *x, int64_t i, const int BF) {
  if (BF)
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)x + i))), 16));
  return _mm256_loadu_ps((const float *)x + i);
}

/* Rows p0.. p0 + kc of A^T (rows values each, ys_p apart; f32, or bf16 (BF) widened as packed)
   packed tile by tile, each tile's MR values at each k in order: ybuf[tile][p][r]. 16 rows of A^T
   at a time, so that each is read from start to end rather than a tile's few values from every
   row. */
static inline __attribute__((always_inline)) void rows_body(const void *y, int64_t ys_p, int64_t p0, int64_t kc,
                                                            int64_t rows, float *ybuf, const int BF) {
  for (int64_t q0 = 0; q0 < kc; q0 += 16) {
    int64_t q1 = kc - q0 < 16 ? kc : q0 + 16;
    for (int64_t i0 = 0; i0 < rows; i0 += MR) {
      int64_t src = p0 * ys_p + i0;
      float *dst = ybuf + i0 * kc;
      int64_t p = q0;
      /* 8 values a step where 8 are there, the last 2 rewritten by the tile's next k (so not at
         the block's last k) */
      if (i0 + 8 <= rows)
        for (; p < q1 && p + 1 < kc; p++) _mm256_storeu_ps(dst + p * MR, ld8(y, src + p * ys_p, BF));
      for (; p < q1; p++)
        for (int64_t r = 0; r < MR && i0 + r < rows; r++) dst[p * MR + r] = ld1(y, src + p * ys_p + r, BF);
    }
  }
}
static void pack_rows(const float *y, int64_t ys_p, int64_t p0, int64_t kc, int64_t rows, float *ybuf) {
  rows_body(y, ys_p, p0, kc, rows, ybuf, 0);
}
static void pack_any_rows(const void *y, int64_t ys_p, int64_t p0, int64_t kc, int64_t rows, float *ybuf, int bf) {
  if (bf) rows_body(y, ys_p, p0, kc, rows, ybuf, 1);
  else pack_rows(y, ys_p, p0, kc, rows, ybuf);
}

/* C[m, n] = alpha * op(A) op(B) + beta * C, row-major, as kiln_sgemm (CBLAS's arguments). */
void kiln_cpu_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  kiln_cpu_sgemm_ep(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, NULL);
}

#endif

#if defined(__AVX512F__)
#include "bf16x16.h"   /* bf16 operands and C (kiln_cpu_sgemm_bf16): widened, and rounded as convert.h rounds */
#include "transpose16.h"
#include <immintrin.h>

enum { PW = 64, KC = KILN_SGEMM_PANEL_K, C_TRANSPOSED = 1, DIRECT_B = 1 };   /* C_TRANSPOSED: the C^T path (below) */

/* 16 values of an f32 or (BF) bf16 operand from element i on, widened to f32 (mask: the lanes
   read). */
static inline __attribute__((always_inline)) __m512 ld16(const void *x, int64_t i, __mmask16 mask, const int BF) {
  if (BF)
    return kiln_bf16x16_load(mask, (const uint16_t *)x + i);
  return mask == 0xffff ? _mm512_loadu_ps((const float *)x + i) : _mm512_maskz_loadu_ps(mask, (const float *)x + i);
}

/* 16 rows of k by 16 columns of X (nr of them, zeros past) from column j on, X's columns along its
   rows (element (p, q) at x[q * sq + p], from p on): transposed in registers into dst[p][q], rows
   PW apart */
static inline __attribute__((always_inline)) void block16(const void *x, int64_t sq, int64_t p, int64_t j, int nr, float *dst,
                                                          const int BF) {
  __m512 v[16];
  for (int r = 0; r < 16; r++) v[r] = r < nr ? ld16(x, (j + r) * sq + p, 0xffff, BF) : _mm512_setzero_ps();
  transpose16(v);
  for (int r = 0; r < 16; r++) _mm512_storeu_ps(dst + r * PW, v[r]);
}

/* The panel of columns [j0, j0 + nc), rows [p0, p0 + kc) of a [k, n] operand X whose element
   (p, q) is x[p * sp + q * sq]: pb[p][q], zeros past nc. X is f32, or bf16 (BF) widened as it is
   packed (the same panel as packing its f32 copy). */
static inline __attribute__((always_inline)) void pack_body(const void *x, int64_t sp, int64_t sq, int64_t p0, int64_t kc,
                                                            int64_t j0, int64_t nc, float *pb, const int BF) {
  const int es = BF ? 2 : 4;
  if (sq == 1) {   /* rows along the columns: copied */
    for (int64_t p = 0; p < kc; p++) {
      float *dst = pb + p * PW;
      /* rows a leading dimension apart (4 KB for a 1024-wide weight) defeat the hardware's
         prefetch: the row 16 ahead asked for now, a line at a time */
      if (p + 16 < kc)
        for (int64_t q = 0; q < nc; q += 64 / es)
          _mm_prefetch((const char *)x + ((p0 + p + 16) * sp + j0 + q) * es, _MM_HINT_T0);
      int64_t at = (p0 + p) * sp + j0;
      if (nc == PW) {
        __m512 v0 = ld16(x, at, 0xffff, BF), v1 = ld16(x, at + 16, 0xffff, BF), v2 = ld16(x, at + 32, 0xffff, BF),
               v3 = ld16(x, at + 48, 0xffff, BF);
        _mm512_store_ps(dst, v0); _mm512_store_ps(dst + 16, v1); _mm512_store_ps(dst + 32, v2);
        _mm512_store_ps(dst + 48, v3);
        continue;
      }
      for (int64_t v = 0; v < PW; v += 16) {
        int64_t left = nc - v;
        __mmask16 mask = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        _mm512_store_ps(dst + v, mask ? ld16(x, at + v, mask, BF) : _mm512_setzero_ps());
      }
    }
    return;
  }
  /* columns along the rows: 16 x 16 blocks transposed in registers, the last one (fewer than 16
     columns left) with zero rows past nc, which zero the panel's columns past nc in the block; the
     vectors past it stored as zeros. (Those columns had been packed one by one and zeroed by a
     memset a row, which gcc makes a rep stos: a bf16 convolution's weight grad with 25 columns
     and 36864 rows of k spent most of its packing there. Emerald Rapids, 1 thread, medians of 30
     alternating in one process: the bf16 CNN step 10.68 -> 10.46 ms; f32 and the avx2 level
     level.) */
  if (sp == 1) {
    int64_t q = 0;
    for (; q < nc; q += 16) {
      const int nr = nc - q < 16 ? (int)(nc - q) : 16;
      int64_t p = 0;
      if (nr == 16)
        for (; p + 16 <= kc; p += 16) block16(x, sq, p0 + p, j0 + q, 16, pb + p * PW + q, BF);
      else
        for (; p + 16 <= kc; p += 16) block16(x, sq, p0 + p, j0 + q, nr, pb + p * PW + q, BF);
      for (; p < kc; p++)
        for (int r = 0; r < 16; r++) pb[p * PW + q + r] = r < nr ? ld1(x, (j0 + q + r) * sq + p0 + p, BF) : 0.0f;
    }
    if (q < PW) {
      __m512 z = _mm512_setzero_ps();
      __asm__("" : "+v"(z));   /* opaque: gcc would make the loop a memset, a rep stos a row */
      for (int64_t p = 0; p < kc; p++)
        for (int64_t v = q; v < PW; v += 16) _mm512_storeu_ps(pb + p * PW + v, z);
    }
    return;
  }
  for (int64_t q = 0; q < nc; q++)   /* neither along: element by element */
    for (int64_t p = 0; p < kc; p++) pb[p * PW + q] = ld1(x, (p0 + p) * sp + (j0 + q) * sq, BF);
  for (int64_t p = 0; p < kc && nc < PW; p++)
    for (int64_t v = nc; v < PW; v++) pb[p * PW + v] = 0.0f;
}

/* C^T's tile (buf[r][q] = alpha * the sums, r < nr rows of C^T, q < nc of its columns) into C:
   row q of C, at d + q * dqs, gets the nr values buf[.][q], = first ? v + beta * C : C + v, then
   the bias of C's columns added and relu, as tile() finishes its own. Each 16 of them transposed
   in registers; a row's nr values stored by plain stores of 4, 2 and 1 rather than one masked
   store (as fast on Emerald Rapids, and masked stores are slow on AMD's Zen). The tile itself is
   the plain one into a buffer: a k loop compiled for this layout of D kept its accumulators on
   the stack (the MLP step 1.4x slower). */
static __attribute__((noinline)) void tr_store(int nr, const float (*buf)[PW], float *d, int64_t dqs, int64_t nc, float beta,
                                               int first, const float *bias, int relu) {
  const __mmask16 rm = (__mmask16)((1u << nr) - 1);
  const __m512 zero = _mm512_setzero_ps(), vb = _mm512_set1_ps(beta);
  const __m512 bv = bias ? _mm512_maskz_loadu_ps(rm, bias) : zero;
  for (int64_t q0 = 0; q0 < nc; q0 += 16) {
    __m512 t[16];
    for (int r = 0; r < 16; r++) t[r] = r < nr ? _mm512_loadu_ps(&buf[r][q0]) : zero;
    transpose16(t);
    int lim = nc - q0 < 16 ? (int)(nc - q0) : 16;
    for (int l = 0; l < lim; l++) {
      float *o = d + (q0 + l) * dqs;
      __m512 y = t[l];
      if (!first) y = _mm512_add_ps(_mm512_maskz_loadu_ps(rm, o), y);
      else if (beta != 0) y = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(rm, o), y);
      if (bias) y = _mm512_add_ps(y, bv);
      if (relu) y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(y, zero, _CMP_LT_OQ), zero);
      __m128 lo = _mm512_castps512_ps128(y), hi = _mm512_extractf32x4_ps(y, 1);
      switch (nr) {
      case 6: _mm_storeu_ps(o, lo); _mm_storel_pi((__m64 *)(o + 4), hi); break;
      case 5: _mm_storeu_ps(o, lo); _mm_store_ss(o + 4, hi); break;
      case 4: _mm_storeu_ps(o, lo); break;
      case 3: _mm_storel_pi((__m64 *)o, lo); _mm_store_ss(o + 2, _mm_movehl_ps(lo, lo)); break;
      case 2: _mm_storel_pi((__m64 *)o, lo); break;
      default: _mm_store_ss(o, lo); break;
      }
    }
  }
}

/* D[r][q] for NR rows and nc columns, at d[r * drs + q] = first ? alpha * acc + beta * D : D +
   alpha * acc, where acc = the broadcast operand's NR rows (element (r, p) at a[r * ars + p *
   aps]) times the panel's kc rows (row p at pb + p * bps). beta == 0 reads nothing of D (it may
   hold NaN), as in the BLAS. */
static inline __attribute__((always_inline)) void tile(const int NR, const int NV, const float *a, int64_t ars,
                                                       int64_t aps, const float *pb, int64_t bps, int64_t kc, float *d,
                                                       int64_t drs, int64_t nc, float alpha, float beta, int first,
                                                       const float *bias, int relu, uint16_t *ob) {
  __m512 acc[MR][4];
#pragma GCC unroll 6
  for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
  const float *ar[MR];
#pragma GCC unroll 6
  for (int r = 0; r < NR; r++) ar[r] = a + r * ars;
  for (int64_t p = 0; p < kc; p++) {
    const float *bp = pb + p * bps;
    __m512 w[4];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) w[v] = _mm512_loadu_ps(bp + 16 * v);
    /* the panel's vectors loaded once for the NR rows (else gcc folds a load into every FMA) */
    if (NV > 0) __asm__("" : "+v"(w[0]));
    if (NV > 1) __asm__("" : "+v"(w[1]));
    if (NV > 2) __asm__("" : "+v"(w[2]));
    if (NV > 3) __asm__("" : "+v"(w[3]));
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++) {
      __m512 x = _mm512_set1_ps(ar[r][p * aps]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(x, w[v], acc[r][v]);
    }
  }
  __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  const __m512 zero = _mm512_setzero_ps();
  /* A whole tile stored, C not read (the usual case): the loop below, without its choices per vector,
     kept its accumulators on the stack (products with k = 128, Emerald Rapids: 145 -> 156 GFLOP/s) */
  if (first && beta == 0 && !ob && nc >= 16 * NV) {
    __m512 bv[4];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) bv[v] = bias ? _mm512_loadu_ps(bias + 16 * v) : zero;
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) {
        __m512 y = _mm512_mul_ps(va, acc[r][v]);
        if (bias) y = _mm512_add_ps(y, bv[v]);
        if (relu) y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(y, zero, _CMP_LT_OQ), zero);
        _mm512_storeu_ps(d + r * drs + 16 * v, y);
      }
    return;
  }
#pragma GCC unroll 6
  for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
      int64_t left = nc - 16 * v;
      __mmask16 mask = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
      __m512 y = _mm512_mul_ps(va, acc[r][v]);
      if (ob) {   /* a bf16 C (one block of k, so first): rounded once, as stored */
        uint16_t *o = ob + r * drs + 16 * v;
        if (left >= 16) {
          if (beta != 0) y = _mm512_fmadd_ps(vb, kiln_bf16x16_load(0xffff, o), y);
          _mm256_storeu_si256((__m256i *)o, kiln_bf16x16_round(y));
        } else {
          if (beta != 0) y = _mm512_fmadd_ps(vb, kiln_bf16x16_load(mask, o), y);
          _mm256_mask_storeu_epi16(o, mask, kiln_bf16x16_round(y));
        }
        continue;
      }
      float *o = d + r * drs + 16 * v;
      if (left >= 16) {   /* whole vectors unmasked: Zen's masked stores are slow */
        if (!first) y = _mm512_add_ps(_mm512_loadu_ps(o), y);
        else if (beta != 0) y = _mm512_fmadd_ps(vb, _mm512_loadu_ps(o), y);
        if (bias) y = _mm512_add_ps(y, _mm512_loadu_ps(bias + 16 * v));
        /* x < 0 ? 0 : x, as the relu op: NaN and -0 kept */
        if (relu) y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(y, zero, _CMP_LT_OQ), zero);
        _mm512_storeu_ps(o, y);
        continue;
      }
      if (!first) y = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, o), y);
      else if (beta != 0) y = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask, o), y);
      if (bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(mask, bias + 16 * v));
      if (relu) y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(y, zero, _CMP_LT_OQ), zero);
      _mm512_mask_storeu_ps(o, mask, y);
    }
}

/* One tile of nr <= MR rows by a panel of nv vectors: the constant shapes' kernels. tr: D is C^T
   (d[r + q * dqs]): the tile goes through a buffer, and tr_store writes it. */
static inline __attribute__((always_inline)) void tile_body(int nr, int nv, int tr, const float *a, int64_t ars,
                                                           int64_t aps, const float *pb, int64_t bps, int64_t kc, float *d,
                                                           int64_t drs, int64_t dqs, int64_t nc, float alpha, float beta,
                                                           int first, const float *bias, int relu, uint16_t *ob) {
  float buf[MR][PW];
  if (tr) memset(buf, 0, sizeof buf);   /* columns past nc are read by the transposes, not used */
#define KILN_TILE(R, V)                                                                           \
  case (R) * 8 + (V):                                                                             \
    if (tr) {                                                                                     \
      tile(R, V, a, ars, aps, pb, bps, kc, &buf[0][0], PW, nc, alpha, 0.0f, 1, NULL, 0, NULL);    \
      tr_store(R, buf, d, dqs, nc, beta, first, bias, relu);                                      \
    } else                                                                                        \
      tile(R, V, a, ars, aps, pb, bps, kc, d, drs, nc, alpha, beta, first, bias, relu, ob);       \
    return;
#define KILN_TILE_ROW(R) KILN_TILE(R, 1) KILN_TILE(R, 2) KILN_TILE(R, 3) KILN_TILE(R, 4)
  switch (nr * 8 + nv) {
    KILN_TILE_ROW(1) KILN_TILE_ROW(2) KILN_TILE_ROW(3) KILN_TILE_ROW(4) KILN_TILE_ROW(5) KILN_TILE_ROW(6)
  }
#undef KILN_TILE_ROW
#undef KILN_TILE
}
/* A read where it lies; and A packed by rows ([k][MR]), whose constant strides give the tiles
   constant offsets (as the avx2 level's strip_packed) */
static void tile_any(int nr, int nv, int tr, const float *a, int64_t ars, int64_t aps, const float *pb, int64_t bps,
                     int64_t kc, float *d, int64_t drs, int64_t dqs, int64_t nc, float alpha, float beta, int first,
                     const float *bias, int relu, uint16_t *ob) {
  if (ars == 1 && aps == MR)
    tile_body(nr, nv, tr, a, 1, MR, pb, bps, kc, d, drs, dqs, nc, alpha, beta, first, bias, relu, ob);
  else
    tile_body(nr, nv, tr, a, ars, aps, pb, bps, kc, d, drs, dqs, nc, alpha, beta, first, bias, relu, ob);
}

/* C[m, n] = alpha * op(A) B + beta * C where B comes packed as kiln_cpu_sgemm packs it, panels of
   64 columns [ceil(n / 64)][k][64] with zeros past n, k <= KILN_SGEMM_PANEL_K: for a B that serves
   many products (cpu/winograd.c's transformed weights, one packing a call instead of one a part).
   The same FMAs in the same order as kiln_cpu_sgemm: the same bits. */
void kiln_cpu_sgemm_panels(int ta, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *pb,
                           float beta, float *c, int64_t ldc) {
  int64_t as_i = ta == KILN_BLAS_NO_TRANS ? lda : 1, as_p = ta == KILN_BLAS_NO_TRANS ? 1 : lda;
  for (int64_t j0 = 0; j0 < n; j0 += PW) {
    int64_t nc = n - j0 < PW ? n - j0 : PW;
    const float *panel = pb + j0 / PW * k * PW;
    for (int64_t i0 = 0; i0 < m; i0 += MR) {
      int nr = m - i0 < MR ? (int)(m - i0) : MR;
      tile_any(nr, (int)((nc + 15) / 16), 0, a + i0 * as_i, as_i, as_p, panel, PW, k, c + i0 * ldc + j0, ldc, 1, nc, alpha,
               beta, 1, NULL, 0, NULL);
    }
  }
}
#elif defined(__AVX2__) && defined(__FMA__)
/* The avx2 level's kernel: panels of 64 columns, packed as four strips of 16 columns (two ymm), each
   strip contiguous; MR x 2 accumulators (12 of the 16 registers); k in blocks of 1024 (a tile's 6
   rows of A, 24 KiB, stay in L1 across the panel's four strips). A transposed A is packed a tile
   at a time, whatever n: read where it lies, a weight's grad ([1024, 2048] x [2048, 64] with A^T)
   ran at half speed. C is written directly (no C^T path: its transposed stores would need the
   avx512 level's masks). Emerald Rapids, one core at this level (GFLOP/s, against OpenBLAS 0.3.21's
   Haswell kernels in the same session): 64-82 against 64-80 on the MLP's, CNN's and char-LM's
   products and 1024^3; the core's ymm FMA peak is about 90. */
#include "transpose8.h"
#include <immintrin.h>
#include <math.h>

enum { PW = 64, SW = 16, KC = 1024, C_TRANSPOSED = 0, DIRECT_B = 0 };

/* bf16 operands and C (kiln_cpu_sgemm_bf16), as the avx512 level's: 8 values widened, 8 rounded to
   nearest even (a NaN made quiet). */
static inline __m256 widen8(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
static inline __m128i round8(__m256 y) {
  const __m256i u = _mm256_castps_si256(y), hi = _mm256_srli_epi32(u, 16);
  __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), _mm256_and_si256(hi, _mm256_set1_epi32(1)));
  r = _mm256_srli_epi32(r, 16);
  __m256i q = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  r = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), _mm256_cmp_ps(y, y, _CMP_UNORD_Q)));
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* pb = op(B)(p0 + p, j0 + q) for q < nc, zeros past nc, in strips of 16 columns, each strip
   contiguous: pb[q / 16][p][q % 16] (a strip is read from start to end, kc * 64 bytes). */
static inline float *at(float *pb, int64_t kc, int64_t p, int64_t q) { return pb + (q / SW) * kc * SW + p * SW + q % SW; }

/* X f32, or bf16 (BF) widened as it is packed. */
static inline __attribute__((always_inline)) void pack_body(const void *x, int64_t sp, int64_t sq, int64_t p0, int64_t kc,
                                                            int64_t j0, int64_t nc, float *pb, const int BF) {
  int64_t q = 0;
  if (nc % SW) {   /* the last strip's rows zeroed first, its columns then packed over them (a memset of
                      its columns past nc a row, which gcc makes a rep stos, costs several times more) */
    __m256 z = _mm256_setzero_ps();
    __asm__("" : "+x"(z));   /* opaque: gcc would make the loop a memset */
    float *last = at(pb, kc, 0, nc - nc % SW);
    for (int64_t p = 0; p < kc; p++) { _mm256_storeu_ps(last + p * SW, z); _mm256_storeu_ps(last + p * SW + 8, z); }
  }
  if (sq == 1) {
    for (int64_t p = 0; p < kc; p++) {
      int64_t i = (p0 + p) * sp + j0;
      for (q = 0; q + 8 <= nc; q += 8) _mm256_storeu_ps(at(pb, kc, p, q), ld8(x, i + q, BF));
      for (; q < nc; q++) *at(pb, kc, p, q) = ld1(x, i + q, BF);
    }
  } else {
    if (sp == 1)
      for (; q + 8 <= nc; q += 8) {
        int64_t p = 0;
        for (; p + 8 <= kc; p += 8) {
          __m256 v[8];
          for (int r = 0; r < 8; r++) v[r] = ld8(x, (j0 + q + r) * sq + p0 + p, BF);
          kiln_transpose8_store(v, at(pb, kc, p, q), SW);
        }
        for (; p < kc; p++)
          for (int r = 0; r < 8; r++) *at(pb, kc, p, q + r) = ld1(x, (j0 + q + r) * sq + p0 + p, BF);
      }
    for (; q < nc; q++)
      for (int64_t p = 0; p < kc; p++) *at(pb, kc, p, q) = ld1(x, (p0 + p) * sp + (j0 + q) * sq, BF);
  }
}

/* D[r][q] for NR rows and nc <= 16 columns of one strip (pb: the strip's first column), as the
   avx512 level's tile: first ? alpha * acc + beta * D : D + alpha * acc, then bias and relu. */
static inline __attribute__((always_inline)) void tile(const int NR, const int NV, const float *a, int64_t ars,
                                                       int64_t aps, const float *pb, int64_t kc, float *d, int64_t drs,
                                                       int64_t nc, float alpha, float beta, int first, const float *bias,
                                                       int relu, uint16_t *ob) {
  __m256 acc[MR][2];
#pragma GCC unroll 6
  for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
    for (int v = 0; v < NV; v++) acc[r][v] = _mm256_setzero_ps();
  const float *ar[MR];
#pragma GCC unroll 6
  for (int r = 0; r < NR; r++) ar[r] = a + r * ars;
#pragma GCC unroll 4
  for (int64_t p = 0; p < kc; p++) {
    const float *bp = pb + p * SW;
    __m256 w[2];
#pragma GCC unroll 2
    for (int v = 0; v < NV; v++) w[v] = _mm256_loadu_ps(bp + 8 * v);
    if (NV > 0) __asm__("" : "+x"(w[0]));
    if (NV > 1) __asm__("" : "+x"(w[1]));
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++) {
      __m256 x = _mm256_broadcast_ss(ar[r] + p * aps);
#pragma GCC unroll 2
      for (int v = 0; v < NV; v++) acc[r][v] = _mm256_fmadd_ps(x, w[v], acc[r][v]);
    }
  }
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta), zero = _mm256_setzero_ps();
#pragma GCC unroll 6
  for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
    for (int v = 0; v < NV; v++) {
      int64_t left = nc - 8 * v;
      __m256 y = _mm256_mul_ps(va, acc[r][v]);
      if (ob) {   /* a bf16 C (one block of k, so first): rounded once, as stored */
        uint16_t *o = ob + r * drs + 8 * v;
        if (left >= 8) {
          if (beta != 0) y = _mm256_fmadd_ps(vb, widen8(_mm_loadu_si128((const __m128i *)o)), y);
          _mm_storeu_si128((__m128i *)o, round8(y));
          continue;
        }
        float t[8];
        _mm256_storeu_ps(t, y);
        for (int64_t l = 0; l < left; l++) o[l] = convert_f32_to_bf16(beta != 0 ? fmaf(beta, convert_bf16_to_f32(o[l]), t[l]) : t[l]);
        continue;
      }
      float *o = d + r * drs + 8 * v;
      if (left >= 8) {
        if (!first) y = _mm256_add_ps(_mm256_loadu_ps(o), y);
        else if (beta != 0) y = _mm256_fmadd_ps(vb, _mm256_loadu_ps(o), y);
        if (bias) y = _mm256_add_ps(y, _mm256_loadu_ps(bias + 8 * v));
        /* x < 0 ? 0 : x, as the relu op: NaN and -0 kept */
        if (relu) y = _mm256_blendv_ps(y, zero, _mm256_cmp_ps(y, zero, _CMP_LT_OQ));
        _mm256_storeu_ps(o, y);
        continue;
      }
      float t[8];   /* a strip's last columns: one element at a time, the same operations */
      _mm256_storeu_ps(t, y);
      for (int64_t l = 0; l < left; l++) {
        float e = t[l];
        if (!first) e = o[l] + e;
        else if (beta != 0) e = fmaf(beta, o[l], e);
        if (bias) e = e + bias[8 * v + l];
        if (relu && e < 0) e = 0;
        o[l] = e;
      }
    }
}

static inline __attribute__((always_inline)) void strip_body(int nr, int nv, const float *a, int64_t ars, int64_t aps,
                                                            const float *pb, int64_t kc, float *d, int64_t drs, int64_t nc,
                                                            float alpha, float beta, int first, const float *bias, int relu,
                                                            uint16_t *ob) {
#define KILN_TILE(R, V)                                                                           \
  case (R) * 4 + (V):                                                                             \
    tile(R, V, a, ars, aps, pb, kc, d, drs, nc, alpha, beta, first, bias, relu, ob);              \
    return;
#define KILN_TILE_ROW(R) KILN_TILE(R, 1) KILN_TILE(R, 2)
  switch (nr * 4 + nv) {
    KILN_TILE_ROW(1) KILN_TILE_ROW(2) KILN_TILE_ROW(3) KILN_TILE_ROW(4) KILN_TILE_ROW(5) KILN_TILE_ROW(6)
  }
#undef KILN_TILE_ROW
#undef KILN_TILE
}

/* A strip's tile, A read where it lies; and A packed by rows ([k][MR]: the constant strides give the
   tiles constant offsets, which gcc found by itself only while nothing else changed the code, and
   without them the weight grads ran 6% slower). */
static void strip_any(int nr, int nv, const float *a, int64_t ars, int64_t aps, const float *pb, int64_t kc, float *d,
                      int64_t drs, int64_t nc, float alpha, float beta, int first, const float *bias, int relu,
                      uint16_t *ob) {
  strip_body(nr, nv, a, ars, aps, pb, kc, d, drs, nc, alpha, beta, first, bias, relu, ob);
}
static void strip_packed(int nr, int nv, const float *a, const float *pb, int64_t kc, float *d, int64_t drs, int64_t nc,
                         float alpha, float beta, int first, const float *bias, int relu, uint16_t *ob) {
  strip_body(nr, nv, a, 1, MR, pb, kc, d, drs, nc, alpha, beta, first, bias, relu, ob);
}

/* A tile of 6 rows by a panel's nc columns, as the avx512 level's tile_any: its strips of 16. C is
   written directly at this level (tr is 0: no C^T path, whose transposed stores would need the
   avx512 level's masks), so nv and dqs are not used. */
static void tile_any(int nr, int nv, int tr, const float *a, int64_t ars, int64_t aps, const float *pb, int64_t bps,
                     int64_t kc, float *d, int64_t drs, int64_t dqs, int64_t nc, float alpha, float beta, int first,
                     const float *bias, int relu, uint16_t *ob) {
  (void)nv; (void)tr; (void)dqs; (void)bps;
  for (int64_t s0 = 0; s0 < nc; s0 += SW) {
    int64_t sc = nc - s0 < SW ? nc - s0 : SW;
    float *ds = d ? d + s0 : NULL;
    const float *bs = bias ? bias + s0 : NULL;
    uint16_t *os = ob ? ob + s0 : NULL;
    if (ars == 1 && aps == MR)
      strip_packed(nr, (int)((sc + 7) / 8), a, pb + s0 * kc, kc, ds, drs, sc, alpha, beta, first, bs, relu, os);
    else
      strip_any(nr, (int)((sc + 7) / 8), a, ars, aps, pb + s0 * kc, kc, ds, drs, sc, alpha, beta, first, bs, relu, os);
  }
}

#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
/* The level's panel of an f32 or bf16 (bf) operand. */
static void pack_any_panel(const void *x, int64_t sp, int64_t sq, int64_t p0, int64_t kc, int64_t j0, int64_t nc,
                           float *pb, int bf) {
  if (bf) pack_body(x, sp, sq, p0, kc, j0, nc, pb, 1);
  else pack_body(x, sp, sq, p0, kc, j0, nc, pb, 0);
}

/* The product, with ep (or NULL) done to each element as the last block of k stores it: one driver
   for both levels, over their pack_panel and tile_any. bf: A and B are bf16 (no ep, alpha != 0),
   each value widened as it is packed (a broadcast operand widened first, row by row); bf16_c: so is
   C (k <= KC), rounded once as its tiles are stored. 0, or -1 where a bf16 product found no memory
   for its buffers. */
static int sgemm_drive(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const void *a, int64_t lda,
                       const void *b, int64_t ldb, float beta, void *cv, int64_t ldc, const struct kiln_sgemm_ep *ep, int bf,
                       int bf16_c) {
  if (m <= 0 || n <= 0) return 0;
  int64_t kc0 = k < KC ? k : KC;
  float *c = bf16_c ? NULL : cv;
  uint16_t *c16 = bf16_c ? cv : NULL;
  const float *bias = ep ? ep->bias : NULL;
  int relu = ep ? ep->relu : 0;
  /* op(A)(i, p) at a[i * as_i + p * as_p], op(B)(p, j) at b[p * bs_p + j * bs_j] */
  int64_t as_i = ta == KILN_BLAS_NO_TRANS ? lda : 1, as_p = ta == KILN_BLAS_NO_TRANS ? 1 : lda;
  int64_t bs_p = tb == KILN_BLAS_NO_TRANS ? ldb : 1, bs_j = tb == KILN_BLAS_NO_TRANS ? 1 : ldb;
  /* The packed operand: op(B) [k, n] for C, op(A) broadcast from where it lies; or op(A)^T [k, m]
     for C^T = op(B)^T op(A)^T when B is stored [n, k] (rows of op(B)^T read along) and C has a
     quarter as many rows as columns or fewer: a batch of 32 against a 1024 x 1024 weight (a
     Linear's forward) packs the batch, not the weight (Zen 5: 112 -> 154 GFLOP/s). Since C^T's
     tiles are written transposed in registers (tr_store), a quarter rather than a sixteenth
     (Emerald Rapids, 1 thread, against the sixteenth with the scalar loop before: [128, 784] x
     [784, 512] 0.94-0.95 of the time, [64, 1024] x [1024, 1024] 0.95, [16, 256] x [256, 1024]
     0.83-0.87; half as many: mixed, 0.96-1.03). Either way each element of C is the same FMAs in
     the same order: the same bits. Not for bf16 operands, whose broadcast operand is widened in a
     pass of its own: there the smaller one is broadcast (1 thread, GFLOP/s: [16, 256] x [256, 1024] 72 -> 92,
     [128, 784] x [784, 512] 141 -> 152, [64, 1024] x [1024, 1024] 122 -> 138). */
  int tr = C_TRANSPOSED && !bf && tb == KILN_BLAS_TRANS && 4 * m <= n;
  const void *x = tr ? a : b, *y = tr ? b : a;
  int64_t xs_p = tr ? as_p : bs_p, xs_q = tr ? as_i : bs_j, ys_r = tr ? bs_j : as_i, ys_p = tr ? bs_p : as_p;
  int64_t rows = tr ? n : m, cols = tr ? m : n, drs = tr ? 1 : ldc, dqs = tr ? ldc : 1;
  /* A short k (k <= 256: a layer's input of 64 features, a weight's grad over a batch of 128):
     every panel of op(B) packed first (up to 1 MB, in L2), then C by rows of tiles, so that a tile
     row's MR rows of C are written along (each row of C its own page: panel by panel, a panel's
     tiles touched a new page each. Emerald Rapids, 1 thread, medians of 19 alternating in one
     quiet process: [2048, 64] x [64, 1024] with B^T 102-105 -> 132-136 GFLOP/s, [512, 128] x
     [128, 784] with A^T 124-125 -> 145, [784, 128] x [128, 512] 127 -> 142; at the avx2 level the
     first 69-70 -> 76, the rest level; the same bits). */
  int64_t np = (cols + PW - 1) / PW;
  /* op(B) read where it lies, not packed, when it is one block of rows end to end (B not
     transposed, its rows exactly C's columns: a whole matrix, not a thread's share of its columns)
     of whole vectors, for the products whose panels would all be packed first (whole), which are
     then at most 1 MB and stay in L2 for every row of tiles, streamed as a packed panel would be
     (Emerald Rapids, 1 thread, GFLOP/s, medians of 15 alternating in one process: [128, 256] x
     [256, 512] 115 -> 133, [256, 128] x [128, 512] with A^T 136 -> 144, [512, 128] x [128, 784]
     with A^T 141 -> 146, [300, 200] x [200, 320] 148 -> 154; the MLP step 0.972-0.988 of its time;
     the same FMAs in the same order, so the same bits). A thread's share of B's columns stays
     packed: read in place, the MLP step at 2 threads took 1.04-1.05 times as long. So does a B of
     more than 1 MB, walked panel by panel, whose rows read in place come from L3 for every tile
     ([96, 2048] x [2048, 256] with A^T 117 -> 82). */
  int in_place = DIRECT_B && !bf && !tr && xs_q == 1 && xs_p == cols && cols % 16 == 0 && k > 0;
  /* A B read in place of at most 1 MB goes by rows of tiles whatever its k (up to 2048 by that
     bound), so that a tile row's rows of A are read once for every panel rather than once a panel
     (1 thread, medians of 11 alternating: [512, 512] x [512, 512] 150 -> 163 GFLOP/s, [256, 1024]
     x [1024, 128] 158 -> 171, [64, 1024] x [1024, 256] 137 -> 149, [1024, 1024] x [1024, 256] 140
     -> 148; 2 threads 1.00-1.08x; k in one block either way, so the same bits). */
  int whole = (k <= 256 || in_place) && np > 1 && (double)k * (double)(np * PW) * 4 <= 1 << 20;
  int direct = in_place && whole;
  float *pb = k > 0 && !direct ? panel_for(sizeof(float) * (size_t)((whole ? np : 1) * kc0 * PW)) : NULL;
  if (bf && (!pb || alpha == 0)) return -1;   /* the caller has seen to alpha */
  if ((!pb && !direct) || alpha == 0) {   /* no memory for a panel, or no products (C = beta C, A and B
                                              not read, as the BLAS does: NaN in them does not reach C):
                                              the BLAS does it */
    kiln_sgemm(ta, tb, (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
    if (ep) kiln_cpu_linear_finish(KILN_F32, m, n, c, ldc, ep->bias, ep->relu);
    return 0;
  }
  /* A broadcast operand whose rows lie side by side (op(A) = A^T: element (r, p) at y[r + p * ys_p])
     touches a new cache line and page every k for a tile's few rows, once per panel of columns:
     each tile's rows of the block go packed [k][MR] first (the same values, so the same FMAs in
     the same order), up to 16 MB (Emerald Rapids, 1 thread, 1024^3 with A^T: 60-72 -> 134-136
     GFLOP/s; plain A 131-154). Packed against fewer than 8 panels too (a weight's grad over a
     long batch, as above: [1024, 2048] x [2048, 64] with A^T 44 -> 62, [1024, 2048] x [2048, 256]
     41 -> 87-94, [256, 2048] x [2048, 96] 55 -> 89-93), 16 rows of A^T at a time, each read from
     start to end. */
  int pack_y = ys_r == 1 && ys_p > 1 && rows >= MR && (double)rows * (double)kc0 * 4 <= 16e6;
  float *ybuf = pack_y ? malloc(sizeof(float) * (size_t)(((rows + MR - 1) / MR) * MR * kc0) + 64) : NULL;
  /* a bf16 broadcast operand not packed by rows: widened first into rows of k */
  float *yw = NULL;
  if (bf && !ybuf) {
    if (!(yw = malloc(sizeof(float) * (size_t)(rows * k)))) return -1;
    const uint16_t *y16 = y;
    for (int64_t r = 0; r < rows; r++)
      if (ys_p == 1) convert_vectorised(yw + r * k, KILN_F32, y16 + r * ys_r, KILN_BF16, k);
      else
        for (int64_t p = 0; p < k; p++) yw[r * k + p] = convert_bf16_to_f32(y16[r * ys_r + p * ys_p]);
    ys_r = k;
    ys_p = 1;
  }
  /* the tile of C at (i0, j0) for the block of k at p0 (kc rows), its panel at panel, bps apart a
     row of k (PW when packed, B's own row stride when read in place) */
#define KILN_SGEMM_TILE(i0, j0, p0, kc, panel, bps)                                                          \
  do {                                                                                                     \
    int64_t nc_ = cols - (j0) < PW ? cols - (j0) : PW;                                                     \
    int nr_ = rows - (i0) < MR ? (int)(rows - (i0)) : MR, nv_ = (int)((nc_ + 15) / 16), last_ = (p0) + (kc) >= k; \
    /* the bias of a tile's columns of C: D's columns, or its rows when D is C^T */                       \
    const float *tb_bias = last_ && bias ? bias + (tr ? (i0) : (j0)) : NULL;                               \
    float *d_ = c ? c + (i0) * drs + (j0) * dqs : NULL;                                                  \
    uint16_t *ob_ = c16 ? c16 + (i0) * drs + (j0) * dqs : NULL;                                          \
    if (ybuf)                                                                                              \
      tile_any(nr_, nv_, tr, ybuf + (i0) * (kc), 1, MR, panel, bps, kc, d_, drs, dqs, nc_, alpha, beta, (p0) == 0, \
               tb_bias, last_ && relu, ob_);                                                               \
    else                                                                                                   \
      tile_any(nr_, nv_, tr, yf + (i0) * ys_r + (p0) * ys_p, ys_r, ys_p, panel, bps, kc, d_, drs, dqs, nc_, alpha, \
               beta, (p0) == 0, tb_bias, last_ && relu, ob_);                                              \
  } while (0)
  const float *yf = bf ? yw : y;
  if (whole) {   /* B's panels where they lie (direct) or all packed first; C by rows of tiles */
    if (ybuf) pack_any_rows(y, ys_p, 0, k, rows, ybuf, bf);
    for (int64_t j0 = 0; j0 < cols && !direct; j0 += PW)
      pack_any_panel(x, xs_p, xs_q, 0, k, j0, cols - j0 < PW ? cols - j0 : PW, pb + j0 / PW * k * PW, bf);
    const float *b0 = direct ? (const float *)x : pb;
    int64_t bstep = direct ? 1 : k, bps = direct ? xs_p : PW;   /* panel j0 at b0 + j0 * bstep */
    for (int64_t i0 = 0; i0 < rows; i0 += MR)
      for (int64_t j0 = 0; j0 < cols; j0 += PW) KILN_SGEMM_TILE(i0, j0, 0, k, b0 + j0 * bstep, bps);
  } else
    for (int64_t p0 = 0; p0 < k; p0 += KC) {
      int64_t kc = k - p0 < KC ? k - p0 : KC;
      if (ybuf) pack_any_rows(y, ys_p, p0, kc, rows, ybuf, bf);
      for (int64_t j0 = 0; j0 < cols; j0 += PW) {
        pack_any_panel(x, xs_p, xs_q, p0, kc, j0, cols - j0 < PW ? cols - j0 : PW, pb, bf);
        for (int64_t i0 = 0; i0 < rows; i0 += MR) KILN_SGEMM_TILE(i0, j0, p0, kc, pb, PW);
      }
    }
#undef KILN_SGEMM_TILE
  free(ybuf);
  free(yw);
  return 0;
}

void kiln_cpu_sgemm_ep(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                       const float *b, int64_t ldb, float beta, float *c, int64_t ldc, const struct kiln_sgemm_ep *ep) {
  sgemm_drive(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ep, 0, 0);
}

int kiln_cpu_sgemm_bf16_here(int64_t m, int64_t n, int64_t k, float alpha, int bf16_c) {
  return k >= 1 && (k <= KC || !bf16_c) && alpha != 0 && kiln_cpu_sgemm_here(m, n, k);
}

int kiln_cpu_sgemm_bf16(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a, int64_t lda,
                        const uint16_t *b, int64_t ldb, float beta, void *c, int64_t ldc, int bf16_c) {
  return sgemm_drive(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, NULL, 1, bf16_c);
}
#else
void kiln_cpu_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  kiln_sgemm(ta, tb, (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}
void kiln_cpu_sgemm_ep(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                       const float *b, int64_t ldb, float beta, float *c, int64_t ldc, const struct kiln_sgemm_ep *ep) {
  kiln_sgemm(ta, tb, (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
  if (ep) kiln_cpu_linear_finish(KILN_F32, m, n, c, ldc, ep->bias, ep->relu);
}
int kiln_cpu_sgemm_bf16_here(int64_t m, int64_t n, int64_t k, float alpha, int bf16_c) {
  (void)m; (void)n; (void)k; (void)alpha; (void)bf16_c;
  return 0;
}
int kiln_cpu_sgemm_bf16(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a, int64_t lda,
                        const uint16_t *b, int64_t ldb, float beta, void *c, int64_t ldc, int bf16_c) {
  (void)ta; (void)tb; (void)m; (void)n; (void)k; (void)alpha; (void)a; (void)lda; (void)b; (void)ldb; (void)beta; (void)c;
  (void)ldc; (void)bf16_c;
  return -1;   /* never called: kiln_cpu_sgemm_bf16_here says no */
}
#endif
