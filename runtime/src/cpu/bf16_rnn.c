/* cpu/bf16_rnn.c: the bf16 products of the persistent recurrent path (cpu/rnn.c, a layer whose
   input is bf16, as autocast("bf16") makes it): y[b] = x[b] W for a weight matrix W packed once per
   sequence into panels of bf16 pairs (panel p, pair row kk, column c: W[2kk][c] in the low half,
   W[2kk+1][c] in the high half, zeros past K and n), each step's rows x[b] in bf16 read as pairs,
   f32 sums.

   With AVX512-BF16, where it is faster than f32 FMAs (kiln_cpu_bf16_products_native), a panel is
   64 columns and vdpbf16ps adds each pair's two products into 16 f32 lanes, 4 sequences x 4
   vectors at a time. Without it (or with KILN_BF16_EMULATE=1) the same sums are made with f32
   arithmetic in vdpbf16ps's order: for each pair the odd product, then the even one, each added
   with one rounding to nearest even (a product of two bf16 values is exact in f32, so an FMA, or a
   multiply and an add, round once), subnormal inputs and results taken as zero (MXCSR's DAZ and
   FTZ while the products run). The packed pairs are then widened once, in place, into f32 panels
   of cpu/rnn.c's f32 products (the level's 4 vectors wide), each pair as two rows, the odd element
   first; each step's rows are widened the same way, once for all the panels; and cpu/rnn.c's f32
   kernel, in k's order, makes the sums (Emerald Rapids, 1 thread: the char-LM's bf16 step
   ~0.9x the time of widening each pair of a panel as it is used). So the emulated products are
   the native ones, bit for bit (the baseline level, which has no FMA, may differ where a single
   product is below 2^-126). */
#include "cpu.h"
#include "convert.h"
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include "transpose8.h"
#include <immintrin.h>
#endif

/* the emulation's panels: cpu/rnn.c's f32 ones, 4 of the level's vectors wide */
#if defined(__AVX512F__)
#define EVEC 64
#elif defined(__AVX__)
#define EVEC 32
#else
#define EVEC 16
#endif
enum { ELANES = EVEC / 4, EPW = 4 * ELANES, NPW = 64 };

/* vdpbf16ps where the CPU runs it faster than the emulation's f32 FMAs (not Sapphire and Emerald
   Rapids, where the emulation takes about 0.55-0.7x its time) */
int64_t kiln_cpu_rnn_bf16_panel(void) { return kiln_cpu_bf16_products_native() ? NPW : EPW; }

int64_t kiln_cpu_rnn_bf16_packed_words(int64_t n, int64_t K) {
  const int64_t PW = kiln_cpu_rnn_bf16_panel(), kp = (K + 1) / 2;
  return (n + PW - 1) / PW * PW * kp * (kiln_cpu_bf16_products_native() ? 1 : 2);
}

/* Emulated: the np panels of kp pair rows widened in place into panels of 2 kp f32 rows (each
   pair's odd element first), from the last row down, as each row's place is at or past its own. */
static void widen_panels(uint32_t *packed, int64_t np, int64_t kp) {
  if (kiln_cpu_bf16_products_native()) return;
  for (int64_t r = np * kp - 1; r >= 0; r--) {
    uint32_t pr[EPW];
    memcpy(pr, packed + r * EPW, sizeof pr);
    float *odd = (float *)(packed + 2 * r * EPW), *even = odd + EPW;
    for (int64_t c = 0; c < EPW; c++) {
      uint32_t hi = pr[c] & 0xffff0000u, lo = pr[c] << 16;
      memcpy(odd + c, &hi, 4);
      memcpy(even + c, &lo, 4);
    }
  }
}

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
  widen_panels(packed, np, kp);
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
  widen_panels(packed, np, kp);
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

/* ---- the emulation: cpu/rnn.c's f32 products on the widened panels ---- */

/* A bf16 row of K elements into 2 kp f32 values as the panels hold them: for each pair, the odd
   element, then the even one (one 64-bit word of two floats from the pair's 32 bits) */
static void widen_row(float *restrict r, const uint16_t *restrict x, int64_t K) {
  const int64_t full = K / 2;
  for (int64_t kk = 0; kk < full; kk++) {
    uint32_t w;
    memcpy(&w, x + 2 * kk, 4);   /* a row need not be 4-byte aligned */
    uint64_t v = w, two = (v & 0xffff0000u) | (v & 0xffffu) << 48;   /* little-endian: the odd element's float first */
    memcpy(r + 2 * kk, &two, 8);
  }
  if (K & 1) {   /* past K: the row's next element is not ours */
    r[2 * full] = 0;
    r[2 * full + 1] = convert_bf16_to_f32(x[K - 1]);
  }
}

size_t kiln_cpu_rnn_bf16_times_scratch(int64_t na, int64_t K, int64_t n, int out_bf16) {
  if (kiln_cpu_bf16_products_native() || na <= 0) return 0;
  return sizeof(float) * (size_t)(na * 2 * ((K + 1) / 2) + (out_bf16 ? na * n : 0));
}

static void times_emulated(const uint32_t *packed, int64_t K, int64_t n, int64_t na, const uint16_t *const *xs, void *const *ys,
                           int out_bf16, int64_t span, int64_t stride, float *wide) {
  const int64_t K2 = 2 * ((K + 1) / 2);
  if (na <= 0) return;
  /* the rows widened as the panels are, each pair's odd element first (a zero past an odd K: the
     row's next element is not ours), into the caller's scratch; with out_bf16 the f32 sums go to
     rows of their own there first */
  const float *rows[na];
  float *outs[na];
  for (int64_t q = 0; q < na; q++) {
    float *r = wide + q * K2;
    widen_row(r, xs[q], K);
    rows[q] = r;
    outs[q] = out_bf16 ? wide + na * K2 + q * n : ys[q];
  }
#if defined(__x86_64__) || defined(__i386__)
  unsigned csr = _mm_getcsr();
  _mm_setcsr((csr & ~0x6000u) | 0x8040u);   /* round to nearest even, DAZ, FTZ: as vdpbf16ps */
#endif
  kiln_cpu_rnn_times_f32_ordered((const float *)packed, K2, n, na, rows, outs, span, stride);
#if defined(__x86_64__) || defined(__i386__)
  _mm_setcsr(csr);
#endif
  if (out_bf16)
    for (int64_t q = 0; q < na; q++) store_row(outs[q], n, ys[q], 0, 1);
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
                             void *const *ys, int out_bf16, int64_t span, int64_t stride, float *scratch) {
#if defined(__x86_64__)
  if (kiln_cpu_bf16_products_native()) { times_native(packed, K, n, na, xs, ys, out_bf16, span, stride); return; }
#endif
  times_emulated(packed, K, n, na, xs, ys, out_bf16, span, stride, scratch);
}
