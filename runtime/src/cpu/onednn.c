/* cpu/onednn.c: which algorithm convolves on the CPU, and the oneDNN path. Compiled once (not per
   instruction-set level: oneDNN chooses its own kernels from the CPU).

   libkiln_onednn.so (runtime/onednn/conv.c) is opened on the first f32 convolution, next to
   libkiln or where KILN_ONEDNN_LIB says; without it (or without oneDNN) kiln convolves by im2col +
   GEMM (cpu/conv.c) as before. The choice, per call:
   - KILN_CONV_ALGO=im2col or onednn forces one (onednn still falls back where it has no kernel);
   - else, in benchmark mode (KILN_CONV_BENCHMARK=1, kiln.set_conv_benchmark(true)), the first call
     of a shape runs both, timed, and the faster is kept for that shape;
   - else oneDNN wherever it takes the shape, but for the grad of a one-channel input (im2col's
     is about twice as fast there, bench/conv.lua) and every bf16 pass of a one-channel input.
   Benchmark mode is off by default, as PyTorch's cudnn.benchmark: a choice made by timing may
   differ between two runs, and then so would the last bits of their results.

   The batch is cut into the same fixed parts as cpu/conv.c (KILN_CONV_PARTS), each part one
   oneDNN call in one thread of kiln's pool; the grad-weight partials are added in part order by
   the caller. A result is therefore bitwise the same at any thread count. */
#define _GNU_SOURCE   /* dladdr */
#include "cpu.h"
#include "onednn.h"
#include "kiln/system.h"
#include <dlfcn.h>
#include <unistd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const struct kiln_onednn *lib;
static char lib_note[800];
static pthread_once_t lib_once = PTHREAD_ONCE_INIT;

static void open_lib(void) {
  const char *env = getenv("KILN_ONEDNN_LIB");
  char path[600];
  snprintf(path, sizeof path, "libkiln_onednn.so");
  if (env && *env) snprintf(path, sizeof path, "%s", env);
  else {
    Dl_info info;
    if (dladdr((void *)kiln_onednn_name, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
      char *slash;
      snprintf(path, sizeof path, "%s", info.dli_fname);
      slash = strrchr(path, '/');
      snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "libkiln_onednn.so");
      if (access(path, F_OK) != 0) snprintf(path, sizeof path, "libkiln_onednn.so");
    }
  }
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(lib_note, sizeof lib_note, "oneDNN not loaded (%s): convolutions by im2col + GEMM", dlerror());
    return;
  }
  kiln_onednn_open_fn open_fn;
  void *sym = dlsym(h, "kiln_onednn_open");
  memcpy(&open_fn, &sym, sizeof open_fn);
  lib = open_fn ? open_fn(KILN_ONEDNN_VERSION) : NULL;
  if (!lib) snprintf(lib_note, sizeof lib_note, "%s is not kiln's oneDNN library (version %d)", path, KILN_ONEDNN_VERSION);
  else snprintf(lib_note, sizeof lib_note, "%s for convolutions%s", lib->name,
           kiln_cpu_has("amx_bf16") ? " and bf16 matrix products (AMX)" : "");
}

static const struct kiln_onednn *onednn(void) {
  pthread_once(&lib_once, open_lib);
  return lib;
}

KILN_API const char *kiln_onednn_name(void) { return onednn() ? lib->name : NULL; }
KILN_API const char *kiln_onednn_note(void) {
  onednn();
  return lib_note;
}

enum { ALGO_IM2COL, ALGO_ONEDNN, ALGO_WINOGRAD };

static int forced_algo(void) {   /* -1: not forced */
  const char *a = getenv("KILN_CONV_ALGO");
  if (!a || !*a || !strcmp(a, "auto")) return -1;
  return !strcmp(a, "onednn") ? ALGO_ONEDNN : !strcmp(a, "winograd") ? ALGO_WINOGRAD : ALGO_IM2COL;
}
static int benchmark_mode(void) {
  const char *b = getenv("KILN_CONV_BENCHMARK");
  return b && *b && strcmp(b, "0") != 0;
}

/* ---- plans and choices, cached per shape ---- */

struct plan_entry {
  int matmul;                    /* the key: a convolution pass's shape, or a matmul's */
  union { struct kiln_onednn_shape conv; struct kiln_onednn_matmul mm; } key;
  void *plan;                    /* NULL: oneDNN has no kernel for it */
  struct plan_entry *next;
};

/* A whole call's shape (the pass: 0 forward, 1 backward; which grads) and what was chosen for it. */
struct choice_key {
  int32_t backward, gx, gw, dtype;   /* dtype: the tensors' (f32 or bf16) */
  int64_t N, C, H, W, O, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, G;
};
struct choice_entry {
  struct choice_key key;
  int algo;
  double im2col_ms, onednn_ms, winograd_ms;   /* benchmark mode's timings; 0 when not timed */
  char impl[64];
  struct choice_entry *next;
};

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static struct plan_entry *plans;
static struct choice_entry *choices;
static int64_t nchoices;

/* The plan of a convolution pass's shape (conv) or a matmul's (mm), made on first use, or NULL
   with the reason in err. */
static void *cached_plan(const struct kiln_onednn_shape *conv, const struct kiln_onednn_matmul *mm, char *err, size_t n) {
  struct plan_entry k;
  memset(&k, 0, sizeof k);
  k.matmul = mm != NULL;
  if (mm) k.key.mm = *mm;
  else k.key.conv = *conv;
  pthread_mutex_lock(&cache_mu);
  struct plan_entry *e = plans;
  while (e && (e->matmul != k.matmul || memcmp(&e->key, &k.key, sizeof k.key) != 0)) e = e->next;
  if (!e && (e = malloc(sizeof *e))) {
    *e = k;
    e->plan = mm ? lib->matmul_plan(mm, err, n) : lib->plan(conv, err, n);
    e->next = plans;
    plans = e;
  } else if (e && !e->plan) {
    snprintf(err, n, "oneDNN has no kernel for this shape");
  } else if (!e) {
    snprintf(err, n, "out of memory for a oneDNN plan");
  }
  void *p = e ? e->plan : NULL;
  pthread_mutex_unlock(&cache_mu);
  return p;
}
static void *plan_for(const struct kiln_onednn_shape *s, char *err, size_t n) { return cached_plan(s, NULL, err, n); }

static struct choice_entry *choice_find(const struct choice_key *k) {
  struct choice_entry *e = choices;
  while (e && memcmp(&e->key, k, sizeof *k) != 0) e = e->next;
  return e;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* ---- the oneDNN path ---- */

struct job {
  const struct kiln_conv_job *c;
  void *plan[3][2];              /* [pass][0: the smaller part, 1: the larger] */
  int64_t small;                 /* images in the smaller part */
  char *wbuf[2][2];              /* forward / backward-data weights in oneDNN's layout, per part size */
  char *gwb;                     /* the parts' weight grads in oneDNN's layout, gw_stride bytes apart, or NULL */
  size_t gw_bytes, gw_stride;
  int64_t folded;                /* the parts added into part 0's grad so far (atomic) */
  int failed;
  char err[256];
};

static int64_t part_begin(const struct kiln_conv_job *c, int64_t t) { return t * c->N / c->parts; }


static void shape_of(const struct kiln_conv_job *c, int pass, int64_t nb, struct kiln_onednn_shape *s) {
  memset(s, 0, sizeof *s);
  s->pass = pass; s->dtype = c->dtype; s->N = nb; s->C = c->C; s->H = c->H; s->W = c->W; s->O = c->O;
  s->OH = c->OH; s->OW = c->OW; s->kh = c->kh; s->kw = c->kw; s->sh = c->sh; s->sw = c->sw; s->ph = c->ph;
  s->pw = c->pw; s->dh = c->dh; s->dw = c->dw; s->groups = c->G; s->bias = pass == KILN_ONEDNN_FORWARD && c->bias;
}

static void fail_job(struct job *j, const char *msg) {
  if (__atomic_exchange_n(&j->failed, 1, __ATOMIC_RELAXED) == 0) snprintf(j->err, sizeof j->err, "%s", msg);
}

static void run_parts(void *ctx, int64_t begin, int64_t end) {
  struct job *j = ctx;
  const struct kiln_conv_job *c = j->c;
  size_t es = (size_t)kiln_dtype_size(c->dtype), ws_bytes = 0;
  char *ws = NULL, *blk = NULL, err[256];
  int fused = c->epilogue || c->prologue;
  if (fused) {   /* the part's output (grad) in nChw16c */
    size_t bytes = (size_t)((j->small + 1) * ((c->O + 15) / 16 * 16) * c->OH * c->OW) * es;
    if (!(blk = kiln_cpu_scratch(bytes))) { fail_job(j, "out of memory for a part's output"); return; }
  }
  for (int64_t t = begin; t < end && !__atomic_load_n(&j->failed, __ATOMIC_RELAXED); t++) {
    int64_t n0 = part_begin(c, t), nb = part_begin(c, t + 1) - n0;
    int size = nb != j->small;
    int passes[3] = {c->y || c->epilogue ? KILN_ONEDNN_FORWARD : -1, c->partials ? KILN_ONEDNN_BACKWARD_WEIGHTS : -1,
                     c->gx ? KILN_ONEDNN_BACKWARD_DATA : -1};
    if (c->prologue && nb > 0) c->prologue(c->ctx, n0, nb, blk);
    for (int k = 0; k < 3; k++) {
      if (passes[k] < 0 || nb == 0) continue;
      void *p = j->plan[passes[k]][size];
      size_t need = lib->workspace_bytes(p);
      if (need > ws_bytes) {
        free(ws);
        ws_bytes = need;
        if (!(ws = kiln_cpu_scratch(ws_bytes))) { fail_job(j, "out of memory for oneDNN's workspace"); return; }
      }
      int rc;
      const char *x = (const char *)c->x + n0 * c->C * c->H * c->W * es;
      const char *gy = c->prologue ? blk : (const char *)c->gy + n0 * c->O * c->OH * c->OW * es;
      int flags = c->prologue ? KILN_ONEDNN_GRAD_BLOCKED : 0;
      if (passes[k] == KILN_ONEDNN_FORWARD) {
        rc = lib->run(p, x, NULL, j->wbuf[0][size] ? j->wbuf[0][size] : c->w, c->bias,
                      c->epilogue ? blk : (char *)c->y + n0 * c->O * c->OH * c->OW * es, ws,
                      c->epilogue ? KILN_ONEDNN_OUT_BLOCKED : 0, err, sizeof err);
        if (!rc && c->epilogue) c->epilogue(c->ctx, n0, nb, blk);
      } else if (passes[k] == KILN_ONEDNN_BACKWARD_WEIGHTS && j->gwb) {
        rc = lib->run(p, x, gy, NULL, NULL, j->gwb + t * j->gw_stride, ws, flags | KILN_ONEDNN_GW_BLOCKED, err, sizeof err);
        /* the next part of the sum while the grad is in cache: part t is added where parts 0..t-1
           already are (in this thread, or in another before it); else it waits for the join */
        if (!rc && __atomic_load_n(&j->folded, __ATOMIC_ACQUIRE) == t) {
          if (t > 0) kiln_add_into((float *)j->gwb, (const float *)(j->gwb + t * j->gw_stride), (int64_t)(j->gw_bytes / sizeof(float)));
          __atomic_store_n(&j->folded, t + 1, __ATOMIC_RELEASE);
        }
      }
      else if (passes[k] == KILN_ONEDNN_BACKWARD_WEIGHTS)
        rc = lib->run(p, x, gy, NULL, NULL, (float *)c->partials + t * c->O * (c->C / c->G) * c->kh * c->kw, ws, flags,
                      err, sizeof err);
      else
        rc = lib->run(p, gy, NULL, j->wbuf[1][size] ? j->wbuf[1][size] : c->w, NULL,
                      (char *)c->gx + n0 * c->C * c->H * c->W * es, ws, flags, err, sizeof err);
      if (rc) { fail_job(j, err); break; }
    }
  }
  free(ws);
  free(blk);
}

/* Make the plans of the passes c asks for, for both part sizes, and the weights they read.
   0: ready; 1: oneDNN does not take the shape (nothing to free); -1: an error. */
static int job_init(struct job *j, const struct kiln_conv_job *c) {
  memset(j, 0, sizeof *j);
  j->c = c;
  j->small = c->N / c->parts;
  int passes[3] = {c->y || c->epilogue ? KILN_ONEDNN_FORWARD : -1, c->partials ? KILN_ONEDNN_BACKWARD_WEIGHTS : -1,
                   c->gx ? KILN_ONEDNN_BACKWARD_DATA : -1};
  char err[256];
  for (int k = 0; k < 3; k++)
    for (int size = 0; size < 2 && passes[k] >= 0; size++) {
      int64_t nb = j->small + size;
      if (nb == 0 || (size == 1 && c->N % c->parts == 0)) continue;
      struct kiln_onednn_shape s;
      shape_of(c, passes[k], nb, &s);
      if (!(j->plan[passes[k]][size] = plan_for(&s, err, sizeof err))) return 1;
      if (c->epilogue || c->prologue) {   /* a fused job: every pass on nChw16c, which its kernels read */
        if (lib->block(j->plan[passes[k]][size]) != 16) return 1;
        /* the forward is taken only where both backward passes will read that layout too */
        for (int bp = KILN_ONEDNN_BACKWARD_DATA; c->epilogue && bp <= KILN_ONEDNN_BACKWARD_WEIGHTS; bp++) {
          struct kiln_onednn_shape bs;
          shape_of(c, bp, nb, &bs);
          void *plan = plan_for(&bs, err, sizeof err);
          if (!plan || lib->block(plan) != 16) return 1;
        }
      }
      if (passes[k] == KILN_ONEDNN_BACKWARD_WEIGHTS) continue;
      size_t wb = lib->weights_bytes(j->plan[passes[k]][size]);
      int slot = passes[k] == KILN_ONEDNN_FORWARD ? 0 : 1;
      if (!wb) continue;
      if (!(j->wbuf[slot][size] = kiln_cpu_scratch(wb)))
        { kiln_fail(KILN_ERR_MEMORY, "conv2d: out of memory for oneDNN's weights (%zu bytes)", wb); return -1; }
      if (lib->prepare_weights(j->plan[passes[k]][size], c->w, j->wbuf[slot][size], err, sizeof err))
        { kiln_fail(KILN_ERR_UNSUPPORTED, "conv2d: %s", err); return -1; }
    }
  return 0;
}

static void job_free(struct job *j) {
  for (int a = 0; a < 2; a++)
    for (int b = 0; b < 2; b++) free(j->wbuf[a][b]);
  free(j->gwb);
}

/* The parts' weight grads added into part 0's, element by element in part order (as the callers
   add the parts' OIHW grads: the same bits, before the one reorder instead of after one each):
   those run_parts did not add as it went. */
static void sum_gw(void *ctx, int64_t begin, int64_t end) {
  const struct job *j = ctx;
  for (int64_t i0 = begin; i0 < end; i0 += 1024) {   /* a piece of part 0 in L1 while the parts are added */
    int64_t n = end - i0 < 1024 ? end - i0 : 1024;
    for (int64_t t = j->folded; t < j->c->parts; t++) kiln_add_into((float *)j->gwb + i0, (const float *)(j->gwb + t * j->gw_stride) + i0, n);
  }
}

/* Run c by oneDNN: 0 done, 1 not taken, -1 an error. Where the weight grad's layout is oneDNN's
   own and every part has as many images (one plan), the parts' grads stay in that layout, are added
   there and reordered once, into c->gw or else partials' first slot (partials_summed). */
static int run_onednn(struct kiln_conv_job *c, char *impl, size_t nimpl) {
  struct job j;
  int rc = job_init(&j, c);
  void *wplan = j.plan[KILN_ONEDNN_BACKWARD_WEIGHTS][0];
  size_t gw_bytes = rc == 0 && wplan && c->N % c->parts == 0 ? lib->grad_weights_bytes(wplan) : 0;
  if (gw_bytes) {
    j.gw_bytes = gw_bytes;
    j.gw_stride = (gw_bytes + 63) & ~(size_t)63;
    if (!(j.gwb = kiln_cpu_scratch(j.gw_stride * (size_t)c->parts))) {
      kiln_fail(KILN_ERR_MEMORY, "conv2d_backward: out of memory for oneDNN's weight grads");
      rc = -1;
    }
  }
  if (rc == 0) {
    void *any = j.plan[KILN_ONEDNN_FORWARD][0] ? j.plan[KILN_ONEDNN_FORWARD][0]
              : j.plan[KILN_ONEDNN_BACKWARD_DATA][0] ? j.plan[KILN_ONEDNN_BACKWARD_DATA][0]
                                                     : j.plan[KILN_ONEDNN_BACKWARD_WEIGHTS][0];
    if (impl && any) snprintf(impl, nimpl, "%s", lib->impl(any));
    kiln_parallel_for(c->parts, 1, run_parts, &j);
    if (!j.failed && j.gwb) {
      char err[256];
      if (j.folded < c->parts) kiln_parallel_for((int64_t)(gw_bytes / sizeof(float)), 16384, sum_gw, &j);
      if (lib->grad_weights_out(wplan, j.gwb, c->gw ? c->gw : c->partials, err, sizeof err)) fail_job(&j, err);
      else c->partials_summed = 1;
    }
    if (j.failed) { kiln_fail(strstr(j.err, "out of memory") ? KILN_ERR_MEMORY : KILN_ERR_UNSUPPORTED, "conv2d%s: %s", c->y || c->epilogue ? "" : "_backward", j.err); rc = -1; }
  }
  job_free(&j);
  return rc;
}

/* c by im2col, whatever oneDNN left in partials before (benchmark mode runs both) */
static int run_im2col(struct kiln_conv_job *c) {
  c->partials_summed = 0;
  return c->im2col(c->ctx);
}

/* the choice of the rule (not timed) for k, for kiln.conv_choices, where none is kept yet */
static struct choice_entry *entry_for(const struct choice_key *k) {   /* found or made (NULL: no memory); cache_mu held */
  struct choice_entry *e = choice_find(k);
  if (!e && (e = calloc(1, sizeof *e))) {
    e->key = *k;
    e->next = choices;
    choices = e;
    nchoices++;
  }
  return e;
}
static void remember(const struct choice_key *k, int algo) {
  pthread_mutex_lock(&cache_mu);
  struct choice_entry *e = choice_find(k);
  if (!e && (e = entry_for(k))) e->algo = algo;
  pthread_mutex_unlock(&cache_mu);
}

/* Whether the auto rule sends c to Winograd where it takes the shape: always in f32; in bf16 where
   the CPU's bf16 products are no faster than its f32 ones (cpu/backend.c's measure) and it has no
   AMX: there Winograd's f32 arithmetic beats oneDNN's bf16 kernels (Emerald Rapids without AMX,
   the CNN's second layer: 6.2 against 16.6 ms forward and backward), while oneDNN's AMX kernels,
   and its vdpbf16ps ones on a CPU that runs vdpbf16ps at full rate, are kept. */
static int winograd_by_rule(const struct kiln_conv_job *c) {
  return c->dtype != KILN_BF16 || (!kiln_cpu_bf16_fast() && !kiln_cpu_has("amx_bf16"));
}

/* c by kiln's Winograd kernels (cpu/winograd.c; c->winograd is set where they take the shape) */
static int run_winograd(struct kiln_conv_job *c) {
  c->partials_summed = 0;
  return c->winograd(c);
}

int kiln_cpu_conv_fused_way(const struct kiln_conv_job *c, int input_grad) {
  int forced = forced_algo();
  if (forced == ALGO_IM2COL) return 1;
  if (c->winograd && (forced == ALGO_WINOGRAD || (forced < 0 && !benchmark_mode() && winograd_by_rule(c)) || !onednn()))
    return 0;
  if (!onednn()) return 1;
  if (forced < 0 && benchmark_mode()) return -1;
  /* the auto rule's one-channel cases, as below */
  if (forced < 0 && ((input_grad && c->C == c->G) || (c->dtype == KILN_BF16 && c->C == 1))) return 1;
  return 0;
}

int kiln_cpu_conv_run(struct kiln_conv_job *c) {
  int forced = forced_algo();
  int bench = forced < 0 && benchmark_mode();
  c->ran_onednn = 0;
  c->partials_summed = 0;
  if (c->epilogue || c->prologue) {   /* a fused layer, where kiln_cpu_conv_fused_way sent it */
    if (c->winograd && (forced == ALGO_WINOGRAD || (forced < 0 && !bench && winograd_by_rule(c)) || !onednn())) {
      int rc = run_winograd(c);
      if (rc != 1) return rc;
      c->winograd = NULL;   /* not taken (an infinity or a NaN): oneDNN's, else the three ops' */
    }
    if (!onednn()) return 1;
    int rc = run_onednn(c, NULL, 0);
    if (rc < 0) return kiln_error_code();
    if (rc == 1 && c->winograd) return run_winograd(c);   /* its forward ran there */
    c->ran_onednn = rc == 0;
    return rc;
  }
  if (forced == ALGO_IM2COL || (c->dtype != KILN_F32 && c->dtype != KILN_BF16)) return run_im2col(c);
  /* the auto rule: kiln's Winograd wherever it takes the shape and winograd_by_rule (bench/conv.lua:
     2-3x oneDNN's speed on the benchmark CNN's second convolution, Zen 5), else oneDNN */
  struct choice_key k;
  memset(&k, 0, sizeof k);
  k.backward = c->y == NULL; k.gx = c->gx != NULL; k.gw = c->partials != NULL; k.dtype = c->dtype;
  k.N = c->N; k.C = c->C; k.H = c->H; k.W = c->W; k.O = c->O; k.OH = c->OH; k.OW = c->OW; k.kh = c->kh; k.kw = c->kw;
  k.sh = c->sh; k.sw = c->sw; k.ph = c->ph; k.pw = c->pw; k.dh = c->dh; k.dw = c->dw; k.G = c->G;
  if (c->winograd && (forced == ALGO_WINOGRAD || (forced < 0 && !bench && winograd_by_rule(c)))) {
    if (forced < 0) remember(&k, ALGO_WINOGRAD);
    int rc = run_winograd(c);
    if (rc != 1) return rc;
    c->winograd = NULL;   /* not taken (an infinity or a NaN): as the rule goes without it */
  }
  if (!onednn() && !(bench && c->winograd)) return run_im2col(c);
  /* measured (bench/conv.lua): oneDNN's grad of a one-channel input (a first layer whose input
     requires grad) runs 1.8-2.3x slower than im2col's, f32 and bf16; in bf16 its forward and weight
     grad of a one-channel input lose too (the CNN's first layer, Zen 5, 1 thread: 0.64 against
     0.55-0.63 ms, and 0.59-0.61 against 0.38-0.42); the rest of its passes win */
  int one_channel_im2col = forced < 0 && !bench && ((c->gx && c->C == c->G) || (c->dtype == KILN_BF16 && c->C == 1));
  pthread_mutex_lock(&cache_mu);
  struct choice_entry *e = choice_find(&k);
  int known = e && (!bench || e->im2col_ms > 0 || e->algo == ALGO_IM2COL);
  int algo = e ? e->algo : ALGO_ONEDNN;
  pthread_mutex_unlock(&cache_mu);
  if (known && algo == ALGO_IM2COL) return run_im2col(c);
  if (known && algo == ALGO_WINOGRAD && c->winograd && forced != ALGO_ONEDNN) {
    int rc = run_winograd(c);
    if (rc != 1) return rc;
    c->winograd = NULL;
    known = 0;
  }
  char impl[64] = "";
  double im2col_ms = 0, onednn_ms = 0, winograd_ms = 0;
  int rc = 1;    /* 1: oneDNN not taken */
  int ran = -1;  /* whose result c holds */
  if (!known && bench) {
    /* time each, twice, and keep the fastest's best; oneDNN's plans (its kernels are generated
       when a plan is made) are made first, outside the timing. This call's result is the fastest
       one's too: each path writes every output afresh. */
    if (onednn()) {
      struct job warm;
      if ((rc = job_init(&warm, c)) < 0) { job_free(&warm); return kiln_error_code(); }
      job_free(&warm);
    }
    for (int r = 0; r < 2; r++) {
      double t0 = now_ms();
      if ((rc = run_im2col(c))) return rc;
      double t = now_ms() - t0;
      if (r == 0 || t < im2col_ms) im2col_ms = t;
    }
    rc = 1;
    ran = ALGO_IM2COL;
  }
  for (int r = 0; onednn() && r < (one_channel_im2col ? 0 : !known && bench ? 2 : 1); r++) {
    double t0 = now_ms();
    rc = run_onednn(c, impl, sizeof impl);
    double t = now_ms() - t0;
    if (rc) break;
    ran = ALGO_ONEDNN;
    if (r == 0 || t < onednn_ms) onednn_ms = t;
  }
  if (rc < 0) return kiln_error_code();
  for (int r = 0; !known && bench && c->winograd && r < 2; r++) {
    double t0 = now_ms();
    int wrc = run_winograd(c);
    if (wrc == 1) { winograd_ms = 0; break; }   /* not taken: an infinity or a NaN */
    if (wrc) return kiln_error_code();
    double t = now_ms() - t0;
    if (r == 0 || t < winograd_ms) winograd_ms = t;
    ran = ALGO_WINOGRAD;
  }
  int best = rc == 0 ? ALGO_ONEDNN : ALGO_IM2COL;
  if (!known) {
    if (bench && rc == 0 && im2col_ms < onednn_ms) best = ALGO_IM2COL;
    if (winograd_ms > 0 && winograd_ms < (best == ALGO_ONEDNN ? onednn_ms : im2col_ms)) best = ALGO_WINOGRAD;
    pthread_mutex_lock(&cache_mu);
    if ((e = entry_for(&k))) {
      e->algo = best;
      e->im2col_ms = im2col_ms;
      e->onednn_ms = rc == 1 ? 0 : onednn_ms;
      e->winograd_ms = winograd_ms;
      snprintf(e->impl, sizeof e->impl, "%s", rc == 1 ? "" : impl);
    }
    pthread_mutex_unlock(&cache_mu);
  }
  /* the choice's result, where another path ran last (benchmark mode) or none did */
  if (best != ran) {
    if (best == ALGO_IM2COL) return run_im2col(c);
    if (best == ALGO_WINOGRAD && (rc = run_winograd(c)) != 1) return rc;
    if (best == ALGO_WINOGRAD) return rc == 0 ? KILN_OK : run_im2col(c);
    c->partials_summed = 0;   /* as another path left it */
    if ((rc = run_onednn(c, NULL, 0)) < 0) return kiln_error_code();
    if (rc == 1) return run_im2col(c);
  }
  c->ran_onednn = best == ALGO_ONEDNN;
  return KILN_OK;
}

KILN_API int64_t kiln_conv_choice_count(void) {
  pthread_mutex_lock(&cache_mu);
  int64_t n = nchoices;
  pthread_mutex_unlock(&cache_mu);
  return n;
}

/* Choice i (0 = the oldest) as one line; NULL past the end. The text lives until the next call. */
KILN_API const char *kiln_conv_choice(int64_t i) {
  static __thread char line[400];
  pthread_mutex_lock(&cache_mu);
  struct choice_entry *e = choices;
  for (int64_t k = nchoices - 1; e && k > i; k--) e = e->next;
  if (!e || i < 0) { pthread_mutex_unlock(&cache_mu); return NULL; }
  const struct choice_key *k = &e->key;
  char wino[48] = "";
  if (e->winograd_ms > 0) snprintf(wino, sizeof wino, ", winograd %.3f ms", e->winograd_ms);
  int n = snprintf(line, sizeof line,
                   "%s%s%s %s x [%lld,%lld,%lld,%lld] w [%lld,%lld,%lld,%lld] stride %lld,%lld pad %lld,%lld dilation "
                   "%lld,%lld groups %lld: %s%s%s",
                   k->backward ? "backward" : "forward", k->backward && k->gx ? " input" : "",
                   k->backward && k->gw ? " weight" : "", kiln_dtype_name(k->dtype), (long long)k->N, (long long)k->C, (long long)k->H,
                   (long long)k->W, (long long)k->O, (long long)(k->C / (k->G ? k->G : 1)), (long long)k->kh,
                   (long long)k->kw, (long long)k->sh, (long long)k->sw, (long long)k->ph, (long long)k->pw,
                   (long long)k->dh, (long long)k->dw, (long long)k->G, e->algo == ALGO_ONEDNN ? "onednn" : e->algo == ALGO_WINOGRAD ? "winograd" : "im2col",
                   e->algo == ALGO_ONEDNN && e->impl[0] ? " " : "", e->algo == ALGO_ONEDNN ? e->impl : "");
  if (e->im2col_ms > 0 && n > 0 && (size_t)n < sizeof line)
    snprintf(line + n, sizeof line - (size_t)n, " (timed: im2col %.3f ms, onednn %.3f ms%s%s%s)", e->im2col_ms, e->onednn_ms,
             e->algo != ALGO_ONEDNN && e->impl[0] ? " by " : "", e->algo != ALGO_ONEDNN ? e->impl : "", wino);
  pthread_mutex_unlock(&cache_mu);
  return line;
}

KILN_API void kiln_conv_choices_clear(void) {
  pthread_mutex_lock(&cache_mu);
  while (choices) {
    struct choice_entry *e = choices;
    choices = e->next;
    free(e);
  }
  nchoices = 0;
  pthread_mutex_unlock(&cache_mu);
}

/* ---- bf16 matrix products by oneDNN's matmul ----

   Where the CPU has AMX (amx_bf16 usable), bf16 x bf16 -> bf16 products run as oneDNN's matmul,
   whose kernels use AMX's tiles; elsewhere kiln's own (vdpbf16ps, or f32 FMAs on the widened
   values: cpu/gemm.c). KILN_BF16_MATMUL=onednn forces oneDNN on any CPU (its AVX512-BF16 or
   emulated kernels: the tests check its results here), =kiln never. Each matrix of the batch is
   cut into fixed parts of 64 rows by 512 columns (whatever the threads: a part is one oneDNN
   call, and its sums do not depend on the thread count), run by kiln's pool. */

enum { MATMUL_ROWS = 64, MATMUL_COLS = 512 };

static void *matmul_plan_for(const struct kiln_onednn_matmul *s, char *err, size_t n) { return cached_plan(NULL, s, err, n); }

int kiln_cpu_onednn_matmul_wanted(void) {
  static int wanted = -1;
  if (wanted < 0) {
    const char *e = getenv("KILN_BF16_MATMUL");
    int forced = e && !strcmp(e, "onednn"), never = e && !strcmp(e, "kiln");
    wanted = !never && (forced || kiln_cpu_has("amx_bf16")) && onednn() != NULL;
  }
  return wanted;
}

const char *kiln_cpu_onednn_matmul_impl(void) {
  static char impl[64];
  if (!impl[0] && kiln_cpu_onednn_matmul_wanted()) {
    char err[200];
    struct kiln_onednn_matmul s = {MATMUL_ROWS, 256, 256, 256, 1, 256, 1, 256};
    void *p = matmul_plan_for(&s, err, sizeof err);
    snprintf(impl, sizeof impl, "%s", p && lib->impl(p) ? lib->impl(p) : "?");
  }
  return impl;
}

struct matmul_job {
  const char *a, *b;
  char *c;
  int64_t sa, sb, sc;            /* batch strides, in elements (0: one matrix for the batch) */
  struct kiln_onednn_matmul whole;
  int64_t rparts, cparts;        /* of each matrix: by rows, by columns */
  int failed;
  char err[200];
  pthread_mutex_t mu;
};

static void matmul_parts(void *ctx, int64_t begin, int64_t end) {
  struct matmul_job *j = ctx;
  for (int64_t t = begin; t < end; t++) {
    int64_t per = j->rparts * j->cparts, bi = t / per;
    int64_t r0 = t % per / j->cparts * MATMUL_ROWS, c0 = t % j->cparts * MATMUL_COLS;
    struct kiln_onednn_matmul s = j->whole;
    s.m = j->whole.m - r0 < MATMUL_ROWS ? j->whole.m - r0 : MATMUL_ROWS;
    s.n = j->whole.n - c0 < MATMUL_COLS ? j->whole.n - c0 : MATMUL_COLS;
    char err[200] = "";
    void *plan = matmul_plan_for(&s, err, sizeof err);
    void *ws = plan ? kiln_cpu_scratch(lib->workspace_bytes(plan)) : NULL;
    int rc = !plan || !ws ? -1
             : lib->matmul_run(plan, j->a + 2 * (bi * j->sa + r0 * s.ars), j->b + 2 * (bi * j->sb + c0 * s.bcs),
                               j->c + 2 * (bi * j->sc + r0 * s.ldc + c0), ws, err, sizeof err);
    free(ws);
    if (rc) {
      pthread_mutex_lock(&j->mu);
      if (!j->failed) snprintf(j->err, sizeof j->err, "%s", plan && !ws ? "out of memory for oneDNN's scratchpad" : err);
      j->failed = 1;
      pthread_mutex_unlock(&j->mu);
    }
  }
}

/* out [B, m, n] = a [B, m, k] b [B, k, n], all bf16 (batch strides 0 for a shared matrix): 1 when
   oneDNN ran it (*rc its status), 0 when not taken (no library, an output that is not row-major,
   no kernel for a shape), before anything was written. */
int kiln_cpu_onednn_gemm(struct kiln_tensor *out, const struct kiln_tensor *a, const struct kiln_tensor *b, int *rc) {
  if (!kiln_cpu_onednn_matmul_wanted() || out->strides[2] != 1 || out->sizes[1] < 1 || out->sizes[2] < 1 || a->sizes[2] < 1)
    return 0;
  struct matmul_job j = {.a = kiln_tensor_data(a), .b = kiln_tensor_data(b), .c = kiln_tensor_data(out),
                         .sa = a->sizes[0] > 1 ? a->strides[0] : 0, .sb = b->sizes[0] > 1 ? b->strides[0] : 0,
                         .sc = out->strides[0], .mu = PTHREAD_MUTEX_INITIALIZER};
  j.whole = (struct kiln_onednn_matmul){out->sizes[1], out->sizes[2], a->sizes[2], a->strides[1], a->strides[2], b->strides[1],
                                        b->strides[2], out->strides[1]};
  j.rparts = (j.whole.m + MATMUL_ROWS - 1) / MATMUL_ROWS;
  j.cparts = (j.whole.n + MATMUL_COLS - 1) / MATMUL_COLS;
  /* every part's plan made first (4 shapes at most): one oneDNN has no kernel for leaves the
     product to kiln */
  char err[200];
  int64_t rows[2] = {MATMUL_ROWS, j.whole.m - (j.rparts - 1) * MATMUL_ROWS};
  int64_t cols[2] = {MATMUL_COLS, j.whole.n - (j.cparts - 1) * MATMUL_COLS};
  for (int r = j.rparts > 1 ? 0 : 1; r < 2; r++)
    for (int q = j.cparts > 1 ? 0 : 1; q < 2; q++) {
      struct kiln_onednn_matmul s = j.whole;
      s.m = rows[r];
      s.n = cols[q];
      if (!matmul_plan_for(&s, err, sizeof err)) return 0;
    }
  kiln_parallel_for(out->sizes[0] * j.rparts * j.cparts, 1, matmul_parts, &j);
  *rc = !j.failed ? KILN_OK
        : kiln_fail(strstr(j.err, "out of memory") ? KILN_ERR_MEMORY : KILN_ERR_UNSUPPORTED, "matmul (bf16, oneDNN): %s", j.err);
  return 1;
}
