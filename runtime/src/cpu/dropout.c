/* cpu/dropout.c: dropout on the CPU. Element i keeps its value (scaled by 1/(1-p)) when word
   i % 4 of Philox block (offset + i / 4) under the seed is at least p * 2^32: a pure function of
   (seed, offset, i), so the mask never depends on the thread count. */
#include "cpu.h"
#include "nn_calls.h"
#include "philox.h"

struct drop_job {
  int dt;
  uint64_t seed, offset, threshold;   /* keep when the word >= threshold */
  double scale;
  int64_t n;
  const void *x;
  void *y, *mask;
};

/* Blocks [begin, end) of four elements. */
static void dropout_blocks(void *ctx, int64_t begin, int64_t end) {
  const struct drop_job *j = ctx;
  for (int64_t b = begin; b < end; b++) {
    uint32_t r[4];
    kiln_philox4x32(j->offset + (uint64_t)b, j->seed, r);
    for (int k = 0; k < 4; k++) {
      int64_t i = b * 4 + k;
      if (i >= j->n) break;
      int keep = (uint64_t)r[k] >= j->threshold;
      if (j->dt == KILN_F32) {
        float m = keep ? (float)j->scale : 0.0f;
        ((float *)j->mask)[i] = m;
        ((float *)j->y)[i] = ((const float *)j->x)[i] * m;
      } else {
        double m = keep ? j->scale : 0.0;
        ((double *)j->mask)[i] = m;
        ((double *)j->y)[i] = ((const double *)j->x)[i] * m;
      }
    }
  }
}

int cpu_dropout(const struct kiln_call *c) {
  struct kiln_tensor *mask = (struct kiln_tensor *)c->extra;
  const struct kiln_tensor *in = c->in[0];
  if (in->dtype != KILN_F32 && in->dtype != KILN_F64)
    return kiln_fail(KILN_ERR_DTYPE, "dropout: %s tensors are not supported on cpu (f32 or f64; got %s)",
                     kiln_dtype_name(in->dtype), kiln_shape_string(in));
  if (c->out->numel == 0) return KILN_OK;
  struct kiln_tensor *x = kiln_cpu_contiguous(in);
  if (!x) return kiln_error_code();
  double p = c->scalar[0];
  struct drop_job j = {.dt = x->dtype, .seed = (uint64_t)c->ints[0], .offset = (uint64_t)c->ints[1],
                       .threshold = (uint64_t)(p * 4294967296.0), .scale = 1.0 / (1.0 - p), .n = x->numel,
                       .x = kiln_tensor_data(x), .y = kiln_tensor_data(c->out), .mask = kiln_tensor_data(mask)};
  kiln_parallel_for((x->numel + 3) / 4, 2048, dropout_blocks, &j);
  kiln_tensor_release(x);
  return KILN_OK;
}
