/* cpu/bf16_rnn.c: the bf16 products of the persistent recurrent path (cpu/rnn.c, a layer whose
   input is bf16, as autocast("bf16") makes it): y[b] = x[b] W for a weight matrix W packed once per
   sequence into panels of bf16 pairs (panel p, pair row kk, column c: W[2kk][c] in the low half,
   W[2kk+1][c] in the high half, zeros past K and n), each step's rows x[b] in bf16 read as pairs,
   f32 sums.

   With AVX512-BF16, where it is faster than f32 FMAs (kiln_cpu_bf16_products_native), a panel is
   64 columns and vdpbf16ps adds each pair's two products into 16 f32 lanes, 4 sequences x 4
   vectors at a time. Without it (or with KILN_BF16_EMULATE=1) a panel is the level's 4 vectors of f32 lanes, each
   step's rows are widened to f32 once for all the panels, and the same sums are made
   with f32 arithmetic in vdpbf16ps's order: for each pair the odd product, then the even one, each
   added with one rounding to nearest even (a product of two bf16 values is exact in f32, so an
   FMA, or a multiply and an add, round once), subnormal inputs and results taken as zero (MXCSR's
   DAZ and FTZ while the products run). So the emulated products are the native ones, bit for bit
   (the baseline level, which has no FMA, may differ where a single product is below 2^-126). */
#include "cpu.h"
#include "convert.h"
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include "transpose8.h"
#include <immintrin.h>
#endif

/* the emulation's vectors: the level's own, as in cpu/rnn.c */
#if defined(__AVX512F__)
#define EVEC 64
#define EBLOCK 4
#elif defined(__AVX__)
#define EVEC 32
#define EBLOCK 2
#else
#define EVEC 16
#define EBLOCK 2
#endif
enum { ELANES = EVEC / 4, EPW = 4 * ELANES, NPW = 64 };

typedef float ev_f32 __attribute__((vector_size(EVEC)));
typedef uint32_t ev_u32 __attribute__((vector_size(EVEC)));

/* vdpbf16ps where the CPU runs it faster than the emulation's f32 FMAs (not Sapphire and Emerald
   Rapids, where the emulation takes about 0.55-0.7x its time) */
int64_t kiln_cpu_rnn_bf16_panel(void) { return kiln_cpu_bf16_products_native() ? NPW : EPW; }

static inline uint16_t to_bf16(int sdt, const void *src, int64_t i) {
  return sdt == KILN_BF16 ? ((const uint16_t *)src)[i] : convert_f32_to_bf16(((const float *)src)[i]);
}

void kiln_cpu_rnn_bf16_round(uint16_t *dst, const void *src, int sdt, int64_t n) {
  if (sdt == KILN_BF16) { if (n > 0) memcpy(dst, src, sizeof(uint16_t) * (size_t)n); return; }
  const float *s = src;
  for (int64_t i = 0; i < n; i++) dst[i] = convert_f32_to_bf16(s[i]);
}

void kiln_cpu_rnn_bf16_pack_rows(uint32_t *packed, int64_t n, int64_t K, const void *src, int sdt, int64_t ld) {
  const int64_t PW = kiln_cpu_rnn_bf16_panel(), kp = (K + 1) / 2, np = (n + PW - 1) / PW;
  for (int64_t p = 0; p < np; p++) {
    int64_t c0 = p * PW, m = n - c0 < PW ? n - c0 : PW;
    for (int64_t kk = 0; kk < kp; kk++) {
      uint32_t *row = packed + (p * kp + kk) * PW;
      int64_t k0 = 2 * kk, k1 = 2 * kk + 1;
      if (k1 < K && sdt == KILN_F32) {
        const float *a = (const float *)src + k0 * ld + c0, *b = (const float *)src + k1 * ld + c0;
        for (int64_t c = 0; c < m; c++) row[c] = (uint32_t)convert_f32_to_bf16(a[c]) | (uint32_t)convert_f32_to_bf16(b[c]) << 16;
      } else if (k1 < K) {
        const uint16_t *a = (const uint16_t *)src + k0 * ld + c0, *b = (const uint16_t *)src + k1 * ld + c0;
        for (int64_t c = 0; c < m; c++) row[c] = (uint32_t)a[c] | (uint32_t)b[c] << 16;
      } else {
        for (int64_t c = 0; c < m; c++) row[c] = to_bf16(sdt, src, k0 * ld + c0 + c);
      }
      for (int64_t c = m; c < PW; c++) row[c] = 0;
    }
  }
}

#if defined(__AVX__)
/* dst[i * ld + r] = rows[r * lr + i] for an 8 x 8 block of 32-bit words (a pair each) */
static inline void transpose8_u32(uint32_t *dst, int64_t ld, const uint32_t *rows, int64_t lr) {
  __m256 r[8];
  for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps((const float *)(rows + i * lr));
  kiln_transpose8_store(r, (float *)dst, ld);
}
#endif

void kiln_cpu_rnn_bf16_pack_cols(uint32_t *packed, int64_t n, int64_t kp, const uint32_t *rows, int64_t ld) {
  const int64_t PW = kiln_cpu_rnn_bf16_panel(), np = (n + PW - 1) / PW;
  for (int64_t p = 0; p < np; p++) {
    int64_t c0 = p * PW, m = n - c0 < PW ? n - c0 : PW, k0 = 0;
    uint32_t *panel = packed + p * kp * PW;
#if defined(__AVX__)
    if (m == PW)   /* 8 source rows read along, 8 packed rows written whole */
      for (; k0 + 8 <= kp; k0 += 8)
        for (int64_t v0 = 0; v0 < PW; v0 += 8) transpose8_u32(panel + k0 * PW + v0, PW, rows + (c0 + v0) * ld + k0, ld);
#endif
    for (int64_t kk = k0; kk < kp; kk++)
      for (int64_t c = 0; c < PW; c++) panel[kk * PW + c] = c < m ? rows[(c0 + c) * ld + kk] : 0;
  }
}

/* The accumulators of one row (4 vectors of `lanes` floats in acc) into y + out: m columns, f32 or
   bf16 (rounded to nearest even by convert_f32_to_bf16 in both paths, so that they agree). */
static inline __attribute__((always_inline)) void store_row(const float *acc, int64_t m, void *y, int64_t out, int out_bf16) {
  if (out_bf16) {
    uint16_t *o = (uint16_t *)y + out;
    for (int64_t c = 0; c < m; c++) o[c] = convert_f32_to_bf16(acc[c]);
  } else {
    memcpy((float *)y + out, acc, sizeof(float) * (size_t)m);
  }
}

/* ---- the emulation: f32 vectors of the level ---- */

/* NB rows x against a panel. WIDE: x holds rows of 2 kp f32 values (the bf16 rows widened, a zero
   past an odd K), whose elements are broadcast straight from memory; else the bf16 rows, each
   pair widened here (slower: the broadcasts from registers take the FMAs' ports). */
static inline __attribute__((always_inline)) void eblock(const int WIDE, const int NB, const uint32_t *ap, int64_t K,
                                                         const void *const *x, void *const *y, int64_t out, int64_t m,
                                                         int out_bf16) {
  const int64_t kp = (K + 1) / 2;
  ev_f32 acc[4][4];
  for (int q = 0; q < NB; q++)
    for (int v = 0; v < 4; v++) acc[q][v] = (ev_f32){0};
  for (int64_t kk = 0; kk < kp; kk++) {
    const uint32_t *ak = ap + kk * EPW;
    float xo[4], xe[4];
    for (int q = 0; q < NB; q++) {
      if (WIDE) {
        xo[q] = ((const float *)x[q])[2 * kk + 1];
        xe[q] = ((const float *)x[q])[2 * kk];
        continue;
      }
      uint32_t pr;
      memcpy(&pr, (const uint16_t *)x[q] + 2 * kk, 4);   /* the pair (x[2kk], x[2kk+1]); a row need not be 4-byte aligned */
      uint32_t hi = pr & 0xffff0000u, lo = pr << 16;
      if (kk == kp - 1 && (K & 1)) hi = 0;   /* past K: the row's next element is not ours */
      memcpy(&xo[q], &hi, 4);
      memcpy(&xe[q], &lo, 4);
    }
    for (int v = 0; v < 4; v++) {
      ev_u32 w;
      memcpy(&w, ak + v * ELANES, sizeof w);
      ev_f32 wo = (ev_f32)(w & 0xffff0000u), we = (ev_f32)(w << 16);
      for (int q = 0; q < NB; q++) {
        acc[q][v] += xo[q] * wo;   /* vdpbf16ps's order: the odd product, then the even one */
        acc[q][v] += xe[q] * we;
      }
    }
  }
  for (int q = 0; q < NB; q++) {
    float vals[EPW];
    for (int v = 0; v < 4; v++) memcpy(vals + v * ELANES, &acc[q][v], sizeof acc[q][v]);
    store_row(vals, m, y[q], out, out_bf16);
  }
}

/* the na rows against one panel, EBLOCK at a time */
static inline __attribute__((always_inline)) void eblocks(const int WIDE, const uint32_t *ap, int64_t K, int64_t na,
                                                          const void *const *x, void *const *y, int64_t out, int64_t m,
                                                          int out_bf16) {
  int64_t q = 0;
  for (; q + EBLOCK <= na; q += EBLOCK) eblock(WIDE, EBLOCK, ap, K, x + q, y + q, out, m, out_bf16);
  if (EBLOCK > 3 && na - q == 3) eblock(WIDE, 3, ap, K, x + q, y + q, out, m, out_bf16);
  else if (na - q == 2) eblock(WIDE, 2, ap, K, x + q, y + q, out, m, out_bf16);
  else if (na - q == 1) eblock(WIDE, 1, ap, K, x + q, y + q, out, m, out_bf16);
}

static void times_emulated(const uint32_t *packed, int64_t K, int64_t n, int64_t na, const uint16_t *const *xs, void *const *ys,
                           int out_bf16, int64_t span, int64_t stride) {
#if defined(__x86_64__) || defined(__i386__)
  unsigned csr = _mm_getcsr();
  _mm_setcsr((csr & ~0x6000u) | 0x8040u);   /* round to nearest even, DAZ, FTZ: as vdpbf16ps */
#endif
  const int64_t kp = (K + 1) / 2;
  /* the rows widened once for all the panels (a step's rows: tens of KB) */
  float *wide = malloc(sizeof(float) * (size_t)(na * 2 * kp + 1));
  const void *rows[na > 0 ? na : 1];
  for (int64_t q = 0; q < na; q++) {
    if (!wide) { rows[q] = xs[q]; continue; }   /* no buffer: the pairs widened as they are read */
    float *r = wide + q * 2 * kp;
    for (int64_t k = 0; k < K; k++) r[k] = convert_bf16_to_f32(xs[q][k]);
    if (K & 1) r[K] = 0;   /* past K: the row's next element is not ours */
    rows[q] = r;
  }
  for (int64_t p = 0; p * EPW < n; p++) {
    int64_t c0 = p * EPW, m = n - c0 < EPW ? n - c0 : EPW, out = span ? (c0 / span) * stride + c0 % span : c0;
    const uint32_t *ap = packed + p * kp * EPW;
    if (wide) eblocks(1, ap, K, na, rows, ys, out, m, out_bf16);
    else eblocks(0, ap, K, na, rows, ys, out, m, out_bf16);
  }
  free(wide);
#if defined(__x86_64__) || defined(__i386__)
  _mm_setcsr(csr);
#endif
}

/* ---- AVX512-BF16 ---- */

#if defined(__x86_64__)
/* One pair row kk of a panel against NB rows: the pair x[q][2kk], x[q][2kk+1] broadcast straight
   from the row, or (last: an odd K's final element) that element alone, as the row's next element
   is not ours. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"), always_inline))
static inline void npair(const int NB, const int last, const uint32_t *ak, const uint16_t *const *x, int64_t kk,
                         __m512 acc[][4]) {
  __m512i w0 = _mm512_loadu_si512(ak), w1 = _mm512_loadu_si512(ak + 16), w2 = _mm512_loadu_si512(ak + 32);
  __m512i w3 = _mm512_loadu_si512(ak + 48);
  /* the four weight vectors are loaded once for the NB sequences (as in cpu/rnn.c) */
  __asm__("" : "+v"(w0), "+v"(w1), "+v"(w2), "+v"(w3));
  for (int q = 0; q < NB; q++) {
    uint32_t pr = 0;
    memcpy(&pr, x[q] + 2 * kk, last ? 2 : 4);
    __m512bh xv = (__m512bh)_mm512_set1_epi32((int)pr);
    acc[q][0] = _mm512_dpbf16_ps(acc[q][0], xv, (__m512bh)w0);
    acc[q][1] = _mm512_dpbf16_ps(acc[q][1], xv, (__m512bh)w1);
    acc[q][2] = _mm512_dpbf16_ps(acc[q][2], xv, (__m512bh)w2);
    acc[q][3] = _mm512_dpbf16_ps(acc[q][3], xv, (__m512bh)w3);
  }
}

/* (the target attribute on its own line, the name on the next: tools/isa_check.lua reads them so) */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"), always_inline))
static inline void nblock(const int NB, const uint32_t *ap, int64_t K, const uint16_t *const *x, void *const *y, int64_t out,
                          int64_t m, int out_bf16) {
  const int64_t kp = (K + 1) / 2, full = K / 2;
  __m512 acc[4][4];
  for (int q = 0; q < NB; q++)
    for (int v = 0; v < 4; v++) acc[q][v] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < full; kk++) npair(NB, 0, ap + kk * NPW, x, kk, acc);
  if (full < kp) npair(NB, 1, ap + full * NPW, x, full, acc);
  for (int q = 0; q < NB; q++) {
    if (m == NPW && !out_bf16) {
      float *o = (float *)y[q] + out;
      for (int v = 0; v < 4; v++) _mm512_storeu_ps(o + 16 * v, acc[q][v]);
      continue;
    }
    float vals[NPW];
    for (int v = 0; v < 4; v++) _mm512_storeu_ps(vals + 16 * v, acc[q][v]);
    store_row(vals, m, y[q], out, out_bf16);
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
static void times_native(const uint32_t *packed, int64_t K, int64_t n, int64_t na, const uint16_t *const *xs, void *const *ys,
                         int out_bf16, int64_t span, int64_t stride) {
  const int64_t kp = (K + 1) / 2;
  for (int64_t p = 0; p * NPW < n; p++) {
    int64_t c0 = p * NPW, m = n - c0 < NPW ? n - c0 : NPW, out = span ? (c0 / span) * stride + c0 % span : c0, q = 0;
    const uint32_t *ap = packed + p * kp * NPW;
    for (; q + 4 <= na; q += 4) nblock(4, ap, K, xs + q, ys + q, out, m, out_bf16);
    if (na - q == 3) nblock(3, ap, K, xs + q, ys + q, out, m, out_bf16);
    else if (na - q == 2) nblock(2, ap, K, xs + q, ys + q, out, m, out_bf16);
    else if (na - q == 1) nblock(1, ap, K, xs + q, ys + q, out, m, out_bf16);
  }
}
#endif

void kiln_cpu_rnn_bf16_times(const uint32_t *packed, int64_t K, int64_t n, int64_t na, const uint16_t *const *xs,
                             void *const *ys, int out_bf16, int64_t span, int64_t stride) {
#if defined(__x86_64__)
  if (kiln_cpu_bf16_products_native()) { times_native(packed, K, n, na, xs, ys, out_bf16, span, stride); return; }
#endif
  times_emulated(packed, K, n, na, xs, ys, out_bf16, span, stride);
}
