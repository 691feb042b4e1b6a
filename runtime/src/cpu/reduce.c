/* cpu/reduce.c: reductions on the CPU. The input is seen as rows [M, R] (kept dims first, reduced
   dims last), each row cut into fixed chunks; partial results combine in order, so results do
   not depend on the thread count. Floats accumulate in double. */
#include "cpu.h"
#include "convert.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { CHUNK = 32768 };

struct acc {
  double s, m, q;   /* sum (or product, or the max for logsumexp), mean, M2 */
  int64_t n, idx;   /* count, index of the max/min */
  int64_t is;       /* integer sum, product, max or min */
};

struct job {
  int op;
  int ints;             /* 1: exact integer path on i64 data */
  int dtype;            /* of the rows: f32, f64 or i64 */
  const char *x;        /* [M, R] contiguous */
  int64_t M, R, nchunks;
  double p;
  struct acc *accs;     /* [M, nchunks] */
};

/* Sums of a chunk in LANES independent double accumulators (element i goes to lane i % LANES),
   folded in a fixed tree at the end: the same order whatever the thread count, and no chain of
   dependent adds (one add in flight at a time ran at a quarter of the memory's speed). */
enum { LANES = 32 };
enum lane_term { TERM_V, TERM_SQUARE, TERM_ABS, TERM_DEVIATION };

/* Element i of an f32 or f64 chunk, as double. Inlined with dt a constant, it is one load. */
static inline __attribute__((always_inline)) double load(const void *x, int dt, int64_t i) {
  return dt == KILN_F32 ? (double)((const float *)x)[i] : ((const double *)x)[i];
}

static inline __attribute__((always_inline)) double lane_sum(const void *x, int dt, int64_t n, int term, double mean) {
  double l[LANES] = {0};
  int64_t i = 0;
#define TERM(v) (term == TERM_V ? (v) : term == TERM_SQUARE ? (v) * (v) : term == TERM_ABS ? fabs(v) : ((v) - mean) * ((v) - mean))
  for (; i + LANES <= n; i += LANES)
    for (int k = 0; k < LANES; k++) { double v = load(x, dt, i + k); l[k] += TERM(v); }
  for (int k = 0; i < n; i++, k++) { double v = load(x, dt, i); l[k] += TERM(v); }
#undef TERM
  return kiln_fold_lanes(l, LANES);
}

static double lsum_f32(const float *x, int64_t n) { return lane_sum(x, KILN_F32, n, TERM_V, 0); }
static double lsum_f64(const double *x, int64_t n) { return lane_sum(x, KILN_F64, n, TERM_V, 0); }
static double lsq_f32(const float *x, int64_t n) { return lane_sum(x, KILN_F32, n, TERM_SQUARE, 0); }
static double lsq_f64(const double *x, int64_t n) { return lane_sum(x, KILN_F64, n, TERM_SQUARE, 0); }
static double labs_f32(const float *x, int64_t n) { return lane_sum(x, KILN_F32, n, TERM_ABS, 0); }
static double labs_f64(const double *x, int64_t n) { return lane_sum(x, KILN_F64, n, TERM_ABS, 0); }
static double ldev_f32(const float *x, int64_t n, double mean) { return lane_sum(x, KILN_F32, n, TERM_DEVIATION, mean); }
static double ldev_f64(const double *x, int64_t n, double mean) { return lane_sum(x, KILN_F64, n, TERM_DEVIATION, mean); }

/* The max (or min) of an f32 chunk and the index of its first occurrence, in 16 vector lanes
   (element i in lane i % 16), each keeping its best value and where it was, then folded: a NaN
   anywhere wins at its first index, else the best value at its first index, as the loop over
   elements gives. */
static void extreme_f32(const float *x, int64_t n, int want_max, float *value, int64_t *index) {
  kiln_vf16 best;
  kiln_vi16 at = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, cur = at;
  memcpy(&best, x, sizeof best);
  int64_t i = 16;
  for (; i + 16 <= n; i += 16) {
    kiln_vf16 v;
    memcpy(&v, x + i, sizeof v);
    cur += 16;
    kiln_vi16 take = (want_max ? v > best : v < best) | ((v != v) & (best == best));
    best = (kiln_vf16)(((kiln_vi16)v & take) | ((kiln_vi16)best & ~take));
    at = (cur & take) | (at & ~take);
  }
  float bv[16];
  int64_t bi[16];
  for (int k = 0; k < 16; k++) { bv[k] = best[k]; bi[k] = at[k]; }
  for (int k = 0; i < n; i++, k++) {
    float v = x[i];
    if ((want_max ? v > bv[k] : v < bv[k]) || (v != v && bv[k] == bv[k])) { bv[k] = v; bi[k] = i; }
  }
  int w = 0;
  for (int k = 1; k < 16; k++) {
    int nan_k = bv[k] != bv[k], nan_w = bv[w] != bv[w];
    if (nan_w) { if (nan_k && bi[k] < bi[w]) w = k; continue; }
    if (nan_k || (want_max ? bv[k] > bv[w] : bv[k] < bv[w]) || (bv[k] == bv[w] && bi[k] < bi[w])) w = k;
  }
  *value = bv[w];
  *index = bi[w];
}

/* The partial result of op over one chunk of an f32 or f64 row; base is the chunk's first index. */
static inline __attribute__((always_inline)) void chunk_float(int op, const void *x, int dt, int64_t n, int64_t base,
                                                             double p, struct acc *a) {
  memset(a, 0, sizeof *a);
  a->n = n;
  switch (op) {
  case KILN_OP_SUM: case KILN_OP_MEAN: a->s = dt == KILN_F32 ? lsum_f32(x, n) : lsum_f64(x, n); break;
  case KILN_OP_PROD: { double s = 1; for (int64_t i = 0; i < n; i++) s *= load(x, dt, i); a->s = s; break; }
  case KILN_OP_MAX: case KILN_OP_ARGMAX: case KILN_OP_MIN: case KILN_OP_ARGMIN: {
    int want_max = op == KILN_OP_MAX || op == KILN_OP_ARGMAX;
    if (dt == KILN_F32 && n >= 32) {
      float v;
      int64_t at;
      extreme_f32(x, n, want_max, &v, &at);
      a->s = v;
      a->idx = base + at;
      break;
    }
    double best = load(x, dt, 0);
    int64_t bi = 0;
    for (int64_t i = 1; i < n && best == best; i++) {
      double v = load(x, dt, i);
      if (v != v || (want_max ? v > best : v < best)) { best = v; bi = i; }
    }
    a->s = best;
    a->idx = base + bi;
    break;
  }
  case KILN_OP_VAR: case KILN_OP_STD: {
    double mean = n ? (dt == KILN_F32 ? lsum_f32(x, n) : lsum_f64(x, n)) / (double)n : 0;
    a->m = mean;
    a->q = dt == KILN_F32 ? ldev_f32(x, n, mean) : ldev_f64(x, n, mean);
    break;
  }
  case KILN_OP_NORM: {
    double s = 0;
    if (p == 2) s = dt == KILN_F32 ? lsq_f32(x, n) : lsq_f64(x, n);
    else if (p == 1) s = dt == KILN_F32 ? labs_f32(x, n) : labs_f64(x, n);
    else if (p == INFINITY) for (int64_t i = 0; i < n; i++) { double v = fabs(load(x, dt, i)); if (v > s || v != v) s = v; }
    else if (isinf(p)) {
      s = INFINITY;
      for (int64_t i = 0; i < n; i++) { double v = fabs(load(x, dt, i)); if (v < s || v != v) { s = v; if (v != v) break; } }
    }
    else if (p == 0) for (int64_t i = 0; i < n; i++) s += load(x, dt, i) != 0;
    else for (int64_t i = 0; i < n; i++) s += pow(fabs(load(x, dt, i)), p);
    a->s = s;
    break;
  }
  case KILN_OP_LOGSUMEXP: {
    double m = -INFINITY;
    for (int64_t i = 0; i < n; i++) { double v = load(x, dt, i); if (v > m || v != v) m = v; }
    double s = 0;
    if (isfinite(m)) for (int64_t i = 0; i < n; i++) s += exp(load(x, dt, i) - m);
    a->m = m;
    a->s = s;
    break;
  }
  }
}

static void chunk_f32(int op, const float *x, int64_t n, int64_t base, double p, struct acc *a) {
  chunk_float(op, x, KILN_F32, n, base, p, a);
}
static void chunk_f64(int op, const double *x, int64_t n, int64_t base, double p, struct acc *a) {
  chunk_float(op, x, KILN_F64, n, base, p, a);
}

static void chunk_i64(int op, const int64_t *x, int64_t n, int64_t base, struct acc *a) {
  memset(a, 0, sizeof *a);
  a->n = n;
  switch (op) {
  case KILN_OP_SUM: { uint64_t s = 0; for (int64_t i = 0; i < n; i++) s += (uint64_t)x[i]; a->is = (int64_t)s; break; }
  case KILN_OP_PROD: { uint64_t s = 1; for (int64_t i = 0; i < n; i++) s *= (uint64_t)x[i]; a->is = (int64_t)s; break; }
  default: {
    int want_max = op == KILN_OP_MAX || op == KILN_OP_ARGMAX;
    int64_t best = x[0], bi = 0;
    for (int64_t i = 1; i < n; i++)
      if (want_max ? x[i] > best : x[i] < best) { best = x[i]; bi = i; }
    a->is = best; a->idx = base + bi;
  }
  }
}

/* Fold b (the later chunk) into a. */
static void combine(int op, int ints, struct acc *a, const struct acc *b, double p) {
  if (b->n == 0) return;
  if (a->n == 0) { *a = *b; return; }
  if (ints) {
    switch (op) {
    case KILN_OP_SUM: a->is = (int64_t)((uint64_t)a->is + (uint64_t)b->is); break;
    case KILN_OP_PROD: a->is = (int64_t)((uint64_t)a->is * (uint64_t)b->is); break;
    case KILN_OP_MAX: case KILN_OP_ARGMAX: if (b->is > a->is) { a->is = b->is; a->idx = b->idx; } break;
    default: if (b->is < a->is) { a->is = b->is; a->idx = b->idx; } break;
    }
  } else {
    switch (op) {
    case KILN_OP_SUM: case KILN_OP_MEAN: a->s += b->s; break;
    case KILN_OP_PROD: a->s *= b->s; break;
    case KILN_OP_MAX: case KILN_OP_ARGMAX:
      if (a->s == a->s && (b->s != b->s || b->s > a->s)) { a->s = b->s; a->idx = b->idx; }
      break;
    case KILN_OP_MIN: case KILN_OP_ARGMIN:
      if (a->s == a->s && (b->s != b->s || b->s < a->s)) { a->s = b->s; a->idx = b->idx; }
      break;
    case KILN_OP_VAR: case KILN_OP_STD: {   /* Chan et al.: merge two (n, mean, M2) */
      double na = (double)a->n, nb = (double)b->n, d = b->m - a->m;
      a->q += b->q + d * d * na * nb / (na + nb);
      a->m += d * nb / (na + nb);
      break;
    }
    case KILN_OP_NORM:   /* the largest magnitude (inf), the smallest (-inf), NaN first */
      if (p == INFINITY) { if (a->s == a->s && (b->s > a->s || b->s != b->s)) a->s = b->s; }
      else if (isinf(p)) { if (a->s == a->s && (b->s < a->s || b->s != b->s)) a->s = b->s; }
      else a->s += b->s;
      break;
    case KILN_OP_LOGSUMEXP: {
      double m = a->m > b->m || a->m != a->m ? a->m : b->m;
      if (isfinite(m)) a->s = a->s * exp(a->m - m) + b->s * exp(b->m - m);
      a->m = m;
      break;
    }
    }
  }
  a->n += b->n;
}

static double finish(int op, const struct acc *a, double p) {
  double n = (double)a->n;
  switch (op) {
  case KILN_OP_MEAN: return a->s / n;
  case KILN_OP_VAR: return a->q / fmax(n - p, 0);         /* PyTorch's divisor: max(0, N - correction) */
  case KILN_OP_STD: return sqrt(a->q / fmax(n - p, 0));
  case KILN_OP_NORM:
    if (p == 2) return sqrt(a->s);
    if (p == 1 || p == 0 || isinf(p)) return a->s;
    return pow(a->s, 1.0 / p);
  case KILN_OP_LOGSUMEXP:
    if (a->n == 0) return -INFINITY;
    if (!isfinite(a->m)) return a->m == a->m && a->m < 0 ? -INFINITY : a->m;
    return a->m + log(a->s);
  case KILN_OP_PROD: return a->n ? a->s : 1;
  default: return a->s;
  }
}

static void run_chunks(void *ctx, int64_t begin, int64_t end) {
  const struct job *j = ctx;
  for (int64_t t = begin; t < end; t++) {
    int64_t row = t / j->nchunks, c = t % j->nchunks;
    int64_t r0 = c * CHUNK, n = j->R - r0 < CHUNK ? j->R - r0 : CHUNK;
    int64_t off = row * j->R + r0;
    struct acc *a = &j->accs[t];
    if (n <= 0) { memset(a, 0, sizeof *a); continue; }
    if (j->dtype == KILN_I64) chunk_i64(j->op, (const int64_t *)j->x + off, n, r0, a);
    else if (j->dtype == KILN_F32) chunk_f32(j->op, (const float *)j->x + off, n, r0, j->p, a);
    else chunk_f64(j->op, (const double *)j->x + off, n, r0, j->p, a);
  }
}

/* Sums over leading dims of a contiguous float tensor (a bias grad: [N, C] summed over N) add
   whole rows, so no transposing copy is needed. Columns accumulate in double, in row order (bf16
   too: autocast's bias grads, which the general path would gather and convert one at a time). */
struct colsum { const char *x; char *out; int dtype, odtype; int64_t rows, cols; double scale; };

static void colsum_range(void *ctx, int64_t begin, int64_t end) {
  const struct colsum *j = ctx;
  enum { W = 256 };
  double acc[W];
  for (int64_t c0 = begin; c0 < end; c0 += W) {
    int64_t w = end - c0 < W ? end - c0 : W;
    for (int64_t k = 0; k < w; k++) acc[k] = 0;
    for (int64_t r = 0; r < j->rows; r++) {
      if (j->dtype == KILN_F32) {
        const float *row = (const float *)j->x + r * j->cols + c0;
        for (int64_t k = 0; k < w; k++) acc[k] += row[k];
      } else if (j->dtype == KILN_BF16) {
        const uint16_t *row = (const uint16_t *)j->x + r * j->cols + c0;
        for (int64_t k = 0; k < w; k++) acc[k] += convert_bf16_to_f32(row[k]);
      } else {
        const double *row = (const double *)j->x + r * j->cols + c0;
        for (int64_t k = 0; k < w; k++) acc[k] += row[k];
      }
    }
    for (int64_t k = 0; k < w; k++) {
      double v = acc[k] * j->scale;
      if (j->odtype == KILN_F32) ((float *)j->out)[c0 + k] = (float)v;
      else if (j->odtype == KILN_F64) ((double *)j->out)[c0 + k] = v;
      else kiln_store_f64(j->out + (c0 + k) * 2, j->odtype, v);   /* as cpu_reduce rounds */
    }
  }
}

static int leading_sum(const struct kiln_call *c) {
  const struct kiln_tensor *a = c->in[0];
  int64_t mask = c->ints[0], rows = 1, cols = 1;
  int nlead = 0;
  while (nlead < a->ndim && (mask & (1 << nlead))) rows *= a->sizes[nlead++];
  for (int d = nlead; d < a->ndim; d++) {
    if (mask & (1 << d)) return 0;
    cols *= a->sizes[d];
  }
  if (nlead == 0 || nlead == a->ndim || rows == 0 || !kiln_is_contiguous(a)) return 0;
  if ((a->dtype != KILN_F32 && a->dtype != KILN_F64 && a->dtype != KILN_BF16) || c->out->dtype != a->dtype) return 0;
  struct colsum j = {kiln_tensor_data(a), kiln_tensor_data(c->out), a->dtype, c->out->dtype, rows, cols,
                     c->op == KILN_OP_MEAN ? 1.0 / (double)rows : 1.0};
  kiln_parallel_for(cols, 256 > 65536 / rows ? 256 : 65536 / rows, colsum_range, &j);
  return 1;
}

int cpu_reduce(const struct kiln_call *c) {
  if ((c->op == KILN_OP_SUM || c->op == KILN_OP_MEAN) && leading_sum(c)) return KILN_OK;
  const struct kiln_tensor *a = c->in[0];
  struct kiln_tensor *out = c->out;
  int op = c->op;
  int64_t mask = c->ints[0];
  int ints = !kiln_dtype_is_float(a->dtype) &&
             (op == KILN_OP_SUM || op == KILN_OP_PROD || op == KILN_OP_MAX || op == KILN_OP_MIN ||
              op == KILN_OP_ARGMAX || op == KILN_OP_ARGMIN);
  /* Rows: kept dims first, then reduced dims, in one contiguous buffer of the row dtype. */
  int perm[KILN_MAX_DIMS], n = 0;
  int64_t M = 1, R = 1;
  for (int d = 0; d < a->ndim; d++) if (!(mask & (1 << d))) { perm[n++] = d; M *= a->sizes[d]; }
  for (int d = 0; d < a->ndim; d++) if (mask & (1 << d)) { perm[n++] = d; R *= a->sizes[d]; }
  int rdtype = ints ? KILN_I64 : a->dtype == KILN_F64 ? KILN_F64 : a->dtype == KILN_F32 ? KILN_F32 : KILN_F64;
  struct kiln_tensor *pv = kiln_layout_permute(a, a->ndim, perm);
  if (!pv) return kiln_error_code();
  struct kiln_tensor *rows = pv;
  if (!kiln_is_contiguous(pv) || pv->dtype != rdtype) {
    rows = kiln_tensor_empty(pv->ndim, pv->sizes, rdtype, pv->device);
    if (!rows) { kiln_tensor_release(pv); return kiln_error_code(); }
    kiln_cpu_copy(rows, pv);
    kiln_tensor_release(pv);
  }
  int64_t nchunks = R > CHUNK ? (R + CHUNK - 1) / CHUNK : 1;
  struct acc *accs = M * nchunks > 0 ? malloc(sizeof(struct acc) * (size_t)(M * nchunks)) : NULL;
  if (M * nchunks > 0 && !accs) { kiln_tensor_release(rows); return kiln_fail(KILN_ERR_MEMORY, "%s: out of memory", kiln_op_name(op)); }
  struct job j = {op, ints, rdtype, rows->numel ? kiln_tensor_data(rows) : NULL, M, R, nchunks, c->scalar[0], accs};
  int64_t grain = R >= 4096 ? 1 : 4096 / (R ? R : 1);
  if (R > 0) kiln_parallel_for(M * nchunks, grain, run_chunks, &j);
  char *o = kiln_tensor_data(out);
  int os = kiln_dtype_size(out->dtype);
  for (int64_t m = 0; m < M; m++) {
    struct acc total = {0};
    if (R > 0) {
      total = accs[m * nchunks];
      for (int64_t k = 1; k < nchunks; k++) combine(op, ints, &total, &accs[m * nchunks + k], c->scalar[0]);
    } else if (op == KILN_OP_PROD) {
      total.s = 1; total.is = 1;
    }
    if (op == KILN_OP_ARGMAX || op == KILN_OP_ARGMIN) ((int64_t *)o)[m] = total.idx;
    else if (ints) {
      if (R == 0) total.is = op == KILN_OP_PROD ? 1 : 0;
      if (out->dtype == KILN_I64) ((int64_t *)o)[m] = total.is;
      else kiln_store_f64(o + m * os, out->dtype, (double)total.is);
    } else {
      if (R == 0 && op == KILN_OP_SUM) total.s = 0;
      kiln_store_f64(o + m * os, out->dtype, finish(op, &total, c->scalar[0]));
    }
  }
  free(accs);
  kiln_tensor_release(rows);
  return KILN_OK;
}
