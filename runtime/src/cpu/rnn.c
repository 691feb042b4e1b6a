/* cpu/rnn.c: one recurrent layer on the CPU (kiln/rnn.h), forward and backward through time, on
   two paths: a GEMM per timestep followed by one fused gate kernel, or a persistent team of
   threads that each keep a slice of the recurrent weights in their core's cache and meet at a
   spinning barrier once per step. */
#include "cpu.h"
#include "convert.h"
#include "dtype_math.h"
#include "rnn_calls.h"
#include "vexp.h"
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <limits.h>
#if defined(__AVX512F__)
#include "bf16x16.h"
#endif
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* A sense-reversing barrier that spins, then sleeps: the team's threads are all running
   (kiln_parallel_team), and a step is far shorter than a sleep and wake-up, so a waiter spins
   first. A teammate that is late by more than a few steps was most likely descheduled (more
   runnable threads than cores: other processes on the machine), and the core it needs may be
   this one: then the waiter sleeps on a futex, and the last to arrive wakes the sleepers. */
struct barrier {
  int n;
  int count;
  int sense;
  int sleepers;
  int failed;   /* a thread could not set up: everyone leaves after the first wait */
};

static void barrier_init(struct barrier *b, int n) {
  b->n = n; b->count = 0; b->sense = 0; b->sleepers = 0; b->failed = 0;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* pauses before a waiter sleeps: about 50 us (a pause is 10-40 ns), several steps of a layer that
   the persistent path runs at 2 threads */
enum { BARRIER_SPINS = 2000 };

static void barrier_wait(struct barrier *b, int *local_sense) {
  if (b->n <= 1) return;
  int s = !*local_sense;
  *local_sense = s;
  if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == b->n) {
    __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&b->sense, s, __ATOMIC_SEQ_CST);
#if defined(__linux__)
    if (__atomic_load_n(&b->sleepers, __ATOMIC_SEQ_CST))
      syscall(SYS_futex, &b->sense, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#endif
    return;
  }
  for (int spins = 0; __atomic_load_n(&b->sense, __ATOMIC_ACQUIRE) != s; spins++) {
    if (spins < BARRIER_SPINS) { cpu_relax(); continue; }
#if defined(__linux__)
    /* announce the sleep, then sleep only while the sense is still the old one (the waker stores
       the sense before it reads sleepers, this thread counts itself before it reads the sense) */
    __atomic_add_fetch(&b->sleepers, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&b->sense, __ATOMIC_SEQ_CST) != s)
      syscall(SYS_futex, &b->sense, FUTEX_WAIT_PRIVATE, !s, NULL, NULL, 0);
    __atomic_sub_fetch(&b->sleepers, 1, __ATOMIC_SEQ_CST);
#else
    sched_yield();
#endif
  }
}

/* exp and tanh for the f32 gates, without branches or calls so that the gate loops vectorise, and
   with one division each. gate_expf: e^x for x clamped to [-86, 89], a degree-6 minimax polynomial
   (coefficients fitted for relative error 3e-9 on |r| <= ln2/2) scaled by 2^n; results are normal
   or +infinity (from x > 88.38), so a sigmoid's 1 / (1 + e^-x) stays within 2.5 ulp of the exact
   one and is 0 at -infinity and 1 at +infinity; NaN stays NaN. gate_tanhf: x P(x^2) / Q(x^2) for
   |x| clamped to 9.02 (beyond, tanh rounds to 1 in f32) with x's sign, degrees 5 and 4 fitted for
   relative error 1.3e-9; in f32 within 5.4 ulp of tanh (3.2e-7 relative), |result| <= 1,
   tanh(-0) = -0. Checked at every float of [-88, 90] (sigmoid) and [0, 20] (tanh) against double.
   The LSTM forward's gate loop runs 2.6 times as fast as with kiln_vexpf and a two-branch tanh. */
static inline float gate_expf(float x) {
  float c = x < -86.0f ? -86.0f : x > 89.0f ? 89.0f : x;
  float n = __builtin_rintf(c * 1.44269504088896341f);
  float r = c - n * 0.693145751953125f;
  r = r - n * 1.428606765330187e-06f;
  float p = 1.0f + r * (1.0f + r * (0.49999993451353264f + r * (0.16666520691192627f + r * (0.041668387518962555f +
            r * (0.008368709679756708f + r * 0.0013814600458248293f)))));
  return p * kiln_pow2if((int32_t)n);   /* n = 128 gives +infinity */
}

static inline float gate_tanhf(float x) {
  float a = __builtin_fabsf(x), c = a > 9.02f ? 9.02f : a, u = c * c;
  float p = 1.0f + u * (0.13679913762174187f + u * (0.0038683261118077775f + u * (2.8007426157229583e-05f +
            u * (3.0584944654534824e-08f + u * -1.220340903880012e-11f))));
  float q = 1.0f + u * (0.4701324582322442f + u * (0.027245832814714478f + u * (0.00039386282432700247f +
            u * 1.287364325414031e-06f)));
  float t = c * p / q;
  t = t > 1.0f ? 1.0f : t;
  /* 1 beyond the clamp, said outright: gcc folds the clamped lanes of a vectorised loop to a
     constant of its own (1 - 2^-24) */
  return __builtin_copysignf(a > 9.02f ? 1.0f : t, x);
}

#if defined(__AVX__)
#include "transpose8.h"
/* dst[i * ld + r] = rows[r][k0 + i] for an 8 x 8 block: eight rows of a matrix read along, the
   block written transposed (the persistent path's packing of w_hh) */
static inline void transpose8_f32(float *dst, int64_t ld, const float *const *rows, int64_t k0) {
  __m256 r[8];
  for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(rows[i] + k0);
  kiln_transpose8_store(r, dst, ld);
}
#endif
#if defined(__AVX512F__)
#include "transpose16.h"
/* the same for a 16 x 16 block, whole 64-byte rows written (the weights' grads' transposes) */
static inline void transpose16_f32(float *dst, int64_t ld, const float *const *rows, int64_t k0) {
  __m512 r[16];
  for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(rows[i] + k0);
  transpose16(r);
  for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * ld, r[i]);
}
#endif

/* The batch from which the persistent forward folds the input projection into its per-step
   products (each weight then serves that many sequences a step) instead of one GEMM first, and
   the most rows (hidden + input) of the packed [w_hh | w_ih] it does it with. This was a panel's
   bytes (64K) when every level's panels were 128 bytes wide: 512 rows of either dtype. The avx512
   level's panels are 256 bytes wide, and there folding is still as fast or faster up to 768 rows
   from batch 16 (Zen 5, 1 thread, LSTM forward + backward, folded time over not: 0.98-0.99 at
   hidden + input 320 to 768 and batch 16 to 32, 1.02 at batch 8), so the rule is kept in rows. */
enum { KILN_RNN_FOLD_MIN_BATCH = 8, KILN_RNN_FOLD_MAX_ROWS = 512 };

/* ---- one recurrent layer, each function one body over dt (cpu/dtype_math.h), a constant at
   each call, with a named function per dtype where the entry points, the pool and the team call
   in ----

   Layout: rows of the time-major buffers are (t, b) = t * B + b. A step s of sequence b works on
   time t = s (forward) or lengths[b] - 1 - s (reverse), and only while s < lengths[b]; the state
   of a sequence past its length is carried unchanged and its outputs there stay zero. */

/* The gates' sigmoid and tanh in the dtype: f32 through gate_expf and gate_tanhf, f64 through
   libm. */
static inline __attribute__((always_inline)) double gate_sigmoid(int dt, double x) {
  if (dt == KILN_F32) {
    float v = (float)x;
    return 1.0f / (1.0f + gate_expf(-v));
  }
  return 1.0 / (1.0 + exp(-x));
}
static inline __attribute__((always_inline)) double gate_tanh(int dt, double x) {
  return dt == KILN_F32 ? (double)gate_tanhf((float)x) : tanh(x);
}

/* The persistent path's products: y[b][0:n] = sum_k x[b][k] a[k][c] for a matrix a [K][n] that
   stays in the thread's cache, packed once per call in panels of PW columns (panel p holds
   columns p*PW.. for every k, contiguous, zeros past n), so that a step streams it in order;
   BLOCK sequences at a time against one panel (BLOCK x 4 vector accumulators of VEC_BYTES:
   LANES elements, PW = 4 * LANES). Each level its own: 64-byte vectors (zmm) in 6 x 4
   accumulators in the avx512 level, which has 32 vector registers (a panel's 4 vectors feed 24
   FMAs a k, against 16 in blocks of 4: the char-LM's step 0.92 of its time on Emerald Rapids at
   1 thread, 0.96 at 2, the same bits); 32-byte vectors (ymm) in the
   avx2 level and 16-byte ones (xmm) in the baseline, in 2 x 4 accumulators, as those have 16
   registers (4 x 4 accumulators and the 4 weights spilled: half the speed). Each product is summed
   over k in order whatever the width and the block, so the results do not depend on them (but for
   a block of one sequence, below, which the batch alone decides). */
#if defined(__AVX512F__)
#define VEC_BYTES 64
#define BLOCK 6
#elif defined(__AVX__)
#define VEC_BYTES 32
#define BLOCK 2
#else
#define VEC_BYTES 16
#define BLOCK 2
#endif
enum { LANES_F32 = VEC_BYTES / 4, PW_F32 = 4 * LANES_F32, LANES_F64 = VEC_BYTES / 8, PW_F64 = 4 * LANES_F64 };

/* VEC_BYTES of the dtype's elements: a vector of each type, of which a body over dt uses the one
   of its dtype (the other is never set, and compiled away). */
typedef float vec_f32 __attribute__((vector_size(VEC_BYTES)));
typedef double vec_f64 __attribute__((vector_size(VEC_BYTES)));
struct vec { vec_f32 f; vec_f64 d; };

static inline __attribute__((always_inline)) struct vec vec_zero(void) {
  struct vec v = {{0}, {0}};
  return v;
}
static inline __attribute__((always_inline)) struct vec vec_load(int dt, const void *p) {
  struct vec v = {{0}, {0}};
  if (dt == KILN_F32) memcpy(&v.f, p, sizeof v.f);
  else memcpy(&v.d, p, sizeof v.d);
  return v;
}
/* acc += x * w, and a += b, in the dtype */
static inline __attribute__((always_inline)) void vec_fma(int dt, struct vec *acc, double x, struct vec w) {
  if (dt == KILN_F32) acc->f += (float)x * w.f;
  else acc->d += x * w.d;
}
static inline __attribute__((always_inline)) void vec_add(int dt, struct vec *a, struct vec b) {
  if (dt == KILN_F32) a->f += b.f;
  else a->d += b.d;
}

static inline __attribute__((always_inline)) int64_t panel_width(int dt) { return dt == KILN_F32 ? PW_F32 : PW_F64; }
static inline __attribute__((always_inline)) int64_t panels(int dt, int64_t n) {
  return (n + panel_width(dt) - 1) / panel_width(dt);
}

/* Pack a [K][n] matrix whose column c is cols[c][k] (forward: rows of w_hh, read along) as rows
   koff.. of panels KP rows tall, or whose row k is rows + k * ld (backward: a column slice of
   w_hh, read row by row). */
static inline __attribute__((always_inline)) void pack_cols(int dt, void *packed, int64_t KP, int64_t koff, int64_t K,
                                                            int64_t n, const void *const *cols) {
  const int64_t PW = panel_width(dt);
  for (int64_t p = 0; p < panels(dt, n); p++) {
    int64_t c0 = p * PW, m = n - c0 < PW ? n - c0 : PW, k0 = 0;
    void *panel = dt_at(packed, dt, (p * KP + koff) * PW);
#if defined(__AVX__)
    /* f32 in 8 x 8 blocks transposed in registers: 8 source rows read along, 8 packed rows
       written whole (a scalar loop over this transpose costs several steps of the layer) */
    if (dt == KILN_F32 && m == PW)
      for (; k0 + 8 <= K; k0 += 8)
        for (int64_t v0 = 0; v0 < PW; v0 += 8)
          transpose8_f32((float *)panel + k0 * PW + v0, PW, (const float *const *)cols + c0 + v0, k0);
#endif
    for (int64_t v = 0; v < PW; v++)
      for (int64_t k = k0; k < K; k++) dt_store(panel, dt, k * PW + v, v < m ? dt_load(cols[c0 + v], dt, k) : 0);
  }
}
static void pack_cols_f32(float *packed, int64_t KP, int64_t koff, int64_t K, int64_t n, const void *const *cols) {
  pack_cols(KILN_F32, packed, KP, koff, K, n, cols);
}
static void pack_cols_f64(double *packed, int64_t KP, int64_t koff, int64_t K, int64_t n, const void *const *cols) {
  pack_cols(KILN_F64, packed, KP, koff, K, n, cols);
}

static inline __attribute__((always_inline)) void pack_rows(int dt, void *packed, int64_t K, int64_t n, const void *rows,
                                                            int64_t ld) {
  const int64_t PW = panel_width(dt);
  for (int64_t k = 0; k < K; k++)
    for (int64_t p = 0; p < panels(dt, n); p++) {
      void *dst = dt_at(packed, dt, (p * K + k) * PW);
      int64_t c0 = p * PW, m = n - c0 < PW ? n - c0 : PW;
      memcpy(dst, dt_at(rows, dt, k * ld + c0), dt_size(dt) * (size_t)m);
      for (int64_t v = m; v < PW; v++) dt_store(dst, dt, v, 0);
    }
}

/* Panel p of the products for NB sequences, written at y[q] + out (for columns p * PW on). ORD:
   every sum in k's order, a lone sequence's too (the bf16 emulation's, which must keep vdpbf16ps's
   order). PF: a line from pf fetched into L2 every second k (K / 2 lines from pf). */
static inline __attribute__((always_inline)) void times_block(int dt, const int ORD, const int PF, const int NB,
                                                              const void *packed, int64_t K, int64_t n, int64_t p,
                                                              const void *const *x, void *const *y, int64_t out,
                                                              const char *pf) {
  const int64_t LANES = dt == KILN_F32 ? LANES_F32 : LANES_F64, PW = 4 * LANES;
  const void *ap = dt_at(packed, dt, p * K * PW);
  /* only the NB x 4 accumulators in use are set (zeroing the whole array costs a rep stos a call) */
  struct vec acc[BLOCK][4];
  for (int q = 0; q < NB; q++)
    for (int v = 0; v < 4; v++) acc[q][v] = vec_zero();
  int64_t k = 0;
  if (NB == 1 && !ORD) {   /* one sequence: a second set of accumulators for odd k hides the FMA latency */
    struct vec odd[4] = {vec_zero(), vec_zero(), vec_zero(), vec_zero()};
    for (; k + 2 <= K; k += 2) {
      const void *ak = dt_at(ap, dt, k * PW);
      double x0 = dt_load(x[0], dt, k), x1 = dt_load(x[0], dt, k + 1);
      for (int v = 0; v < 4; v++) {
        vec_fma(dt, &acc[0][v], x0, vec_load(dt, dt_at(ak, dt, v * LANES)));
        vec_fma(dt, &odd[v], x1, vec_load(dt, dt_at(ak, dt, PW + v * LANES)));
      }
    }
    for (int v = 0; v < 4; v++) vec_add(dt, &acc[0][v], odd[v]);
  }
  for (; k < K; k++) {
    const void *ak = dt_at(ap, dt, k * PW);
    if (PF && !(k & 1)) __builtin_prefetch(pf + (k >> 1) * 64, 0, 2);
    struct vec w0 = vec_load(dt, ak), w1 = vec_load(dt, dt_at(ak, dt, LANES)), w2 = vec_load(dt, dt_at(ak, dt, 2 * LANES));
    struct vec w3 = vec_load(dt, dt_at(ak, dt, 3 * LANES));
    /* the four weight vectors are loaded once for the NB sequences: without this the compiler
       folds a load into every FMA, and the loop waits on the load ports instead of the FMAs */
#if defined(__AVX512F__)   /* "v": any of the 32 vector registers */
    if (dt == KILN_F32) __asm__("" : "+v"(w0.f), "+v"(w1.f), "+v"(w2.f), "+v"(w3.f));
    else __asm__("" : "+v"(w0.d), "+v"(w1.d), "+v"(w2.d), "+v"(w3.d));
#elif defined(__x86_64__)
    if (dt == KILN_F32) __asm__("" : "+x"(w0.f), "+x"(w1.f), "+x"(w2.f), "+x"(w3.f));
    else __asm__("" : "+x"(w0.d), "+x"(w1.d), "+x"(w2.d), "+x"(w3.d));
#endif
    for (int q = 0; q < NB; q++) {
      double xv = dt_load(x[q], dt, k);
      vec_fma(dt, &acc[q][0], xv, w0); vec_fma(dt, &acc[q][1], xv, w1);
      vec_fma(dt, &acc[q][2], xv, w2); vec_fma(dt, &acc[q][3], xv, w3);
    }
  }
  int64_t c0 = p * PW, m = n - c0 < PW ? n - c0 : PW;
  for (int q = 0; q < NB; q++) {
    if (m == PW) {   /* a whole panel: the accumulators stored as they are */
      for (int v = 0; v < 4; v++)
        if (dt == KILN_F32) memcpy(dt_at(y[q], dt, out + v * LANES), &acc[q][v].f, VEC_BYTES);
        else memcpy(dt_at(y[q], dt, out + v * LANES), &acc[q][v].d, VEC_BYTES);
      continue;
    }
    char vals[4 * VEC_BYTES];
    for (int v = 0; v < 4; v++)
      if (dt == KILN_F32) memcpy(vals + VEC_BYTES * v, &acc[q][v].f, VEC_BYTES);
      else memcpy(vals + VEC_BYTES * v, &acc[q][v].d, VEC_BYTES);
    memcpy(dt_at(y[q], dt, out), vals, dt_size(dt) * (size_t)m);
  }
}

/* ys[q] = xs[q] a for na rows. Panel by panel, each panel against all of them in blocks of BLOCK,
   so that the weights are read once a step whatever the batch (from L2 or further out when they
   do not fit), and a panel is reused from L1 or L2 by the blocks after the first. With span > 0
   (a multiple of PW), column c goes to (c / span) * stride + c % span of ys[q]: the forward's
   gates straight into their places in a row of w_hh h. PF: the packed matrix is not in cache (the
   weights' grads' panels, 8 MB a char-LM step, streamed out by the backward team): each panel's
   blocks fetch the next panel into L2, K / 2 lines a block, so that only the first panel waits on
   memory (Emerald Rapids, 1 thread: the char-LM step's weight grads 24.4% -> 22.8% of its time,
   the step 28.15 -> 27.45 ms, medians of 40 alternating in one process; the same bits). */
static inline __attribute__((always_inline)) void times_rows(int dt, const int ORD, const int PF, const void *packed, int64_t K,
                                                             int64_t n, int64_t na, const void *const *xs, void *const *ys,
                                                             int64_t span, int64_t stride) {
  const int64_t np = panels(dt, n), lines = K * panel_width(dt) * (int64_t)dt_size(dt) / 64;
  for (int64_t p = 0; p < np; p++) {
    int64_t c0 = p * panel_width(dt), out = span ? (c0 / span) * stride + c0 % span : c0, q = 0;
    /* block q / BLOCK's share of the next panel (the blocks after the eighth fetch the same
       lines again, found in L2; the last panel's blocks its own) */
    const char *next = PF && lines ? (const char *)dt_at(packed, dt, (p + (p + 1 < np)) * K * panel_width(dt)) : NULL;
#define KILN_RNN_PF(q) (next ? next + (q) / BLOCK * (K / 2) % lines * 64 : NULL)
#if BLOCK == 6
    /* blocks of 6, the last two 4 + 3 rather than 6 + 1 and 4 + 4 rather than 6 + 2 (a block of
       2 has 8 sums, too few to hide the FMAs' latency: char-LM step 0.985-0.996, batch 8 0.966);
       a batch of 4j + 1 leaves its last sequence alone, as blocks of 4 did before (a block of one
       sums in another order), so that every batch's bits stay what they were */
    int64_t m = na > 1 && na % 4 == 1 ? na - 1 : na;
    for (; m - q >= 6 && m - q != 7 && m - q != 8; q += 6) times_block(dt, ORD, PF, 6, packed, K, n, p, xs + q, ys + q, out, KILN_RNN_PF(q));
    if (m - q == 7 || m - q == 8) { times_block(dt, ORD, PF, 4, packed, K, n, p, xs + q, ys + q, out, KILN_RNN_PF(q)); q += 4; }
    if (m - q == 5) times_block(dt, ORD, PF, 5, packed, K, n, p, xs + q, ys + q, out, KILN_RNN_PF(q));
    else if (m - q == 4) times_block(dt, ORD, PF, 4, packed, K, n, p, xs + q, ys + q, out, KILN_RNN_PF(q));
    else if (m - q == 3) times_block(dt, ORD, PF, 3, packed, K, n, p, xs + q, ys + q, out, KILN_RNN_PF(q));
    else if (m - q == 2) times_block(dt, ORD, PF, 2, packed, K, n, p, xs + q, ys + q, out, KILN_RNN_PF(q));
    else if (m - q == 1) times_block(dt, ORD, PF, 1, packed, K, n, p, xs + q, ys + q, out, KILN_RNN_PF(q));
    if (m < na) times_block(dt, ORD, PF, 1, packed, K, n, p, xs + m, ys + m, out, KILN_RNN_PF(m));
#else
    for (; q + BLOCK <= na; q += BLOCK) times_block(dt, ORD, PF, BLOCK, packed, K, n, p, xs + q, ys + q, out, KILN_RNN_PF(q));
    if (na - q == 1) times_block(dt, ORD, PF, 1, packed, K, n, p, xs + q, ys + q, out, KILN_RNN_PF(q));
#endif
  }
#undef KILN_RNN_PF
}
static void times_rows_f32(const float *packed, int64_t K, int64_t n, int64_t na, const void **xs, void **ys, int64_t span,
                           int64_t stride) {
  times_rows(KILN_F32, 0, 0, packed, K, n, na, xs, ys, span, stride);
}
static void times_rows_f64(const double *packed, int64_t K, int64_t n, int64_t na, const void **xs, void **ys, int64_t span,
                           int64_t stride) {
  times_rows(KILN_F64, 0, 0, packed, K, n, na, xs, ys, span, stride);
}
/* the same for a packed matrix out of cache (PF) */
static void times_rows_fetch_f32(const float *packed, int64_t K, int64_t n, int64_t na, const void **xs, void **ys) {
  times_rows(KILN_F32, 0, 1, packed, K, n, na, xs, ys, 0, 0);
}
static void times_rows_fetch_f64(const double *packed, int64_t K, int64_t n, int64_t na, const void **xs, void **ys) {
  times_rows(KILN_F64, 0, 1, packed, K, n, na, xs, ys, 0, 0);
}
void kiln_cpu_rnn_times_f32_ordered(const float *packed, int64_t K, int64_t n, int64_t na, const float *const *xs,
                                    float *const *ys, int64_t span, int64_t stride) {
  times_rows(KILN_F32, 1, 0, packed, K, n, na, (const void *const *)xs, (void *const *)ys, span, stride);
}

/* A layer's buffers, of its dtype. */
struct layer {
  int mode, reverse, G, RS;
  int padded;                    /* some sequence is shorter than T: rows past its end stay 0 */
  const int64_t *xidx;           /* or NULL: xp is a table (x, I = 0), step row (t * B + b) its row xidx[row] */
  int64_t T, B, I, H, GH;
  const int64_t *len;            /* [B] */
  const void *x, *h0, *c0;       /* h0, c0: [B,H], zeros when the layer has none */
  const void *w_ih, *w_hh, *b_hh;   /* b_hh: zeros when the layer has none */
  void *z, *res;                 /* Z [T+S,B,H]; reserve [T,B,RS*H] */
  int res_stream;                /* the persistent teams' LSTM gates write the reserve by streaming stores
                                    (lstm_forward_f32_zmm), each thread fencing before the team's join */
  void *xp;                      /* forward: [T,B,GH] input projection (b_ih is added in the gates);
                                    NULL when the persistent team folds it into its products */
  const void *b_ih;              /* zeros when the layer has none */
  const void *zero;              /* GH zeros */
  void *hh;                      /* [B,GH]: the recurrent products of the current step */
  void *h, *hnext, *c;           /* [B,H] state; hnext: the persistent path's second buffer */
  /* backward */
  const void *gz;
  void *dgx, *dgh;               /* [T,B,GH] pre-activation grads (dgh: as seen by w_hh; = dgx but for GRU) */
  void *dgs;                     /* [B,GH]: the GEMM path's rows of this step, when dgh has them apart */
  void *dh, *dc, *tmp;           /* [B,H] */
  int dh0;                       /* h0's grad is wanted: else the first step's product against w_hh,
                                    which only that grad reads, is not computed */
  void *gbx, *gbh;               /* [GH]: the bias grads (sums of dgx and of dgh rows), when the persistent
                                    team sums them as it goes (gbh: the GRU's, else NULL); else NULL */
  void *gx;                      /* [T,B,I]: the grad of x, when the persistent team computes it step by
                                    step (the input projection's fold, backward); else NULL */
  void *gwp;                     /* dgh packed in panels [panels(GH)][T*B][PW] for the weights' grads,
                                    by the persistent team as it goes (weight_grads); else NULL */
  void *gt;                      /* a looked-up table's grad [V][GH] (xidx), summed by the persistent
                                    team as it goes (table_rows); else NULL */
  int ring;                      /* dgx (= dgh) holds two steps' rows, [2,B,GH], step s's at s % 2:
                                    the persistent team's, when nothing reads them after it */
  /* bf16: a layer whose input is bf16 (autocast's) runs its products on bf16 rows with f32 sums
     (cpu/bf16_rnn.c); its state, gates, reserve and grads stay f32 until their last rounding. The
     f32 buffers above are then f32 (x, z and gz are not used: xb, zb and an f32 copy of gz) */
  int bf;
  int wdt;                       /* the weights' dtype (f32 or bf16) */
  const uint16_t *xb;            /* x [T,B,I] */
  uint16_t *zb;                  /* Z [T+S,B,H] */
  uint16_t *h0b;                 /* [B,H] h0 rounded, one element to spare */
  uint16_t *whhb, *wihb;         /* w_hh, w_ih rounded (the GEMM path and the GEMMs of the layer) */
  uint16_t *dgxb, *dghb;         /* [T,B,GHp] dgx and dgh rounded (dghb = dgxb but for the GRU) */
  const uint16_t *gzb;           /* the bf16 grad of Z, read as it is by the persistent LSTM (else gz, in f32) */
  uint16_t *gxb;                 /* [T,B,I] x's grad (bf16), when the persistent team computes it */
  int64_t GHp;                   /* GH rounded up to even: dgxb's rows */
  uint16_t *hb;                  /* the GEMM path: [B,H] the state rounded, the step's product's rows */
  float *yrows;                  /* the GEMM path: [B,H] output rows before their rounding */
  struct barrier bar;
};

static inline int64_t step_time(const struct layer *L, int64_t s, int64_t b) {
  return L->reverse ? L->len[b] - 1 - s : s;
}
/* The row of dgx (dgh) holding the grads of sequence b at step s (its time row, or its row of the
   step's half of the ring). */
static inline int64_t grad_row(const struct layer *L, int64_t s, int64_t b) {
  return L->ring ? (s & 1) * L->B + b : step_time(L, s, b) * L->B + b;
}
/* The time of the step before s (s > 0). */
static inline int64_t prev_time(const struct layer *L, int64_t t) { return L->reverse ? t + 1 : t - 1; }

/* The state before step s of sequence b: h0/c0 at s = 0, else the previous step's output/cell. */
static inline __attribute__((always_inline)) const void *h_before(int dt, const struct layer *L, int64_t s, int64_t b,
                                                                  int64_t t) {
  return s == 0 ? dt_at(L->h0, dt, b * L->H) : dt_at(L->z, dt, (prev_time(L, t) * L->B + b) * L->H);
}

/* The same in bf16 (the products' rows): h0 rounded, else the previous step's output row. */
static inline const uint16_t *h_before_bf(const struct layer *L, int64_t s, int64_t b, int64_t t) {
  return s == 0 ? L->h0b + b * L->H : L->zb + (prev_time(L, t) * L->B + b) * L->H;
}

/* A gate's input, xp + bi + hh + bh at element k, in the dtype. */
static inline __attribute__((always_inline)) double gate_in(int dt, const void *xp, const void *bi, const void *hh,
                                                            const void *bh, int64_t k) {
  return dt_add(dt, dt_add(dt, dt_add(dt, dt_load(xp, dt, k), dt_load(bi, dt, k)), dt_load(hh, dt, k)), dt_load(bh, dt, k));
}

/* The gate loops over n units, with restrict pointers (at the first unit; gates are H apart) so
   that they vectorise. Where two products meet in a sum they are computed in this order: gcc
   fuses the first into an FMA. */
/* bf (a constant): the bf16 team's form, y a row of bf16 outputs, written rounded */
static inline __attribute__((always_inline)) void lstm_forward(int dt, const int bf, int64_t H, int64_t n, const void *restrict xp,
                                                               const void *restrict bi, const void *restrict hh,
                                                               const void *restrict bh, void *restrict c,
                                                               void *restrict res, void *restrict ho, void *restrict y) {
#pragma GCC ivdep   /* gate rows are H >= n apart: no overlap */
  for (int64_t j = 0; j < n; j++) {
    double i = gate_sigmoid(dt, gate_in(dt, xp, bi, hh, bh, j));
    double f = gate_sigmoid(dt, gate_in(dt, xp, bi, hh, bh, H + j));
    double g = gate_tanh(dt, gate_in(dt, xp, bi, hh, bh, 2 * H + j));
    double o = gate_sigmoid(dt, gate_in(dt, xp, bi, hh, bh, 3 * H + j));
    double fc = dt_mul(dt, f, dt_load(c, dt, j));
    double ig = dt_mul(dt, i, g);
    double cn = dt_add(dt, fc, ig);
    double hn = dt_mul(dt, o, gate_tanh(dt, cn));
    dt_store(res, dt, j, i); dt_store(res, dt, H + j, f); dt_store(res, dt, 2 * H + j, g);
    dt_store(res, dt, 3 * H + j, o); dt_store(res, dt, 4 * H + j, cn);
    dt_store(c, dt, j, cn); dt_store(ho, dt, j, hn);
    if (bf) ((uint16_t *)y)[j] = convert_f32_to_bf16((float)hn);
    else dt_store(y, dt, j, hn);
  }
}

static inline __attribute__((always_inline)) void gru_forward(int dt, int64_t H, int64_t n, const void *restrict xp,
                                                              const void *restrict bi, const void *restrict hh,
                                                              const void *restrict bh, const void *restrict hp,
                                                              void *restrict res, void *restrict ho, void *restrict y) {
#pragma GCC ivdep   /* gate rows are H >= n apart: no overlap */
  for (int64_t j = 0; j < n; j++) {
    double r = gate_sigmoid(dt, gate_in(dt, xp, bi, hh, bh, j));
    double zg = gate_sigmoid(dt, gate_in(dt, xp, bi, hh, bh, H + j));
    double hn = dt_add(dt, dt_load(hh, dt, 2 * H + j), dt_load(bh, dt, 2 * H + j));
    double nn = gate_tanh(dt, dt_add(dt, dt_add(dt, dt_load(xp, dt, 2 * H + j), dt_load(bi, dt, 2 * H + j)), dt_mul(dt, r, hn)));
    double a = dt_mul(dt, dt_sub(dt, 1, zg), nn);
    double b = dt_mul(dt, zg, dt_load(hp, dt, j));
    double h = dt_add(dt, a, b);
    dt_store(res, dt, j, r); dt_store(res, dt, H + j, zg); dt_store(res, dt, 2 * H + j, nn); dt_store(res, dt, 3 * H + j, hn);
    dt_store(ho, dt, j, h); dt_store(y, dt, j, h);
  }
}

static inline __attribute__((always_inline)) void plain_forward(int dt, const int relu, int64_t n, const void *restrict xp,
                                                                const void *restrict bi, const void *restrict hh,
                                                                const void *restrict bh, void *restrict ho,
                                                                void *restrict y) {
#pragma GCC ivdep   /* gate rows are H >= n apart: no overlap */
  for (int64_t j = 0; j < n; j++) {
    double p = gate_in(dt, xp, bi, hh, bh, j);
    double h = relu ? dt_select(dt, p > 0, p, 0) : gate_tanh(dt, p);
    dt_store(ho, dt, j, h); dt_store(y, dt, j, h);
  }
}

/* The four grads are added to the bias grads gb (the team's sums) when given. bf (a constant): the
   bf16 team's form, in f32: gy read as bf16, the grads written rounded to bf16 (dgx a row of dgxb)
   and their f32 values added to gb. */
static inline __attribute__((always_inline)) void lstm_backward(int dt, const int bf, int64_t H, int64_t n,
                                                                const void *restrict gy, const void *restrict res,
                                                                const void *restrict cp, void *restrict dh, void *restrict dc,
                                                                void *restrict dgx, void *restrict gb) {
#pragma GCC ivdep   /* gate rows are H >= n apart: no overlap */
  for (int64_t j = 0; j < n; j++) {
    double d = dt_add(dt, dt_load(dh, dt, j), bf ? (double)convert_bf16_to_f32(((const uint16_t *)gy)[j]) : dt_load(gy, dt, j));
    dt_store(dh, dt, j, d);
    double i = dt_load(res, dt, j), f = dt_load(res, dt, H + j), g = dt_load(res, dt, 2 * H + j);
    double o = dt_load(res, dt, 3 * H + j), tc = gate_tanh(dt, dt_load(res, dt, 4 * H + j));
    double dct = dt_add(dt, dt_load(dc, dt, j), dt_mul(dt, dt_mul(dt, d, o), dt_sub(dt, 1, dt_mul(dt, tc, tc))));
    double di = dt_mul(dt, dt_mul(dt, dt_mul(dt, dct, g), i), dt_sub(dt, 1, i));
    double df = dt_mul(dt, dt_mul(dt, dt_mul(dt, dct, dt_load(cp, dt, j)), f), dt_sub(dt, 1, f));
    double dg = dt_mul(dt, dt_mul(dt, dct, i), dt_sub(dt, 1, dt_mul(dt, g, g)));
    double dout = dt_mul(dt, dt_mul(dt, dt_mul(dt, d, tc), o), dt_sub(dt, 1, o));
    dt_store(dc, dt, j, dt_mul(dt, dct, f));
    if (bf) {
      uint16_t *row = dgx;
      row[j] = convert_f32_to_bf16((float)di); row[H + j] = convert_f32_to_bf16((float)df);
      row[2 * H + j] = convert_f32_to_bf16((float)dg); row[3 * H + j] = convert_f32_to_bf16((float)dout);
    } else {
      dt_store(dgx, dt, j, di);
      dt_store(dgx, dt, H + j, df);
      dt_store(dgx, dt, 2 * H + j, dg);
      dt_store(dgx, dt, 3 * H + j, dout);
    }
    if (gb) {
      dt_store(gb, dt, j, dt_add(dt, dt_load(gb, dt, j), di));
      dt_store(gb, dt, H + j, dt_add(dt, dt_load(gb, dt, H + j), df));
      dt_store(gb, dt, 2 * H + j, dt_add(dt, dt_load(gb, dt, 2 * H + j), dg));
      dt_store(gb, dt, 3 * H + j, dt_add(dt, dt_load(gb, dt, 3 * H + j), dout));
    }
  }
}

static inline __attribute__((always_inline)) void gru_backward(int dt, int64_t H, int64_t n, const void *restrict gy,
                                                               const void *restrict res, const void *restrict hp,
                                                               void *restrict dh, void *restrict dgx, void *restrict dgh) {
#pragma GCC ivdep   /* gate rows are H >= n apart: no overlap */
  for (int64_t j = 0; j < n; j++) {
    double d = dt_add(dt, dt_load(dh, dt, j), dt_load(gy, dt, j));
    dt_store(dh, dt, j, d);
    double r = dt_load(res, dt, j), zg = dt_load(res, dt, H + j), nn = dt_load(res, dt, 2 * H + j);
    double hn = dt_load(res, dt, 3 * H + j);
    double dn = dt_mul(dt, dt_mul(dt, d, dt_sub(dt, 1, zg)), dt_sub(dt, 1, dt_mul(dt, nn, nn)));
    double dr = dt_mul(dt, dt_mul(dt, dt_mul(dt, dn, hn), r), dt_sub(dt, 1, r));
    double dz = dt_mul(dt, dt_mul(dt, dt_mul(dt, d, dt_sub(dt, dt_load(hp, dt, j), nn)), zg), dt_sub(dt, 1, zg));
    dt_store(dgx, dt, j, dr); dt_store(dgh, dt, j, dr);
    dt_store(dgx, dt, H + j, dz); dt_store(dgh, dt, H + j, dz);
    dt_store(dgx, dt, 2 * H + j, dn);
    dt_store(dgh, dt, 2 * H + j, dt_mul(dt, dn, r));
  }
}

static inline __attribute__((always_inline)) void plain_backward(int dt, const int relu, int64_t n, const void *restrict gy,
                                                                 const void *restrict y, void *restrict dh,
                                                                 void *restrict dgx) {
#pragma GCC ivdep   /* gate rows are H >= n apart: no overlap */
  for (int64_t j = 0; j < n; j++) {
    double d = dt_add(dt, dt_load(dh, dt, j), dt_load(gy, dt, j));
    dt_store(dh, dt, j, d);
    double yj = dt_load(y, dt, j);
    double p = relu ? dt_select(dt, yj > 0, d, 0) : dt_mul(dt, d, dt_sub(dt, 1, dt_mul(dt, yj, yj)));
    dt_store(dgx, dt, j, p);
  }
}

#if defined(__AVX512F__)
/* The f32 LSTM forward's gate loop in zmm: gate_expf, gate_tanhf and lstm_forward's arithmetic
   operation by operation, with the multiply-adds gcc makes of lstm_forward (the same bits, checked
   at every f32 input), the clamps as vmaxps/vminps in the operand order that keeps a NaN (gcc's
   loop makes each a compare and two blends, ~200 instructions a vector). */
/* e^-x as p * scale: gate_expf(-x) as gcc's loop computes it, -x clamped for the reduction and
   x * -log2(e) clamped for the exponent (the same in range; a NaN keeps x's sign) */
static inline __attribute__((always_inline)) __m512 gate_expneg16(__m512 x, __m512 *scale) {
  const float log2e = 1.44269504088896341f;
  __m512 nx = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)));
  __m512 c = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-86.0f), nx));
  __m512 m = _mm512_min_ps(_mm512_set1_ps(89.0f * log2e), _mm512_max_ps(_mm512_set1_ps(-86.0f * log2e), _mm512_mul_ps(x, _mm512_set1_ps(-log2e))));
  __m512 n = _mm512_roundscale_ps(m, _MM_FROUND_CUR_DIRECTION);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), c);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_fmadd_ps(r, _mm512_set1_ps(0.0013814600458248293f), _mm512_set1_ps(0.008368709679756708f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(0.041668387518962555f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(0.16666520691192627f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(0.49999993451353264f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(1.0f));
  *scale = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23));
  return p;
}
/* 1 / (1 + e^-x), 1 + p * scale as one multiply-add */
static inline __attribute__((always_inline)) __m512 gate_sigmoid16(__m512 x) {
  __m512 scale, p = gate_expneg16(x, &scale);
  return _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(p, scale, _mm512_set1_ps(1.0f)));
}
static inline __attribute__((always_inline)) __m512 gate_tanh16(__m512 x) {
  const __m512i sign = _mm512_set1_epi32(INT32_MIN);
  __m512 a = _mm512_castsi512_ps(_mm512_andnot_si512(sign, _mm512_castps_si512(x)));
  __m512 c = _mm512_min_ps(_mm512_set1_ps(9.02f), a), u = _mm512_mul_ps(c, c);
  __m512 p = _mm512_fmadd_ps(u, _mm512_set1_ps(-1.220340903880012e-11f), _mm512_set1_ps(3.0584944654534824e-08f));
  p = _mm512_fmadd_ps(u, p, _mm512_set1_ps(2.8007426157229583e-05f));
  p = _mm512_fmadd_ps(u, p, _mm512_set1_ps(0.0038683261118077775f));
  p = _mm512_fmadd_ps(u, p, _mm512_set1_ps(0.13679913762174187f));
  p = _mm512_fmadd_ps(u, p, _mm512_set1_ps(1.0f));
  __m512 q = _mm512_fmadd_ps(u, _mm512_set1_ps(1.287364325414031e-06f), _mm512_set1_ps(0.00039386282432700247f));
  q = _mm512_fmadd_ps(u, q, _mm512_set1_ps(0.027245832814714478f));
  q = _mm512_fmadd_ps(u, q, _mm512_set1_ps(0.4701324582322442f));
  q = _mm512_fmadd_ps(u, q, _mm512_set1_ps(1.0f));
  __m512 t = _mm512_min_ps(_mm512_set1_ps(1.0f), _mm512_div_ps(_mm512_mul_ps(c, p), q));
  t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(9.02f), _CMP_GT_OQ), t, _mm512_set1_ps(1.0f));
  /* t's sign is clear: copysign is an or */
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), _mm512_and_si512(sign, _mm512_castps_si512(x))));
}
/* sixteen units of lstm_forward at j, the lanes of m (masked loads and stores only for the last
   pass: Zen's masked stores are slow); the output to y, or rounded to bf16 into yb (bf = 1) */
static inline __attribute__((always_inline)) void lstm_forward16(const int masked, const int nt, __mmask16 m, int64_t H, int64_t j,
                                                                 const float *restrict xp, const float *restrict bi,
                                                                 const float *restrict hh, const float *restrict bh,
                                                                 float *restrict c, float *restrict res, float *restrict ho,
                                                                 float *restrict y, uint16_t *restrict yb) {
#define LD(p) (masked ? _mm512_maskz_loadu_ps(m, (p)) : _mm512_loadu_ps(p))
#define ST(p, v) (masked ? _mm512_mask_storeu_ps((p), m, (v)) : _mm512_storeu_ps((p), (v)))
  __m512 gin[4];
  for (int g = 0; g < 4; g++) {
    int64_t k = g * H + j;
    gin[g] = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(LD(xp + k), LD(bi + k)), LD(hh + k)), LD(bh + k));
  }
  __m512 i = gate_sigmoid16(gin[0]), f = gate_sigmoid16(gin[1]), g = gate_tanh16(gin[2]), o = gate_sigmoid16(gin[3]);
  __m512 cn = _mm512_fmadd_ps(f, LD(c + j), _mm512_mul_ps(i, g));
  __m512 hn = _mm512_mul_ps(o, gate_tanh16(cn));
  if (res && nt) {
    _mm512_stream_ps(res + j, i); _mm512_stream_ps(res + H + j, f); _mm512_stream_ps(res + 2 * H + j, g);
    _mm512_stream_ps(res + 3 * H + j, o); _mm512_stream_ps(res + 4 * H + j, cn);
  } else if (res) {
    ST(res + j, i); ST(res + H + j, f); ST(res + 2 * H + j, g); ST(res + 3 * H + j, o); ST(res + 4 * H + j, cn);
  }
  ST(c + j, cn); ST(ho + j, hn);
  if (!yb) { ST(y + j, hn); return; }
  __m256i h = kiln_bf16x16_round(hn);   /* as convert_f32_to_bf16 rounds */
  if (masked) _mm256_mask_storeu_epi16(yb + j, m, h);
  else _mm256_storeu_si256((__m256i *)(yb + j), h);
#undef LD
#undef ST
}
/* y the f32 output row, or (y NULL) yb the bf16 one (the bf16 team's form, bf = 1). stream: the
   reserve's whole vectors by streaming stores where its rows are 64-byte aligned: nothing reads it
   before the backward, and its lines (10.5 MB a char-LM step) need not be fetched before they are
   written (the caller fences). */
static void lstm_forward_f32_zmm(int64_t H, int64_t n, const float *restrict xp, const float *restrict bi,
                                 const float *restrict hh, const float *restrict bh, float *restrict c,
                                 float *restrict res, float *restrict ho, float *restrict y, uint16_t *restrict yb,
                                 int stream) {
  int64_t j = 0;
  if (stream && res && H % 16 == 0 && (uintptr_t)res % 64 == 0)
    for (; j + 16 <= n; j += 16) lstm_forward16(0, 1, 0xffff, H, j, xp, bi, hh, bh, c, res, ho, y, yb);
  for (; j + 16 <= n; j += 16) lstm_forward16(0, 0, 0xffff, H, j, xp, bi, hh, bh, c, res, ho, y, yb);
  if (j < n) lstm_forward16(1, 0, (__mmask16)((1u << (n - j)) - 1), H, j, xp, bi, hh, bh, c, res, ho, y, yb);
}
#endif

/* Gates of units [j0, j1) of sequence b at step s: reads hh[b] (w_hh h) and the state in hin[b]
   (and c[b]), writes the new state to hout[b] (another buffer) and c[b], the output to Z and the
   reserve. */
static inline __attribute__((always_inline)) void cell_forward(int dt, struct layer *L, int64_t s, int64_t b, int64_t j0,
                                                               int64_t j1, const void *hin, void *hout, void *yf) {
  int64_t H = L->H, t = step_time(L, s, b), row = t * L->B + b, n = j1 - j0;
  const void *xp = L->xp ? dt_at(L->xp, dt, (L->xidx ? L->xidx[row] : row) * L->GH + j0) : dt_at(L->zero, dt, j0);
  const void *bi = dt_at(L->b_ih, dt, j0), *hh = dt_at(L->hh, dt, b * L->GH + j0), *bh = dt_at(L->b_hh, dt, j0);
  /* the output row; bf16: yf, a scratch row of the caller's, then the output rounded into zb */
  void *y = L->bf ? yf : dt_at(L->z, dt, row * H + j0), *ho = dt_at(hout, dt, b * H + j0);
  void *res = L->res ? dt_at(L->res, dt, row * L->RS * H + j0) : NULL;
#if defined(__AVX512F__)
  if (dt == KILN_F32 && L->mode == KILN_RNN_LSTM)
    lstm_forward_f32_zmm(H, n, xp, bi, hh, bh, (float *)L->c + b * H + j0, res, ho, y, NULL, L->res_stream);
  else
#endif
  if (L->mode == KILN_RNN_LSTM) lstm_forward(dt, 0, H, n, xp, bi, hh, bh, dt_at(L->c, dt, b * H + j0), res, ho, y);
  else if (L->mode == KILN_RNN_GRU) gru_forward(dt, H, n, xp, bi, hh, bh, dt_at(hin, dt, b * H + j0), res, ho, y);
  else if (L->mode == KILN_RNN_RELU) plain_forward(dt, 1, n, xp, bi, hh, bh, ho, y);
  else plain_forward(dt, 0, n, xp, bi, hh, bh, ho, y);
  if (L->bf) kiln_cpu_rnn_bf16_round(L->zb + row * H + j0, y, KILN_F32, n);
}
static void cell_forward_f32(struct layer *L, int64_t s, int64_t b, int64_t j0, int64_t j1, const void *hin, void *hout,
                             void *yf) {
  cell_forward(KILN_F32, L, s, b, j0, j1, hin, hout, yf);
}
static void cell_forward_f64(struct layer *L, int64_t s, int64_t b, int64_t j0, int64_t j1, const void *hin, void *hout,
                             void *yf) {
  cell_forward(KILN_F64, L, s, b, j0, j1, hin, hout, yf);
}
/* The LSTM's in the bf16 team: its outputs rounded into zb in the gates' pass (cell_forward's
   second pass, the same bits) */
static void cell_forward_lstm_bf(struct layer *L, int64_t s, int64_t b, int64_t j0, int64_t j1, void *hout) {
  int64_t H = L->H, t = step_time(L, s, b), row = t * L->B + b, GH = L->GH, n = j1 - j0;
  const float *xp = L->xp ? (const float *)L->xp + (L->xidx ? L->xidx[row] : row) * GH + j0 : (const float *)L->zero + j0;
#if defined(__AVX512F__)
  lstm_forward_f32_zmm(H, n, xp, (const float *)L->b_ih + j0, (const float *)L->hh + b * GH + j0, (const float *)L->b_hh + j0,
                       (float *)L->c + b * H + j0, L->res ? (float *)L->res + row * L->RS * H + j0 : NULL,
                       (float *)hout + b * H + j0, NULL, L->zb + row * H + j0, L->res_stream);
#else
  lstm_forward(KILN_F32, 1, H, n, xp, (const float *)L->b_ih + j0, (const float *)L->hh + b * GH + j0,
               (const float *)L->b_hh + j0, (float *)L->c + b * H + j0, L->res ? (float *)L->res + row * L->RS * H + j0 : NULL,
               (float *)hout + b * H + j0, L->zb + row * H + j0);
#endif
}

/* The grads of units [j0, j1) of sequence b at step s: dh[b] holds the grad of the step's output
   state (the output's grad added here), dc[b] that of its cell. Writes the pre-activation grads
   to dgx and dgh (time rows; dgh is dgx but for the GRU), or to the rows gxr and ghr (a row of GH
   each, the bf16 team's scratch) when given, and dc[b] for the step before. With sums, the LSTM's
   grads are also added to the bias grads gbx, in the pass (bias_rows' sums, for the other modes). */
static inline __attribute__((always_inline)) void cell_backward(int dt, struct layer *L, int64_t s, int64_t b, int64_t j0,
                                                                int64_t j1, void *gxr, void *ghr, int sums) {
  int64_t H = L->H, t = step_time(L, s, b), row = t * L->B + b, GH = L->GH, n = j1 - j0;
  const void *gy = dt_at(L->gz, dt, row * H + j0), *res = L->res ? dt_at(L->res, dt, row * L->RS * H + j0) : NULL;
  void *dh = dt_at(L->dh, dt, b * H + j0), *dgx = gxr ? dt_at(gxr, dt, j0) : dt_at(L->dgx, dt, grad_row(L, s, b) * GH + j0);
  if (L->mode == KILN_RNN_LSTM) {
    const void *cp = s == 0 ? dt_at(L->c0, dt, b * H) : dt_at(L->res, dt, (prev_time(L, t) * L->B + b) * L->RS * H + 4 * H);
    lstm_backward(dt, 0, H, n, gy, res, dt_at(cp, dt, j0), dh, dt_at(L->dc, dt, b * H + j0), dgx,
                  sums && L->gbx ? dt_at(L->gbx, dt, j0) : NULL);
  } else if (L->mode == KILN_RNN_GRU) {
    gru_backward(dt, H, n, gy, res, dt_at(h_before(dt, L, s, b, t), dt, j0), dh, dgx,
                 ghr ? dt_at(ghr, dt, j0) : dt_at(L->dgh, dt, grad_row(L, s, b) * GH + j0));
  } else if (L->mode == KILN_RNN_RELU) {
    plain_backward(dt, 1, n, gy, dt_at(L->z, dt, row * H + j0), dh, dgx);
  } else {
    plain_backward(dt, 0, n, gy, dt_at(L->z, dt, row * H + j0), dh, dgx);
  }
}
static void cell_backward_f32(struct layer *L, int64_t s, int64_t b, int64_t j0, int64_t j1, float *gxr, float *ghr, int sums) {
  cell_backward(KILN_F32, L, s, b, j0, j1, gxr, ghr, sums);
}
static void cell_backward_f64(struct layer *L, int64_t s, int64_t b, int64_t j0, int64_t j1, int sums) {
  cell_backward(KILN_F64, L, s, b, j0, j1, NULL, NULL, sums);
}
/* The LSTM's in the bf16 team, in one pass: gy from the bf16 grad of Z (L->gzb), the grads
   rounded straight into dgxb and summed into the bias grads (as grad_rows_bf does after
   cell_backward_f32, the same bits) */
static void cell_backward_lstm_bf(struct layer *L, int64_t s, int64_t b, int64_t j0, int64_t j1) {
  int64_t H = L->H, t = step_time(L, s, b), row = t * L->B + b, RS = L->RS, n = j1 - j0;
  const float *res = (const float *)L->res + row * RS * H + j0;
  const float *cp = s == 0 ? (const float *)L->c0 + b * H : (const float *)L->res + (prev_time(L, t) * L->B + b) * RS * H + 4 * H;
  lstm_backward(KILN_F32, 1, H, n, L->gzb + row * H + j0, res, cp + j0, (float *)L->dh + b * H + j0, (float *)L->dc + b * H + j0,
                L->dgxb + row * L->GHp + j0, L->gbx ? (float *)L->gbx + j0 : NULL);
}

/* The grad of the state before step s for units [k0, k1) of sequence b, from prod[k - k0] (its
   dgh row times w_hh); GRU adds the direct path h = ... + z h_prev. */
static inline __attribute__((always_inline)) void carry_back(int dt, struct layer *L, int64_t s, int64_t b, int64_t k0,
                                                             int64_t k1, const void *prod) {
  void *dh = dt_at(L->dh, dt, b * L->H);
  if (L->mode == KILN_RNN_GRU) {
    const void *zg = dt_at(L->res, dt, (step_time(L, s, b) * L->B + b) * L->RS * L->H + L->H);
    for (int64_t k = k0; k < k1; k++)
      dt_store(dh, dt, k, dt_add(dt, dt_load(prod, dt, k - k0), dt_mul(dt, dt_load(dh, dt, k), dt_load(zg, dt, k))));
  } else {
    for (int64_t k = k0; k < k1; k++) dt_store(dh, dt, k, dt_load(prod, dt, k - k0));
  }
}
static void carry_back_f32(struct layer *L, int64_t s, int64_t b, int64_t k0, int64_t k1, const float *prod) {
  carry_back(KILN_F32, L, s, b, k0, k1, prod);
}
static void carry_back_f64(struct layer *L, int64_t s, int64_t b, int64_t k0, int64_t k1, const double *prod) {
  carry_back(KILN_F64, L, s, b, k0, k1, prod);
}

/* The bias grads of units [j0, j1) of every gate, from the rows of sequence b at step s: the
   persistent team's sums, kept per unit by the thread that owns it, over steps from the last. */
static inline __attribute__((always_inline)) void bias_rows(int dt, struct layer *L, int64_t s, int64_t b, int64_t j0,
                                                            int64_t j1) {
  int64_t row = grad_row(L, s, b);
  for (int k = 0; k < 2; k++) {
    void *gb = k ? L->gbh : L->gbx;
    if (!gb) continue;
    const void *src = dt_at(k ? L->dgh : L->dgx, dt, row * L->GH);
    for (int64_t g = 0; g < L->G; g++)
      for (int64_t j = g * L->H + j0; j < g * L->H + j1; j++) dt_store(gb, dt, j, dt_add(dt, dt_load(gb, dt, j), dt_load(src, dt, j)));
  }
}
static void bias_rows_f32(struct layer *L, int64_t s, int64_t b, int64_t j0, int64_t j1) { bias_rows(KILN_F32, L, s, b, j0, j1); }

/* bf16: the rows of dgx (and dgh) of units [j0, j1) of sequence b at step s, from the f32 rows
   gxr and ghr (GH each; ghr is gxr but for the GRU), rounded into dgxb (dghb), the rows the
   products and the weight grads read, and added to the bias grads when the team sums them (gbx,
   gbh), in one pass */
static inline __attribute__((always_inline)) void grad_rows_one(int64_t n, const float *restrict src, uint16_t *restrict dst,
                                                                float *restrict gb) {
  if (gb)
    for (int64_t j = 0; j < n; j++) { gb[j] += src[j]; dst[j] = convert_f32_to_bf16(src[j]); }
  else
    for (int64_t j = 0; j < n; j++) dst[j] = convert_f32_to_bf16(src[j]);
}
static void grad_rows_bf(struct layer *L, int64_t s, int64_t b, int64_t j0, int64_t j1, int sums, const float *gxr,
                         const float *ghr) {
  int64_t row = step_time(L, s, b) * L->B + b;
  for (int64_t g = 0; g < L->G; g++) {
    int64_t k = g * L->H + j0;
    grad_rows_one(j1 - j0, gxr + k, L->dgxb + row * L->GHp + k, sums && L->gbx ? (float *)L->gbx + k : NULL);
    if (L->dghb != L->dgxb)
      grad_rows_one(j1 - j0, ghr + k, L->dghb + row * L->GHp + k, sums && L->gbh ? (float *)L->gbh + k : NULL);
    else if (sums && L->gbh)
      for (int64_t j = k; j < k + j1 - j0; j++) ((float *)L->gbh)[j] += ghr[j];
  }
}
static void bias_rows_f64(struct layer *L, int64_t s, int64_t b, int64_t j0, int64_t j1) { bias_rows(KILN_F64, L, s, b, j0, j1); }

/* A looked-up input's grad: the row of dgx of sequence b at step s, units [j0, j1) of every gate,
   added into the table's row its index names (gt). The team's sums as it goes, over steps from the
   last and sequences in order, as table_columns sums after the GEMM path; with them dgx needs only
   two steps' rows (ring). */
static inline __attribute__((always_inline)) void table_rows(int dt, struct layer *L, int64_t s, int64_t b, int64_t j0,
                                                             int64_t j1) {
  int64_t GH = L->GH, t = step_time(L, s, b);
  void *restrict g = dt_at(L->gt, dt, L->xidx[t * L->B + b] * GH);
  const void *restrict d = dt_at(L->dgx, dt, grad_row(L, s, b) * GH);
  for (int64_t gate = 0; gate < L->G; gate++)
    for (int64_t j = gate * L->H + j0; j < gate * L->H + j1; j++) dt_store(g, dt, j, dt_add(dt, dt_load(g, dt, j), dt_load(d, dt, j)));
}
static void table_rows_f32(struct layer *L, int64_t s, int64_t b, int64_t j0, int64_t j1) { table_rows(KILN_F32, L, s, b, j0, j1); }
static void table_rows_f64(struct layer *L, int64_t s, int64_t b, int64_t j0, int64_t j1) { table_rows(KILN_F64, L, s, b, j0, j1); }

/* ---- the GEMM path: one product per step over the batch, then the fused gates ---- */

struct rows { struct layer *L; int64_t s; };

static inline __attribute__((always_inline)) void forward_rows(int dt, const struct rows *r, int64_t b0, int64_t b1) {
  struct layer *L = r->L;
  for (int64_t b = b0; b < b1; b++)
    if (r->s < L->len[b]) dt == KILN_F32 ? cell_forward_f32(L, r->s, b, 0, L->H, L->h, L->hnext, L->yrows + b * L->H)
                                         : cell_forward_f64(L, r->s, b, 0, L->H, L->h, L->hnext, NULL);
    else memcpy(dt_at(L->hnext, dt, b * L->H), dt_at(L->h, dt, b * L->H), dt_size(dt) * (size_t)L->H);   /* past its end: carry */
}
static void forward_rows_f32(void *ctx, int64_t b0, int64_t b1) { forward_rows(KILN_F32, ctx, b0, b1); }
static void forward_rows_f64(void *ctx, int64_t b0, int64_t b1) { forward_rows(KILN_F64, ctx, b0, b1); }

static inline __attribute__((always_inline)) void backward_rows(int dt, const struct rows *r, int64_t b0, int64_t b1) {
  struct layer *L = r->L;
  for (int64_t b = b0; b < b1; b++)
    if (r->s < L->len[b]) {
      dt == KILN_F32 ? cell_backward_f32(L, r->s, b, 0, L->H, NULL, NULL, 0) : cell_backward_f64(L, r->s, b, 0, L->H, 0);
      if (L->bf) {
        int64_t row = step_time(L, r->s, b) * L->B + b;
        grad_rows_bf(L, r->s, b, 0, L->H, 0, (const float *)L->dgx + row * L->GH, (const float *)L->dgh + row * L->GH);
      }
    }
}
static void backward_rows_f32(void *ctx, int64_t b0, int64_t b1) { backward_rows(KILN_F32, ctx, b0, b1); }
static void backward_rows_f64(void *ctx, int64_t b0, int64_t b1) { backward_rows(KILN_F64, ctx, b0, b1); }

static int64_t row_grain(const struct layer *L) {
  int64_t per_row = L->GH * 8;   /* rough work of a row of gates */
  return per_row >= 16384 ? 1 : 16384 / per_row + 1;
}

static int forward_gemm(int dt, struct layer *L) {
  for (int64_t s = 0; s < L->T; s++) {
    if (L->bf) {   /* the state rounded, times w_hh rounded: f32 sums (cpu/bf16_gemm.c) */
      kiln_cpu_rnn_bf16_round(L->hb, L->h, KILN_F32, L->B * L->H);
      if (kiln_cpu_gemm_bf16_f32(L->B, L->GH, L->H, 1.0f, L->hb, L->H, 1, L->whhb, 1, L->H, 0.0f, L->hh, L->GH, 1))
        return kiln_error_code();
    } else {
      kiln_cpu_gemm_raw(dt, 0, 1, L->B, L->GH, L->H, 1.0, L->h, L->H, L->w_hh, L->H, 0.0, L->hh, L->GH);
    }
    struct rows r = {L, s};
    kiln_parallel_for(L->B, row_grain(L), dt == KILN_F32 ? forward_rows_f32 : forward_rows_f64, &r);
    void *swap = L->h; L->h = L->hnext; L->hnext = swap;
  }
  return KILN_OK;
}

static inline __attribute__((always_inline)) int backward_gemm(int dt, struct layer *L) {
  for (int64_t s = L->T - 1; s >= 0; s--) {
    struct rows r = {L, s};
    kiln_parallel_for(L->B, row_grain(L), dt == KILN_F32 ? backward_rows_f32 : backward_rows_f64, &r);
    if (s == 0 && !L->dh0) break;
    if (L->bf) {   /* the step's rows of dgh rounded, times w_hh rounded */
      int64_t t0 = L->B ? step_time(L, s, 0) : 0, GHp = L->GHp;
      const uint16_t *rows = L->dghb + t0 * L->B * GHp;
      if (L->reverse && L->padded) {
        uint16_t *g = L->dgs;
        for (int64_t b = 0; b < L->B; b++)
          if (s < L->len[b]) memcpy(g + b * GHp, L->dghb + (step_time(L, s, b) * L->B + b) * GHp, sizeof(uint16_t) * (size_t)GHp);
          else memset(g + b * GHp, 0, sizeof(uint16_t) * (size_t)GHp);
        rows = g;
      }
      if (kiln_cpu_gemm_bf16_f32(L->B, L->H, L->GH, 1.0f, rows, GHp, 1, L->whhb, L->H, 1, 0.0f, L->tmp, L->H, 1))
        return kiln_error_code();
      for (int64_t b = 0; b < L->B; b++)
        if (s < L->len[b]) carry_back_f32(L, s, b, 0, L->H, (const float *)L->tmp + b * L->H);
      continue;
    }
    /* this step's dgh rows: the B rows of one time, in place (rows past a sequence's end are 0),
       unless reversed sequences of several lengths put them at different times */
    const void *rows = dt_at(L->dgh, dt, (L->B ? step_time(L, s, 0) : 0) * L->B * L->GH);
    if (L->reverse && L->padded) {
      for (int64_t b = 0; b < L->B; b++) {
        void *dst = dt_at(L->dgs, dt, b * L->GH);
        if (s < L->len[b]) memcpy(dst, dt_at(L->dgh, dt, (step_time(L, s, b) * L->B + b) * L->GH), dt_size(dt) * (size_t)L->GH);
        else memset(dst, 0, dt_size(dt) * (size_t)L->GH);
      }
      rows = L->dgs;
    }
    kiln_cpu_gemm_raw(dt, 0, 0, L->B, L->H, L->GH, 1.0, rows, L->GH, L->w_hh, L->H, 0.0, L->tmp, L->H);
    for (int64_t b = 0; b < L->B; b++)
      if (s < L->len[b])
        dt == KILN_F32 ? carry_back_f32(L, s, b, 0, L->H, dt_at(L->tmp, dt, b * L->H))
                       : carry_back_f64(L, s, b, 0, L->H, dt_at(L->tmp, dt, b * L->H));
  }
  return KILN_OK;
}
static int backward_gemm_f32(struct layer *L) { return backward_gemm(KILN_F32, L); }
static int backward_gemm_f64(struct layer *L) { return backward_gemm(KILN_F64, L); }

/* ---- the persistent path: each thread of a team owns hidden units [j0, j1) for the whole
   sequence, with its rows of w_hh (forward) or its columns (backward) packed in its own memory ---- */

static void slice(int64_t H, int id, int nteam, int64_t *j0, int64_t *j1) {
  *j0 = H * id / nteam;
  *j1 = H * (id + 1) / nteam;
}

/* Each thread of a team allocates its own buffers, then all learn at one barrier whether any
   thread could not (L->bar.failed): 1 when every thread has its buffers, else 0 (each thread then
   frees its own and returns, and the caller reports the failure). */
static int team_ready(struct layer *L, int *sense, int ok) {
  if (!ok) __atomic_store_n(&L->bar.failed, 1, __ATOMIC_RELAXED);
  barrier_wait(&L->bar, sense);
  return !__atomic_load_n(&L->bar.failed, __ATOMIC_RELAXED);
}

static inline __attribute__((always_inline)) void forward_team(int dt, struct layer *L, int id, int nteam) {
  int64_t j0, j1, H = L->H, G = L->G, B = L->B;
  slice(H, id, nteam, &j0, &j1);
  int64_t nj = j1 - j0;
  int sense = 0;
  const size_t es = dt_size(dt);
  /* rows g*H + j of w_hh for the own units as the columns of a packed [H][G*nj] (and below them
     the same rows of w_ih when the input projection is folded in: [H+I][G*nj] against [h | x]);
     their products [B][G*nj] */
  int64_t nq = G * nj, I = L->xp ? 0 : L->I, K = H + I;
  void *w = kiln_cpu_scratch(es * (size_t)(panels(dt, nq) * panel_width(dt) * K + 1));
  const void **cols = malloc(sizeof(void *) * (size_t)(nq + 1));
  void *prod = kiln_cpu_scratch(es * (size_t)(B * nq + 1));
  void *hx = I ? kiln_cpu_scratch(es * (size_t)(B * K + 1)) : NULL;
  unsigned char *active = malloc((size_t)B);
  const void **xs = malloc(sizeof(void *) * (size_t)(B + 1));
  void **ys = malloc(sizeof(void *) * (size_t)(B + 1));
  if (!team_ready(L, &sense, w && cols && prod && (!I || hx) && active && xs && ys)) {
    free(w); free(cols); free(prod); free(hx); free(active); free(xs); free(ys);
    return;
  }
  for (int64_t q = 0; q < nq; q++) cols[q] = dt_at(L->w_hh, dt, ((q / nj) * H + j0 + q % nj) * H);
  dt == KILN_F32 ? pack_cols_f32(w, K, 0, H, nq, cols) : pack_cols_f64(w, K, 0, H, nq, cols);
  if (I) {
    for (int64_t q = 0; q < nq; q++) cols[q] = dt_at(L->w_ih, dt, ((q / nj) * H + j0 + q % nj) * I);
    dt == KILN_F32 ? pack_cols_f32(w, K, H, I, nq, cols) : pack_cols_f64(w, K, H, I, nq, cols);
  }
  free(cols);
  void *hcur = L->h, *hnext = L->hnext;
  /* when whole panels fall within one gate, the products go straight to their places in hh
     (gate g of unit j at g * H + j); else through prod */
  int direct = nj % panel_width(dt) == 0;
  for (int64_t s = 0; s < L->T; s++) {
    int64_t na = 0;
    for (int64_t b = 0; b < B; b++) {
      active[b] = s < L->len[b];
      if (!active[b]) continue;
      if (I) {   /* [h | x] of the step */
        memcpy(dt_at(hx, dt, na * K), dt_at(hcur, dt, b * H), es * (size_t)H);
        memcpy(dt_at(hx, dt, na * K + H), dt_at(L->x, dt, (step_time(L, s, b) * B + b) * I), es * (size_t)I);
      }
      xs[na] = I ? dt_at(hx, dt, na * K) : dt_at(hcur, dt, b * H);
      ys[na] = direct ? dt_at(L->hh, dt, b * L->GH + j0) : dt_at(prod, dt, b * nq);
      na++;
    }
    if (dt == KILN_F32) times_rows_f32(w, K, nq, na, xs, ys, direct ? nj : 0, H);
    else times_rows_f64(w, K, nq, na, xs, ys, direct ? nj : 0, H);
    for (int64_t b = 0; b < B; b++) {
      if (!active[b]) {   /* past its end: carry the state */
        memcpy(dt_at(hnext, dt, b * H + j0), dt_at(hcur, dt, b * H + j0), es * (size_t)nj);
        continue;
      }
      void *hh = dt_at(L->hh, dt, b * L->GH);
      if (!direct)
        for (int64_t g = 0; g < G; g++) memcpy(dt_at(hh, dt, g * H + j0), dt_at(prod, dt, b * nq + g * nj), es * (size_t)nj);
      dt == KILN_F32 ? cell_forward_f32(L, s, b, j0, j1, hcur, hnext, NULL) : cell_forward_f64(L, s, b, j0, j1, hcur, hnext, NULL);
    }
    void *swap = hcur; hcur = hnext; hnext = swap;
    barrier_wait(&L->bar, &sense);
  }
#if defined(__AVX512F__)
  if (L->res_stream) _mm_sfence();   /* the reserve's streaming stores seen before the team's join */
#endif
  free(w); free(prod); free(hx); free(active); free(xs); free(ys);
}
static void forward_team_f32(void *ctx, int id, int nteam) { forward_team(KILN_F32, ctx, id, nteam); }
static void forward_team_f64(void *ctx, int id, int nteam) { forward_team(KILN_F64, ctx, id, nteam); }

/* m elements of a row of dgh into a row of its panels (gwp, 64-byte aligned rows): a whole row of
   a panel at the avx512 level by streaming stores, which do not read the cold lines first (gwp is
   read only by the weights' grads after the team: 1.8% of the LSTM's backward + forward, Zen 5) */
static inline __attribute__((always_inline)) void panel_row(int dt, void *dst, const void *src, int64_t m) {
#if defined(__AVX512F__)
  if (m == panel_width(dt)) {
    for (int v = 0; v < 4; v++)
      if (dt == KILN_F32) _mm512_stream_ps((float *)dst + 16 * v, _mm512_loadu_ps((const float *)src + 16 * v));
      else _mm512_stream_pd((double *)dst + 8 * v, _mm512_loadu_pd((const double *)src + 8 * v));
    return;
  }
#endif
  memcpy(dst, src, dt_size(dt) * (size_t)m);
}

static inline __attribute__((always_inline)) void backward_team(int dt, struct layer *L, int id, int nteam) {
  int64_t j0, j1, H = L->H, GH = L->GH, B = L->B;
  slice(H, id, nteam, &j0, &j1);
  int64_t nj = j1 - j0;
  int sense = 0;
  const size_t es = dt_size(dt);
  /* columns j0..j1 of w_hh, packed [GH][nj]; the products [B][nj]. With the fold, also columns
     i0..i1 of w_ih, packed [GH][ni], against the step's rows of dgx: its rows of x's grad. */
  int64_t i0 = 0, i1 = 0, I = L->I;
  if (L->gx) slice(I, id, nteam, &i0, &i1);
  int64_t ni = i1 - i0;
  void *wc = kiln_cpu_scratch(es * (size_t)(panels(dt, nj) * panel_width(dt) * GH + 1));
  void *wi = ni ? kiln_cpu_scratch(es * (size_t)(panels(dt, ni) * panel_width(dt) * GH + 1)) : NULL;
  void *prod = kiln_cpu_scratch(es * (size_t)(B * nj + 1));
  unsigned char *active = malloc((size_t)B);
  const void **xs = malloc(sizeof(void *) * (size_t)(B + 1));
  void **ys = malloc(sizeof(void *) * (size_t)(B + 1));
  if (!team_ready(L, &sense, wc && (!ni || wi) && prod && active && xs && ys)) {
    free(wc); free(wi); free(prod); free(active); free(xs); free(ys);
    return;
  }
  pack_rows(dt, wc, GH, nj, dt_at(L->w_hh, dt, j0), H);
  if (ni) pack_rows(dt, wi, GH, ni, dt_at(L->w_ih, dt, i0), I);
  for (int64_t s = L->T - 1; s >= 0; s--) {
    for (int64_t b = 0; b < B; b++) {
      active[b] = s < L->len[b];
      if (!active[b]) continue;
      dt == KILN_F32 ? cell_backward_f32(L, s, b, j0, j1, NULL, NULL, 1) : cell_backward_f64(L, s, b, j0, j1, 1);
      if ((L->gbx || L->gbh) && L->mode != KILN_RNN_LSTM)
        dt == KILN_F32 ? bias_rows_f32(L, s, b, j0, j1) : bias_rows_f64(L, s, b, j0, j1);
      if (L->gt) dt == KILN_F32 ? table_rows_f32(L, s, b, j0, j1) : table_rows_f64(L, s, b, j0, j1);
    }
    barrier_wait(&L->bar, &sense);
    /* this step's rows are read where they are in dgh, by time, so that the next step may write
       its own rows while other threads still read these: one barrier per step */
    int64_t na = 0;
    if (s > 0 || L->dh0) {   /* the grad of the state before the step (before the first: h0's) */
      for (int64_t b = 0; b < B; b++)
        if (active[b]) { xs[na] = dt_at(L->dgh, dt, grad_row(L, s, b) * GH); ys[na] = dt_at(prod, dt, b * nj); na++; }
      if (dt == KILN_F32) times_rows_f32(wc, GH, nj, na, xs, ys, 0, 0);
      else times_rows_f64(wc, GH, nj, na, xs, ys, 0, 0);
      for (int64_t b = 0; b < B; b++)
        if (active[b])
          dt == KILN_F32 ? carry_back_f32(L, s, b, j0, j1, dt_at(prod, dt, b * nj)) : carry_back_f64(L, s, b, j0, j1, dt_at(prod, dt, b * nj));
    }
    if (L->gwp) {   /* the step's rows of dgh into the weights' grads' panels: this thread's panels */
      const int64_t PW = panel_width(dt), np = panels(dt, GH), TB = L->T * B;
      int64_t p0, p1;
      slice(np, id, nteam, &p0, &p1);
      for (int64_t b = 0; b < B; b++) {
        if (!active[b]) continue;
        int64_t r = step_time(L, s, b) * B + b, rg = grad_row(L, s, b);
        for (int64_t p = p0; p < p1; p++) {
          int64_t c0 = p * PW, m = GH - c0 < PW ? GH - c0 : PW;
          panel_row(dt, dt_at(L->gwp, dt, (p * TB + r) * PW), dt_at(L->dgh, dt, rg * GH + c0), m);
        }
      }
    }
    if (ni) {   /* x's grad of the step, off the recurrence's path: its rows of dgx times w_ih */
      na = 0;
      for (int64_t b = 0; b < B; b++)
        if (active[b]) {
          int64_t row = step_time(L, s, b) * B + b;
          xs[na] = dt_at(L->dgx, dt, grad_row(L, s, b) * GH);
          ys[na] = dt_at(L->gx, dt, row * I + i0);
          na++;
        }
      if (dt == KILN_F32) times_rows_f32(wi, GH, ni, na, xs, ys, 0, 0);
      else times_rows_f64(wi, GH, ni, na, xs, ys, 0, 0);
    }
  }
#if defined(__AVX512F__)
  if (L->gwp) _mm_sfence();   /* panel_row's stores seen before the weights' grads read them */
#endif
  free(wc); free(wi); free(prod); free(active); free(xs); free(ys);
}
static void backward_team_f32(void *ctx, int id, int nteam) { backward_team(KILN_F32, ctx, id, nteam); }
static void backward_team_f64(void *ctx, int id, int nteam) { backward_team(KILN_F64, ctx, id, nteam); }

/* ---- the persistent path in bf16: the same steps, the products on bf16 rows (cpu/bf16_rnn.c):
   forward the previous outputs (zb) or h0 rounded, with x's rows under the fold; backward the rows
   of dgh and dgx rounded. Each product is summed in one order whatever the threads. ---- */

static void forward_team_bf(void *ctx, int id, int nteam) {
  struct layer *L = ctx;
  int64_t j0, j1, H = L->H, G = L->G, B = L->B;
  slice(H, id, nteam, &j0, &j1);
  int64_t nj = j1 - j0;
  int sense = 0;
  /* rows g*H + j of w_hh (then of w_ih under the fold) for the own units, rounded, as the columns
     of the packed [K][G*nj]; each column is first a row of K elements (2 kp, zero-padded) */
  int64_t nq = G * nj, I = L->xp ? 0 : L->I, K = H + I, kp = (K + 1) / 2, PW = kiln_cpu_rnn_bf16_panel();
  size_t ws = L->wdt == KILN_BF16 ? 2 : 4;
  uint32_t *w = kiln_cpu_scratch(sizeof(uint32_t) * (size_t)(kiln_cpu_rnn_bf16_packed_words(nq, K) + 1));
  uint16_t *rows = kiln_cpu_scratch(sizeof(uint16_t) * (size_t)(nq * 2 * kp + 1));
  float *prod = kiln_cpu_scratch(sizeof(float) * (size_t)(B * nq + 1)), *yf = kiln_cpu_scratch(sizeof(float) * (size_t)(nj + 1));
  uint16_t *hx = I ? calloc((size_t)(B * 2 * kp + 1), sizeof(uint16_t)) : NULL;   /* [h | x] rows of 2 kp */
  size_t nsc = kiln_cpu_rnn_bf16_times_scratch(B, K, nq, 0);
  float *sc = nsc ? kiln_cpu_scratch(nsc) : NULL;   /* the products' widened rows, when emulated */
  unsigned char *active = malloc((size_t)B);
  const uint16_t **xs = malloc(sizeof(void *) * (size_t)(B + 1));
  void **ys = malloc(sizeof(void *) * (size_t)(B + 1));
  if (!team_ready(L, &sense, w && rows && prod && yf && (!I || hx) && (!nsc || sc) && active && xs && ys)) {
    free(w); free(rows); free(prod); free(yf); free(hx); free(sc); free(active); free(xs); free(ys);
    return;
  }
  for (int64_t q = 0; q < nq; q++) {
    int64_t r = (q / nj) * H + j0 + q % nj;
    uint16_t *row = rows + q * 2 * kp;
    kiln_cpu_rnn_bf16_round(row, (const char *)L->w_hh + ws * (size_t)(r * H), L->wdt, H);
    if (I) kiln_cpu_rnn_bf16_round(row + H, (const char *)L->w_ih + ws * (size_t)(r * I), L->wdt, I);
    if (K & 1) row[K] = 0;
  }
  kiln_cpu_rnn_bf16_pack_cols(w, nq, kp, (const uint32_t *)rows, kp);
  free(rows);
  float *hcur = L->h, *hnext = L->hnext;
  int direct = nj % PW == 0;   /* as forward_team */
  for (int64_t s = 0; s < L->T; s++) {
    int64_t na = 0;
    for (int64_t b = 0; b < B; b++) {
      active[b] = s < L->len[b];
      if (!active[b]) continue;
      int64_t t = step_time(L, s, b);
      if (I) {
        memcpy(hx + na * 2 * kp, h_before_bf(L, s, b, t), sizeof(uint16_t) * (size_t)H);
        memcpy(hx + na * 2 * kp + H, L->xb + (t * B + b) * L->I, sizeof(uint16_t) * (size_t)I);
      }
      xs[na] = I ? hx + na * 2 * kp : h_before_bf(L, s, b, t);
      ys[na] = direct ? (float *)L->hh + b * L->GH + j0 : prod + b * nq;
      na++;
    }
    kiln_cpu_rnn_bf16_times(w, K, nq, na, xs, ys, 0, direct ? nj : 0, H, sc);
    for (int64_t b = 0; b < B; b++) {
      if (!active[b]) {
        memcpy(hnext + b * H + j0, hcur + b * H + j0, sizeof(float) * (size_t)nj);
        continue;
      }
      float *hh = (float *)L->hh + b * L->GH;
      if (!direct)
        for (int64_t g = 0; g < G; g++) memcpy(hh + g * H + j0, prod + b * nq + g * nj, sizeof(float) * (size_t)nj);
      if (L->mode == KILN_RNN_LSTM) cell_forward_lstm_bf(L, s, b, j0, j1, hnext);
      else cell_forward_f32(L, s, b, j0, j1, hcur, hnext, yf);
    }
    float *swap = hcur; hcur = hnext; hnext = swap;
    barrier_wait(&L->bar, &sense);
  }
#if defined(__AVX512F__)
  if (L->res_stream) _mm_sfence();   /* the reserve's streaming stores seen before the team's join */
#endif
  free(w); free(prod); free(yf); free(hx); free(sc); free(active); free(xs); free(ys);
}

static void backward_team_bf(void *ctx, int id, int nteam) {
  struct layer *L = ctx;
  int64_t j0, j1, H = L->H, GH = L->GH, B = L->B, GHp = L->GHp, I = L->I;
  slice(H, id, nteam, &j0, &j1);
  int64_t nj = j1 - j0, i0 = 0, i1 = 0;
  if (L->gxb) slice(I, id, nteam, &i0, &i1);
  int64_t ni = i1 - i0;
  int sense = 0;
  size_t ws = L->wdt == KILN_BF16 ? 2 : 4;
  /* columns j0..j1 of w_hh (and i0..i1 of w_ih), rounded and packed [GH][nj] */
  uint32_t *wc = kiln_cpu_scratch(sizeof(uint32_t) * (size_t)(kiln_cpu_rnn_bf16_packed_words(nj, GH) + 1));
  uint32_t *wi = ni ? kiln_cpu_scratch(sizeof(uint32_t) * (size_t)(kiln_cpu_rnn_bf16_packed_words(ni, GH) + 1)) : NULL;
  float *prod = kiln_cpu_scratch(sizeof(float) * (size_t)(B * nj + 1));
  /* a step's f32 grads of one sequence, rounded into dgxb (dghb) as soon as they are written: a
     row of dgx (and of dgh for the GRU), of which this thread fills its units; none for the LSTM,
     whose gates write dgxb themselves (cell_backward_lstm_bf) */
  float *gxr = L->gzb ? NULL : kiln_cpu_scratch(sizeof(float) * (size_t)(2 * GH + 1)), *ghr = L->dghb != L->dgxb ? gxr + GH : gxr;
  /* the products' widened rows, when emulated: the larger of the two products' needs */
  size_t nsc = kiln_cpu_rnn_bf16_times_scratch(B, GH, nj, 0), nsi = ni ? kiln_cpu_rnn_bf16_times_scratch(B, GH, ni, 1) : 0;
  if (nsi > nsc) nsc = nsi;
  float *sc = nsc ? kiln_cpu_scratch(nsc) : NULL;
  unsigned char *active = malloc((size_t)B);
  const uint16_t **xs = malloc(sizeof(void *) * (size_t)(B + 1));
  void **ys = malloc(sizeof(void *) * (size_t)(B + 1));
  if (!team_ready(L, &sense, wc && (!ni || wi) && prod && (L->gzb || gxr) && (!nsc || sc) && active && xs && ys)) {
    free(wc); free(wi); free(prod); free(gxr); free(sc); free(active); free(xs); free(ys);
    return;
  }
  kiln_cpu_rnn_bf16_pack_rows(wc, nj, GH, (const char *)L->w_hh + ws * (size_t)j0, L->wdt, H);
  if (ni) kiln_cpu_rnn_bf16_pack_rows(wi, ni, GH, (const char *)L->w_ih + ws * (size_t)i0, L->wdt, I);
  for (int64_t s = L->T - 1; s >= 0; s--) {
    for (int64_t b = 0; b < B; b++) {
      active[b] = s < L->len[b];
      if (!active[b]) continue;
      if (L->gzb) {
        cell_backward_lstm_bf(L, s, b, j0, j1);
        continue;
      }
      cell_backward_f32(L, s, b, j0, j1, gxr, ghr, 0);
      grad_rows_bf(L, s, b, j0, j1, 1, gxr, ghr);
    }
    barrier_wait(&L->bar, &sense);
    int64_t na = 0;
    if (s > 0 || L->dh0) {   /* the grad of the state before the step (before the first: h0's) */
      for (int64_t b = 0; b < B; b++)
        if (active[b]) { xs[na] = L->dghb + (step_time(L, s, b) * B + b) * GHp; ys[na] = prod + b * nj; na++; }
      kiln_cpu_rnn_bf16_times(wc, GH, nj, na, xs, ys, 0, 0, 0, sc);
      for (int64_t b = 0; b < B; b++)
        if (active[b]) carry_back_f32(L, s, b, j0, j1, prod + b * nj);
    }
    if (L->gwp) {   /* the step's rounded rows of dgx, widened, into the weights' grads' panels: this thread's */
      const int64_t TB = L->T * B, np = panels(KILN_F32, GH);
      int64_t p0, p1;
      slice(np, id, nteam, &p0, &p1);
      for (int64_t b = 0; b < B; b++) {
        if (!active[b]) continue;
        int64_t r = step_time(L, s, b) * B + b;
        for (int64_t p = p0; p < p1; p++) {
          int64_t c0 = p * PW_F32, m = GH - c0 < PW_F32 ? GH - c0 : PW_F32;
          float *dst = (float *)L->gwp + (p * TB + r) * PW_F32;
          const uint16_t *src = L->dgxb + r * GHp + c0;
          for (int64_t c = 0; c < m; c++) dst[c] = convert_bf16_to_f32(src[c]);
        }
      }
    }
    if (ni) {   /* x's grad of the step, rounded once */
      na = 0;
      for (int64_t b = 0; b < B; b++)
        if (active[b]) {
          int64_t row = step_time(L, s, b) * B + b;
          xs[na] = L->dgxb + row * GHp;
          ys[na] = L->gxb + row * I + i0;
          na++;
        }
      kiln_cpu_rnn_bf16_times(wi, GH, ni, na, xs, ys, 1, 0, 0, sc);
    }
  }
  free(wc); free(wi); free(prod); free(gxr); free(sc); free(active); free(xs); free(ys);
}

/* ---- the layer ---- */

static int setup(int dt, struct layer *L, int mode, int reverse, const struct kiln_rnn_tensors *t, void **zeros) {
  L->mode = mode; L->reverse = reverse;
  L->G = kiln_rnn_gates(mode); L->RS = kiln_rnn_reserve(mode);
  const struct kiln_tensor *steps = t->index ? t->index : t->x;   /* [T,B,...] */
  L->T = steps->sizes[0]; L->B = steps->sizes[1]; L->I = t->index ? 0 : t->x->sizes[2];
  L->H = t->w_hh->sizes[1]; L->GH = L->G * L->H;
  L->x = kiln_tensor_data(t->x);
  /* an index: x is a table of rows already projected that it picks (kiln/rnn.h), which the steps
     read as they read the projection they make; the layer has no input of its own (I = 0) */
  L->xidx = t->index ? kiln_tensor_data(t->index) : NULL;
  L->w_ih = t->w_ih ? kiln_tensor_data(t->w_ih) : NULL; L->w_hh = kiln_tensor_data(t->w_hh);
  int64_t nz = L->GH > L->B * L->H ? L->GH : L->B * L->H;
  *zeros = calloc((size_t)nz, dt_size(dt));
  int64_t *len = malloc(sizeof(int64_t) * (size_t)(L->B > 0 ? L->B : 1));
  if (!*zeros || !len) { free(len); return kiln_fail(KILN_ERR_MEMORY, "rnn: out of memory"); }
  for (int64_t b = 0; b < L->B; b++) {
    len[b] = t->lengths ? ((const int64_t *)kiln_tensor_data(t->lengths))[b] : L->T;
    if (len[b] < L->T) L->padded = 1;
  }
  L->len = len;
  L->h0 = t->h0 ? kiln_tensor_data(t->h0) : *zeros;
  L->c0 = t->c0 ? kiln_tensor_data(t->c0) : *zeros;
  L->b_hh = t->b_hh ? kiln_tensor_data(t->b_hh) : *zeros;
  L->b_ih = t->b_ih ? kiln_tensor_data(t->b_ih) : *zeros;
  return KILN_OK;
}

static inline __attribute__((always_inline)) int forward(int dt, const struct kiln_call *c) {
  const struct kiln_rnn_forward *f = c->extra;
  struct layer L = {0};
  void *zeros = NULL;
  if (setup(dt, &L, (int)c->ints[0], (int)c->ints[1], &f->t, &zeros)) return kiln_error_code();
  int64_t T = L.T, B = L.B, H = L.H, GH = L.GH;
  const size_t es = dt_size(dt);
  L.z = kiln_tensor_data(c->out);
  L.res = f->reserve ? kiln_tensor_data(f->reserve) : NULL;
  /* The persistent team folds the input projection into its products when each weight serves
     enough sequences a step and a panel of [w_hh | w_ih] is small (LSTM and plain
     RNN: a GRU's n gate keeps the two apart) */
  int fold = c->ints[2] == KILN_RNN_PERSISTENT && L.mode != KILN_RNN_GRU && B >= KILN_RNN_FOLD_MIN_BATCH &&
             H + L.I <= KILN_RNN_FOLD_MAX_ROWS && !L.xidx;
  size_t nxp = es * (size_t)(T * B * GH > 0 ? T * B * GH : 1);   /* large: from the block cache */
  L.xp = fold ? NULL : L.xidx ? (void *)L.x : kiln_cpu_alloc(nxp);
  L.zero = zeros;
  L.hh = calloc((size_t)(B * GH > 0 ? B * GH : 1), es);
  L.h = kiln_cpu_scratch(es * (size_t)(B * H > 0 ? B * H : 1));
  L.hnext = kiln_cpu_scratch(es * (size_t)(B * H > 0 ? B * H : 1));
  L.c = kiln_cpu_scratch(es * (size_t)(B * H > 0 ? B * H : 1));
  int rc = KILN_OK;
  if ((!fold && !L.xp) || !L.hh || !L.h || !L.hnext || !L.c) {
    rc = kiln_fail(KILN_ERR_MEMORY, "rnn: out of memory for the layer's buffers");
    goto done;
  }
  if (L.padded) memset(L.z, 0, es * (size_t)c->out->numel);   /* else every row is written */
  /* the input projection of every step: one GEMM */
  if (!fold && !L.xidx) kiln_cpu_gemm_raw(dt, 0, 1, T * B, GH, L.I, 1.0, L.x, L.I, L.w_ih, L.I, 0.0, L.xp, GH);
  memcpy(L.h, L.h0, es * (size_t)(B * H));
  memcpy(L.c, L.c0, es * (size_t)(B * H));
  if (c->ints[2] == KILN_RNN_PERSISTENT) {
    barrier_init(&L.bar, kiln_parallel_team_size());
    L.res_stream = 1;
    kiln_parallel_team(dt == KILN_F32 ? forward_team_f32 : forward_team_f64, &L);
    if (L.bar.failed) { rc = kiln_fail(KILN_ERR_MEMORY, "rnn: out of memory for the persistent threads' weights"); goto done; }
    /* the team swapped the buffers T times: after an odd count the final state is in hnext */
    if (T % 2) { void *swap = L.h; L.h = L.hnext; L.hnext = swap; }
  } else {
    rc = forward_gemm(dt, &L);
  }
  memcpy(dt_at(L.z, dt, T * B * H), L.h, es * (size_t)(B * H));
  if (L.mode == KILN_RNN_LSTM) memcpy(dt_at(L.z, dt, (T + 1) * B * H), L.c, es * (size_t)(B * H));
done:
  if (!L.xidx) kiln_cpu_free(L.xp, nxp);
  free(L.hh);
  free(L.h); free(L.hnext); free(L.c);
  free((void *)L.len); free(zeros);
  return rc;
}
static int forward_f32(const struct kiln_call *c) { return forward(KILN_F32, c); }
static int forward_f64(const struct kiln_call *c) { return forward(KILN_F64, c); }

/* dst[i * ld + r] = rows[r][k0 + i] for r < nr, i < nk (rows[r] NULL: zeros): a block of a
   transpose, 8 x 8 through registers in f32 */
static inline __attribute__((always_inline)) void transpose_block8(int dt, void *dst, int64_t ld, const void *const *rows,
                                                                   int64_t k0, int nr, int nk) {
#if defined(__AVX__)
  if (dt == KILN_F32 && nr == 8 && nk == 8 && rows[0] && rows[1] && rows[2] && rows[3] && rows[4] && rows[5] && rows[6] && rows[7]) {
    transpose8_f32(dst, ld, (const float *const *)rows, k0);
    return;
  }
#endif
  for (int r = 0; r < nr; r++)
    for (int i = 0; i < nk; i++) dt_store(dst, dt, i * ld + r, rows[r] ? dt_load(rows[r], dt, k0 + i) : 0);
}
/* the same for nr, nk <= 16: 16 x 16 through registers in f32 at the avx512 level, else in
   8 x 8 quarters */
static inline __attribute__((always_inline)) void transpose_block(int dt, void *dst, int64_t ld, const void *const *rows,
                                                                  int64_t k0, int nr, int nk) {
#if defined(__AVX512F__)
  if (dt == KILN_F32 && nr == 16 && nk == 16) {
    int all = 1;
    for (int r = 0; r < 16; r++) all &= rows[r] != NULL;
    if (all) { transpose16_f32(dst, ld, (const float *const *)rows, k0); return; }
  }
#endif
  for (int r0 = 0; r0 < nr; r0 += 8)
    for (int i0 = 0; i0 < nk; i0 += 8)
      transpose_block8(dt, dt_at(dst, dt, i0 * ld + r0), ld, rows + r0, k0 + i0, nr - r0 < 8 ? nr - r0 : 8, nk - i0 < 8 ? nk - i0 : 8);
}

/* The state before the step of row r = t * B + b (its time t), NULL past the sequence's end. */
static inline __attribute__((always_inline)) const void *row_before(int dt, const struct layer *L, int64_t r) {
  int64_t b = r % L->B, t = r / L->B;
  if (t >= L->len[b]) return NULL;
  return h_before(dt, L, L->reverse ? L->len[b] - 1 - t : t, b, t);
}

struct gw_job { int dt; const struct layer *L; const void *xt; void *gwt; int64_t R, ldx, ldg; };

static inline __attribute__((always_inline)) void gw_panels(int dt, void *ctx, int64_t p0, int64_t p1) {
  const struct gw_job *j = ctx;
  const struct layer *L = j->L;
  const int64_t PW = panel_width(dt), TB = L->T * L->B, n = (p1 * PW < L->GH ? p1 * PW : L->GH) - p0 * PW;
  const void *xs[j->R > 0 ? j->R : 1];
  void *ys[j->R > 0 ? j->R : 1];
  for (int64_t k = 0; k < j->R; k++) { xs[k] = dt_at(j->xt, dt, k * j->ldx); ys[k] = dt_at(j->gwt, dt, k * j->ldg + p0 * PW); }
  if (dt == KILN_F32) times_rows_fetch_f32(dt_at(L->gwp, dt, p0 * TB * PW), TB, n, j->R, xs, ys);
  else times_rows_fetch_f64(dt_at(L->gwp, dt, p0 * TB * PW), TB, n, j->R, xs, ys);
}
static void gw_panels_f32(void *ctx, int64_t p0, int64_t p1) { gw_panels(KILN_F32, ctx, p0, p1); }
static void gw_panels_f64(void *ctx, int64_t p0, int64_t p1) { gw_panels(KILN_F64, ctx, p0, p1); }

/* Whether the weights' grads run on the persistent path's products rather than a GEMM: at the
   avx512 level (the products in zmm; char-LM step, Zen 5, 1 thread: 24.3-24.9 against 26.9-28.5 ms
   by kiln's own f32 GEMM or OpenBLAS's AVX-512 kernels, at 2 threads 15.4-16.1 against 16.8-19.3),
   and where the BLAS's kernels are generic or there is none. */
static int weight_grads_here(void) {
  int state = kiln_blas_state();
  return VEC_BYTES == 64 || state == KILN_BLAS_MISSING || state == KILN_BLAS_GENERIC;
}

/* The weights' grads on the persistent path's products: [h_prev | x]^T (R x T*B, transposed here
   8 x 8) times dgh packed by the team (gwp), panel by panel over the pool, then transposed into
   w_hh's grad [GH][H] and w_ih's [GH][I]. Each sum runs over the rows in order, whatever the
   threads; the kernel runs at the level's width, whatever BLAS core is loaded. */
static inline __attribute__((always_inline)) int weight_grads(int dt, struct layer *L, void *gw_hh, void *gw_ih) {
  const int64_t TB = L->T * L->B, H = L->H, I = L->I, GH = L->GH, PW = panel_width(dt);
  const int64_t Hh = gw_hh ? H : 0, R = Hh + (gw_ih ? I : 0);
  /* rows a little longer than T*B and GH: 8 rows of a power-of-two length would fall in one set of
     L1 and evict each other in the transposes */
  const int64_t ldx = TB + 16, ldg = GH + 16;
  /* the transposes' blocks: 16 x 16 in zmm for f32 at the avx512 level, else 8 x 8 */
  const int TBK = VEC_BYTES == 64 && dt == KILN_F32 ? 16 : 8;
  const size_t es = dt_size(dt), nxt = es * (size_t)(R * ldx + 1), ngt = es * (size_t)(R * ldg + 1);
  void *xt = kiln_cpu_alloc(nxt), *gwt = kiln_cpu_alloc(ngt);
  /* a bf16 layer (f32 here, no sequence ends): its rows widened, TBK at a time, [h_prev | x];
     else the states' rows where they lie, found once (NULL past a sequence's end: zeros): a
     pointer a row of T*B, a thirty-second of gwp's bytes at most */
  float *wide = L->bf ? malloc(sizeof(float) * (size_t)(TBK * (H + I) + 1)) : NULL;
  const void **rowp = L->bf ? NULL : malloc(sizeof(void *) * (size_t)(TB + 1));
  if (!xt || !gwt || (L->bf ? !wide : !rowp)) {
    kiln_cpu_free(xt, nxt); kiln_cpu_free(gwt, ngt); free(wide); free(rowp);
    return kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory");
  }
  if (rowp) {
    /* a block of k across every row before the next, so that xt's rows are written along, TBK at
       a time (block by block of rows, its R rows were each written 64 bytes at a time: char-LM
       step, Emerald Rapids, 1 thread: these transposes 0.48 -> 0.36 ms) */
    for (int64_t r = 0; r < TB; r++) rowp[r] = row_before(dt, L, r);
    for (int64_t k = 0; k < Hh; k += TBK)
      for (int64_t r0 = 0; r0 < TB; r0 += TBK)
        transpose_block(dt, dt_at(xt, dt, k * ldx + r0), ldx, rowp + r0, k, TB - r0 < TBK ? (int)(TB - r0) : TBK,
                        Hh - k < TBK ? (int)(Hh - k) : TBK);
    for (int64_t k = 0; k < R - Hh; k += TBK)
      for (int64_t r0 = 0; r0 < TB; r0 += TBK) {
        int nr = TB - r0 < TBK ? (int)(TB - r0) : TBK;
        const void *xr[16];
        for (int r = 0; r < nr; r++) xr[r] = rowp[r0 + r] ? dt_at(L->x, dt, (r0 + r) * I) : NULL;
        transpose_block(dt, dt_at(xt, dt, (Hh + k) * ldx + r0), ldx, xr, k, nr, R - Hh - k < TBK ? (int)(R - Hh - k) : TBK);
      }
  } else
    for (int64_t r0 = 0; r0 < TB; r0 += TBK) {
      int nr = TB - r0 < TBK ? (int)(TB - r0) : TBK;
      const void *hp[16], *xr[16];
      for (int r = 0; r < nr; r++) {
        int64_t t = (r0 + r) / L->B, b = (r0 + r) % L->B;
        float *w = wide + r * (H + I);
        const uint16_t *h = h_before_bf(L, L->reverse ? L->T - 1 - t : t, b, t), *x = L->xb ? L->xb + (r0 + r) * I : NULL;
        for (int64_t k = 0; k < H; k++) w[k] = convert_bf16_to_f32(h[k]);
        for (int64_t k = 0; k < R - Hh; k++) w[H + k] = convert_bf16_to_f32(x[k]);   /* x when its grad is wanted */
        hp[r] = w; xr[r] = w + H;
      }
      for (int64_t k = 0; k < Hh; k += TBK)
        transpose_block(dt, dt_at(xt, dt, k * ldx + r0), ldx, hp, k, nr, Hh - k < TBK ? (int)(Hh - k) : TBK);
      for (int64_t k = 0; k < R - Hh; k += TBK)
        transpose_block(dt, dt_at(xt, dt, (Hh + k) * ldx + r0), ldx, xr, k, nr, R - Hh - k < TBK ? (int)(R - Hh - k) : TBK);
    }
  struct gw_job j = {dt, L, xt, gwt, R, ldx, ldg};
  int64_t np = panels(dt, GH);
  kiln_parallel_for(np, 1, dt == KILN_F32 ? gw_panels_f32 : gw_panels_f64, &j);
  for (int part = 0; part < 2; part++) {
    void *gw = part ? gw_ih : gw_hh;
    if (!gw) continue;
    int64_t k0 = part ? Hh : 0, nk = part ? I : H;
    for (int64_t k = 0; k < nk; k += TBK) {
      int nr = nk - k < TBK ? (int)(nk - k) : TBK;
      const void *rows[16];
      for (int r = 0; r < nr; r++) rows[r] = dt_at(gwt, dt, (k0 + k + r) * ldg);
      for (int64_t g = 0; g < GH; g += TBK)
        transpose_block(dt, dt_at(gw, dt, g * nk + k), nk, rows, g, nr, GH - g < TBK ? (int)(GH - g) : TBK);
    }
  }
  (void)PW;
  kiln_cpu_free(xt, nxt); kiln_cpu_free(gwt, ngt); free(wide); free(rowp);
  return KILN_OK;
}

/* A large buffer from the block cache, zeroed when some rows will not be written. */
static void *scratch(size_t nbytes, int zero) {
  void *p = kiln_cpu_alloc(nbytes);
  if (p && zero) memset(p, 0, nbytes);
  return p;
}

/* The bias grads: dst[q] = the sum over rows r of src[r * GH + q], rows in order. */
static inline __attribute__((always_inline)) void bias_grad(int dt, void *dst, const void *src, int64_t rows, int64_t GH) {
  memset(dst, 0, dt_size(dt) * (size_t)GH);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t q = 0; q < GH; q++) dt_store(dst, dt, q, dt_add(dt, dt_load(dst, dt, q), dt_load(src, dt, r * GH + q)));
}

/* A looked-up input's grad, the table's [V][GH], after the GEMM path (the persistent team sums
   it as it goes: table_rows): each active row of dgx added into the row its index names, over
   steps from the last and sequences in order, as the team does; columns shared out over the pool
   (each column's sums in one thread, in the same order at any thread count). dgx's rows are
   f32/f64 (dgx) or rounded bf16 (dgxb, GHp apart). */
struct table_job { int dt; const struct layer *L; void *gt; int64_t V; };
static void table_columns(void *ctx, int64_t q0, int64_t q1) {
  const struct table_job *j = ctx;
  const struct layer *L = j->L;
  int64_t GH = L->GH;
  for (int64_t v = 0; v < j->V; v++) memset(dt_at(j->gt, j->dt, v * GH + q0), 0, dt_size(j->dt) * (size_t)(q1 - q0));
  for (int64_t s = L->T - 1; s >= 0; s--)
    for (int64_t b = 0; b < L->B; b++) {
      if (s >= L->len[b]) continue;
      int64_t r = step_time(L, s, b) * L->B + b, v = L->xidx[r];
      if (L->dgxb) {
        float *g = (float *)j->gt + v * GH;
        const uint16_t *d = L->dgxb + r * L->GHp;
        for (int64_t q = q0; q < q1; q++) g[q] += convert_bf16_to_f32(d[q]);
      } else if (j->dt == KILN_F32) {
        float *g = (float *)j->gt + v * GH;
        const float *d = (const float *)L->dgx + r * GH;
        for (int64_t q = q0; q < q1; q++) g[q] += d[q];
      } else {
        double *g = (double *)j->gt + v * GH;
        const double *d = (const double *)L->dgx + r * GH;
        for (int64_t q = q0; q < q1; q++) g[q] += d[q];
      }
    }
}
static void table_grad(int dt, const struct layer *L, void *gt, int64_t V) {
  struct table_job j = {dt, L, gt, V};
  kiln_parallel_for(L->GH, 64, table_columns, &j);
}

static inline __attribute__((always_inline)) int backward(int dt, const struct kiln_call *c) {
  const struct kiln_rnn_backward *bw = c->extra;
  struct layer L = {0};
  void *zeros = NULL;
  if (setup(dt, &L, (int)c->ints[0], (int)c->ints[1], &bw->t, &zeros)) return kiln_error_code();
  int64_t T = L.T, B = L.B, H = L.H, GH = L.GH, I = L.I;
  const size_t es = dt_size(dt);
  L.dh0 = bw->gh0 != NULL;
  L.z = kiln_tensor_data(bw->z);
  L.res = bw->reserve ? kiln_tensor_data(bw->reserve) : NULL;
  L.gz = kiln_tensor_data(bw->gz);
  /* the large buffers come from the block cache, zeroed when rows past a sequence's end must stay 0 */
  size_t nbig = es * (size_t)(T * B * GH > 0 ? T * B * GH : 1), nbh = (size_t)(B * H > 0 ? B * H : 1);
  size_t nprev = es * (size_t)(T * B * H > 0 ? T * B * H : 1);
  size_t ngwp = es * (size_t)(panels(dt, GH) * panel_width(dt) * T * B + 1);
  /* the persistent team's rows of dgx are read by nothing after it when it also packs them for the
     weights' grads, computes x's grad or sums a looked-up table's (table_rows), and sums the bias
     grads (below; not the GRU, whose dgh is apart): then two steps' rows, which stay in cache,
     rather than T steps' (8 MB, char-LM) */
  int persistent = c->ints[2] == KILN_RNN_PERSISTENT;
  int fold_gx = bw->gx && persistent && B >= KILN_RNN_FOLD_MIN_BATCH && H + I <= KILN_RNN_FOLD_MAX_ROWS && I > 0;
  int team_gw = persistent && L.mode != KILN_RNN_GRU && (bw->gw_hh || bw->gw_ih) && T * B > 0 && weight_grads_here();
  int team_table = persistent && bw->gx && L.xidx;
  L.ring = persistent && L.mode != KILN_RNN_GRU && (!bw->gx || fold_gx || team_table) && (team_gw || (!bw->gw_hh && !bw->gw_ih));
  if (L.ring) nbig = es * (size_t)(2 * B * GH > 0 ? 2 * B * GH : 1);
  L.dgx = scratch(nbig, L.padded && !L.ring);
  L.dgh = L.mode == KILN_RNN_GRU ? scratch(nbig, L.padded) : L.dgx;
  /* the GEMM path's rows of a step, gathered when reversed sequences of several lengths put them
     at different times (backward_gemm) */
  int gather_rows = c->ints[2] != KILN_RNN_PERSISTENT && L.reverse && L.padded;
  L.dgs = gather_rows ? kiln_cpu_scratch(es * (size_t)(B * GH)) : NULL;
  L.dh = kiln_cpu_scratch(es * nbh);
  L.dc = kiln_cpu_scratch(es * nbh);
  L.tmp = kiln_cpu_scratch(es * nbh);
  /* the states before each step, for w_hh's grad: gathered only when sequences of several lengths
     scatter them (else they are h0 and the output rows, read in place) */
  int gather = (L.padded || T * B == 0);
  void *hprev = bw->gw_hh && gather ? scratch(nprev, L.padded) : NULL;
  int rc = KILN_OK;
  if (!L.dgx || !L.dgh || (gather_rows && !L.dgs) || !L.dh || !L.dc || !L.tmp || (bw->gw_hh && gather && !hprev)) {
    rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory for the layer's buffers");
    goto done;
  }
  /* the persistent team computes x's grad step by step under the forward's fold rule: as many
     sequences a step and as small a packed w_ih (its columns, as tall as w_hh's) */
  if (fold_gx) {
    L.gx = kiln_tensor_data(bw->gx);
    if (L.padded) memset(L.gx, 0, es * (size_t)(T * B * I));   /* rows past a sequence's end */
  }
  memcpy(L.dh, dt_at(L.gz, dt, T * B * H), es * (size_t)(B * H));
  if (L.mode == KILN_RNN_LSTM) memcpy(L.dc, dt_at(L.gz, dt, (T + 1) * B * H), es * (size_t)(B * H));
  else memset(L.dc, 0, es * (size_t)(B * H));
  /* the weights' grads on the team's products when dgh is dgx (not the GRU) and the BLAS is
     narrower (weight_grads_here): [h_prev | x] against dgh, which the team packs as it goes */
  if (team_gw) {
    L.gwp = scratch(ngwp, L.padded || GH % panel_width(dt));   /* zeros: rows past the ends, columns past GH */
    if (!L.gwp) { rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory for the layer's buffers"); goto done; }
  }
  if (team_table) {
    L.gt = kiln_tensor_data(bw->gx);
    memset(L.gt, 0, es * (size_t)(bw->gx->sizes[0] * GH));
  }
  int team_bias = c->ints[2] == KILN_RNN_PERSISTENT;
  if (team_bias) {
    /* the team sums the bias grads as it goes, instead of a pass over dgx (and dgh) after it:
       b_ih's from dgx, b_hh's from dgh (the same sums but for the GRU: copied below) */
    if (bw->gb_ih) L.gbx = kiln_tensor_data(bw->gb_ih);
    else if (bw->gb_hh && L.dgh == L.dgx) L.gbx = kiln_tensor_data(bw->gb_hh);
    if (bw->gb_hh && L.dgh != L.dgx) L.gbh = kiln_tensor_data(bw->gb_hh);
    if (L.gbx) memset(L.gbx, 0, es * (size_t)GH);
    if (L.gbh) memset(L.gbh, 0, es * (size_t)GH);
  }
  if (c->ints[2] == KILN_RNN_PERSISTENT) {
    barrier_init(&L.bar, kiln_parallel_team_size());
    kiln_parallel_team(dt == KILN_F32 ? backward_team_f32 : backward_team_f64, &L);
    if (L.bar.failed) { rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory for the persistent threads' weights"); goto done; }
  } else if (dt == KILN_F32) {
    rc = backward_gemm_f32(&L);
  } else {
    rc = backward_gemm_f64(&L);
  }
  if (bw->gh0) memcpy(kiln_tensor_data(bw->gh0), L.dh, es * (size_t)(B * H));
  if (bw->gc0) memcpy(kiln_tensor_data(bw->gc0), L.dc, es * (size_t)(B * H));
  if (bw->gx && L.xidx && !L.gt) {
    table_grad(dt, &L, kiln_tensor_data(bw->gx), bw->gx->sizes[0]);
  } else if (bw->gx && !L.gx) {
    kiln_cpu_gemm_raw(dt, 0, 0, T * B, I, GH, 1.0, L.dgx, GH, L.w_ih, I, 0.0, kiln_tensor_data(bw->gx), I);
  }
  if (L.gwp) {
    if ((rc = weight_grads(dt, &L, bw->gw_hh ? kiln_tensor_data(bw->gw_hh) : NULL, bw->gw_ih ? kiln_tensor_data(bw->gw_ih) : NULL)))
      goto done;
  } else if (bw->gw_ih) {
    kiln_cpu_gemm_raw(dt, 1, 0, GH, I, T * B, 1.0, L.dgx, GH, L.x, I, 0.0, kiln_tensor_data(bw->gw_ih), I);
  }
  if (L.gwp) {
    /* done above */
  } else if (bw->gw_hh && !gather) {
    /* rows of the step whose state before is h0 (the first, or the last when reversed), then the
       rest against the outputs of the steps before them */
    void *gw = kiln_tensor_data(bw->gw_hh);
    const void *first = L.reverse ? dt_at(L.dgh, dt, (T - 1) * B * GH) : L.dgh;
    const void *rest = L.reverse ? L.dgh : dt_at(L.dgh, dt, B * GH);
    kiln_cpu_gemm_raw(dt, 1, 0, GH, H, B, 1.0, first, GH, L.h0, H, 0.0, gw, H);
    if (T > 1)
      kiln_cpu_gemm_raw(dt, 1, 0, GH, H, (T - 1) * B, 1.0, rest, GH, L.reverse ? dt_at(L.z, dt, B * H) : L.z, H, 1.0, gw, H);
  } else if (bw->gw_hh) {
    for (int64_t b = 0; b < B; b++)
      for (int64_t s = 0; s < L.len[b]; s++) {
        int64_t t = step_time(&L, s, b);
        memcpy(dt_at(hprev, dt, (t * B + b) * H), h_before(dt, &L, s, b, t), es * (size_t)H);
      }
    kiln_cpu_gemm_raw(dt, 1, 0, GH, H, T * B, 1.0, L.dgh, GH, hprev, H, 0.0, kiln_tensor_data(bw->gw_hh), H);
  }
  for (int k = 0; k < 2; k++) {
    struct kiln_tensor *gb = k ? bw->gb_hh : bw->gb_ih;
    if (!gb) continue;
    if (k == 1 && bw->gb_ih && L.dgh == L.dgx)   /* the same sums as b_ih's */
      memcpy(kiln_tensor_data(gb), kiln_tensor_data(bw->gb_ih), es * (size_t)GH);
    else if (!team_bias)
      bias_grad(dt, kiln_tensor_data(gb), k ? L.dgh : L.dgx, T * B, GH);
  }
done:
  if (L.dgh != L.dgx) kiln_cpu_free(L.dgh, nbig);
  kiln_cpu_free(L.dgx, nbig); kiln_cpu_free(hprev, nprev); kiln_cpu_free(L.gwp, ngwp);
  free(L.dgs); free(L.dh); free(L.dc); free(L.tmp);
  free((void *)L.len); free(zeros);
  return rc;
}
static int backward_f32(const struct kiln_call *c) { return backward(KILN_F32, c); }
static int backward_f64(const struct kiln_call *c) { return backward(KILN_F64, c); }

/* ---- the layer in bf16: a bf16 input (x, and so Z and its grad) with f32 or bf16 weights,
   biases and initial states (autocast keeps them f32: the master weights, and a state that is
   carried on); the products take bf16 operands with f32 sums, the rest runs in f32, and each grad
   is rounded once to its tensor's dtype ---- */

/* t's n values as f32: its own data when it is f32, else a copy in *copy (to free) */
static const float *f32_of(const struct kiln_tensor *t, int64_t n, float **copy) {
  *copy = NULL;
  if (t->dtype == KILN_F32) return kiln_tensor_data(t);
  *copy = kiln_cpu_scratch(sizeof(float) * (size_t)(n > 0 ? n : 1));
  if (*copy) {
    const uint16_t *src = kiln_tensor_data(t);
    for (int64_t i = 0; i < n; i++) (*copy)[i] = convert_bf16_to_f32(src[i]);
  }
  return *copy;
}

/* n f32 values into t (f32, or bf16 rounded once); src may be t's own data */
static void store_f32(struct kiln_tensor *t, const float *src, int64_t n) {
  void *d = kiln_tensor_data(t);
  if (t->dtype != KILN_F32) kiln_cpu_rnn_bf16_round(d, src, KILN_F32, n);
  else if (d != (const void *)src && n > 0) memcpy(d, src, sizeof(float) * (size_t)n);
}

/* where an f32 result for t goes: t's data when it is f32, else a scratch (to free) */
static float *f32_out(struct kiln_tensor *t, int64_t n, float **scratch) {
  *scratch = NULL;
  if (t->dtype == KILN_F32) return kiln_tensor_data(t);
  return *scratch = kiln_cpu_scratch(sizeof(float) * (size_t)(n > 0 ? n : 1));
}

/* The bf16 copies a bf16 layer's products read, where allocated: h0 (one element more, 0, as the
   rows are read in pairs) and the GEMM path's w_hh and w_ih. */
static void round_inputs_bf(struct layer *L) {
  int64_t BH = L->B * L->H;
  kiln_cpu_rnn_bf16_round(L->h0b, L->h0, KILN_F32, BH);
  L->h0b[BH] = 0;
  if (L->whhb) kiln_cpu_rnn_bf16_round(L->whhb, L->w_hh, L->wdt, L->GH * L->H);
  if (L->wihb) kiln_cpu_rnn_bf16_round(L->wihb, L->w_ih, L->wdt, L->GH * L->I);
}

static int forward_bf(const struct kiln_call *c) {
  const struct kiln_rnn_forward *f = c->extra;
  struct layer L = {0};
  void *zeros = NULL;
  if (setup(KILN_F32, &L, (int)c->ints[0], (int)c->ints[1], &f->t, &zeros)) return kiln_error_code();
  int64_t T = L.T, B = L.B, H = L.H, GH = L.GH, I = L.I;
  int persistent = c->ints[2] == KILN_RNN_PERSISTENT;
  L.bf = 1;
  L.wdt = f->t.w_hh->dtype;
  L.xb = L.xidx ? NULL : L.x; L.x = NULL;   /* a looked-up table: f32, the steps' xp itself */
  L.zb = kiln_tensor_data(c->out);
  L.res = f->reserve ? kiln_tensor_data(f->reserve) : NULL;
  float *h0c = NULL, *c0c = NULL, *bic = NULL, *bhc = NULL;
  int rc = KILN_OK, fold = persistent && L.mode != KILN_RNN_GRU && B >= KILN_RNN_FOLD_MIN_BATCH &&
                          H + I <= KILN_RNN_FOLD_MAX_ROWS && !L.xidx;
  if (f->t.h0) L.h0 = f32_of(f->t.h0, B * H, &h0c);
  if (f->t.c0) L.c0 = f32_of(f->t.c0, B * H, &c0c);
  if (f->t.b_ih) L.b_ih = f32_of(f->t.b_ih, GH, &bic);
  if (f->t.b_hh) L.b_hh = f32_of(f->t.b_hh, GH, &bhc);
  size_t nxp = sizeof(float) * (size_t)(T * B * GH > 0 ? T * B * GH : 1), nbh = (size_t)(B * H > 0 ? B * H : 1);
  L.xp = fold ? NULL : L.xidx ? (void *)kiln_tensor_data(f->t.x) : kiln_cpu_alloc(nxp);
  L.zero = zeros;
  L.hh = calloc((size_t)(B * GH > 0 ? B * GH : 1), sizeof(float));
  L.h = kiln_cpu_scratch(sizeof(float) * nbh);
  L.hnext = kiln_cpu_scratch(sizeof(float) * nbh);
  L.c = kiln_cpu_scratch(sizeof(float) * nbh);
  L.h0b = kiln_cpu_scratch(sizeof(uint16_t) * (nbh + 1));
  L.wihb = fold ? NULL : kiln_cpu_scratch(sizeof(uint16_t) * (size_t)(GH * I + 1));
  if (!persistent) {
    L.whhb = kiln_cpu_scratch(sizeof(uint16_t) * (size_t)(GH * H + 1));
    L.hb = kiln_cpu_scratch(sizeof(uint16_t) * (nbh + 1));
    L.yrows = kiln_cpu_scratch(sizeof(float) * nbh);
  }
  if (!L.h0 || !L.c0 || !L.b_ih || !L.b_hh || (!fold && (!L.xp || !L.wihb)) || !L.hh || !L.h || !L.hnext || !L.c || !L.h0b ||
      (!persistent && (!L.whhb || !L.hb || !L.yrows))) {
    rc = kiln_fail(KILN_ERR_MEMORY, "rnn: out of memory for the layer's buffers");
    goto done;
  }
  round_inputs_bf(&L);
  if (L.padded) memset(L.zb, 0, sizeof(uint16_t) * (size_t)c->out->numel);
  /* the input projection of every step: one GEMM on bf16 operands (cpu/bf16_gemm.c) */
  if (!fold && !L.xidx && (rc = kiln_cpu_gemm_bf16_f32(T * B, GH, I, 1.0f, L.xb, I, 1, L.wihb, 1, I, 0.0f, L.xp, GH, 1)))
    goto done;
  memcpy(L.h, L.h0, sizeof(float) * (size_t)(B * H));
  memcpy(L.c, L.c0, sizeof(float) * (size_t)(B * H));
  if (persistent) {
    barrier_init(&L.bar, kiln_parallel_team_size());
    L.res_stream = 1;
    kiln_parallel_team(forward_team_bf, &L);
    if (L.bar.failed) { rc = kiln_fail(KILN_ERR_MEMORY, "rnn: out of memory for the persistent threads' weights"); goto done; }
    if (T % 2) { void *swap = L.h; L.h = L.hnext; L.hnext = swap; }
  } else if ((rc = forward_gemm(KILN_F32, &L))) {
    goto done;
  }
  kiln_cpu_rnn_bf16_round(L.zb + T * B * H, L.h, KILN_F32, B * H);
  if (L.mode == KILN_RNN_LSTM) kiln_cpu_rnn_bf16_round(L.zb + (T + 1) * B * H, L.c, KILN_F32, B * H);
done:
  if (!L.xidx) kiln_cpu_free(L.xp, nxp);
  free(L.hh);
  free(L.h); free(L.hnext); free(L.c); free(L.h0b); free(L.wihb); free(L.whhb); free(L.hb); free(L.yrows);
  free(h0c); free(c0c); free(bic); free(bhc);
  free((void *)L.len); free(zeros);
  return rc;
}

static int backward_bf(const struct kiln_call *c) {
  const struct kiln_rnn_backward *bw = c->extra;
  struct layer L = {0};
  void *zeros = NULL;
  if (setup(KILN_F32, &L, (int)c->ints[0], (int)c->ints[1], &bw->t, &zeros)) return kiln_error_code();
  int64_t T = L.T, B = L.B, H = L.H, GH = L.GH, I = L.I, S = kiln_rnn_states(L.mode), GHp = GH + (GH & 1);
  int persistent = c->ints[2] == KILN_RNN_PERSISTENT, gru = L.mode == KILN_RNN_GRU;
  L.bf = 1;
  L.dh0 = bw->gh0 != NULL;
  L.wdt = bw->t.w_hh->dtype;
  L.xb = L.xidx ? NULL : L.x; L.x = NULL;
  L.zb = kiln_tensor_data(bw->z);
  L.res = bw->reserve ? kiln_tensor_data(bw->reserve) : NULL;
  L.GHp = GHp;
  float *gzc = NULL, *h0c = NULL, *c0c = NULL, *zf = NULL, *gxf = NULL, *gwc = NULL, *gbxc = NULL, *gbhc = NULL;
  uint16_t *hprev = NULL;
  int rc = KILN_OK;
  size_t nbig = sizeof(float) * (size_t)(T * B * GH > 0 ? T * B * GH : 1), nbh = (size_t)(B * H > 0 ? B * H : 1);
  size_t nbigb = sizeof(uint16_t) * (size_t)(T * B * GHp + 1), nz = (size_t)((T + S) * B * H);
  size_t ngwp = sizeof(float) * (size_t)(panels(KILN_F32, GH) * PW_F32 * T * B + 1);   /* the team's panels, when made */
  /* the persistent LSTM reads gz as it is (bf16) but for the last state's grads, below; the rest an f32 copy */
  const float *gz_last = NULL;   /* rows T.. of gz (the last states' grads) in f32 */
  if (persistent && L.mode == KILN_RNN_LSTM && bw->gz->dtype == KILN_BF16) {
    L.gzb = kiln_tensor_data(bw->gz);
    if ((gzc = kiln_cpu_scratch(sizeof(float) * (size_t)(S * B * H + 1))))
      for (int64_t i = 0; i < S * B * H; i++) gzc[i] = convert_bf16_to_f32(L.gzb[T * B * H + i]);
    gz_last = gzc;
  } else if ((L.gz = f32_of(bw->gz, (T + S) * B * H, &gzc))) {
    gz_last = (const float *)L.gz + T * B * H;
  }
  if (bw->t.h0) L.h0 = f32_of(bw->t.h0, B * H, &h0c);
  if (bw->t.c0) L.c0 = f32_of(bw->t.c0, B * H, &c0c);
  if (L.mode != KILN_RNN_LSTM) {   /* the GRU and the plain RNN read the outputs (the states) in f32 */
    L.z = zf = kiln_cpu_scratch(sizeof(float) * (nz > 0 ? nz : 1));
    if (zf)
      for (size_t i = 0; i < nz; i++) zf[i] = convert_bf16_to_f32(L.zb[i]);
  }
  /* the f32 grads dgx (dgh) in full for the GEMM path; the persistent team keeps one row of them
     per thread and rounds it at once */
  if (!persistent) {
    L.dgx = scratch(nbig, L.padded);
    L.dgh = gru ? scratch(nbig, L.padded) : L.dgx;
  }
  L.dgxb = scratch(nbigb, L.padded || (GH & 1));
  L.dghb = gru ? scratch(nbigb, L.padded || (GH & 1)) : L.dgxb;
  L.dh = kiln_cpu_scratch(sizeof(float) * nbh);
  L.dc = kiln_cpu_scratch(sizeof(float) * nbh);
  L.tmp = kiln_cpu_scratch(sizeof(float) * nbh);
  L.h0b = kiln_cpu_scratch(sizeof(uint16_t) * (nbh + 1));
  if (!persistent) {
    L.whhb = kiln_cpu_scratch(sizeof(uint16_t) * (size_t)(GH * H + 1));
    if (L.reverse && L.padded) L.dgs = kiln_cpu_scratch(sizeof(uint16_t) * (size_t)(B * GHp + 1));
  }
  int fold_gx = bw->gx && persistent && B >= KILN_RNN_FOLD_MIN_BATCH && H + I <= KILN_RNN_FOLD_MAX_ROWS && I > 0;
  if (bw->gx && !fold_gx) L.wihb = kiln_cpu_scratch(sizeof(uint16_t) * (size_t)(GH * I + 1));
  int gather = L.padded || T * B == 0;
  if (bw->gw_hh && gather) hprev = scratch(sizeof(uint16_t) * (size_t)(T * B * H + 1), L.padded);
  if (!gz_last || !L.h0 || !L.c0 || (L.mode != KILN_RNN_LSTM && !zf) || (!persistent && (!L.dgx || !L.dgh)) || !L.dgxb ||
      !L.dghb || !L.dh ||
      !L.dc || !L.tmp || !L.h0b || (!persistent && !L.whhb) || (!persistent && L.reverse && L.padded && !L.dgs) ||
      (bw->gx && !fold_gx && !L.wihb) || (bw->gw_hh && gather && !hprev)) {
    rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory for the layer's buffers");
    goto done;
  }
  round_inputs_bf(&L);
  if (fold_gx) {
    L.gxb = kiln_tensor_data(bw->gx);
    if (L.padded) memset(L.gxb, 0, sizeof(uint16_t) * (size_t)(T * B * I));
  }
  if (persistent) {   /* the team sums the bias grads as it goes (as backward) */
    if (bw->gb_ih) L.gbx = f32_out(bw->gb_ih, GH, &gbxc);
    else if (bw->gb_hh && !gru) L.gbx = f32_out(bw->gb_hh, GH, &gbxc);
    if (bw->gb_hh && gru) L.gbh = f32_out(bw->gb_hh, GH, &gbhc);
    if ((bw->gb_ih || (bw->gb_hh && !gru)) && !L.gbx) { rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory"); goto done; }
    if (bw->gb_hh && gru && !L.gbh) { rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory"); goto done; }
    if (L.gbx) memset(L.gbx, 0, sizeof(float) * (size_t)GH);
    if (L.gbh) memset(L.gbh, 0, sizeof(float) * (size_t)GH);
  }
  memcpy(L.dh, gz_last, sizeof(float) * (size_t)(B * H));
  if (L.mode == KILN_RNN_LSTM) memcpy(L.dc, gz_last + B * H, sizeof(float) * (size_t)(B * H));
  else memset(L.dc, 0, sizeof(float) * (size_t)(B * H));
  /* emulated (vdpbf16ps the slower), every sequence of length T, dgh = dgx (not the GRU) and the
     level's own kernels for the weights' grads (weight_grads_here): as in the f32 path, the team
     widens the rounded rows of dgx into panels as it goes, and the grads are the f32 products on
     them (not a GEMM of the bf16 rows, whose operands would be widened, and the large one packed,
     after the team) */
  if (persistent && (bw->gw_ih || bw->gw_hh) && (!bw->gw_ih || L.xb) && !gather && L.dghb == L.dgxb && T * B > 0 &&
      !kiln_cpu_bf16_products_native() && weight_grads_here()) {
    L.gwp = scratch(ngwp, GH % PW_F32 != 0);
    if (!L.gwp) { rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory for the layer's buffers"); goto done; }
  }
  if (persistent) {
    barrier_init(&L.bar, kiln_parallel_team_size());
    kiln_parallel_team(backward_team_bf, &L);
    if (L.bar.failed) { rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory for the persistent threads' weights"); goto done; }
  } else if ((rc = backward_gemm_f32(&L))) {
    goto done;
  }
  if (bw->gh0) store_f32(bw->gh0, L.dh, B * H);
  if (bw->gc0) store_f32(bw->gc0, L.dc, B * H);
  if (bw->gx && L.xidx) {   /* a looked-up input's grad: dgx rounded (as the products below read it), by rows */
    table_grad(KILN_F32, &L, kiln_tensor_data(bw->gx), bw->gx->sizes[0]);
  } else if (bw->gx && !fold_gx) {   /* dgx rounded times w_ih rounded, then rounded once */
    if (!(gxf = kiln_cpu_scratch(sizeof(float) * (size_t)(T * B * I + 1)))) { rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory"); goto done; }
    if ((rc = kiln_cpu_gemm_bf16_f32(T * B, I, GH, 1.0f, L.dgxb, GHp, 1, L.wihb, I, 1, 0.0f, gxf, I, 1))) goto done;
    store_f32(bw->gx, gxf, T * B * I);
  }
  /* the weight grads in f32 (written transposed: x^T dgx is [I][GH], w_ih's grad [GH][I]), rounded
     once when the weight is bf16. Both wanted, every sequence of length T and dgh = dgx (not the
     GRU): one product [x | h_prev]^T dgx, so that dgx (the large operand) is packed once */
  int fused = bw->gw_ih && bw->gw_hh && !gather && L.dghb == L.dgxb && T * B > 0;
  if (L.gwp) {   /* the f32 path's products on the panels the team widened */
    float *gi = NULL, *gh = NULL, *ghc = NULL;
    if ((bw->gw_ih && !(gi = f32_out(bw->gw_ih, GH * I, &gwc))) || (bw->gw_hh && !(gh = f32_out(bw->gw_hh, GH * H, &ghc))))
      rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory");
    else
      rc = weight_grads(KILN_F32, &L, gh, gi);
    if (!rc) {
      if (gwc) store_f32(bw->gw_ih, gwc, GH * I);
      if (ghc) store_f32(bw->gw_hh, ghc, GH * H);
    }
    free(ghc); free(gwc); gwc = NULL;
    if (rc) goto done;
  } else if (fused) {
    const int64_t R = I + H;
    uint16_t *xh = kiln_cpu_scratch(sizeof(uint16_t) * (size_t)(T * B * R + 1));
    float *both = kiln_cpu_scratch(sizeof(float) * (size_t)(GH * R + 1));
    if (!xh || !both) { free(xh); free(both); rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory"); goto done; }
    for (int64_t t = 0; t < T; t++)
      for (int64_t b = 0; b < B; b++) {
        int64_t k = t * B + b;
        memcpy(xh + k * R, L.xb + k * I, sizeof(uint16_t) * (size_t)I);
        memcpy(xh + k * R + I, h_before_bf(&L, L.reverse ? T - 1 - t : t, b, t), sizeof(uint16_t) * (size_t)H);
      }
    rc = kiln_cpu_gemm_bf16_f32(R, GH, T * B, 1.0f, xh, 1, R, L.dgxb, GHp, 1, 0.0f, both, 1, R);
    free(xh);
    float *gi = rc ? NULL : f32_out(bw->gw_ih, GH * I, &gwc), *gh = NULL, *ghc = NULL;
    if (gi) gh = f32_out(bw->gw_hh, GH * H, &ghc);
    if (!rc && (!gi || !gh)) rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory");
    if (!rc) {
      for (int64_t g = 0; g < GH; g++) {
        memcpy(gi + g * I, both + g * R, sizeof(float) * (size_t)I);
        memcpy(gh + g * H, both + g * R + I, sizeof(float) * (size_t)H);
      }
      if (gwc) store_f32(bw->gw_ih, gwc, GH * I);
      if (ghc) store_f32(bw->gw_hh, ghc, GH * H);
    }
    free(both); free(gwc); free(ghc); gwc = NULL;
    if (rc) goto done;
  }
  if (bw->gw_ih && !fused && !L.gwp) {
    float *gw = f32_out(bw->gw_ih, GH * I, &gwc);
    if (!gw) { rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory"); goto done; }
    if ((rc = kiln_cpu_gemm_bf16_f32(I, GH, T * B, 1.0f, L.xb, 1, I, L.dgxb, GHp, 1, 0.0f, gw, 1, I))) goto done;
    if (gwc) { store_f32(bw->gw_ih, gwc, GH * I); free(gwc); gwc = NULL; }
  }
  if (bw->gw_hh && !fused && !L.gwp) {
    float *gw = f32_out(bw->gw_hh, GH * H, &gwc);
    if (!gw) { rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory"); goto done; }
    if (!gather) {   /* as backward: the rows whose state before is h0, then the rest against the outputs */
      const uint16_t *first = L.dghb + (L.reverse ? (T - 1) * B * GHp : 0), *rest = L.dghb + (L.reverse ? 0 : B * GHp);
      if ((rc = kiln_cpu_gemm_bf16_f32(H, GH, B, 1.0f, L.h0b, 1, H, first, GHp, 1, 0.0f, gw, 1, H))) goto done;
      if (T > 1 &&
          (rc = kiln_cpu_gemm_bf16_f32(H, GH, (T - 1) * B, 1.0f, L.zb + (L.reverse ? B * H : 0), 1, H, rest, GHp, 1, 1.0f, gw, 1, H)))
        goto done;
    } else {
      for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < L.len[b]; s++) {
          int64_t t = step_time(&L, s, b);
          memcpy(hprev + (t * B + b) * H, h_before_bf(&L, s, b, t), sizeof(uint16_t) * (size_t)H);
        }
      if ((rc = kiln_cpu_gemm_bf16_f32(H, GH, T * B, 1.0f, hprev, 1, H, L.dghb, GHp, 1, 0.0f, gw, 1, H))) goto done;
    }
    if (gwc) { store_f32(bw->gw_hh, gwc, GH * H); free(gwc); gwc = NULL; }
  }
  if (!persistent) {   /* the GEMM path: the sums after it, in f32 */
    if (bw->gb_ih && !(L.gbx = f32_out(bw->gb_ih, GH, &gbxc))) { rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory"); goto done; }
    if (bw->gb_hh && gru && !(L.gbh = f32_out(bw->gb_hh, GH, &gbhc))) { rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory"); goto done; }
    if (!bw->gb_ih && bw->gb_hh && !gru && !(L.gbx = f32_out(bw->gb_hh, GH, &gbxc))) { rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory"); goto done; }
    if (L.gbx) bias_grad(KILN_F32, L.gbx, L.dgx, T * B, GH);
    if (L.gbh) bias_grad(KILN_F32, L.gbh, L.dgh, T * B, GH);
  }
  /* b_ih's sums into its grad; b_hh's: its own (the GRU) or b_ih's */
  if (bw->gb_ih) store_f32(bw->gb_ih, L.gbx, GH);
  if (bw->gb_hh) store_f32(bw->gb_hh, gru ? L.gbh : L.gbx, GH);
done:
  if (L.dgh != L.dgx) kiln_cpu_free(L.dgh, nbig);
  kiln_cpu_free(L.dgx, nbig);
  if (L.dghb != L.dgxb) kiln_cpu_free(L.dghb, nbigb);
  kiln_cpu_free(L.dgxb, nbigb);
  if (hprev) kiln_cpu_free(hprev, sizeof(uint16_t) * (size_t)(T * B * H + 1));
  kiln_cpu_free(L.gwp, ngwp);
  free(L.dgs); free(L.dh); free(L.dc); free(L.tmp); free(L.h0b); free(L.whhb); free(L.wihb);
  free(gzc); free(h0c); free(c0c); free(zf); free(gxf); free(gwc); free(gbxc); free(gbhc);
  free((void *)L.len); free(zeros);
  return rc;
}

int cpu_rnn(const struct kiln_call *c) {
  if (c->out->dtype == KILN_BF16) return forward_bf(c);
  return c->out->dtype == KILN_F64 ? forward_f64(c) : forward_f32(c);
}

int cpu_rnn_backward(const struct kiln_call *c) {
  const struct kiln_rnn_backward *bw = c->extra;
  if (bw->z->dtype == KILN_BF16) return backward_bf(c);   /* a bf16 layer (its input bf16, or a looked-up f32 table) */
  return bw->gz->dtype == KILN_F64 ? backward_f64(c) : backward_f32(c);
}
