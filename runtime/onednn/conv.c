/* libkiln_onednn.so: oneDNN's convolutions, and its bf16 matmul, for kiln's CPU backend, behind
   the table of cpu/onednn.h. libkiln opens this library at run time (cpu/onednn.c), so that kiln without
   oneDNN still starts and convolves by im2col + GEMM.

   A plan is one pass of one shape. Its primitive reads and writes oneDNN's own layouts (chosen
   by oneDNN: blocked channels for its AVX-512 and AVX2 kernels); the plan keeps the reorders
   between those and kiln's NCHW / OIHW buffers, and the blocked copies live in the caller's
   workspace. Every call runs in the calling thread alone: the calling thread's OpenMP team is
   set to one thread before oneDNN first looks at it, and the scratchpad is the caller's, so kiln's
   pool can run several parts of a batch at once, each in its own thread, with no second pool. */
#include "cpu/onednn.h"
#include "kiln/dtype.h"
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

void omp_set_num_threads(int n);   /* libgomp, which oneDNN's OpenMP build brings */

static dnnl_engine_t engine;
static __thread dnnl_stream_t thread_stream;
static pthread_key_t stream_key;   /* destroys a thread's stream when the thread ends */

static void stream_end(void *s) { dnnl_stream_destroy(s); }

/* This thread's stream, and its OpenMP team of one (oneDNN asks OpenMP how many threads it has
   when it makes a primitive and when it runs one). */
static dnnl_stream_t stream(void) {
  if (!thread_stream) {
    omp_set_num_threads(1);
    if (dnnl_stream_create(&thread_stream, engine, dnnl_stream_default_flags) != dnnl_success) thread_stream = NULL;
    else pthread_setspecific(stream_key, thread_stream);
  }
  return thread_stream;
}

static const char *status_name(dnnl_status_t s) {
  switch (s) {
  case dnnl_out_of_memory: return "out of memory";
  case dnnl_invalid_arguments: return "invalid arguments";
  case dnnl_unimplemented: return "no kernel for this shape";
  case dnnl_runtime_error: return "runtime error";
  default: return "failed";
  }
}

#define TRY(call, what)                                                                        \
  do {                                                                                         \
    dnnl_status_t st_ = (call);                                                                \
    if (st_ != dnnl_success) {                                                                 \
      snprintf(err, n, "oneDNN %s: %s", what, status_name(st_));                               \
      goto fail;                                                                               \
    }                                                                                          \
  } while (0)

/* One tensor of a pass: kiln's layout (user), the primitive's (inner), and the reorder between
   them (NULL when they are the same), which goes user -> inner for an input and inner -> user
   for an output; off is where the inner copy lives in the workspace. */
struct side {
  dnnl_memory_desc_t user, inner;
  dnnl_primitive_t reorder;
  size_t bytes, off;
};

/* A thread's memory objects for a plan's descriptors, made at its first call and pointed at each
   call's buffers after (making and destroying the six or so a call needs cost ~1.5 us: ~1% of the
   CNN step's 96 calls on Zen 5). owner: the thread (pthread_self), 0 while the slot is free. */
enum { SLOTS = 32, SLOT_MDS = 12 };
struct slot {
  uintptr_t owner;
  int n;
  const dnnl_memory_desc_t *md[SLOT_MDS];
  dnnl_memory_t m[SLOT_MDS];
};

struct plan {
  int pass, bias;
  dnnl_primitive_t prim;
  struct side a, b, w, o;     /* a, b: the inputs; w: the weights; o: the output (a side may be unused) */
  dnnl_memory_desc_t bias_md, scratch_md;
  size_t scratch_off, workspace;
  char impl[64];
  struct slot slot[SLOTS];    /* one a thread that has run the plan; past SLOTS threads, none */
};

static size_t up64(size_t x) { return (x + 63) & ~(size_t)63; }

/* Set up s between the user layout and the primitive's; place its copy at *at in the workspace. */
static int side_init(struct side *s, const dnnl_memory_desc_t *user, const dnnl_memory_desc_t *inner, int input,
                     size_t *at, char *err, size_t n) {
  s->user = *user;
  s->inner = *inner;
  if (dnnl_memory_desc_equal(user, inner)) return 0;
  dnnl_primitive_desc_t rpd = NULL;
  TRY(dnnl_reorder_primitive_desc_create(&rpd, input ? user : inner, engine, input ? inner : user, engine, NULL),
      "reorder");
  dnnl_status_t st = dnnl_primitive_create(&s->reorder, rpd);
  dnnl_primitive_desc_destroy(rpd);
  if (st != dnnl_success) { snprintf(err, n, "oneDNN reorder: %s", status_name(st)); return -1; }
  s->bytes = dnnl_memory_desc_get_size(inner);
  s->off = *at;
  *at += up64(s->bytes);
  return 0;
fail:
  return -1;
}

static void plan_free(void *p) {
  struct plan *pl = p;
  if (!pl) return;
  for (int i = 0; i < SLOTS; i++)
    for (int k = 0; k < pl->slot[i].n; k++) dnnl_memory_destroy(pl->slot[i].m[k]);
  if (pl->prim) dnnl_primitive_destroy(pl->prim);
  struct side *sides[] = {&pl->a, &pl->b, &pl->w, &pl->o};
  for (int i = 0; i < 4; i++)
    if (sides[i]->reorder) dnnl_primitive_destroy(sides[i]->reorder);
  free(pl);
}

static void *plan(const struct kiln_onednn_shape *s, char *err, size_t n) {
  struct plan *pl = calloc(1, sizeof *pl);
  dnnl_primitive_desc_t fwd = NULL, pd = NULL;
  dnnl_primitive_attr_t attr = NULL;
  if (!pl) { snprintf(err, n, "oneDNN plan: out of memory"); return NULL; }
  if (!stream()) { snprintf(err, n, "oneDNN: cannot make a stream"); goto fail; }
  if (s->dtype != KILN_F32 && s->dtype != KILN_BF16) { snprintf(err, n, "oneDNN convolutions here take f32 and bf16"); goto fail; }
  /* bf16: the tensors in bf16, the grad of the weights in f32 (kiln adds the parts' in f32 and
     rounds once) */
  dnnl_data_type_t dt = s->dtype == KILN_BF16 ? dnnl_bf16 : dnnl_f32;
  dnnl_data_type_t wdt = s->pass == KILN_ONEDNN_BACKWARD_WEIGHTS ? dnnl_f32 : dt;
  int64_t G = s->groups > 0 ? s->groups : 1;
  /* the right/bottom padding that gives the output size kiln computed */
  int64_t prh = (s->OH - 1) * s->sh + (s->kh - 1) * s->dh + 1 - s->H - s->ph;
  int64_t prw = (s->OW - 1) * s->sw + (s->kw - 1) * s->dw + 1 - s->W - s->pw;
  if (prh < 0 || prw < 0) { snprintf(err, n, "oneDNN: an input row or column no output reads"); goto fail; }
  pl->pass = s->pass;
  pl->bias = s->pass == KILN_ONEDNN_FORWARD && s->bias;
  dnnl_dims_t xd = {s->N, s->C, s->H, s->W}, yd = {s->N, s->O, s->OH, s->OW}, bd = {s->O};
  dnnl_dims_t wd = {s->O, s->C, s->kh, s->kw}, gwd = {G, s->O / G, s->C / G, s->kh, s->kw};
  dnnl_dims_t strides = {s->sh, s->sw}, dil = {s->dh - 1, s->dw - 1}, pad_l = {s->ph, s->pw}, pad_r = {prh, prw};
  dnnl_memory_desc_t x_user, y_user, w_user, x_any, y_any, w_any;
  int wn = G > 1 ? 5 : 4;
  dnnl_memory_desc_t fw_any;   /* the forward's weights, for the hint of a backward pass */
  TRY(dnnl_memory_desc_init_by_tag(&x_user, 4, xd, dt, dnnl_nchw), "input");
  TRY(dnnl_memory_desc_init_by_tag(&y_user, 4, yd, dt, dnnl_nchw), "output");
  TRY(dnnl_memory_desc_init_by_tag(&w_user, wn, G > 1 ? gwd : wd, wdt, G > 1 ? dnnl_goihw : dnnl_oihw), "weights");
  TRY(dnnl_memory_desc_init_by_tag(&x_any, 4, xd, dt, dnnl_format_tag_any), "input");
  TRY(dnnl_memory_desc_init_by_tag(&y_any, 4, yd, dt, dnnl_format_tag_any), "output");
  TRY(dnnl_memory_desc_init_by_tag(&w_any, wn, G > 1 ? gwd : wd, wdt, dnnl_format_tag_any), "weights");
  TRY(dnnl_memory_desc_init_by_tag(&fw_any, wn, G > 1 ? gwd : wd, dt, dnnl_format_tag_any), "weights");
  TRY(dnnl_memory_desc_init_by_tag(&pl->bias_md, 1, bd, dt, dnnl_x), "bias");
  TRY(dnnl_primitive_attr_create(&attr), "attributes");
  TRY(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "scratchpad");
  dnnl_convolution_desc_t fd, cd;
  TRY(dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct, &x_any, &fw_any,
                                                 pl->bias ? &pl->bias_md : NULL, &y_any, strides, dil, pad_l, pad_r),
      "convolution");
  TRY(dnnl_primitive_desc_create(&fwd, &fd, attr, engine, NULL), "convolution");
  /* the workspace: the inputs' and the output's copies, then the scratchpad; the weights of
     forward and backward data go to prepare_weights' buffer instead (offsets from 0 there) */
  size_t at = 0, wat = 0;
  if (s->pass == KILN_ONEDNN_FORWARD) {
    pd = fwd;
    fwd = NULL;
    if (side_init(&pl->a, &x_user, dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0), 1, &at, err, n) ||
        side_init(&pl->w, &w_user, dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0), 1, &wat, err, n) ||
        side_init(&pl->o, &y_user, dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0), 0, &at, err, n))
      goto fail;
  } else if (s->pass == KILN_ONEDNN_BACKWARD_DATA) {
    TRY(dnnl_dilated_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &x_any, &w_any, &y_any, strides,
                                                         dil, pad_l, pad_r),
        "convolution backward data");
    TRY(dnnl_primitive_desc_create(&pd, &cd, attr, engine, fwd), "convolution backward data");
    if (side_init(&pl->a, &y_user, dnnl_primitive_desc_query_md(pd, dnnl_query_diff_dst_md, 0), 1, &at, err, n) ||
        side_init(&pl->w, &w_user, dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0), 1, &wat, err, n) ||
        side_init(&pl->o, &x_user, dnnl_primitive_desc_query_md(pd, dnnl_query_diff_src_md, 0), 0, &at, err, n))
      goto fail;
  } else {
    TRY(dnnl_dilated_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &x_any, &w_any, NULL, &y_any,
                                                            strides, dil, pad_l, pad_r),
        "convolution backward weights");
    TRY(dnnl_primitive_desc_create(&pd, &cd, attr, engine, fwd), "convolution backward weights");
    if (side_init(&pl->a, &x_user, dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0), 1, &at, err, n) ||
        side_init(&pl->b, &y_user, dnnl_primitive_desc_query_md(pd, dnnl_query_diff_dst_md, 0), 1, &at, err, n) ||
        side_init(&pl->w, &w_user, dnnl_primitive_desc_query_md(pd, dnnl_query_diff_weights_md, 0), 0, &at, err, n))
      goto fail;
  }
  pl->scratch_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  pl->scratch_off = at;
  pl->workspace = at + up64(dnnl_memory_desc_get_size(&pl->scratch_md));
  const char *impl = NULL;
  if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
    snprintf(pl->impl, sizeof pl->impl, "%s", impl);
  TRY(dnnl_primitive_create(&pl->prim, pd), "convolution");
  dnnl_primitive_desc_destroy(pd);
  dnnl_primitive_attr_destroy(attr);
  return pl;
fail:
  if (fwd) dnnl_primitive_desc_destroy(fwd);
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (attr) dnnl_primitive_attr_destroy(attr);
  plan_free(pl);
  return NULL;
}

static const char *impl(void *p) { return ((struct plan *)p)->impl; }
static size_t weights_bytes(void *p) {
  struct plan *pl = p;
  return pl->pass != KILN_ONEDNN_BACKWARD_WEIGHTS && pl->w.reorder ? pl->w.bytes : 0;
}
static size_t workspace_bytes(void *p) { return ((struct plan *)p)->workspace; }

/* The channel block of the pass's activation side (the forward's output, a backward pass's grad
   of the output) in the primitive's layout: 16 or 8 for nChw16c / nChw8c, 0 when it is kiln's NCHW
   itself, -1 for any other layout. */
static int block(void *p) {
  struct plan *pl = p;
  const struct side *s = pl->pass == KILN_ONEDNN_FORWARD ? &pl->o : pl->pass == KILN_ONEDNN_BACKWARD_DATA ? &pl->a : &pl->b;
  if (!s->reorder) return 0;
  static const struct { dnnl_format_tag_t tag; int block; } tags[] = {{dnnl_nChw16c, 16}, {dnnl_nChw8c, 8}};
  for (int i = 0; i < 2; i++) {
    dnnl_memory_desc_t b;
    if (dnnl_memory_desc_init_by_tag(&b, s->user.ndims, s->user.dims, s->user.data_type, tags[i].tag) == dnnl_success &&
        dnnl_memory_desc_equal(&b, &s->inner))
      return tags[i].block;
  }
  return -1;
}

/* This thread's slot of pl, claimed on its first call; NULL when every slot has another owner. */
static struct slot *slot_of(struct plan *pl) {
  uintptr_t self = (uintptr_t)pthread_self();
  for (int i = 0; i < SLOTS; i++)
    if (__atomic_load_n(&pl->slot[i].owner, __ATOMIC_ACQUIRE) == self) return &pl->slot[i];
  for (int i = 0; i < SLOTS; i++) {
    uintptr_t free_ = 0;
    if (__atomic_compare_exchange_n(&pl->slot[i].owner, &free_, self, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return &pl->slot[i];
  }
  return NULL;
}

/* A memory object of md over ptr: the slot's for md (sl: the calling thread's), pointed at ptr,
   or (*owned set) a new one the caller destroys; NULL when oneDNN cannot make one. A call's
   arguments have distinct descriptors, so one object per descriptor serves them all. */
static dnnl_memory_t mem(struct slot *sl, const dnnl_memory_desc_t *md, const void *ptr, int *owned) {
  dnnl_memory_t m = NULL;
  *owned = 0;
  if (sl) {
    for (int k = 0; k < sl->n; k++)
      if (sl->md[k] == md) return dnnl_memory_set_data_handle(sl->m[k], (void *)ptr) == dnnl_success ? sl->m[k] : NULL;
    if (sl->n < SLOT_MDS) {
      if (dnnl_memory_create(&m, md, engine, (void *)ptr) != dnnl_success) return NULL;
      sl->md[sl->n] = md;
      sl->m[sl->n++] = m;
      return m;
    }
  }
  *owned = 1;
  return dnnl_memory_create(&m, md, engine, (void *)ptr) == dnnl_success ? m : NULL;
}

static int reorder(struct plan *pl, dnnl_primitive_t r, const dnnl_memory_desc_t *from_md, const void *from,
                   const dnnl_memory_desc_t *to_md, void *to, char *err, size_t n) {
  int fo, to_;
  struct slot *sl = slot_of(pl);
  dnnl_memory_t f = mem(sl, from_md, from, &fo), t = mem(sl, to_md, to, &to_);
  dnnl_status_t st = dnnl_out_of_memory;
  if (f && t) {
    dnnl_exec_arg_t args[] = {{DNNL_ARG_FROM, f}, {DNNL_ARG_TO, t}};
    st = dnnl_primitive_execute(r, stream(), 2, args);
  }
  if (f && fo) dnnl_memory_destroy(f);
  if (t && to_) dnnl_memory_destroy(t);
  if (st != dnnl_success) snprintf(err, n, "oneDNN reorder: %s", status_name(st));
  return st == dnnl_success ? 0 : -1;
}

/* A weight-grad pass: the bytes of the grad in the primitive's own layout (0: OIHW itself), and
   that layout's grad (a sum of partials left in it) into OIHW. */
static size_t grad_weights_bytes(void *p) {
  struct plan *pl = p;
  return pl->pass == KILN_ONEDNN_BACKWARD_WEIGHTS && pl->w.reorder ? pl->w.bytes : 0;
}
static int grad_weights_out(void *p, const void *blocked, void *gw, char *err, size_t n) {
  struct plan *pl = p;
  if (!stream()) { snprintf(err, n, "oneDNN: cannot make a stream"); return -1; }
  return reorder(pl, pl->w.reorder, &pl->w.inner, blocked, &pl->w.user, gw, err, n);
}

static int prepare_weights(void *p, const void *w, void *wbuf, char *err, size_t n) {
  struct plan *pl = p;
  if (!stream()) { snprintf(err, n, "oneDNN: cannot make a stream"); return -1; }
  if (pl->pass == KILN_ONEDNN_BACKWARD_WEIGHTS || !pl->w.reorder) return 0;
  return reorder(pl, pl->w.reorder, &pl->w.user, w, &pl->w.inner, wbuf, err, n);
}

/* An input side: the user's buffer as it is, or its reordered copy in the workspace. */
static const void *take(struct plan *pl, const struct side *s, const void *user, char *ws, char *err, size_t n, int *failed) {
  if (!s->reorder || *failed) return user;
  if (reorder(pl, s->reorder, &s->user, user, &s->inner, ws + s->off, err, n)) *failed = 1;
  return ws + s->off;
}

static int run(void *p, const void *a, const void *b, const void *w, const void *bias, void *out, void *workspace,
               int flags, char *err, size_t n) {
  struct plan *pl = p;
  char *ws = workspace;
  int failed = !stream();
  if (failed) { snprintf(err, n, "oneDNN: cannot make a stream"); return -1; }
  int given = flags & KILN_ONEDNN_GRAD_BLOCKED;   /* the output's grad comes in the primitive's layout */
  const void *ai = given && pl->pass == KILN_ONEDNN_BACKWARD_DATA ? a : take(pl, &pl->a, a, ws, err, n, &failed);
  const void *bi = pl->pass != KILN_ONEDNN_BACKWARD_WEIGHTS ? NULL : given ? b : take(pl, &pl->b, b, ws, err, n, &failed);
  if (failed) return -1;
  struct side *os = pl->pass == KILN_ONEDNN_BACKWARD_WEIGHTS ? &pl->w : &pl->o;
  int keep = ((flags & KILN_ONEDNN_OUT_BLOCKED) && pl->pass == KILN_ONEDNN_FORWARD) ||   /* the output stays in it */
             ((flags & KILN_ONEDNN_GW_BLOCKED) && pl->pass == KILN_ONEDNN_BACKWARD_WEIGHTS);
  void *oi = os->reorder && !keep ? ws + os->off : out;
  dnnl_memory_t m[5] = {0};
  int owned[5] = {0};
  struct slot *sl = slot_of(pl);
  int nargs = 0;
  dnnl_exec_arg_t args[5];
  if (pl->pass == KILN_ONEDNN_FORWARD) {
    m[0] = mem(sl, &pl->a.inner, ai, &owned[0]); m[1] = mem(sl, &pl->w.inner, w, &owned[1]); m[2] = mem(sl, &pl->o.inner, oi, &owned[2]);
    args[0] = (dnnl_exec_arg_t){DNNL_ARG_SRC, m[0]}; args[1] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, m[1]};
    args[2] = (dnnl_exec_arg_t){DNNL_ARG_DST, m[2]};
    nargs = 3;
    if (pl->bias) { m[3] = mem(sl, &pl->bias_md, bias, &owned[3]); args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, m[3]}; }
  } else if (pl->pass == KILN_ONEDNN_BACKWARD_DATA) {
    m[0] = mem(sl, &pl->a.inner, ai, &owned[0]); m[1] = mem(sl, &pl->w.inner, w, &owned[1]); m[2] = mem(sl, &pl->o.inner, oi, &owned[2]);
    args[0] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_DST, m[0]}; args[1] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, m[1]};
    args[2] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_SRC, m[2]};
    nargs = 3;
  } else {
    m[0] = mem(sl, &pl->a.inner, ai, &owned[0]); m[1] = mem(sl, &pl->b.inner, bi, &owned[1]); m[2] = mem(sl, &pl->w.inner, oi, &owned[2]);
    args[0] = (dnnl_exec_arg_t){DNNL_ARG_SRC, m[0]}; args[1] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_DST, m[1]};
    args[2] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_WEIGHTS, m[2]};
    nargs = 3;
  }
  m[4] = mem(sl, &pl->scratch_md, ws + pl->scratch_off, &owned[4]);
  args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, m[4]};
  dnnl_status_t st = dnnl_out_of_memory;
  int ok = m[0] && m[1] && m[2] && m[4] && (!pl->bias || pl->pass != KILN_ONEDNN_FORWARD || m[3]);
  if (ok) st = dnnl_primitive_execute(pl->prim, stream(), nargs, args);
  for (int i = 0; i < 5; i++)
    if (m[i] && owned[i]) dnnl_memory_destroy(m[i]);
  if (st != dnnl_success) { snprintf(err, n, "oneDNN convolution: %s", status_name(st)); return -1; }
  if (os->reorder && !keep) return reorder(pl, os->reorder, &os->inner, oi, &os->user, out, err, n);
  return 0;
}

/* ---- bf16 matrix products ---- */

/* oneDNN's matmul of one shape and layout: bf16 operands read through their strides, f32 sums,
   bf16 out; its kernel is oneDNN's choice for the CPU (AMX's tiles where there are, else
   AVX512-BF16 or its f32 emulation). The sides keep the plain descriptors (no reorders). */
static void *matmul_plan(const struct kiln_onednn_matmul *s, char *err, size_t n) {
  struct plan *pl = calloc(1, sizeof *pl);
  dnnl_primitive_desc_t pd = NULL;
  dnnl_primitive_attr_t attr = NULL;
  if (!pl) { snprintf(err, n, "oneDNN matmul plan: out of memory"); return NULL; }
  if (!stream()) { snprintf(err, n, "oneDNN: cannot make a stream"); goto fail; }
  pl->pass = -1;
  dnnl_dims_t ad = {s->m, s->k}, bd = {s->k, s->n}, cd = {s->m, s->n};
  dnnl_dims_t as = {s->ars, s->acs}, bs = {s->brs, s->bcs}, cs = {s->ldc, 1};
  TRY(dnnl_memory_desc_init_by_strides(&pl->a.user, 2, ad, dnnl_bf16, as), "matmul input");
  TRY(dnnl_memory_desc_init_by_strides(&pl->b.user, 2, bd, dnnl_bf16, bs), "matmul weights");
  TRY(dnnl_memory_desc_init_by_strides(&pl->o.user, 2, cd, dnnl_bf16, cs), "matmul output");
  pl->a.inner = pl->a.user; pl->b.inner = pl->b.user; pl->o.inner = pl->o.user;
  TRY(dnnl_primitive_attr_create(&attr), "attributes");
  TRY(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "scratchpad");
  dnnl_matmul_desc_t md;
  TRY(dnnl_matmul_desc_init(&md, &pl->a.user, &pl->b.user, NULL, &pl->o.user), "matmul");
  TRY(dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL), "matmul");
  pl->scratch_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  pl->scratch_off = 0;
  pl->workspace = up64(dnnl_memory_desc_get_size(&pl->scratch_md));
  const char *impl = NULL;
  if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
    snprintf(pl->impl, sizeof pl->impl, "%s", impl);
  TRY(dnnl_primitive_create(&pl->prim, pd), "matmul");
  dnnl_primitive_desc_destroy(pd);
  dnnl_primitive_attr_destroy(attr);
  return pl;
fail:
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (attr) dnnl_primitive_attr_destroy(attr);
  plan_free(pl);
  return NULL;
}

static int matmul_run(void *p, const void *a, const void *b, void *c, void *workspace, char *err, size_t n) {
  struct plan *pl = p;
  if (!stream()) { snprintf(err, n, "oneDNN: cannot make a stream"); return -1; }
  struct slot *sl = slot_of(pl);
  int owned[4] = {0};
  dnnl_memory_t m[4] = {mem(sl, &pl->a.inner, a, &owned[0]), mem(sl, &pl->b.inner, b, &owned[1]),
                        mem(sl, &pl->o.inner, c, &owned[2]), mem(sl, &pl->scratch_md, workspace, &owned[3])};
  dnnl_status_t st = dnnl_out_of_memory;
  if (m[0] && m[1] && m[2] && m[3]) {
    dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]}, {DNNL_ARG_DST, m[2]}, {DNNL_ARG_SCRATCHPAD, m[3]}};
    st = dnnl_primitive_execute(pl->prim, stream(), 4, args);
  }
  for (int i = 0; i < 4; i++)
    if (m[i] && owned[i]) dnnl_memory_destroy(m[i]);
  if (st != dnnl_success) { snprintf(err, n, "oneDNN matmul: %s", status_name(st)); return -1; }
  return 0;
}

static struct kiln_onednn table = {
  .version = KILN_ONEDNN_VERSION,
  .plan = plan,
  .plan_free = plan_free,
  .impl = impl,
  .weights_bytes = weights_bytes,
  .workspace_bytes = workspace_bytes,
  .block = block,
  .grad_weights_bytes = grad_weights_bytes,
  .grad_weights_out = grad_weights_out,
  .prepare_weights = prepare_weights,
  .run = run,
  .matmul_plan = matmul_plan,
  .matmul_run = matmul_run,
};

EXPORT const struct kiln_onednn *kiln_onednn_open(int version) {
  if (version != KILN_ONEDNN_VERSION) return NULL;
  if (!engine) {   /* libkiln calls this once (pthread_once) */
    omp_set_num_threads(1);
    if (pthread_key_create(&stream_key, stream_end) != 0) return NULL;
    if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) return NULL;
    const dnnl_version_t *v = dnnl_version();
    snprintf(table.name, sizeof table.name, "oneDNN %d.%d.%d", v->major, v->minor, v->patch);
  }
  return &table;
}
