/* cpu/bf16_gemm.c: the GEMM of bf16 tensors with f32 accumulation on CPUs with AVX512-BF16.
   op(A) is packed into rows of k pairs and op(B) into panels of 32 columns of k pairs (zero-padded),
   an 8x32 micro-kernel keeps 16 f32 accumulators and runs vdpbf16ps (32 bf16 products summed into
   16 f32 lanes per instruction), and each result is rounded to bf16 once (round to nearest even).
   The pool splits the work by column panels, or, for a short k, by rows of C across op(B) packed
   whole (rows mode, below). On a CPU without AVX512-BF16, where vdpbf16ps is the slower
   (kiln_cpu_bf16_products_native) or with KILN_BF16_EMULATE=1, the operands are widened to f32
   and sgemm runs instead (cpu/gemm.c for matmul, kiln_cpu_gemm_bf16_f32 below): the same f32
   products of exact bf16 values and f32 sums, rounded once. */
#include "cpu.h"
#include "convert.h"
#include "transpose8.h"
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

enum { MR = 8, NR = 32, ROWS_MODE_MAX_PAIRS = 64 };

struct bgemm {
  int64_t nbatch, n, m, k, kp, npad, panels;   /* kp: pairs of k; npad: n rounded up to MR */
  const char *a, *b;
  char *c;
  int64_t as[3], bs[3], cs[3];                 /* strides in elements: batch, row, column */
  float alpha, beta;
  int a_once;                                  /* A broadcast over the batch: packed once */
  int c_f32;                                   /* c holds f32 (kept unrounded) rather than bf16 */
  uint32_t *pa;                                /* packed A: (1 or nbatch) x npad x kp */
  uint32_t *pball;                             /* rows mode: every panel of op(B) */
};

int kiln_cpu_bf16_native(void) {
  static int native = -1;
  if (native < 0) {
    const char *e = getenv("KILN_BF16_EMULATE");
    native = kiln_cpu_has("avx512_bf16") && kiln_cpu_has("avx512bw") && kiln_cpu_has("avx512vl") &&
             !(e && strcmp(e, "1") == 0);
  }
  return native;
}

int kiln_cpu_bf16_products_native(void) {
  static int native = -1;
  if (native < 0) {
    const char *e = getenv("KILN_BF16_EMULATE");
    native = kiln_cpu_bf16_native() && ((e && strcmp(e, "0") == 0) || kiln_cpu_bf16_fast());
  }
  return native;
}

static inline uint32_t pair(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }


/* 8 rows of A whose rows are adjacent (A[i][k] at a[i + k * s]: a transposed operand, such as x^T
   or h^T in a weight's grad): 8 pairs of rows of A are two 16-byte loads, interleaved into the
   8 rows' pairs, and 8 such are transposed into 8 pairs of each row. */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static int64_t pack_a_cols8(const uint16_t *a, int64_t s, int64_t pairs, uint32_t *rows, int64_t kp) {
  int64_t p = 0;
  for (; p + 8 <= pairs; p += 8) {
    __m256 v[8];
    for (int q = 0; q < 8; q++) {
      __m128i lo = _mm_loadu_si128((const __m128i *)(a + 2 * (p + q) * s));
      __m128i hi = _mm_loadu_si128((const __m128i *)(a + (2 * (p + q) + 1) * s));
      v[q] = _mm256_castsi256_ps(_mm256_set_m128i(_mm_unpackhi_epi16(lo, hi), _mm_unpacklo_epi16(lo, hi)));
    }
    kiln_transpose8_store(v, (float *)(rows + p), kp);
  }
  return p;
}

/* Rows [r0, r1) of packed A for batch bi: pa[i][p] = (A[i][2p], A[i][2p+1]). */
static void pack_a(const struct bgemm *g, int64_t bi, int64_t r0, int64_t r1) {
  const uint16_t *a = (const uint16_t *)g->a + bi * g->as[0];
  int64_t done = 0;
  if (g->as[1] == 1 && g->as[2] != 1 && r1 - r0 == 8 && r1 <= g->n)
    done = pack_a_cols8(a + r0, g->as[2], g->k / 2, g->pa + (bi * g->npad + r0) * g->kp, g->kp);
  for (int64_t i = r0; i < r1; i++) {
    uint32_t *row = g->pa + (bi * g->npad + i) * g->kp;
    if (i >= g->n) { memset(row, 0, sizeof(uint32_t) * (size_t)g->kp); continue; }
    const uint16_t *ai = a + i * g->as[1];
    int64_t s = g->as[2];
    if (s == 1) memcpy(row, ai, sizeof(uint32_t) * (size_t)(g->k / 2));   /* pairs are already adjacent */
    else for (int64_t p = done; p < g->k / 2; p++) row[p] = pair(ai[2 * p * s], ai[(2 * p + 1) * s]);
    if (g->k & 1) row[g->kp - 1] = pair(ai[(g->k - 1) * s], 0);
  }
}

static void pack_a_range(void *ctx, int64_t begin, int64_t end) {
  const struct bgemm *g = ctx;
  for (int64_t t = begin; t < end; t++) {
    int64_t blocks = g->npad / MR, bi = t / blocks, r = (t % blocks) * MR;
    pack_a(g, bi, r, r + MR);
  }
}

/* A full panel of rows of contiguous columns: two rows of 32 bf16 interleaved into 32 pairs. */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void pack_b_rows(const uint16_t *b, int64_t r, int64_t pairs, uint32_t *pb) {
  for (int64_t p = 0; p < pairs; p++) {
    const uint16_t *b0 = b + 2 * p * r;
    for (int h = 0; h < 2; h++) {
      __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(b0 + 16 * h)));
      __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(b0 + r + 16 * h)));
      _mm512_storeu_si512(pb + p * NR + 16 * h, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}

/* A full panel of B stored by columns (B[p][j] at j*s + p: a weight used transposed, x W^T): each
   pair is one 32-bit word of a column, so the panel is the transpose of NR columns' words, 8 x 8
   words at a time in registers (pairs past a multiple of 8 one by one). Returns the pairs done. */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static int64_t pack_b_cols(const uint16_t *b, int64_t s, int64_t pairs, uint32_t *pb) {
  int64_t p = 0;
  for (; p + 8 <= pairs; p += 8)
    for (int q0 = 0; q0 < NR; q0 += 8) {
      __m256 v[8];
      for (int r = 0; r < 8; r++) v[r] = _mm256_loadu_ps((const float *)(b + (q0 + r) * s + 2 * p));
      kiln_transpose8_store(v, (float *)(pb + p * NR + q0), NR);
    }
  for (; p < pairs; p++)
    for (int q = 0; q < NR; q++) pb[p * NR + q] = pair(b[q * s + 2 * p], b[q * s + 2 * p + 1]);
  return p;
}

/* Panel of columns [j0, j0 + NR) of op(B): pb[p][q] = (B[2p][j0+q], B[2p+1][j0+q]). */
static void pack_b(const struct bgemm *g, int64_t bi, int64_t j0, uint32_t *pb) {
  const uint16_t *b = (const uint16_t *)g->b + bi * g->bs[0];
  int64_t r = g->bs[1], s = g->bs[2], nq = g->m - j0 < NR ? g->m - j0 : NR;
  int64_t p = 0;
  if (s == 1 && nq == NR) { pack_b_rows(b + j0, r, g->k / 2, pb); p = g->k / 2; }
  else if (r == 1 && nq == NR) p = pack_b_cols(b + j0 * s, s, g->k / 2, pb);
  for (; p < g->kp; p++) {
    uint32_t *row = pb + p * NR;
    const uint16_t *b0 = b + 2 * p * r + j0 * s;
    int has_hi = 2 * p + 1 < g->k;
    for (int64_t q = 0; q < nq; q++) row[q] = pair(b0[q * s], has_hi ? b0[r + q * s] : 0);
    for (int64_t q = nq; q < NR; q++) row[q] = 0;
  }
}

/* tile[MR][NR] = packed A rows (MR of them, kp pairs each) @ the packed B panel; or, with c, the
   products rounded straight into 8 x 32 bf16 of C (rows ldc apart): C = A B, no tile in between
   (a whole tile, alpha 1, beta 0, the common case). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"), always_inline))
static inline void kernel_body(const uint32_t *pa, const uint32_t *pb, int64_t kp, float *tile, uint16_t *c, int64_t ldc) {
  __m512 acc[MR][2];
  for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; p++) {
    __m512bh b0 = (__m512bh)_mm512_loadu_si512(pb + p * NR);
    __m512bh b1 = (__m512bh)_mm512_loadu_si512(pb + p * NR + 16);
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
      __m512bh av = (__m512bh)_mm512_set1_epi32((int)pa[r * kp + p]);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
  for (int r = 0; r < MR; r++) {
    if (c) {
      _mm256_storeu_si256((__m256i *)(c + r * ldc), (__m256i)_mm512_cvtneps_pbh(acc[r][0]));
      _mm256_storeu_si256((__m256i *)(c + r * ldc + 16), (__m256i)_mm512_cvtneps_pbh(acc[r][1]));
    } else {
      _mm512_storeu_ps(tile + r * NR, acc[r][0]);
      _mm512_storeu_ps(tile + r * NR + 16, acc[r][1]);
    }
  }
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
static void kernel_8x32(const uint32_t *pa, const uint32_t *pb, int64_t kp, float *tile) {
  kernel_body(pa, pb, kp, tile, NULL, 0);
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
static void kernel_8x32_bf16(const uint32_t *pa, const uint32_t *pb, int64_t kp, uint16_t *c, int64_t ldc) {
  kernel_body(pa, pb, kp, NULL, c, ldc);
}

/* Rows of a tile into contiguous bf16 rows of c: alpha * tile + beta * c, rounded to nearest even
   by vcvtneps2bf16 (NaN stays NaN). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
static void store_rows(const struct bgemm *g, const float *tile, uint16_t *c, int64_t nr, int64_t nq) {
  __m512 alpha = _mm512_set1_ps(g->alpha), beta = _mm512_set1_ps(g->beta);
  for (int64_t r = 0; r < nr; r++) {
    uint16_t *cr = c + r * g->cs[1];
    for (int h = 0; h < NR / 16; h++) {
      int64_t left = nq - 16 * h;
      if (left <= 0) break;
      __mmask16 mask = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
      __m512 v = _mm512_mul_ps(alpha, _mm512_loadu_ps(tile + r * NR + 16 * h));
      if (g->beta != 0) {
        __m256i old = _mm256_maskz_loadu_epi16(mask, cr + 16 * h);
        __m512 of = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(old), 16));
        v = _mm512_fmadd_ps(beta, of, v);
      }
      __m256bh o = _mm512_cvtneps_pbh(v);
      if (left >= 16) _mm256_storeu_si256((__m256i *)(cr + 16 * h), (__m256i)o);   /* unmasked when whole */
      else _mm256_mask_storeu_epi16(cr + 16 * h, mask, (__m256i)o);
    }
  }
}

/* Rows of a tile into contiguous f32 rows of c: alpha * tile + beta * c. */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void store_rows_f32(const struct bgemm *g, const float *tile, float *c, int64_t nr, int64_t nq) {
  __m512 alpha = _mm512_set1_ps(g->alpha), beta = _mm512_set1_ps(g->beta);
  for (int64_t r = 0; r < nr; r++) {
    float *cr = c + r * g->cs[1];
    for (int h = 0; h < NR / 16; h++) {
      int64_t left = nq - 16 * h;
      if (left <= 0) break;
      __mmask16 mask = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
      __m512 v = _mm512_mul_ps(alpha, _mm512_loadu_ps(tile + r * NR + 16 * h));
      if (left >= 16) {   /* whole vectors unmasked: Zen's masked stores are slow */
        if (g->beta != 0) v = _mm512_fmadd_ps(beta, _mm512_loadu_ps(cr + 16 * h), v);
        _mm512_storeu_ps(cr + 16 * h, v);
        continue;
      }
      if (g->beta != 0) v = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(mask, cr + 16 * h), v);
      _mm512_mask_storeu_ps(cr + 16 * h, mask, v);
    }
  }
}

/* A full tile into f32 columns of c (C[r][q] at c[r + q * cs2]: a transposed result, such as a
   weight's grad computed as x^T dy): alpha * tile + beta * c, 8 rows of 8 columns at a time. */
__attribute__((target("avx512f,avx512bw,avx512vl,fma")))
static void store_cols_f32(const struct bgemm *g, const float *tile, float *c, int64_t cs2) {
  __m256 alpha = _mm256_set1_ps(g->alpha), beta = _mm256_set1_ps(g->beta);
  for (int64_t q0 = 0; q0 < NR; q0 += 8) {
    __m256 v[8];
    for (int r = 0; r < MR; r++) v[r] = _mm256_loadu_ps(tile + r * NR + q0);
    float t[8 * 8];
    kiln_transpose8_store(v, t, 8);   /* t[q][r] */
    for (int q = 0; q < 8; q++) {
      float *o = c + (q0 + q) * cs2;
      __m256 x = _mm256_mul_ps(alpha, _mm256_loadu_ps(t + 8 * q));
      if (g->beta != 0) x = _mm256_fmadd_ps(beta, _mm256_loadu_ps(o), x);
      _mm256_storeu_ps(o, x);
    }
  }
}

/* A tile's nr x nq results into C at rows i0.., columns j0.. of batch bi. */
static void store_tile(const struct bgemm *g, const float *tile, int64_t bi, int64_t i0, int64_t j0, int64_t nr, int64_t nq) {
  if (g->c_f32) {
    float *cf = (float *)g->c + bi * g->cs[0] + i0 * g->cs[1] + j0 * g->cs[2];
    if (g->cs[2] == 1) { store_rows_f32(g, tile, cf, nr, nq); return; }
    if (g->cs[1] == 1 && nr == MR && nq == NR) { store_cols_f32(g, tile, cf, g->cs[2]); return; }
    for (int64_t r = 0; r < nr; r++)
      for (int64_t q = 0; q < nq; q++) {
        float *o = cf + r * g->cs[1] + q * g->cs[2];
        *o = g->alpha * tile[r * NR + q] + (g->beta != 0 ? g->beta * *o : 0.0f);
      }
    return;
  }
  uint16_t *c = (uint16_t *)g->c + bi * g->cs[0];
  if (g->cs[2] == 1) { store_rows(g, tile, c + i0 * g->cs[1] + j0, nr, nq); return; }
  for (int64_t r = 0; r < nr; r++) {
    uint16_t *ci = c + (i0 + r) * g->cs[1] + j0 * g->cs[2];
    for (int64_t q = 0; q < nq; q++) {
      float v = g->alpha * tile[r * NR + q];
      if (g->beta != 0) v += g->beta * kiln_bf16_to_f32(ci[q * g->cs[2]]);
      ci[q * g->cs[2]] = kiln_f32_to_bf16(v);
    }
  }
}

/* One tile: rounded straight into bf16 C where it can, else through tile and store_tile. */
static void multiply_tile(const struct bgemm *g, const uint32_t *pa, const uint32_t *pb, float *tile, int64_t bi, int64_t i0,
                          int64_t j0, int64_t nr, int64_t nq) {
  if (!g->c_f32 && g->cs[2] == 1 && nr == MR && nq == NR && g->alpha == 1 && g->beta == 0) {
    kernel_8x32_bf16(pa, pb, g->kp, (uint16_t *)g->c + bi * g->cs[0] + i0 * g->cs[1] + j0, g->cs[1]);
    return;
  }
  kernel_8x32(pa, pb, g->kp, tile);
  store_tile(g, tile, bi, i0, j0, nr, nq);
}

static void panel_range(void *ctx, int64_t begin, int64_t end) {
  const struct bgemm *g = ctx;
  uint32_t *pb = malloc(sizeof(uint32_t) * (size_t)(g->kp * NR));
  float tile[MR * NR];
  if (!pb) return;   /* cannot happen for the sizes kiln packs; cpu_gemm_bf16 checks one first */
  for (int64_t t = begin; t < end; t++) {
    int64_t bi = t / g->panels, j0 = (t % g->panels) * NR, nq = g->m - j0 < NR ? g->m - j0 : NR;
    pack_b(g, bi, j0, pb);
    for (int64_t i0 = 0; i0 < g->n; i0 += MR)
      multiply_tile(g, g->pa + ((g->a_once ? 0 : bi) * g->npad + i0) * g->kp, pb, tile, bi, i0, j0,
                    g->n - i0 < MR ? g->n - i0 : MR, nq);
  }
  free(pb);
}

/* Rows mode, for a short k (a weight's grad over a batch, k = the batch): op(B) is packed whole
   first (pball: every panel, kp x NR words each), then each task takes MR rows across all the
   panels, so that C is written row by row rather than down its columns one 64-byte piece at a
   time. The same kernel sums each element in the same order as the panel order does. */
static void pack_b_range(void *ctx, int64_t begin, int64_t end) {
  const struct bgemm *g = ctx;
  for (int64_t t = begin; t < end; t++) pack_b(g, t / g->panels, (t % g->panels) * NR, g->pball + t * g->kp * NR);
}
static void row_range(void *ctx, int64_t begin, int64_t end) {
  const struct bgemm *g = ctx;
  float tile[MR * NR];
  int64_t blocks = g->npad / MR;
  for (int64_t t = begin; t < end; t++) {
    int64_t bi = t / blocks, i0 = (t % blocks) * MR, nr = g->n - i0 < MR ? g->n - i0 : MR;
    for (int64_t pnl = 0; pnl < g->panels; pnl++) {
      int64_t j0 = pnl * NR, nq = g->m - j0 < NR ? g->m - j0 : NR;
      multiply_tile(g, g->pa + ((g->a_once ? 0 : bi) * g->npad + i0) * g->kp, g->pball + (bi * g->panels + pnl) * g->kp * NR,
                    tile, bi, i0, j0, nr, nq);
    }
  }
}

/* Pack and multiply: g holds the shapes, pointers and strides; g->pa is allocated here. */
static int bgemm_run(struct bgemm *g, int64_t abatch) {
  g->kp = (g->k + 1) / 2;
  g->npad = (g->n + MR - 1) / MR * MR;
  g->panels = (g->m + NR - 1) / NR;
  if (g->n <= 0 || g->m <= 0 || g->nbatch <= 0) return KILN_OK;
  g->pa = malloc(sizeof(uint32_t) * (size_t)(abatch * g->npad * (g->kp > 0 ? g->kp : 1)));
  void *probe = malloc(sizeof(uint32_t) * (size_t)((g->kp > 0 ? g->kp : 1) * NR));
  if (!g->pa || !probe) {
    free(g->pa); free(probe);
    return kiln_fail(KILN_ERR_MEMORY, "matmul: out of memory packing bf16 operands (%lld x %lld x %lld)",
                     (long long)g->n, (long long)g->k, (long long)g->m);
  }
  free(probe);
  int64_t blocks = abatch * (g->npad / MR);
  double flops = 2.0 * (double)g->nbatch * (double)g->n * (double)g->m * (double)g->k;
  int serial = kiln_get_num_threads() == 1 || flops < 2e5;
  g->a_once = abatch == 1;
  /* a small A (a batch of activations, a weight) is packed before the pool starts: one start less */
  if (serial || abatch * g->npad * g->kp < (1 << 18)) pack_a_range(g, 0, blocks);
  else kiln_parallel_for(blocks, 1, pack_a_range, g);
  int64_t tasks = g->nbatch * g->panels;
  /* rows mode where k is short, C has rows for several row blocks (4 or more: fewer leave its panels
     the better split) and op(B) packed whole stays in L2 (256 KB) */
  size_t nball = sizeof(uint32_t) * (size_t)(tasks * g->kp * NR);
  if (g->kp <= ROWS_MODE_MAX_PAIRS && g->n >= 4 * MR && nball <= ((size_t)256 << 10) && (g->pball = malloc(nball))) {
    if (serial) pack_b_range(g, 0, tasks);
    else kiln_parallel_for(tasks, 1, pack_b_range, g);
    int64_t rblocks = g->nbatch * (g->npad / MR);   /* every batch's rows, A shared or not */
    if (serial) row_range(g, 0, rblocks);
    else kiln_parallel_for(rblocks, 1, row_range, g);
    free(g->pball);
    g->pball = NULL;
  } else if (serial) {
    panel_range(g, 0, tasks);
  } else {
    kiln_parallel_for(tasks, 1, panel_range, g);
  }
  free(g->pa);
  g->pa = NULL;
  return KILN_OK;
}

/* out[B,n,m] = alpha * a[B,n,k] @ b[B,k,m] + beta * out, all bf16 (batch strides may be 0). */
int cpu_gemm_bf16(struct kiln_tensor *out, const struct kiln_tensor *a, const struct kiln_tensor *b, double alpha,
                  double beta) {
  struct bgemm g = {.nbatch = out->sizes[0], .n = out->sizes[1], .m = out->sizes[2], .k = a->sizes[2],
                    .alpha = (float)alpha, .beta = (float)beta};
  g.a = (const char *)kiln_tensor_data(a); g.b = (const char *)kiln_tensor_data(b); g.c = kiln_tensor_data(out);
  for (int d = 0; d < 3; d++) { g.as[d] = a->strides[d]; g.bs[d] = b->strides[d]; g.cs[d] = out->strides[d]; }
  if (a->sizes[0] == 1) g.as[0] = 0;
  if (b->sizes[0] == 1) g.bs[0] = 0;
  return bgemm_run(&g, a->sizes[0] == 1 ? 1 : g.nbatch);
}

/* A rows x cols bf16 operand (element [i][p] at x[i * s1 + p * s2]) widened to f32 for sgemm: as it
   lies where it is a plain row-major matrix or the transpose of one (one vectorised pass over its
   span; *tr and *ld say how sgemm reads it), else copied into a row-major one. NULL: no memory. */
static float *widen_operand(const uint16_t *x, int64_t rows, int64_t cols, int64_t s1, int64_t s2, int *tr, int64_t *ld) {
  int64_t span = 0;
  if (rows <= 0 || cols <= 0) { *tr = 0; *ld = 1; return malloc(64); }   /* nothing to read */
  if (s2 == 1 && s1 >= cols) { span = (rows - 1) * s1 + cols; *tr = 0; *ld = s1; }
  else if (s1 == 1 && s2 >= rows) { span = (cols - 1) * s2 + rows; *tr = 1; *ld = s2; }
  if (span > 2 * rows * cols + 4096) span = 0;   /* a small part of a larger storage: copied */
  float *w = malloc(sizeof(float) * (size_t)(span ? span : rows * cols) + 64);
  if (!w) return NULL;
  if (span) { kiln_cpu_widen_bf16(w, x, span); return w; }
  for (int64_t i = 0; i < rows; i++)
    for (int64_t p = 0; p < cols; p++) w[i * cols + p] = kiln_bf16_to_f32(x[i * s1 + p * s2]);
  *tr = 0; *ld = cols;
  return w;
}

int kiln_cpu_gemm_bf16_f32(int64_t n, int64_t m, int64_t k, float alpha, const uint16_t *a, int64_t as1, int64_t as2,
                           const uint16_t *b, int64_t bs1, int64_t bs2, float beta, float *c, int64_t cs1, int64_t cs2) {
  /* where vdpbf16ps is not the faster (kiln_cpu_bf16_products_native): exact bf16 values in f32,
     then sgemm: f32 products and sums */
  if (!kiln_cpu_bf16_products_native()) {
    if (n <= 0 || m <= 0) return KILN_OK;
    int ta = 0, tb = 0;
    int64_t lda = 1, ldb = 1;
    /* on kiln's kernel, which widens them as it packs (operands as rows or their transpose) */
    if (kiln_cpu_blas_layout(n, k, as1, as2, &ta, &lda) && kiln_cpu_blas_layout(k, m, bs1, bs2, &tb, &ldb) &&
        (cs2 == 1 ? kiln_cpu_sgemm_bf16_here(n, m, k, alpha, 0) : kiln_cpu_sgemm_bf16_here(m, n, k, alpha, 0))) {
      ta = ta == KILN_BLAS_TRANS;
      tb = tb == KILN_BLAS_TRANS;
      int rc = cs2 == 1 ? kiln_cpu_gemm_raw_bf16(ta, tb, n, m, k, alpha, a, lda, b, ldb, beta, c, cs1)
                        : kiln_cpu_gemm_raw_bf16(!tb, !ta, m, n, k, alpha, b, ldb, a, lda, beta, c, cs2);   /* c^T = b^T a^T */
      if (rc)
        return kiln_fail(KILN_ERR_MEMORY, "a bf16 product [%lld, %lld] x [%lld, %lld]: out of memory for its buffers",
                         (long long)n, (long long)k, (long long)k, (long long)m);
      return KILN_OK;
    }
    float *af = widen_operand(a, n, k, as1, as2, &ta, &lda), *bf = widen_operand(b, k, m, bs1, bs2, &tb, &ldb);
    if (!af || !bf) {
      free(af); free(bf);
      return kiln_fail(KILN_ERR_MEMORY, "a bf16 product [%lld, %lld] x [%lld, %lld]: out of memory widening its operands to f32",
                       (long long)n, (long long)k, (long long)k, (long long)m);
    }
    if (cs2 == 1) kiln_cpu_gemm_raw_fixed(KILN_F32, ta, tb, n, m, k, alpha, af, lda, bf, ldb, beta, c, cs1);
    else kiln_cpu_gemm_raw_fixed(KILN_F32, !tb, !ta, m, n, k, alpha, bf, ldb, af, lda, beta, c, cs2);   /* c^T = b^T a^T */
    free(af); free(bf);
    return KILN_OK;
  }
  struct bgemm g = {.nbatch = 1, .n = n, .m = m, .k = k, .alpha = alpha, .beta = beta, .c_f32 = 1,
                    .a = (const char *)a, .b = (const char *)b, .c = (char *)c,
                    .as = {0, as1, as2}, .bs = {0, bs1, bs2}, .cs = {0, cs1, cs2}};
  return bgemm_run(&g, 1);
}
