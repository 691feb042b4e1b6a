/* nn.c: the front ends of the fused neural-network ops (kiln/nn.h) and their derivatives.
   A front end checks shapes, dtypes and devices, allocates the outputs, dispatches the forward
   kernel (nn_calls.h says what each call carries) and records a node with what the backward
   reads; their derivatives (named by the op table) dispatch the *_BACKWARD kernels (grad mode is off there). */
#include "internal.h"
#include "nn_calls.h"
#include <math.h>
#include <string.h>

/* ---- checks ---- */

static int live(const char *op, const struct kiln_tensor *t) { return t ? kiln_check_live(op, t) : KILN_OK; }

/* input is a float tensor; other (if given) has its dtype and device. */
static int check_float(const char *op, const char *what, const struct kiln_tensor *t) {
  if (!kiln_dtype_is_float(t->dtype))
    return kiln_fail(KILN_ERR_DTYPE, "%s: %s %s is %s (expected a float dtype: f32 or f64)", op, what,
                     kiln_shape_string(t), kiln_dtype_name(t->dtype));
  return KILN_OK;
}

static int check_like(const char *op, const char *what, const struct kiln_tensor *t, const struct kiln_tensor *input) {
  if (!t) return KILN_OK;
  if (kiln_check_live(op, t) || kiln_check_same_device(op, input, t)) return kiln_error_code();
  if (t->dtype != input->dtype)
    return kiln_fail(KILN_ERR_DTYPE, "%s: %s %s is %s but the input %s is %s", op, what, kiln_shape_string(t),
                     kiln_dtype_name(t->dtype), kiln_shape_string(input), kiln_dtype_name(input->dtype));
  return KILN_OK;
}

/* A per-channel parameter: NULL, or 1-d of size c. */
static int check_vector(const char *op, const char *what, const struct kiln_tensor *t, int64_t c,
                        const struct kiln_tensor *input) {
  if (!t) return KILN_OK;
  if (check_like(op, what, t, input)) return kiln_error_code();
  if (t->ndim != 1 || t->sizes[0] != c)
    return kiln_fail(KILN_ERR_SHAPE, "%s: %s %s does not fit input %s (expected [%lld], one per channel)", op, what,
                     kiln_shape_string(t), kiln_shape_string(input), (long long)c);
  return KILN_OK;
}

static struct kiln_tensor *empty_like(const struct kiln_tensor *t) {
  return kiln_tensor_empty(t->ndim, t->sizes, t->dtype, t->device);
}

/* Dispatch call; on failure release out (and the extra outputs given) and return NULL. */
static struct kiln_tensor *run(struct kiln_device dev, const struct kiln_call *call, struct kiln_tensor *out) {
  if (kiln_dispatch(dev, call)) { kiln_tensor_release(out); return NULL; }
  return out;
}

/* Record out = kind(inputs) with the tensors the derivative reads; NULL (out released) on failure. */
static struct kiln_tensor *record(int kind, struct kiln_tensor *out, int n, const struct kiln_tensor *const *inputs,
                                  const double *scalars, const int64_t *ints, int nints,
                                  const struct kiln_tensor *const *saved, int nsaved) {
  if (!out) return NULL;
  if (kiln_autograd_record_saved(kind, out, n, inputs, scalars, ints, nints, saved, nsaved)) {
    kiln_tensor_release(out);
    return NULL;
  }
  return out;
}

/* ---- convolution ---- */

/* ints of a conv node: stride, pad, dilation (h, w each), groups, transposed, out_pad h, w. */
enum { CONV_NODE_INTS = 10 };

static int conv_params(const char *op, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t groups) {
  if (sh < 1 || sw < 1) return kiln_fail(KILN_ERR_ARGUMENT, "%s: stride (%lld, %lld) must be >= 1", op, (long long)sh, (long long)sw);
  if (ph < 0 || pw < 0) return kiln_fail(KILN_ERR_ARGUMENT, "%s: padding (%lld, %lld) must be >= 0", op, (long long)ph, (long long)pw);
  if (dh < 1 || dw < 1) return kiln_fail(KILN_ERR_ARGUMENT, "%s: dilation (%lld, %lld) must be >= 1", op, (long long)dh, (long long)dw);
  if (groups < 1) return kiln_fail(KILN_ERR_ARGUMENT, "%s: groups = %lld must be >= 1", op, (long long)groups);
  return KILN_OK;
}

static int conv_tensors(const char *op, const struct kiln_tensor *x, const struct kiln_tensor *w, const struct kiln_tensor *b) {
  if (kiln_check_live(op, x) || kiln_check_live(op, w) || live(op, b)) return kiln_error_code();
  if (x->ndim != 4)
    return kiln_fail(KILN_ERR_SHAPE, "%s: input %s has %d dims (expected 4: [N,C,H,W]; for a single image, unsqueeze it)",
                     op, kiln_shape_string(x), x->ndim);
  if (w->ndim != 4)
    return kiln_fail(KILN_ERR_SHAPE, "%s: weight %s has %d dims (expected 4: [out,in/groups,kh,kw])", op,
                     kiln_shape_string(w), w->ndim);
  if (check_float(op, "input", x) || check_like(op, "weight", w, x)) return kiln_error_code();
  return KILN_OK;
}

/* The checks of conv2d, and its output's sizes. */
static int conv_sizes(const char *op, const struct kiln_tensor *x, const struct kiln_tensor *w, const struct kiln_tensor *b,
                      int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t groups, int64_t sizes[4]) {
  if (conv_tensors(op, x, w, b) || conv_params(op, sh, sw, ph, pw, dh, dw, groups)) return kiln_error_code();
  int64_t N = x->sizes[0], C = x->sizes[1], H = x->sizes[2], W = x->sizes[3];
  int64_t O = w->sizes[0], kh = w->sizes[2], kw = w->sizes[3];
  if (C % groups || O % groups)
    return kiln_fail(KILN_ERR_SHAPE, "%s: input %s and weight %s: channels in (%lld) and out (%lld) must be multiples of groups = %lld",
                     op, kiln_shape_string(x), kiln_shape_string(w), (long long)C, (long long)O, (long long)groups);
  if (w->sizes[1] * groups != C)
    return kiln_fail(KILN_ERR_SHAPE, "%s: input %s has %lld channels but weight %s expects %lld (%lld per group, groups = %lld)",
                     op, kiln_shape_string(x), (long long)C, kiln_shape_string(w), (long long)(w->sizes[1] * groups),
                     (long long)w->sizes[1], (long long)groups);
  if (kh < 1 || kw < 1) return kiln_fail(KILN_ERR_SHAPE, "%s: weight %s has an empty kernel", op, kiln_shape_string(w));
  if (check_vector(op, "bias", b, O, x)) return kiln_error_code();
  int64_t eh = H + 2 * ph - dh * (kh - 1) - 1, ew = W + 2 * pw - dw * (kw - 1) - 1;
  if (eh < 0 || ew < 0)
    return kiln_fail(KILN_ERR_SHAPE, "%s: input %s padded by (%lld, %lld) is smaller than the kernel %s dilated by (%lld, %lld)",
                     op, kiln_shape_string(x), (long long)ph, (long long)pw, kiln_shape_string(w), (long long)dh, (long long)dw);
  sizes[0] = N; sizes[1] = O; sizes[2] = eh / sh + 1; sizes[3] = ew / sw + 1;
  return KILN_OK;
}

KILN_API struct kiln_tensor *kiln_conv2d(const struct kiln_tensor *x, const struct kiln_tensor *w, const struct kiln_tensor *b,
                                         int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t groups) {
  struct kiln_tensor *ac[3];
  switch (kiln_autocast_inputs(KILN_OP_CONV2D, 3, (const struct kiln_tensor *[]){x, w, b}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_conv2d(ac[0], ac[1], ac[2], sh, sw, ph, pw, dh, dw, groups);
    kiln_autocast_release(3, ac);
    return r;
  }
  default: return NULL;
  }
  int64_t sizes[4];
  if (conv_sizes("conv2d", x, w, b, sh, sw, ph, pw, dh, dw, groups, sizes)) return NULL;
  struct kiln_tensor *out = kiln_tensor_empty(4, sizes, x->dtype, x->device);
  if (!out) return NULL;
  int64_t ints[CONV_NODE_INTS] = {sh, sw, ph, pw, dh, dw, groups, 0, 0, 0};
  struct kiln_call call = {.op = KILN_OP_CONV2D, .out = out, .in = {x, w, b}, .nin = 3, .nints = KILN_CONV_INTS};
  memcpy(call.ints, ints, sizeof(int64_t) * KILN_CONV_INTS);
  if (!run(x->device, &call, out)) return NULL;
  const struct kiln_tensor *inputs[3] = {x, w, b}, *saved[2] = {x, w};
  return record(KILN_OP_CONV2D, out, 3, inputs, NULL, ints, CONV_NODE_INTS, saved, 2);
}

/* conv2d, relu and max_pool2d of 2x2 windows at stride 2, as one kernel where the CPU has one
   (cpu/conv.c, cpu/bf16_conv.c: f32 and bf16 at the avx512 level), else as the three ops; the same
   bits either way. */
KILN_API struct kiln_tensor *kiln_conv2d_relu_max_pool2d(const struct kiln_tensor *x, const struct kiln_tensor *w,
                                                         const struct kiln_tensor *b, int64_t sh, int64_t sw, int64_t ph,
                                                         int64_t pw, int64_t dh, int64_t dw, int64_t groups) {
  int64_t sizes[4];
  struct kiln_tensor *ac[3];
  switch (kiln_autocast_inputs(KILN_OP_CONV2D, 3, (const struct kiln_tensor *[]){x, w, b}, ac)) {
  case 0: break;
  case 1: {   /* as conv2d: the cast inputs are what the layer (or its three ops) reads */
    struct kiln_tensor *r = kiln_conv2d_relu_max_pool2d(ac[0], ac[1], ac[2], sh, sw, ph, pw, dh, dw, groups);
    kiln_autocast_release(3, ac);
    return r;
  }
  default: return NULL;
  }
  if (conv_sizes("conv2d_relu_max_pool2d", x, w, b, sh, sw, ph, pw, dh, dw, groups, sizes)) return NULL;
  if (x->device.type == KILN_CPU && (x->dtype == KILN_F32 || x->dtype == KILN_BF16) && sizes[2] >= 2 && sizes[3] >= 2) {
    int64_t psizes[4] = {sizes[0], sizes[1], sizes[2] / 2, sizes[3] / 2};
    struct kiln_tensor *out = kiln_tensor_empty(4, psizes, x->dtype, x->device);
    if (!out) return NULL;
    int64_t ints[KILN_CONV_POOL_INTS] = {sh, sw, ph, pw, dh, dw, groups, sizes[2], sizes[3], 0};
    struct kiln_conv_pool cp = {.input_grad = kiln_grad_enabled() && x->requires_grad};
    struct kiln_call call = {.op = KILN_OP_CONV2D_RELU_MAX_POOL2D, .out = out, .in = {x, w, b}, .nin = 3,
                             .nints = KILN_CONV_POOL_INTS, .extra = &cp};
    memcpy(call.ints, ints, sizeof ints);
    if (!run(x->device, &call, out)) return NULL;
    if (cp.taken) {
      ints[KILN_CONV_INTS + 2] = cp.layout;
      const struct kiln_tensor *inputs[3] = {x, w, b}, *saved[3] = {x, w, cp.codes};
      out = record(KILN_OP_CONV2D_RELU_MAX_POOL2D, out, 3, inputs, NULL, ints, KILN_CONV_POOL_INTS, saved, 3);
      kiln_tensor_release(cp.codes);
      return out;
    }
    kiln_tensor_release(out);
  }
  struct kiln_tensor *y = kiln_conv2d(x, w, b, sh, sw, ph, pw, dh, dw, groups);
  struct kiln_tensor *r = y ? kiln_unary(KILN_OP_RELU, y) : NULL;
  kiln_tensor_release(y);
  struct kiln_tensor *p = r ? kiln_max_pool2d(r, 2, 2, 2, 2, 0, 0, 1, 1, 0) : NULL;
  kiln_tensor_release(r);
  return p;
}

int kiln_conv_pool_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  struct kiln_conv_grads grads = {0};
  struct kiln_tensor **slot[3] = {&grads.gx, &grads.gw, &grads.gb};
  for (int i = 0; i < 3 && i < n->nin; i++) {
    if (!n->in[i].needs) continue;
    if (!(gin[i] = kiln_tensor_empty(n->in[i].ndim, n->in[i].sizes, n->in[i].dtype, n->in[i].device))) return kiln_error_code();
    *slot[i] = gin[i];
  }
  if (!grads.gx && !grads.gw && !grads.gb) return KILN_OK;
  struct kiln_call call = {.op = KILN_OP_CONV2D_RELU_MAX_POOL2D_BACKWARD, .in = {g, n->saved[0], n->saved[1], n->saved[2]}, .nin = 4,
                           .nints = KILN_CONV_POOL_INTS, .extra = &grads};
  memcpy(call.ints, n->ints, sizeof(int64_t) * KILN_CONV_POOL_INTS);
  return kiln_dispatch(g->device, &call);
}

KILN_API struct kiln_tensor *kiln_conv_transpose2d(const struct kiln_tensor *x, const struct kiln_tensor *w,
                                                   const struct kiln_tensor *b, int64_t sh, int64_t sw, int64_t ph,
                                                   int64_t pw, int64_t oph, int64_t opw, int64_t dh, int64_t dw,
                                                   int64_t groups) {
  struct kiln_tensor *ac[3];
  switch (kiln_autocast_inputs(KILN_OP_CONV2D, 3, (const struct kiln_tensor *[]){x, w, b}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_conv_transpose2d(ac[0], ac[1], ac[2], sh, sw, ph, pw, oph, opw, dh, dw, groups);
    kiln_autocast_release(3, ac);
    return r;
  }
  default: return NULL;
  }
  const char *op = "conv_transpose2d";
  if (conv_tensors(op, x, w, b) || conv_params(op, sh, sw, ph, pw, dh, dw, groups)) return NULL;
  int64_t N = x->sizes[0], C = x->sizes[1], H = x->sizes[2], W = x->sizes[3];
  int64_t kh = w->sizes[2], kw = w->sizes[3], O = w->sizes[1] * groups;
  if (w->sizes[0] != C || C % groups) {
    kiln_fail(KILN_ERR_SHAPE, "%s: input %s has %lld channels but weight %s expects %lld (weight is [in,out/groups,kh,kw], groups = %lld)",
              op, kiln_shape_string(x), (long long)C, kiln_shape_string(w), (long long)w->sizes[0], (long long)groups);
    return NULL;
  }
  if (kh < 1 || kw < 1) {
    kiln_fail(KILN_ERR_SHAPE, "%s: weight %s has an empty kernel", op, kiln_shape_string(w));
    return NULL;
  }
  if (oph < 0 || opw < 0 || (oph >= sh && oph >= dh) || (opw >= sw && opw >= dw)) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: output padding (%lld, %lld) must be >= 0 and smaller than the stride (%lld, %lld) or the dilation (%lld, %lld)",
              op, (long long)oph, (long long)opw, (long long)sh, (long long)sw, (long long)dh, (long long)dw);
    return NULL;
  }
  if (check_vector(op, "bias", b, O, x)) return NULL;
  int64_t OH = (H - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1, OW = (W - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1;
  if (OH < 1 || OW < 1 || H < 1 || W < 1) {
    kiln_fail(KILN_ERR_SHAPE, "%s: input %s with weight %s, stride (%lld, %lld), padding (%lld, %lld) gives an empty output (%lld x %lld)",
              op, kiln_shape_string(x), kiln_shape_string(w), (long long)sh, (long long)sw, (long long)ph, (long long)pw,
              (long long)OH, (long long)OW);
    return NULL;
  }
  int64_t sizes[4] = {N, O, OH, OW};
  struct kiln_tensor *out = kiln_tensor_empty(4, sizes, x->dtype, x->device);
  if (!out) return NULL;
  /* the input-gradient of a conv2d that maps out's shape to x's: the conv backward kernel */
  struct kiln_conv_grads grads = {.gx = out};
  int64_t ints[CONV_NODE_INTS] = {sh, sw, ph, pw, dh, dw, groups, 1, oph, opw};
  struct kiln_call call = {.op = KILN_OP_CONV2D_BACKWARD, .in = {x, NULL, w, b}, .nin = 4, .nints = KILN_CONV_INTS,
                           .extra = &grads};
  memcpy(call.ints, ints, sizeof(int64_t) * KILN_CONV_INTS);
  if (!run(x->device, &call, out)) return NULL;
  const struct kiln_tensor *inputs[3] = {x, w, b}, *saved[2] = {x, w};
  return record(KILN_OP_CONV2D, out, 3, inputs, NULL, ints, CONV_NODE_INTS, saved, 2);
}

int kiln_conv_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  const struct kiln_tensor *x = n->saved[0], *w = n->saved[1];
  int need_x = n->in[0].needs, need_w = n->in[1].needs, need_b = n->nin > 2 && n->in[2].needs;
  struct kiln_call call = {.nints = KILN_CONV_INTS};
  memcpy(call.ints, n->ints, sizeof(int64_t) * KILN_CONV_INTS);
  if (need_x && !(gin[0] = kiln_tensor_empty(n->in[0].ndim, n->in[0].sizes, n->in[0].dtype, n->in[0].device))) return kiln_error_code();
  if (need_w && !(gin[1] = kiln_tensor_empty(n->in[1].ndim, n->in[1].sizes, n->in[1].dtype, n->in[1].device))) return kiln_error_code();
  if (!n->ints[7]) {   /* conv2d: one backward kernel for all three */
    if (need_b && !(gin[2] = kiln_tensor_empty(n->in[2].ndim, n->in[2].sizes, n->in[2].dtype, n->in[2].device))) return kiln_error_code();
    struct kiln_conv_grads grads = {gin[0], gin[1], gin[2]};
    call.op = KILN_OP_CONV2D_BACKWARD;
    call.in[0] = g; call.in[1] = need_w ? x : NULL; call.in[2] = w; call.nin = 4;
    call.extra = &grads;
    return kiln_dispatch(g->device, &call);
  }
  /* conv_transpose2d: grad input = conv2d(g, w); grad weight = the conv grad weight with the
     roles of input and output swapped; grad bias = the sum of g over all but the channels */
  if (need_x) {
    call.op = KILN_OP_CONV2D; call.out = gin[0];
    call.in[0] = g; call.in[1] = w; call.in[2] = NULL; call.nin = 3;
    if (kiln_dispatch(g->device, &call)) return kiln_error_code();
  }
  if (need_w) {
    struct kiln_conv_grads grads = {.gw = gin[1]};
    struct kiln_call bw = call;
    bw.op = KILN_OP_CONV2D_BACKWARD; bw.out = NULL;
    bw.in[0] = x; bw.in[1] = g; bw.in[2] = w; bw.in[3] = NULL; bw.nin = 4;
    bw.extra = &grads;
    if (kiln_dispatch(g->device, &bw)) return kiln_error_code();
  }
  if (need_b && !(gin[2] = kiln_reduce(KILN_OP_SUM, g, 3, (const int[]){0, 2, 3}, 0, 0))) return kiln_error_code();
  return KILN_OK;
}

/* ---- pooling ---- */

static int pool_input(const char *op, const struct kiln_tensor *x) {
  if (kiln_check_live(op, x)) return kiln_error_code();
  if (x->ndim != 3 && x->ndim != 4)
    return kiln_fail(KILN_ERR_SHAPE, "%s: input %s has %d dims (expected [N,C,H,W] or [C,H,W])", op, kiln_shape_string(x), x->ndim);
  if (check_float(op, "input", x)) return kiln_error_code();
  if (x->sizes[x->ndim - 1] < 1 || x->sizes[x->ndim - 2] < 1)
    return kiln_fail(KILN_ERR_SHAPE, "%s: input %s has an empty plane", op, kiln_shape_string(x));
  return KILN_OK;
}

/* Output size along one dim, as PyTorch computes it; -1 (with an error) when empty. */
static int64_t pool_size(const char *op, const struct kiln_tensor *x, int64_t n, int64_t k, int64_t s, int64_t p, int64_t d, int ceil_mode) {
  int64_t span = n + 2 * p - d * (k - 1) - 1;
  int64_t o = span < 0 ? 0 : (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (o > 0 && ceil_mode && (o - 1) * s >= n + p) o--;
  if (o < 1) {
    kiln_fail(KILN_ERR_SHAPE, "%s: input %s is too small for a window of %lld (stride %lld, padding %lld, dilation %lld)",
              op, kiln_shape_string(x), (long long)k, (long long)s, (long long)p, (long long)d);
    return -1;
  }
  return o;
}

static int pool_params(const char *op, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw) {
  if (kh < 1 || kw < 1) return kiln_fail(KILN_ERR_ARGUMENT, "%s: kernel size (%lld, %lld) must be >= 1", op, (long long)kh, (long long)kw);
  if (sh < 1 || sw < 1) return kiln_fail(KILN_ERR_ARGUMENT, "%s: stride (%lld, %lld) must be >= 1", op, (long long)sh, (long long)sw);
  if (dh < 1 || dw < 1) return kiln_fail(KILN_ERR_ARGUMENT, "%s: dilation (%lld, %lld) must be >= 1", op, (long long)dh, (long long)dw);
  if (ph < 0 || pw < 0 || ph > kh / 2 || pw > kw / 2)
    return kiln_fail(KILN_ERR_ARGUMENT, "%s: padding (%lld, %lld) must be >= 0 and at most half the kernel size (%lld, %lld)",
                     op, (long long)ph, (long long)pw, (long long)kh, (long long)kw);
  return KILN_OK;
}

KILN_API struct kiln_tensor *kiln_max_pool2d(const struct kiln_tensor *x, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                                             int64_t ph, int64_t pw, int64_t dh, int64_t dw, int ceil_mode) {
  struct kiln_tensor *ac[1];
  switch (kiln_autocast_inputs(KILN_OP_MAX_POOL2D, 1, (const struct kiln_tensor *[]){x}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_max_pool2d(ac[0], kh, kw, sh, sw, ph, pw, dh, dw, ceil_mode);
    kiln_autocast_release(1, ac);
    return r;
  }
  default: return NULL;
  }
  const char *op = "max_pool2d";
  if (pool_input(op, x) || pool_params(op, kh, kw, sh, sw, ph, pw, dh, dw)) return NULL;
  int nd = x->ndim;
  int64_t sizes[4];
  memcpy(sizes, x->sizes, sizeof(int64_t) * (size_t)nd);
  sizes[nd - 2] = pool_size(op, x, x->sizes[nd - 2], kh, sh, ph, dh, ceil_mode);
  sizes[nd - 1] = pool_size(op, x, x->sizes[nd - 1], kw, sw, pw, dw, ceil_mode);
  if (sizes[nd - 2] < 0 || sizes[nd - 1] < 0) return NULL;
  struct kiln_tensor *out = kiln_tensor_empty(nd, sizes, x->dtype, x->device);
  struct kiln_tensor *idx = kiln_tensor_empty(nd, sizes, KILN_I64, x->device);
  if (!out || !idx) { kiln_tensor_release(out); kiln_tensor_release(idx); return NULL; }
  int64_t ints[8] = {kh, kw, sh, sw, ph, pw, dh, dw};
  struct kiln_call call = {.op = KILN_OP_MAX_POOL2D, .out = out, .in = {x}, .nin = 1, .nints = 8, .extra = idx};
  memcpy(call.ints, ints, sizeof ints);
  const struct kiln_tensor *saved[1] = {idx};
  out = run(x->device, &call, out);
  if (out) out = record(KILN_OP_MAX_POOL2D, out, 1, &x, NULL, ints, 8, saved, 1);
  kiln_tensor_release(idx);
  return out;
}

static struct kiln_tensor *avg_pool(const struct kiln_tensor *x, const int64_t *ints, int64_t oh, int64_t ow) {
  int nd = x->ndim;
  int64_t sizes[4];
  memcpy(sizes, x->sizes, sizeof(int64_t) * (size_t)nd);
  sizes[nd - 2] = oh;
  sizes[nd - 1] = ow;
  struct kiln_tensor *out = kiln_tensor_empty(nd, sizes, x->dtype, x->device);
  if (!out) return NULL;
  struct kiln_call call = {.op = KILN_OP_AVG_POOL2D, .out = out, .in = {x}, .nin = 1, .nints = 8};
  memcpy(call.ints, ints, sizeof(int64_t) * 8);
  if (!run(x->device, &call, out)) return NULL;
  return record(KILN_OP_AVG_POOL2D, out, 1, &x, NULL, ints, 8, NULL, 0);
}

KILN_API struct kiln_tensor *kiln_avg_pool2d(const struct kiln_tensor *x, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                                             int64_t ph, int64_t pw, int ceil_mode, int count_include_pad) {
  struct kiln_tensor *ac[1];
  switch (kiln_autocast_inputs(KILN_OP_AVG_POOL2D, 1, (const struct kiln_tensor *[]){x}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_avg_pool2d(ac[0], kh, kw, sh, sw, ph, pw, ceil_mode, count_include_pad);
    kiln_autocast_release(1, ac);
    return r;
  }
  default: return NULL;
  }
  const char *op = "avg_pool2d";
  if (pool_input(op, x) || pool_params(op, kh, kw, sh, sw, ph, pw, 1, 1)) return NULL;
  int nd = x->ndim;
  int64_t oh = pool_size(op, x, x->sizes[nd - 2], kh, sh, ph, 1, ceil_mode);
  int64_t ow = pool_size(op, x, x->sizes[nd - 1], kw, sw, pw, 1, ceil_mode);
  if (oh < 0 || ow < 0) return NULL;
  int64_t ints[8] = {kh, kw, sh, sw, ph, pw, count_include_pad != 0, 0};
  return avg_pool(x, ints, oh, ow);
}

KILN_API struct kiln_tensor *kiln_adaptive_avg_pool2d(const struct kiln_tensor *x, int64_t out_h, int64_t out_w) {
  struct kiln_tensor *ac[1];
  switch (kiln_autocast_inputs(KILN_OP_AVG_POOL2D, 1, (const struct kiln_tensor *[]){x}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_adaptive_avg_pool2d(ac[0], out_h, out_w);
    kiln_autocast_release(1, ac);
    return r;
  }
  default: return NULL;
  }
  const char *op = "adaptive_avg_pool2d";
  if (pool_input(op, x)) return NULL;
  if (out_h < 1 || out_w < 1) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: output size (%lld, %lld) must be >= 1", op, (long long)out_h, (long long)out_w);
    return NULL;
  }
  int64_t ints[8] = {0, 0, 0, 0, 0, 0, 0, 1};
  return avg_pool(x, ints, out_h, out_w);
}

int kiln_pool_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  const struct edge *e = &n->in[0];
  if (!e->needs) return KILN_OK;
  if (!(gin[0] = kiln_tensor_empty(e->ndim, e->sizes, e->dtype, e->device))) return kiln_error_code();
  int max = n->kind == KILN_OP_MAX_POOL2D;
  struct kiln_call call = {.op = max ? KILN_OP_MAX_POOL2D_BACKWARD : KILN_OP_AVG_POOL2D_BACKWARD, .out = gin[0],
                           .in = {g, max ? n->saved[0] : NULL}, .nin = max ? 2 : 1, .nints = 8};
  memcpy(call.ints, n->ints, sizeof(int64_t) * 8);
  return kiln_dispatch(g->device, &call);
}

/* ---- normalisation ---- */

KILN_API struct kiln_tensor *kiln_batch_norm(const struct kiln_tensor *x, const struct kiln_tensor *w,
                                             const struct kiln_tensor *b, struct kiln_tensor *rm, struct kiln_tensor *rv,
                                             int training, double momentum, double eps) {
  struct kiln_tensor *ac[3];
  switch (kiln_autocast_inputs(KILN_OP_BATCH_NORM, 3, (const struct kiln_tensor *[]){x, w, b}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_batch_norm(ac[0], ac[1], ac[2], rm, rv, training, momentum, eps);
    kiln_autocast_release(3, ac);
    return r;
  }
  default: return NULL;
  }
  const char *op = "batch_norm";
  if (kiln_check_live(op, x) || live(op, w) || live(op, b) || live(op, rm) || live(op, rv)) return NULL;
  if (x->ndim < 2) {
    kiln_fail(KILN_ERR_SHAPE, "%s: input %s has %d dims (expected [N,C] or [N,C,...])", op, kiln_shape_string(x), x->ndim);
    return NULL;
  }
  if (check_float(op, "input", x)) return NULL;
  int64_t C = x->sizes[1], per = x->numel / (C ? C : 1);
  if (check_vector(op, "weight", w, C, x) || check_vector(op, "bias", b, C, x) ||
      check_vector(op, "running_mean", rm, C, x) || check_vector(op, "running_var", rv, C, x))
    return NULL;
  if ((rm == NULL) != (rv == NULL)) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: give both running_mean and running_var, or neither", op);
    return NULL;
  }
  if (!(eps > 0) || !(momentum >= 0 && momentum <= 1)) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: eps = %g must be > 0 and momentum = %g in [0, 1]", op, eps, momentum);
    return NULL;
  }
  /* An empty batch has no statistics: it leaves the running stats alone (PyTorch's early return). */
  int batch_stats = training || !rm, update = training && rm && x->numel > 0;
  if (batch_stats && per <= 1 && x->numel > 0) {
    kiln_fail(KILN_ERR_SHAPE, "%s: input %s has one value per channel; training needs more (batch size > 1)", op,
              kiln_shape_string(x));
    return NULL;
  }
  if (update && (kiln_autograd_check_inplace(op, rm, NULL) || kiln_autograd_check_inplace(op, rv, NULL)))
    return NULL;
  struct kiln_tensor *out = empty_like(x);
  struct kiln_tensor *mean = kiln_tensor_empty(1, &C, x->dtype, x->device), *invstd = kiln_tensor_empty(1, &C, x->dtype, x->device);
  struct kiln_norm_stats st = {mean, invstd, rm, rv};
  double scalars[4] = {eps, momentum};
  struct kiln_call call = {.op = KILN_OP_BATCH_NORM, .out = out, .in = {x, w, b}, .nin = 3, .ints = {batch_stats, update},
                           .nints = 2, .scalar = {eps, momentum}, .extra = &st};
  if (!out || !mean || !invstd) { kiln_tensor_release(out); out = NULL; }
  else out = run(x->device, &call, out);
  if (out) {
    if (update) { kiln_tensor_bump_version(rm); kiln_tensor_bump_version(rv); }
    const struct kiln_tensor *inputs[3] = {x, w, b}, *saved[4] = {x, w, mean, invstd};
    int64_t ints[2] = {batch_stats, update};
    out = record(KILN_OP_BATCH_NORM, out, 3, inputs, scalars, ints, 2, saved, 4);
  }
  kiln_tensor_release(mean); kiln_tensor_release(invstd);
  return out;
}

/* Layer and group norm share their kernels: rows normalised on their own. */
static struct kiln_tensor *row_norm(int kind, const struct kiln_tensor *x, const struct kiln_tensor *w, const struct kiln_tensor *b,
                                    int64_t param, int64_t rows, double eps) {
  struct kiln_tensor *out = empty_like(x);
  struct kiln_tensor *mean = kiln_tensor_empty(1, &rows, x->dtype, x->device), *invstd = kiln_tensor_empty(1, &rows, x->dtype, x->device);
  struct kiln_norm_stats st = {mean, invstd, NULL, NULL};
  double scalars[4] = {eps};
  struct kiln_call call = {.op = kind, .out = out, .in = {x, w, b}, .nin = 3, .ints = {param}, .nints = 1,
                           .scalar = {eps}, .extra = &st};
  if (!out || !mean || !invstd) { kiln_tensor_release(out); out = NULL; }
  else out = run(x->device, &call, out);
  if (out) {
    const struct kiln_tensor *inputs[3] = {x, w, b}, *saved[4] = {x, w, mean, invstd};
    out = record(kind, out, 3, inputs, scalars, &param, 1, saved, 4);
  }
  kiln_tensor_release(mean); kiln_tensor_release(invstd);
  return out;
}

KILN_API struct kiln_tensor *kiln_layer_norm(const struct kiln_tensor *x, int k, const struct kiln_tensor *w,
                                             const struct kiln_tensor *b, double eps) {
  struct kiln_tensor *ac[3];
  switch (kiln_autocast_inputs(KILN_OP_LAYER_NORM, 3, (const struct kiln_tensor *[]){x, w, b}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_layer_norm(ac[0], k, ac[1], ac[2], eps);
    kiln_autocast_release(3, ac);
    return r;
  }
  default: return NULL;
  }
  const char *op = "layer_norm";
  if (kiln_check_live(op, x) || live(op, w) || live(op, b) || check_float(op, "input", x)) return NULL;
  if (k < 1 || k > x->ndim) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: normalizing the last %d dims of input %s (expected 1 to %d)", op, k,
              kiln_shape_string(x), x->ndim);
    return NULL;
  }
  const int64_t *shape = x->sizes + (x->ndim - k);
  const struct kiln_tensor *params[2] = {w, b};
  const char *names[2] = {"weight", "bias"};
  for (int i = 0; i < 2; i++) {
    const struct kiln_tensor *p = params[i];
    if (!p) continue;
    if (check_like(op, names[i], p, x)) return NULL;
    if (p->ndim != k || memcmp(p->sizes, shape, sizeof(int64_t) * (size_t)k) != 0) {
      kiln_fail(KILN_ERR_SHAPE, "%s: %s %s does not match the normalized shape %s of input %s", op, names[i],
                kiln_shape_string(p), kiln_sizes_string(k, shape), kiln_shape_string(x));
      return NULL;
    }
  }
  if (!(eps > 0)) { kiln_fail(KILN_ERR_ARGUMENT, "%s: eps = %g must be > 0", op, eps); return NULL; }
  int64_t rows = 1;
  for (int d = 0; d < x->ndim - k; d++) rows *= x->sizes[d];
  return row_norm(KILN_OP_LAYER_NORM, x, w, b, k, rows, eps);
}

KILN_API struct kiln_tensor *kiln_group_norm(const struct kiln_tensor *x, int64_t groups, const struct kiln_tensor *w,
                                             const struct kiln_tensor *b, double eps) {
  struct kiln_tensor *ac[3];
  switch (kiln_autocast_inputs(KILN_OP_GROUP_NORM, 3, (const struct kiln_tensor *[]){x, w, b}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_group_norm(ac[0], groups, ac[1], ac[2], eps);
    kiln_autocast_release(3, ac);
    return r;
  }
  default: return NULL;
  }
  const char *op = "group_norm";
  if (kiln_check_live(op, x) || live(op, w) || live(op, b) || check_float(op, "input", x)) return NULL;
  if (x->ndim < 2) {
    kiln_fail(KILN_ERR_SHAPE, "%s: input %s has %d dims (expected [N,C,...])", op, kiln_shape_string(x), x->ndim);
    return NULL;
  }
  int64_t C = x->sizes[1];
  if (groups < 1 || C % groups) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: %lld channels of input %s do not split into %lld groups", op, (long long)C,
              kiln_shape_string(x), (long long)groups);
    return NULL;
  }
  if (check_vector(op, "weight", w, C, x) || check_vector(op, "bias", b, C, x)) return NULL;
  if (!(eps > 0)) { kiln_fail(KILN_ERR_ARGUMENT, "%s: eps = %g must be > 0", op, eps); return NULL; }
  return row_norm(KILN_OP_GROUP_NORM, x, w, b, groups, x->sizes[0] * groups, eps);
}

int kiln_norm_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  struct kiln_tensor *out[3] = {0};
  for (int k = 0; k < 3 && k < n->nin; k++) {
    const struct edge *e = &n->in[k];
    if (e->needs && !(out[k] = gin[k] = kiln_tensor_empty(e->ndim, e->sizes, e->dtype, e->device))) return kiln_error_code();
  }
  struct kiln_norm_grads gr = {n->saved[2], n->saved[3], out[0], out[1], out[2]};
  int back = n->kind == KILN_OP_BATCH_NORM ? KILN_OP_BATCH_NORM_BACKWARD
           : n->kind == KILN_OP_LAYER_NORM ? KILN_OP_LAYER_NORM_BACKWARD : KILN_OP_GROUP_NORM_BACKWARD;
  struct kiln_call call = {.op = back, .in = {g, n->saved[0], n->saved[1]}, .nin = 3, .nints = n->nints,
                           .scalar = {n->scalar[0], n->scalar[1]}, .extra = &gr};
  memcpy(call.ints, n->ints, sizeof(int64_t) * (size_t)n->nints);
  return kiln_dispatch(g->device, &call);
}

/* ---- softmax ---- */

static struct kiln_tensor *softmax(int kind, const struct kiln_tensor *x, int dim) {
  struct kiln_tensor *ac[1];
  switch (kiln_autocast_inputs(kind, 1, (const struct kiln_tensor *[]){x}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = softmax(kind, ac[0], dim);
    kiln_autocast_release(1, ac);
    return r;
  }
  default: return NULL;
  }
  const char *op = kiln_op_name(kind);
  int d;
  if (kiln_check_live(op, x) || check_float(op, "input", x) || kiln_normalize_dim(op, dim, x->ndim, &d)) return NULL;
  struct kiln_tensor *out = empty_like(x);
  if (!out) return NULL;
  int64_t ints[1] = {d};
  struct kiln_call call = {.op = kind, .out = out, .in = {x}, .nin = 1, .ints = {d}, .nints = 1};
  if (!run(x->device, &call, out)) return NULL;
  const struct kiln_tensor *saved[1] = {out};
  return record(kind, out, 1, &x, NULL, ints, 1, saved, 1);
}

KILN_API struct kiln_tensor *kiln_softmax(const struct kiln_tensor *x, int dim) { return softmax(KILN_OP_SOFTMAX, x, dim); }
KILN_API struct kiln_tensor *kiln_log_softmax(const struct kiln_tensor *x, int dim) { return softmax(KILN_OP_LOG_SOFTMAX, x, dim); }

int kiln_softmax_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  const struct edge *e = &n->in[0];
  if (!e->needs) return KILN_OK;
  if (!(gin[0] = kiln_tensor_empty(e->ndim, e->sizes, e->dtype, e->device))) return kiln_error_code();
  struct kiln_call call = {.op = n->kind == KILN_OP_SOFTMAX ? KILN_OP_SOFTMAX_BACKWARD : KILN_OP_LOG_SOFTMAX_BACKWARD,
                           .out = gin[0], .in = {g, n->saved[0]}, .nin = 2, .ints = {n->ints[0]}, .nints = 1};
  return kiln_dispatch(g->device, &call);
}

/* ---- losses ---- */

static struct kiln_tensor *nll(const char *op, int fused, const struct kiln_tensor *x, const struct kiln_tensor *target,
                               const struct kiln_tensor *w, int64_t ignore_index, double smoothing, int reduction) {
  struct kiln_tensor *ac[2];
  switch (kiln_autocast_inputs(KILN_OP_NLL_LOSS, 2, (const struct kiln_tensor *[]){x, w}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = nll(op, fused, ac[0], target, ac[1], ignore_index, smoothing, reduction);
    kiln_autocast_release(2, ac);
    return r;
  }
  default: return NULL;
  }
  if (kiln_check_live(op, x) || kiln_check_live(op, target) || live(op, w)) return NULL;
  if (x->ndim < 2) {
    kiln_fail(KILN_ERR_SHAPE, "%s: input %s has %d dims (expected [N,C] or [N,C,d1,...])", op, kiln_shape_string(x), x->ndim);
    return NULL;
  }
  if (check_float(op, "input", x) || kiln_check_same_device(op, x, target)) return NULL;
  if (target->dtype != KILN_I64 && target->dtype != KILN_I32) {
    kiln_fail(KILN_ERR_DTYPE, "%s: target %s is %s (expected i64 class indices)", op, kiln_shape_string(target),
              kiln_dtype_name(target->dtype));
    return NULL;
  }
  int64_t C = x->sizes[1], tshape[KILN_MAX_DIMS];
  int tnd = 0;
  for (int d = 0; d < x->ndim; d++) if (d != 1) tshape[tnd++] = x->sizes[d];
  if (target->ndim != tnd || memcmp(target->sizes, tshape, sizeof(int64_t) * (size_t)tnd) != 0) {
    kiln_fail(KILN_ERR_SHAPE, "%s: target %s does not fit input %s (expected target %s: one class per sample)", op,
              kiln_shape_string(target), kiln_shape_string(x), kiln_sizes_string(tnd, tshape));
    return NULL;
  }
  if (check_vector(op, "weight", w, C, x)) return NULL;
  if (reduction < KILN_REDUCTION_NONE || reduction > KILN_REDUCTION_SUM) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: reduction %d (expected 0: none, 1: mean, 2: sum)", op, reduction);
    return NULL;
  }
  if (!(smoothing >= 0 && smoothing <= 1)) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: label_smoothing = %g (expected 0 to 1)", op, smoothing);
    return NULL;
  }
  struct kiln_tensor *t64 = kiln_to_dtype(target, KILN_I64);
  struct kiln_tensor *out = reduction == KILN_REDUCTION_NONE ? kiln_tensor_empty(tnd, tshape, x->dtype, x->device)
                                                             : kiln_tensor_empty(0, NULL, x->dtype, x->device);
  struct kiln_nll_extra ex = {.logp = fused ? empty_like(x) : NULL};
  int64_t ints[3] = {reduction, ignore_index, fused};
  struct kiln_call call = {.op = KILN_OP_NLL_LOSS, .out = out, .in = {x, t64, w}, .nin = 3, .nints = 3,
                           .scalar = {smoothing}, .extra = &ex};
  memcpy(call.ints, ints, sizeof ints);
  if (!t64 || !out || (fused && !ex.logp)) { kiln_tensor_release(out); out = NULL; }
  else out = run(x->device, &call, out);
  if (out) {
    double scalars[4] = {smoothing, ex.total_weight};
    const struct kiln_tensor *inputs[3] = {x, target, w}, *saved[3] = {t64, w, ex.logp};
    out = record(KILN_OP_NLL_LOSS, out, 3, inputs, scalars, ints, 3, saved, 3);
  }
  kiln_tensor_release(t64); kiln_tensor_release(ex.logp);
  return out;
}

KILN_API struct kiln_tensor *kiln_nll_loss(const struct kiln_tensor *logp, const struct kiln_tensor *target,
                                           const struct kiln_tensor *weight, int64_t ignore_index, int reduction) {
  return nll("nll_loss", 0, logp, target, weight, ignore_index, 0, reduction);
}

KILN_API struct kiln_tensor *kiln_cross_entropy(const struct kiln_tensor *logits, const struct kiln_tensor *target,
                                                const struct kiln_tensor *weight, int64_t ignore_index,
                                                double label_smoothing, int reduction) {
  return nll("cross_entropy", 1, logits, target, weight, ignore_index, label_smoothing, reduction);
}

int kiln_nll_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  const struct edge *e = &n->in[0];
  if (!e->needs) return KILN_OK;
  if (!(gin[0] = kiln_tensor_empty(e->ndim, e->sizes, e->dtype, e->device))) return kiln_error_code();
  struct kiln_call call = {.op = KILN_OP_NLL_LOSS_BACKWARD, .out = gin[0], .in = {g, n->saved[0], n->saved[1], n->saved[2]},
                           .nin = 4, .nints = 3, .scalar = {n->scalar[0], n->scalar[1]}};
  memcpy(call.ints, n->ints, sizeof(int64_t) * 3);
  return kiln_dispatch(g->device, &call);
}

/* ---- dropout ---- */

KILN_API struct kiln_tensor *kiln_dropout(const struct kiln_tensor *x, double p, int training) {
  struct kiln_tensor *ac[1];
  switch (kiln_autocast_inputs(KILN_OP_DROPOUT, 1, (const struct kiln_tensor *[]){x}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_dropout(ac[0], p, training);
    kiln_autocast_release(1, ac);
    return r;
  }
  default: return NULL;
  }
  const char *op = "dropout";
  if (kiln_check_live(op, x)) return NULL;
  if (!(p >= 0 && p < 1)) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: probability p = %g (expected 0 <= p < 1)", op, p);
    return NULL;
  }
  if (!training || p == 0) return kiln_alias(x);
  if (check_float(op, "input", x)) return NULL;
  struct kiln_tensor *out = empty_like(x), *mask = empty_like(x);
  if (!out || !mask) { kiln_tensor_release(out); kiln_tensor_release(mask); return NULL; }
  /* four elements per Philox block; the generator moves on by the blocks used, as the fills do */
  uint64_t seed = kiln_initial_seed(), offset = kiln_random_offset();
  kiln_random_set_state(seed, offset + (uint64_t)(x->numel + 3) / 4);
  struct kiln_call call = {.op = KILN_OP_DROPOUT, .out = out, .in = {x}, .nin = 1, .ints = {(int64_t)seed, (int64_t)offset},
                           .nints = 2, .scalar = {p}, .extra = mask};
  double scalars[4] = {p};
  const struct kiln_tensor *saved[1] = {mask};
  out = run(x->device, &call, out);
  if (out) out = record(KILN_OP_DROPOUT, out, 1, &x, scalars, NULL, 0, saved, 1);
  kiln_tensor_release(mask);
  return out;
}

/* ---- connectionist temporal classification ---- */

/* A contiguous CPU i64 copy of an integer tensor (i64 or i32); NULL with an error. */
static struct kiln_tensor *host_i64(const char *op, const char *what, const struct kiln_tensor *t) {
  if (kiln_check_live(op, t)) return NULL;
  if (t->dtype != KILN_I64 && t->dtype != KILN_I32) {
    kiln_fail(KILN_ERR_DTYPE, "%s: %s %s is %s (expected i64)", op, what, kiln_shape_string(t), kiln_dtype_name(t->dtype));
    return NULL;
  }
  struct kiln_tensor *cpu = kiln_to_device(t, (struct kiln_device){KILN_CPU, 0});
  struct kiln_tensor *i64 = cpu ? kiln_to_dtype(cpu, KILN_I64) : NULL;
  struct kiln_tensor *c = i64 ? kiln_contiguous(i64) : NULL;
  kiln_tensor_release(cpu); kiln_tensor_release(i64);
  return c;
}

/* Check the lengths and labels and pack them as the kernels read them (nn_calls.h): a CPU i64
   [N, 2 + S] tensor, S the longest target. NULL with an error naming the sample. */
static struct kiln_tensor *ctc_labels(const char *op, const struct kiln_tensor *lp, const struct kiln_tensor *tg,
                                      const struct kiln_tensor *il, const struct kiln_tensor *tl, int64_t blank,
                                      int zero_infinity) {
  int64_t T = lp->sizes[0], N = lp->sizes[1], C = lp->sizes[2];
  const char *names[3] = {"targets", "input_lengths", "target_lengths"};
  const struct kiln_tensor *given[3] = {tg, il, tl};
  struct kiln_tensor *h[3] = {0}, *packed = NULL;
  for (int k = 0; k < 3; k++)
    if (!(h[k] = host_i64(op, names[k], given[k]))) goto done;
  for (int k = 1; k < 3; k++)
    if (h[k]->ndim != 1 || h[k]->sizes[0] != N) {
      kiln_fail(KILN_ERR_SHAPE, "%s: %s %s does not fit log_probs %s (expected [%lld], one per sample)", op, names[k],
                kiln_shape_string(h[k]), kiln_shape_string(lp), (long long)N);
      goto done;
    }
  int padded = h[0]->ndim == 2;
  if (!(padded && h[0]->sizes[0] == N) && h[0]->ndim != 1) {
    kiln_fail(KILN_ERR_SHAPE, "%s: targets %s do not fit log_probs %s (expected [%lld,S], padded, or 1-d, concatenated)",
              op, kiln_shape_string(h[0]), kiln_shape_string(lp), (long long)N);
    goto done;
  }
  const int64_t *labels = kiln_tensor_data(h[0]), *ilen = kiln_tensor_data(h[1]), *tlen = kiln_tensor_data(h[2]);
  int64_t S = 0, total = 0, avail = padded ? h[0]->sizes[1] : h[0]->numel;
  for (int64_t n = 0; n < N; n++) {
    if (ilen[n] < 0 || ilen[n] > T) {
      kiln_fail(KILN_ERR_ARGUMENT, "%s: input length %lld of sample %lld (from 0) is out of range 0..%lld (log_probs %s)", op,
                (long long)ilen[n], (long long)n, (long long)T, kiln_shape_string(lp));
      goto done;
    }
    if (tlen[n] < 0 || (padded && tlen[n] > avail)) {
      kiln_fail(KILN_ERR_ARGUMENT, "%s: target length %lld of sample %lld (from 0) is out of range 0..%lld (targets %s)", op,
                (long long)tlen[n], (long long)n, (long long)(padded ? avail : INT64_MAX), kiln_shape_string(h[0]));
      goto done;
    }
    if (!padded && tlen[n] > avail - total) {
      kiln_fail(KILN_ERR_SHAPE, "%s: target_lengths add up to more than the %lld labels of targets %s (at sample %lld (from 0))",
                op, (long long)avail, kiln_shape_string(h[0]), (long long)n);
      goto done;
    }
    total += tlen[n];
    if (tlen[n] > S) S = tlen[n];
  }
  int64_t sizes[2] = {N, 2 + S};
  if (!(packed = kiln_tensor_full(2, sizes, 0, KILN_I64, (struct kiln_device){KILN_CPU, 0}))) goto done;
  int64_t *row = kiln_tensor_data(packed);
  total = 0;
  for (int64_t n = 0; n < N; n++, row += 2 + S) {
    const int64_t *l = labels + (padded ? n * avail : total);
    int64_t L = tlen[n], repeats = 0;
    row[0] = ilen[n]; row[1] = L;
    for (int64_t i = 0; i < L; i++) {
      if (l[i] < 0 || l[i] >= C || l[i] == blank) {
        if (l[i] == blank)
          kiln_fail(KILN_ERR_INDEX, "%s: label %lld (from 0) at position %lld (from 0) of the target of sample %lld (from 0) "
                    "is the blank", op, (long long)l[i], (long long)i, (long long)n);
        else
          kiln_fail(KILN_ERR_INDEX, "%s: label %lld (from 0) at position %lld (from 0) of the target of sample %lld (from 0) "
                    "is out of range for %lld classes (log_probs %s)", op, (long long)l[i], (long long)i, (long long)n,
                    (long long)C, kiln_shape_string(lp));
        kiln_tensor_release(packed); packed = NULL;
        goto done;
      }
      repeats += i > 0 && l[i] == l[i - 1];
      row[2 + i] = l[i];
    }
    if (ilen[n] < L + repeats && !zero_infinity) {
      kiln_fail(KILN_ERR_ARGUMENT, "%s: sample %lld (from 0) has input length %lld, too short for its target of length %lld "
                "with %lld repeated neighbours (it needs %lld steps); set zero_infinity to give such samples zero loss",
                op, (long long)n, (long long)ilen[n], (long long)L, (long long)repeats, (long long)(L + repeats));
      kiln_tensor_release(packed); packed = NULL;
      goto done;
    }
    total += L;
  }
done:
  for (int k = 0; k < 3; k++) kiln_tensor_release(h[k]);
  return packed;
}

KILN_API struct kiln_tensor *kiln_ctc_loss(const struct kiln_tensor *lp, const struct kiln_tensor *targets,
                                           const struct kiln_tensor *input_lengths, const struct kiln_tensor *target_lengths,
                                           int64_t blank, int reduction, int zero_infinity) {
  struct kiln_tensor *ac[1];
  switch (kiln_autocast_inputs(KILN_OP_CTC_LOSS, 1, (const struct kiln_tensor *[]){lp}, ac)) {
  case 0: break;
  case 1: {
    struct kiln_tensor *r = kiln_ctc_loss(ac[0], targets, input_lengths, target_lengths, blank, reduction, zero_infinity);
    kiln_autocast_release(1, ac);
    return r;
  }
  default: return NULL;
  }
  const char *op = "ctc_loss";
  if (kiln_check_live(op, lp) || kiln_check_live(op, targets) || kiln_check_live(op, input_lengths) ||
      kiln_check_live(op, target_lengths))
    return NULL;
  if (lp->ndim != 3) {
    kiln_fail(KILN_ERR_SHAPE, "%s: log_probs %s has %d dims (expected 3: [T,N,C])", op, kiln_shape_string(lp), lp->ndim);
    return NULL;
  }
  if (check_float(op, "log_probs", lp)) return NULL;
  int64_t T = lp->sizes[0], N = lp->sizes[1], C = lp->sizes[2];
  if (blank < 0 || blank >= C) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: blank %lld (from 0) is out of range for the %lld classes of log_probs %s", op,
              (long long)blank, (long long)C, kiln_shape_string(lp));
    return NULL;
  }
  if (reduction < KILN_REDUCTION_NONE || reduction > KILN_REDUCTION_SUM) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: reduction %d (expected 0: none, 1: mean, 2: sum)", op, reduction);
    return NULL;
  }
  struct kiln_tensor *host = ctc_labels(op, lp, targets, input_lengths, target_lengths, blank, zero_infinity);
  struct kiln_tensor *labels = host ? kiln_to_device(host, lp->device) : NULL;
  kiln_tensor_release(host);
  if (!labels) return NULL;
  int64_t W = 2 * (labels->sizes[1] - 2) + 1, asizes[3] = {N, T, W};
  struct kiln_ctc_extra ex = {kiln_tensor_empty(1, &N, lp->dtype, lp->device), kiln_tensor_empty(3, asizes, lp->dtype, lp->device)};
  struct kiln_tensor *out = reduction == KILN_REDUCTION_NONE ? kiln_tensor_empty(1, &N, lp->dtype, lp->device)
                                                             : kiln_tensor_empty(0, NULL, lp->dtype, lp->device);
  int64_t ints[3] = {blank, reduction, zero_infinity != 0};
  struct kiln_call call = {.op = KILN_OP_CTC_LOSS, .out = out, .in = {lp, labels}, .nin = 2, .nints = 3, .extra = &ex};
  memcpy(call.ints, ints, sizeof ints);
  if (!out || !ex.nll || !ex.log_alpha) { kiln_tensor_release(out); out = NULL; }
  else out = run(lp->device, &call, out);
  if (out) {
    const struct kiln_tensor *saved[4] = {lp, labels, ex.nll, ex.log_alpha};
    out = record(KILN_OP_CTC_LOSS, out, 1, &lp, NULL, ints, 3, saved, 4);
  }
  kiln_tensor_release(labels); kiln_tensor_release(ex.nll); kiln_tensor_release(ex.log_alpha);
  return out;
}

int kiln_ctc_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  const struct edge *e = &n->in[0];
  if (!e->needs) return KILN_OK;
  if (!(gin[0] = kiln_tensor_empty(e->ndim, e->sizes, e->dtype, e->device))) return kiln_error_code();
  struct kiln_call call = {.op = KILN_OP_CTC_LOSS_BACKWARD, .out = gin[0], .in = {g, n->saved[0], n->saved[1], n->saved[2]},
                           .nin = 4, .nints = 3, .extra = n->saved[3]};
  memcpy(call.ints, n->ints, sizeof(int64_t) * 3);
  return kiln_dispatch(g->device, &call);
}

/* ---- derivatives ---- */

int kiln_dropout_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  if (n->in[0].needs && !(gin[0] = kiln_binary(KILN_OP_MUL, g, n->saved[0]))) return kiln_error_code();
  return KILN_OK;
}
