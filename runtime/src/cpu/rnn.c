/* cpu/rnn.c: one recurrent layer on the CPU (kiln/rnn.h), forward and backward through time, on
   two paths: a GEMM per timestep followed by one fused gate kernel, or a persistent team of
   threads that each keep a slice of the recurrent weights in their core's cache and meet at a
   spinning barrier once per step. rnn_impl.h holds the code, once per element type. */
#include "cpu.h"
#include "../rnn_calls.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A sense-reversing barrier that spins: the team's threads are all running (kiln_parallel_team),
   and a step is far shorter than a sleep and wake-up. */
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
    while (__atomic_load_n(&b->sense, __ATOMIC_ACQUIRE) != s) cpu_relax();
  }
}

#define R float
#define FN(name) name##_f32
#define DT KILN_F32
#define EXP expf
#define TANH tanhf
#include "rnn_impl.h"
#undef R
#undef FN
#undef DT
#undef EXP
#undef TANH

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
