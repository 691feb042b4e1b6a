/* cpu/rnn.c: one recurrent layer on the CPU (kiln/rnn.h), forward and backward through time, on
   two paths: a GEMM per timestep followed by one fused gate kernel, or a persistent team of
   threads that each keep a slice of the recurrent weights in their core's cache and meet at a
   spinning barrier once per step. rnn_impl.h holds the code, once per element type. */
#include "cpu.h"
#include "rnn_calls.h"
#include "vexp.h"
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

/* A sense-reversing barrier that spins: the team's threads are all running (kiln_parallel_team),
   and a step is far shorter than a sleep and wake-up; a long wait yields the core. */
struct barrier {
  int n;
  int count;
  int sense;
  int failed;   /* a thread could not set up: everyone leaves after the first wait */
};

static void barrier_init(struct barrier *b, int n) {
  b->n = n; b->count = 0; b->sense = 0; b->failed = 0;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void barrier_wait(struct barrier *b, int *local_sense) {
  if (b->n <= 1) return;
  int s = !*local_sense;
  *local_sense = s;
  if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == b->n) {
    __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&b->sense, s, __ATOMIC_RELEASE);
  } else {
    /* spin; after a while give the core away, in case a teammate was descheduled (more threads
       than free cores) */
    for (unsigned spins = 0; __atomic_load_n(&b->sense, __ATOMIC_ACQUIRE) != s; spins++) {
      if (spins < 20000) cpu_relax();
      else sched_yield();
    }
  }
}

/* exp and tanh for the f32 gates, without branches or calls so that the gate loops vectorise.
   exp: kiln_vexpf (cpu/vexp.h, relative error below 3e-7). tanh: its odd Taylor series through
   x^13 below |x| = 0.4 (error below 1e-8), else 1 - 2 / (e^2|x| + 1) (relative error below 5e-7). */

static inline float gate_tanhf(float x) {
  float a = x < 0 ? -x : x, a2 = a * a;
  float small = a * (1.0f + a2 * (-1.0f / 3 + a2 * (2.0f / 15 + a2 * (-17.0f / 315 + a2 * (62.0f / 2835 +
                a2 * (-1382.0f / 155925 + a2 * (21844.0f / 6081075)))))));
  float large = 1.0f - 2.0f / (kiln_vexpf(2.0f * a) + 1.0f);
  float t = a < 0.4f ? small : large;
  return x < 0 ? -t : t;
}

#if defined(__AVX__)
#include <immintrin.h>
/* dst[i * ld + r] = rows[r][k0 + i] for an 8 x 8 block: eight rows of a matrix read along, the
   block written transposed (the persistent path's packing of w_hh) */
static inline void transpose8_f32(float *dst, int64_t ld, const float *const *rows, int64_t k0) {
  __m256 r[8], t[8], u[8];
  for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(rows[i] + k0);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; i++) {
    _mm256_storeu_ps(dst + i * ld, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ld, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
  }
}
#endif

/* The batch from which the persistent forward folds the input projection into its per-step
   products (each weight then serves that many sequences a step) instead of one GEMM first, and
   the largest panel of packed weights (bytes) it does it with. */
enum { KILN_RNN_FOLD_MIN_BATCH = 8, KILN_RNN_FOLD_MAX_PANEL = 64 << 10 };

#define R float
#define FN(name) name##_f32
#define DT KILN_F32
#define EXP kiln_vexpf
#define TANH gate_tanhf
#include "rnn_impl.h"
#undef R
#undef FN
#undef DT
#undef EXP
#undef TANH
#undef LANES
#undef PW

#define R double
#define FN(name) name##_f64
#define DT KILN_F64
#define EXP exp
#define TANH tanh
#include "rnn_impl.h"

int cpu_rnn(const struct kiln_call *c) {
  return c->out->dtype == KILN_F64 ? forward_f64(c) : forward_f32(c);
}

int cpu_rnn_backward(const struct kiln_call *c) {
  const struct kiln_rnn_backward *bw = c->extra;
  return bw->gz->dtype == KILN_F64 ? backward_f64(c) : backward_f32(c);
}
