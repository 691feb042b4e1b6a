/* random.c: the generator's state (seed, offset) and the random fills' front end.
   Element i of a fill is drawn from Philox block (offset + i): a pure function of its position. */
#include "internal.h"
#include <math.h>

static uint64_t gen_seed = 67280421310721ull;
static uint64_t gen_offset = 0;

KILN_API void kiln_manual_seed(uint64_t seed) {
  __atomic_store_n(&gen_seed, seed, __ATOMIC_RELAXED);
  __atomic_store_n(&gen_offset, 0, __ATOMIC_RELAXED);
}
KILN_API uint64_t kiln_initial_seed(void) { return gen_seed; }
KILN_API uint64_t kiln_random_offset(void) { return gen_offset; }
KILN_API void kiln_random_set_state(uint64_t seed, uint64_t offset) { gen_seed = seed; gen_offset = offset; }

/* lo and hi: randint's exact bounds (p0 and p1 hold them rounded, for messages). */
static int random_fill(int op, struct kiln_tensor *t, double p0, double p1, int64_t lo, int64_t hi) {
  const char *name = kiln_op_name(op);
  if (kiln_check_live(name, t) || kiln_autograd_check_inplace(name, t, NULL)) return kiln_error_code();
  if (op != KILN_OP_RANDINT && !kiln_dtype_is_float(t->dtype))
    return kiln_fail(KILN_ERR_DTYPE, "%s: tensor %s is %s (expected a float dtype)", name, kiln_shape_string(t), kiln_dtype_name(t->dtype));
  if (t->dtype == KILN_BOOL && op == KILN_OP_RANDINT && (p0 < 0 || p1 > 2))
    return kiln_fail(KILN_ERR_ARGUMENT, "randint: range [%g, %g) does not fit bool", p0, p1);
  struct kiln_tensor *target = kiln_is_contiguous(t) ? t : kiln_tensor_empty(t->ndim, t->sizes, t->dtype, t->device);
  if (!target) return kiln_error_code();
  uint64_t offset = __atomic_fetch_add(&gen_offset, (uint64_t)t->numel, __ATOMIC_RELAXED);
  struct kiln_call call = {.op = op, .out = target, .scalar = {p0, p1}, .ints = {(int64_t)gen_seed, (int64_t)offset, lo, hi}, .nints = 4};
  int rc = kiln_dispatch(t->device, &call);
  if (target != t) {
    if (!rc) rc = kiln_copy_(t, target);
    kiln_tensor_release(target);
  }
  if (!rc) kiln_tensor_bump_version(t);
  return rc;
}

KILN_API int kiln_uniform_(struct kiln_tensor *t, double lo, double hi) {
  if (!(lo <= hi) || !isfinite(lo) || !isfinite(hi)) return kiln_fail(KILN_ERR_ARGUMENT, "uniform: range [%g, %g) is empty or not finite", lo, hi);
  return random_fill(KILN_OP_UNIFORM, t, lo, hi, 0, 0);
}

KILN_API int kiln_normal_(struct kiln_tensor *t, double mean, double std) {
  if (!(std >= 0) || !isfinite(mean)) return kiln_fail(KILN_ERR_ARGUMENT, "normal: mean %g, std %g (std must be >= 0)", mean, std);
  return random_fill(KILN_OP_NORMAL, t, mean, std, 0, 0);
}

KILN_API int kiln_randint_(struct kiln_tensor *t, int64_t lo, int64_t hi) {
  if (hi <= lo) return kiln_fail(KILN_ERR_ARGUMENT, "randint: range [%lld, %lld) is empty", (long long)lo, (long long)hi);
  return random_fill(KILN_OP_RANDINT, t, (double)lo, (double)hi, lo, hi);
}
