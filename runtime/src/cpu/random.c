/* cpu/random.c: Philox 4x32-10 (Salmon et al., SC'11) filling contiguous tensors.
   Element i takes block counter = offset + i under key = seed, so threads can split freely. */
#include "cpu.h"
#include "philox.h"
#include <math.h>

/* Uniform in [0, 1) with 53 bits, and in (0, 1] for logarithms. */
static double unit53(const uint32_t r[4]) { return kiln_philox_unit53(r); }

/* The largest f16 or bf16 value below hi. */
static uint16_t below(double hi, int dtype) {
  uint16_t h;
  kiln_store_f64(&h, dtype, hi);
  while (kiln_load_f64(&h, dtype) >= hi) {
    if (h == 0x0000) h = 0x8001;                /* just below +0: the smallest negative value */
    else if (h & 0x8000) h++;                  /* negative: a larger magnitude is smaller */
    else h--;
  }
  return h;
}

struct rjob { int op; char *data; int dtype; uint64_t seed, offset; double p0, p1; int64_t lo, hi; };

static void fill_range(void *ctx, int64_t begin, int64_t end) {
  const struct rjob *j = ctx;
  int es = kiln_dtype_size(j->dtype);
  for (int64_t i = begin; i < end; i++) {
    uint32_t r[4];
    kiln_philox4x32(j->offset + (uint64_t)i, j->seed, r);
    double v;
    if (j->op == KILN_OP_UNIFORM) {
      double u = j->dtype == KILN_F64 ? unit53(r) : (double)(r[0] >> 8) * 0x1p-24;
      v = fma(j->p1 - j->p0, u, j->p0);   /* one rounding, as the CUDA kernel does, whatever -march says */
      if (v >= j->p1 && j->p1 > j->p0) v = nextafter(j->p1, j->p0);  /* rounding must not reach hi */
      if (j->dtype != KILN_F64 && (float)v >= (float)j->p1 && j->p1 > j->p0) v = nextafterf((float)j->p1, (float)j->p0);
    } else if (j->op == KILN_OP_NORMAL) {
      double u1 = 1.0 - unit53(r);                       /* (0, 1] */
      double u2 = (double)(((uint64_t)r[2] << 21) ^ (r[3] >> 11)) * 0x1p-53;
      /* one rounding for the last multiply-add, as the CUDA kernel does, whatever -march says (the
         baseline level has no FMA to contract it into) */
      v = fma(j->p1 * sqrt(-2.0 * log(u1)), cos(2.0 * M_PI * u2), j->p0);
    } else {
      uint64_t range = (uint64_t)j->hi - (uint64_t)j->lo;   /* exact for any lo < hi, in unsigned arithmetic */
      uint64_t x = ((uint64_t)r[0] << 32) | r[1];
      int64_t k = (int64_t)((uint64_t)j->lo + x % range);
      if (j->dtype == KILN_I64) { ((int64_t *)j->data)[i] = k; continue; }
      v = (double)k;
    }
    char *dst = j->data + i * es;
    kiln_store_f64(dst, j->dtype, v);
    /* f16 and bf16 round after the range check above: a draw just below hi can round up to it */
    if (j->op == KILN_OP_UNIFORM && (j->dtype == KILN_F16 || j->dtype == KILN_BF16) && j->p1 > j->p0 &&
        kiln_load_f64(dst, j->dtype) >= j->p1)
      *(uint16_t *)dst = below(j->p1, j->dtype);
  }
}

int cpu_random(const struct kiln_call *c) {
  struct rjob j = {c->op, kiln_tensor_data(c->out), c->out->dtype, (uint64_t)c->ints[0], (uint64_t)c->ints[1], c->scalar[0], c->scalar[1], c->ints[2], c->ints[3]};
  kiln_parallel_for(c->out->numel, 8192, fill_range, &j);
  return KILN_OK;
}
