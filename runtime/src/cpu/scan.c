/* cpu/scan.c: the CPU kernels along one dim: cumsum and cumprod (and cumprod's backward) and a
   stable argsort (all of each line, or its first k). The front end (ops/scan.c) gives contiguous operands in the compute dtype (f32,
   f64 or i64) and the dim in ints[0]; a tensor is seen as [outer, n, inner] around that dim, and
   each of the outer * inner lines is independent: kiln's thread pool takes them in ranges, each
   line computed by one loop, so results do not depend on the thread count. */
#include "cpu.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct lines { int64_t outer, n, inner; };

static struct lines lines_of(const struct kiln_tensor *t, int d) {
  struct lines l = {1, 1, 1};
  for (int k = 0; k < t->ndim; k++) {
    if (k < d) l.outer *= t->sizes[k];
    else if (k == d) l.n = t->sizes[k];
    else l.inner *= t->sizes[k];
  }
  return l;
}

/* The first element of line t (of outer * inner). */
static inline int64_t line_base(struct lines l, int64_t t) { return (t / l.inner) * l.n * l.inner + t % l.inner; }

/* Lines per task of the thread pool: about 32768 elements. */
static int64_t line_grain(struct lines l) { return l.n > 0 && l.n < 32768 ? 32768 / l.n : 1; }

/* One call cut into ranges of lines for the thread pool. */
struct job {
  const struct kiln_call *c;
  struct lines l;
  int failed;
};

/* ---- cumsum, cumprod: f32 sums and products run in double (PyTorch's CPU does the same) ---- */

static inline __attribute__((always_inline)) void scan_f32(int op, struct lines l, int64_t b, int64_t e, float *o,
                                                           const float *a) {
  for (int64_t t = b; t < e; t++) {
    int64_t base = line_base(l, t);
    double acc = op == KILN_OP_CUMSUM ? 0.0 : 1.0;
    for (int64_t i = 0; i < l.n; i++) {
      int64_t k = base + i * l.inner;
      acc = op == KILN_OP_CUMSUM ? acc + a[k] : acc * a[k];
      o[k] = (float)acc;
    }
  }
}
static inline __attribute__((always_inline)) void scan_f64(int op, struct lines l, int64_t b, int64_t e, double *o,
                                                           const double *a) {
  for (int64_t t = b; t < e; t++) {
    int64_t base = line_base(l, t);
    double acc = op == KILN_OP_CUMSUM ? 0.0 : 1.0;
    for (int64_t i = 0; i < l.n; i++) {
      int64_t k = base + i * l.inner;
      acc = op == KILN_OP_CUMSUM ? acc + a[k] : acc * a[k];
      o[k] = acc;
    }
  }
}
/* integers wrap through unsigned, as the elementwise ops do */
static inline __attribute__((always_inline)) void scan_i64(int op, struct lines l, int64_t b, int64_t e, int64_t *o,
                                                           const int64_t *a) {
  for (int64_t t = b; t < e; t++) {
    int64_t base = line_base(l, t);
    uint64_t acc = op == KILN_OP_CUMSUM ? 0 : 1;
    for (int64_t i = 0; i < l.n; i++) {
      int64_t k = base + i * l.inner;
      acc = op == KILN_OP_CUMSUM ? acc + (uint64_t)a[k] : acc * (uint64_t)a[k];
      o[k] = (int64_t)acc;
    }
  }
}
static void cumsum_f32(struct lines l, int64_t b, int64_t e, void *o, const void *a) { scan_f32(KILN_OP_CUMSUM, l, b, e, o, a); }
static void cumsum_f64(struct lines l, int64_t b, int64_t e, void *o, const void *a) { scan_f64(KILN_OP_CUMSUM, l, b, e, o, a); }
static void cumsum_i64(struct lines l, int64_t b, int64_t e, void *o, const void *a) { scan_i64(KILN_OP_CUMSUM, l, b, e, o, a); }
static void cumprod_f32(struct lines l, int64_t b, int64_t e, void *o, const void *a) { scan_f32(KILN_OP_CUMPROD, l, b, e, o, a); }
static void cumprod_f64(struct lines l, int64_t b, int64_t e, void *o, const void *a) { scan_f64(KILN_OP_CUMPROD, l, b, e, o, a); }
static void cumprod_i64(struct lines l, int64_t b, int64_t e, void *o, const void *a) { scan_i64(KILN_OP_CUMPROD, l, b, e, o, a); }

static void scan_range(void *ctx, int64_t b, int64_t e) {
  const struct job *j = ctx;
  const struct kiln_call *c = j->c;
  void *o = kiln_tensor_data(c->out);
  const void *x = kiln_tensor_data(c->in[0]);
  int cum = c->op == KILN_OP_CUMSUM;
  switch (c->in[0]->dtype) {
  case KILN_F32: cum ? cumsum_f32(j->l, b, e, o, x) : cumprod_f32(j->l, b, e, o, x); break;
  case KILN_F64: cum ? cumsum_f64(j->l, b, e, o, x) : cumprod_f64(j->l, b, e, o, x); break;
  default: cum ? cumsum_i64(j->l, b, e, o, x) : cumprod_i64(j->l, b, e, o, x); break;
  }
}

int cpu_scan(const struct kiln_call *c) {
  const struct kiln_tensor *a = c->in[0];
  if (a->dtype != KILN_F32 && a->dtype != KILN_F64 && a->dtype != KILN_I64)
    return kiln_fail(KILN_ERR_DTYPE, "%s: no CPU kernel for %s", kiln_op_name(c->op), kiln_dtype_name(a->dtype));
  struct job j = {c, lines_of(a, (int)c->ints[0]), 0};
  if (j.l.n > 0) kiln_parallel_for(j.l.outer * j.l.inner, line_grain(j.l), scan_range, &j);
  return KILN_OK;
}

/* The grad of y = cumprod(x) along a line, without dividing by x (exact where x has zeros):
   gx[i] = prod(x[0..i-1]) * S[i], S[i] = g[i] + x[i+1] * S[i+1], S[n-1] = g[n-1]. */
static void cumprod_backward_f64(struct lines l, int64_t b, int64_t e, double *gx, const double *g, const double *x) {
  for (int64_t t = b; t < e; t++) {
    int64_t base = line_base(l, t);
    double s = 0;
    for (int64_t i = l.n - 1; i >= 0; i--) {
      int64_t k = base + i * l.inner;
      s = i == l.n - 1 ? g[k] : g[k] + x[k + l.inner] * s;
      gx[k] = s;   /* S[i], times the prefix below */
    }
    double prefix = 1;
    for (int64_t i = 0; i < l.n; i++) {
      int64_t k = base + i * l.inner;
      gx[k] *= prefix;
      prefix *= x[k];
    }
  }
}
static void cumprod_backward_f32(struct lines l, int64_t b, int64_t e, float *gx, const float *g, const float *x) {
  for (int64_t t = b; t < e; t++) {
    int64_t base = line_base(l, t);
    float s = 0;
    for (int64_t i = l.n - 1; i >= 0; i--) {
      int64_t k = base + i * l.inner;
      s = i == l.n - 1 ? g[k] : g[k] + x[k + l.inner] * s;
      gx[k] = s;
    }
    float prefix = 1;
    for (int64_t i = 0; i < l.n; i++) {
      int64_t k = base + i * l.inner;
      gx[k] *= prefix;
      prefix *= x[k];
    }
  }
}

static void cumprod_backward_range(void *ctx, int64_t b, int64_t e) {
  const struct job *j = ctx;
  const struct kiln_call *c = j->c;
  if (c->in[1]->dtype == KILN_F64)
    cumprod_backward_f64(j->l, b, e, kiln_tensor_data(c->out), kiln_tensor_data(c->in[0]), kiln_tensor_data(c->in[1]));
  else cumprod_backward_f32(j->l, b, e, kiln_tensor_data(c->out), kiln_tensor_data(c->in[0]), kiln_tensor_data(c->in[1]));
}

int cpu_cumprod_backward(const struct kiln_call *c) {
  const struct kiln_tensor *x = c->in[1];
  if (x->dtype != KILN_F64 && x->dtype != KILN_F32)
    return kiln_fail(KILN_ERR_DTYPE, "cumprod_backward: no CPU kernel for %s", kiln_dtype_name(x->dtype));
  struct job j = {c, lines_of(x, (int)c->ints[0]), 0};
  if (j.l.n > 0) kiln_parallel_for(j.l.outer * j.l.inner, line_grain(j.l), cumprod_backward_range, &j);
  return KILN_OK;
}

/* ---- argsort: a stable merge sort of each line's indices by key; NaN sorts above every number
   (last ascending, first descending), as in PyTorch ---- */

static inline int before_f64(double a, double b, int desc) {
  if (desc) return a > b || (isnan(a) && !isnan(b));
  return a < b || (!isnan(a) && isnan(b));
}
static inline int before_i64(int64_t a, int64_t b, int desc) { return desc ? a > b : a < b; }

/* Sort idx[0..n) (positions along the line) by key[idx * step]; tmp holds n indices. Bottom-up:
   runs of width w merged pairwise, the left run first on ties (stable). */
#define MERGE_SORT(name, T, before)                                                                        \
  static void name(int64_t n, int64_t *idx, int64_t *tmp, const T *key, int64_t step, int desc) {          \
    for (int64_t w = 1; w < n; w *= 2) {                                                                   \
      for (int64_t lo = 0; lo < n; lo += 2 * w) {                                                          \
        int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;                       \
        int64_t i = lo, j = mid, k = lo;                                                                   \
        while (i < mid && j < hi) tmp[k++] = before(key[idx[j] * step], key[idx[i] * step], desc) ? idx[j++] : idx[i++]; \
        while (i < mid) tmp[k++] = idx[i++];                                                               \
        while (j < hi) tmp[k++] = idx[j++];                                                                \
      }                                                                                                    \
      memcpy(idx, tmp, sizeof(int64_t) * (size_t)n);                                                       \
    }                                                                                                      \
  }
MERGE_SORT(sort_line_f64, double, before_f64)
MERGE_SORT(sort_line_i64, int64_t, before_i64)

/* The k first positions of a line in sorted order, for k well below n: an insertion into a sorted
   list of k that most elements leave at one comparison with its last; a later element goes after
   the equal ones and never displaces an equal last, so the result is the stable sort's first k. */
#define TOP_K(name, T, before)                                                                             \
  static void name(int64_t n, int64_t k, int64_t *idx, const T *key, int64_t step, int desc) {             \
    int64_t m = 0;                                                                                         \
    for (int64_t j = 0; j < n; j++) {                                                                      \
      T v = key[j * step];                                                                                 \
      if (m == k && !before(v, key[idx[k - 1] * step], desc)) continue;                                    \
      int64_t p = m < k ? m++ : k - 1;                                                                     \
      while (p > 0 && before(v, key[idx[p - 1] * step], desc)) { idx[p] = idx[p - 1]; p--; }               \
      idx[p] = j;                                                                                          \
    }                                                                                                      \
  }
TOP_K(top_line_f64, double, before_f64)
TOP_K(top_line_i64, int64_t, before_i64)

/* Partial selection pays while k is small against the line. */
static int partial(int64_t k, int64_t n) { return k < n && k <= 64 && k * 8 <= n; }

/* A range of lines; each task has its own buffers (positions, merge space, f32 keys as double). */
static void argsort_range(void *ctx, int64_t b, int64_t e) {
  struct job *j = ctx;
  const struct kiln_tensor *a = j->c->in[0];
  struct lines l = j->l;
  int desc = (int)j->c->ints[1];
  int64_t k = j->c->ints[2];
  int64_t *o = kiln_tensor_data(j->c->out);
  int64_t *buf = malloc(sizeof(int64_t) * 2 * (size_t)l.n);
  double *keys = a->dtype == KILN_F32 ? malloc(sizeof(double) * (size_t)l.n) : NULL;
  if (!buf || (a->dtype == KILN_F32 && !keys)) {
    __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
    free(buf);
    free(keys);
    return;
  }
  int64_t *idx = buf, *tmp = buf + l.n;
  int part = partial(k, l.n);
  for (int64_t t = b; t < e; t++) {
    int64_t base = line_base(l, t), step = l.inner;
    const void *key = (const char *)kiln_tensor_data(a) + base * kiln_dtype_size(a->dtype);
    if (a->dtype == KILN_F32) {
      const float *x = key;
      for (int64_t i = 0; i < l.n; i++) keys[i] = x[i * l.inner];   /* exact: every float is a double */
      key = keys;
      step = 1;
    }
    if (part) {
      if (a->dtype == KILN_I64) top_line_i64(l.n, k, idx, key, step, desc);
      else top_line_f64(l.n, k, idx, key, step, desc);
    } else {
      for (int64_t i = 0; i < l.n; i++) idx[i] = i;
      if (a->dtype == KILN_I64) sort_line_i64(l.n, idx, tmp, key, step, desc);
      else sort_line_f64(l.n, idx, tmp, key, step, desc);
    }
    int64_t out_base = (t / l.inner) * k * l.inner + t % l.inner;
    for (int64_t i = 0; i < k; i++) o[out_base + i * l.inner] = idx[i];
  }
  free(buf);
  free(keys);
}

int cpu_argsort(const struct kiln_call *c) {
  const struct kiln_tensor *a = c->in[0];
  if (a->dtype != KILN_F32 && a->dtype != KILN_F64 && a->dtype != KILN_I64)
    return kiln_fail(KILN_ERR_DTYPE, "argsort: no CPU kernel for %s", kiln_dtype_name(a->dtype));
  struct job j = {c, lines_of(a, (int)c->ints[0]), 0};
  if (j.l.n == 0 || j.l.outer * j.l.inner == 0 || c->ints[2] == 0) return KILN_OK;
  kiln_parallel_for(j.l.outer * j.l.inner, line_grain(j.l), argsort_range, &j);
  if (j.failed) return kiln_fail(KILN_ERR_MEMORY, "argsort: out of memory for lines of %lld elements", (long long)j.l.n);
  return KILN_OK;
}
