/* autocast.c: mixed precision's conversions at the op front ends. The policy is the op table's
   autocast class of each op (lower, f32, keep, promote) and the dtypes its kernel takes on the
   input's device; the state is one dtype per thread. */
#include "internal.h"

static _Thread_local int autocast_dtype = -1;   /* KILN_BF16, KILN_F16, or -1: off */

KILN_API int kiln_autocast_set(int dtype) {
  int prev = autocast_dtype;
  if (dtype != KILN_BF16 && dtype != KILN_F16 && dtype != -1)
    return kiln_fail(KILN_ERR_DTYPE, "autocast: dtype %s is not a mixed-precision dtype (bf16 or f16)",
                     kiln_dtype_name(dtype)), prev;
  autocast_dtype = dtype;
  return prev;
}

KILN_API int kiln_autocast_get(void) { return autocast_dtype; }

KILN_API int kiln_autocast_dtype(int op, int dtype, int device_type, int lower) {
  const struct kiln_op_info *info = kiln_op_info(op);
  if (!info || (lower != KILN_BF16 && lower != KILN_F16)) return -1;
  if (dtype != KILN_F32 && dtype != KILN_F16 && dtype != KILN_BF16) return dtype;
  int want = dtype;
  if (info->autocast == KILN_AUTOCAST_LOWER) want = lower;
  else if (info->autocast == KILN_AUTOCAST_F32) want = KILN_F32;
  unsigned takes = device_type == KILN_CUDA ? info->dtypes_cuda : info->dtypes_cpu;
  if (!(takes & KILN_DT(want))) want = KILN_F32;
  return want;
}

/* A tensor autocast may convert: live (a freed one is left for the op to refuse). */
static int live(const struct kiln_tensor *t) { return t && !(t->storage && (t->storage->flags & KILN_STORAGE_FREED)); }

int kiln_autocast_inputs(int op, int n, const struct kiln_tensor *const *in, struct kiln_tensor **out) {
  if (autocast_dtype < 0) return 0;
  int change = 0;
  for (int i = 0; i < n; i++)
    if (live(in[i]) &&
        kiln_autocast_dtype(op, in[i]->dtype, in[i]->device.type, autocast_dtype) != in[i]->dtype) change = 1;
  if (!change) return 0;
  for (int i = 0; i < n; i++) out[i] = NULL;
  for (int i = 0; i < n; i++) {
    if (!in[i]) continue;
    int want = live(in[i]) ? kiln_autocast_dtype(op, in[i]->dtype, in[i]->device.type, autocast_dtype) : in[i]->dtype;
    out[i] = want == in[i]->dtype ? kiln_to_dtype(in[i], want) : kiln_to_dtype_in_layout(in[i], want);
    if (!out[i]) { kiln_autocast_release(n, out); return -1; }
  }
  return 1;
}

void kiln_autocast_release(int n, struct kiln_tensor **t) {
  for (int i = 0; i < n; i++) { kiln_tensor_release(t[i]); t[i] = NULL; }
}
