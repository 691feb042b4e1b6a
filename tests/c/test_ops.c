/* test_ops.c: the op table, elementwise ops, reductions, matrix products, joining and indexing,
   each against a naive loop in double over odd, non-contiguous, broadcast and empty shapes. */
#include "check.h"

static const int all_dtypes[8] = {KILN_F32, KILN_F64, KILN_F16, KILN_BF16, KILN_I64, KILN_I32, KILN_U8, KILN_BOOL};

/* ---- test data and layouts ---- */

/* Test values for dtype: floats in [lo, hi], integers rounded into [lo, hi] (u8: [max(lo,0), hi]),
   bool 0/1. coarse: floats on a grid of 0.5 so that ties and equal pairs occur. */
static double test_value(uint64_t i, int dtype, double lo, double hi, int coarse) {
  double u = (hashval(i) + 1) / 2;   /* [0, 1) */
  if (dtype == KILN_BOOL) return u < 0.5;
  if (!kiln_dtype_is_float(dtype)) {
    if (dtype == KILN_U8 && lo < 0) lo = 0;
    return round(lo + (hi - lo) * u);
  }
  double v = lo + (hi - lo) * u;
  return coarse ? round(v * 2) / 2 : v;
}

static struct kiln_tensor *make(int ndim, const int64_t *sizes, int dtype, uint64_t seed, double lo, double hi, int coarse) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= sizes[d];
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) v[i] = test_value(seed * 1000003 + (uint64_t)i, dtype, lo, hi, coarse);
  struct kiln_tensor *t = T(ndim, sizes, v, dtype);
  free(v);
  return t;
}

enum { CONTIG, TRANSPOSED, NARROWED, EXPANDED, NLAYOUTS };
static const char *const layout_names[NLAYOUTS] = {"contiguous", "transposed", "narrowed", "expanded"};

/* A tensor of logical shape sizes (3-d) laid out as kind. */
static struct kiln_tensor *make_layout(int kind, const int64_t *s, int dtype, uint64_t seed, double lo, double hi, int coarse) {
  struct kiln_tensor *base, *v = NULL;
  switch (kind) {
  case TRANSPOSED:
    base = make(3, (int64_t[]){s[2], s[1], s[0]}, dtype, seed, lo, hi, coarse);
    v = kiln_permute(base, 3, (int[]){2, 1, 0});
    break;
  case NARROWED: {
    base = make(3, (int64_t[]){s[0], s[1] + 3, s[2] + 2}, dtype, seed, lo, hi, coarse);
    struct kiln_tensor *n1 = kiln_narrow(base, 1, 2, s[1]);
    v = kiln_narrow(n1, 2, 1, s[2]);
    kiln_tensor_release(n1);
    break;
  }
  case EXPANDED:
    base = make(3, (int64_t[]){1, s[1], s[2]}, dtype, seed, lo, hi, coarse);
    v = kiln_expand(base, 3, s);
    break;
  default:
    return make(3, s, dtype, seed, lo, hi, coarse);
  }
  kiln_tensor_release(base);
  return v;
}

/* Row-major index into a tensor of shape (nd, sz) broadcast to (ond, osz), for the flat index i of the latter. */
static int64_t bcast_index(int ond, const int64_t *osz, int64_t i, int nd, const int64_t *sz) {
  int64_t idx = 0, stride = 1;
  for (int d = ond - 1; d >= 0; d--) {
    int64_t k = i % osz[d];
    i /= osz[d];
    int dd = d - (ond - nd);
    if (dd < 0) continue;
    if (sz[dd] != 1) idx += k * stride;
    stride *= sz[dd];
  }
  return idx;
}

/* v as stored in dtype, for integer and bool results (exact); floats are compared with a tolerance. */
static double cast_to(int dtype, double v) {
  if (!isfinite(v)) return dtype == KILN_BOOL ? v != 0 : v;   /* (integer results are always finite here) */
  switch (dtype) {
  case KILN_F32: return (double)(float)v;
  case KILN_I32: return (double)(int32_t)(uint32_t)(uint64_t)(int64_t)v;
  case KILN_U8: return (double)(uint8_t)(uint64_t)(int64_t)v;
  case KILN_BOOL: return v != 0;
  default: return v;
  }
}

static const char *sizes_str(int n, const int64_t *s) {
  static char buf[160];
  int k = snprintf(buf, sizeof buf, "[");
  for (int d = 0; d < n; d++) k += snprintf(buf + k, sizeof buf - (size_t)k, d ? ",%lld" : "%lld", (long long)s[d]);
  snprintf(buf + k, sizeof buf - (size_t)k, "]");
  return buf;
}

static double rtol_of(int dtype) {
  switch (dtype) {
  case KILN_F64: return 1e-12;
  case KILN_F32: return 2e-6;
  case KILN_F16: return 1e-3;
  case KILN_BF16: return 8e-3;
  default: return 0;
  }
}
static double atol_of(int dtype) { return kiln_dtype_is_float(dtype) ? (dtype == KILN_F64 ? 1e-12 : 1e-6) : 0; }

/* ---- the op table ---- */

static void test_op_table(void) {
  int unnamed = 0, unsupported = 0, dup = 0;
  for (int op = 0; op < KILN_OP_COUNT; op++) {
    const char *name = kiln_op_name(op);
    if (!name || strcmp(name, "?") == 0 || !*name) { unnamed++; fprintf(stderr, "op %d has no name\n", op); continue; }
    if (kiln_op_supported(op, KILN_CPU) != 1) { unsupported++; fprintf(stderr, "op %s has no cpu kernel\n", name); }
    for (int o = 0; o < op; o++) dup += strcmp(kiln_op_name(o), name) == 0;
  }
  CHECK(unnamed == 0);
  CHECK(unsupported == 0);
  CHECK(dup == 0);
  CHECK(strcmp(kiln_op_name(-1), "?") == 0 && strcmp(kiln_op_name(KILN_OP_COUNT), "?") == 0);
  CHECK(kiln_op_supported(KILN_OP_COUNT, KILN_CPU) == 0 && kiln_op_supported(-1, KILN_CPU) == 0);
  CHECK(kiln_op_supported(KILN_OP_ADD, 99) == 0);
  CHECK(strcmp(kiln_op_name(KILN_OP_ADD), "add") == 0 && strcmp(kiln_op_name(KILN_OP_GEMM), "gemm") == 0);
  CHECK(strcmp(kiln_op_name(KILN_OP_RANDINT), "randint") == 0);
}

/* ---- unary ---- */

static double r_neg(double x) { return -x; }
static double r_sign(double x) { return (x > 0) - (x < 0); }
static double r_rsqrt(double x) { return 1 / sqrt(x); }
static double r_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double r_relu(double x) { return x < 0 ? 0 : x; }
static double r_recip(double x) { return 1 / x; }
static double r_square(double x) { return x * x; }
static double r_not(double x) { return x == 0; }

static const struct uop {
  int op;
  double (*ref)(double);
  double lo, hi;
  int keeps_int, coarse;
} uops[] = {
  {KILN_OP_NEG, r_neg, -3, 3, 1, 0}, {KILN_OP_ABS, fabs, -3, 3, 1, 1}, {KILN_OP_SIGN, r_sign, -2, 2, 1, 1},
  {KILN_OP_SQRT, sqrt, 0.1, 5, 0, 0}, {KILN_OP_RSQRT, r_rsqrt, 0.1, 5, 0, 0}, {KILN_OP_EXP, exp, -3, 3, 0, 0},
  {KILN_OP_LOG, log, 0.1, 5, 0, 0}, {KILN_OP_LOG1P, log1p, -0.9, 3, 0, 0}, {KILN_OP_EXPM1, expm1, -2, 2, 0, 0},
  {KILN_OP_SIN, sin, -6, 6, 0, 0}, {KILN_OP_COS, cos, -6, 6, 0, 0}, {KILN_OP_TANH, tanh, -4, 4, 0, 0},
  {KILN_OP_SIGMOID, r_sigmoid, -6, 6, 0, 0}, {KILN_OP_RELU, r_relu, -2, 2, 1, 1}, {KILN_OP_FLOOR, floor, -5, 5, 1, 0},
  {KILN_OP_CEIL, ceil, -5, 5, 1, 0}, {KILN_OP_ROUND, nearbyint, -5, 5, 1, 1}, {KILN_OP_TRUNC, trunc, -5, 5, 1, 0},
  {KILN_OP_RECIPROCAL, r_recip, 0.2, 5, 0, 0}, {KILN_OP_SQUARE, r_square, -3, 3, 1, 0}, {KILN_OP_ERF, erf, -3, 3, 0, 0},
  {KILN_OP_LOGICAL_NOT, r_not, -1, 1, 0, 1},
};

static int unary_result_dtype(const struct uop *u, int dt) {
  if (u->op == KILN_OP_LOGICAL_NOT) return KILN_BOOL;
  if (u->keeps_int || kiln_dtype_is_float(dt)) return dt;
  return KILN_F32;
}

static void test_unary(void) {
  const int64_t shape[3] = {3, 5, 7};
  CHECK(sizeof uops / sizeof uops[0] == KILN_OP_LOGICAL_NOT - KILN_OP_NEG + 1);
  for (size_t i = 0; i < sizeof uops / sizeof uops[0]; i++) {
    const struct uop *u = &uops[i];
    for (int di = 0; di < 8; di++) {
      int dt = all_dtypes[di];
      if (u->op == KILN_OP_NEG && dt == KILN_BOOL) {
        struct kiln_tensor *b = make(3, shape, dt, 1, 0, 1, 0);
        CHECK_ERR(kiln_unary(KILN_OP_NEG, b), "neg: not defined for bool");
        kiln_tensor_release(b);
        continue;
      }
      double lo = kiln_dtype_is_float(dt) ? u->lo : -10, hi = kiln_dtype_is_float(dt) ? u->hi : 10;
      for (int lay = 0; lay < NLAYOUTS; lay++) {
        struct kiln_tensor *a = make_layout(lay, shape, dt, 100 + i * 10 + lay, lo, hi, u->coarse);
        struct kiln_tensor *out = kiln_unary(u->op, a);
        int rd = unary_result_dtype(u, dt);
        double *va = V(a), *vo = V(out), want[105];
        for (int k = 0; k < 105; k++) want[k] = cast_to(rd, u->ref(va[k]));
        char what[96];
        snprintf(what, sizeof what, "%s(%s, %s)", kiln_op_name(u->op), kiln_dtype_name(dt), layout_names[lay]);
        check_report(out && out->dtype == rd && same_sizes(out, 3, shape) && kiln_is_contiguous(out), __FILE__, __LINE__,
                     "%s: result %s %s (expected %s): %s", what, out ? kiln_dtype_name(out->dtype) : "NULL",
                     out ? kiln_shape_string(out) : "", kiln_dtype_name(rd), out ? "" : kiln_error_message());
        check_arrays(vo, want, 105, atol_of(rd), rtol_of(rd), what, __FILE__, __LINE__);
        free(va); free(vo);
        kiln_tensor_release(out); kiln_tensor_release(a);
      }
    }
  }
  /* known values: rounding ties to even, signs of zero */
  struct kiln_tensor *t = T(1, (int64_t[]){8}, (double[]){0.5, 1.5, 2.5, -0.5, -1.5, 2.4999, -2.6, 3.5}, KILN_F32);
  struct kiln_tensor *r = kiln_unary(KILN_OP_ROUND, t);
  double *v = V(r);
  CHECK_ARRAY_NEAR(v, ((double[]){0, 2, 2, -0.0, -2, 2, -3, 4}), 8, 0);
  free(v); kiln_tensor_release(r);
  r = kiln_unary(KILN_OP_TRUNC, t);
  v = V(r);
  CHECK_ARRAY_NEAR(v, ((double[]){0, 1, 2, 0, -1, 2, -2, 3}), 8, 0);
  free(v); kiln_tensor_release(r);
  kiln_tensor_release(t);
  CHECK_ERR(kiln_unary(KILN_OP_ADD, NULL), "missing");
  t = kiln_tensor_full(1, (int64_t[]){2}, 1, KILN_F32, CPU);
  CHECK_ERR(kiln_unary(KILN_OP_ADD, t), "not a unary op");
  CHECK_ERR(kiln_unary(KILN_OP_SUM, t), "not a unary op");
  kiln_tensor_release(t);
}

/* ---- binary ---- */

static double py_mod(double x, double y) {
  double r = fmod(x, y);
  return r != 0 && ((r < 0) != (y < 0)) ? r + y : r;
}
static double int_pow(double b, double e) {
  if (e < 0) return b == 1 ? 1 : b == -1 ? (fmod(e, 2) != 0 ? -1 : 1) : 0;
  double r = 1;
  for (int k = 0; k < (int)e; k++) r *= b;
  return r;
}

static int is_cmp(int op) { return op >= KILN_OP_EQ && op <= KILN_OP_LOGICAL_OR; }

static double ref_binary(int op, double x, double y, int ints) {
  switch (op) {
  case KILN_OP_ADD: return x + y;
  case KILN_OP_SUB: return x - y;
  case KILN_OP_MUL: return x * y;
  case KILN_OP_DIV: return x / y;
  case KILN_OP_POW: return ints ? int_pow(x, y) : pow(x, y);
  case KILN_OP_MAXIMUM: return isnan(x) || isnan(y) ? NAN : x > y ? x : y;
  case KILN_OP_MINIMUM: return isnan(x) || isnan(y) ? NAN : x < y ? x : y;
  case KILN_OP_REMAINDER: return ints && y == 0 ? 0 : py_mod(x, y);
  case KILN_OP_EQ: return x == y;
  case KILN_OP_NE: return x != y;
  case KILN_OP_LT: return x < y;
  case KILN_OP_LE: return x <= y;
  case KILN_OP_GT: return x > y;
  case KILN_OP_GE: return x >= y;
  case KILN_OP_LOGICAL_AND: return x != 0 && y != 0;
  case KILN_OP_LOGICAL_OR: return x != 0 || y != 0;
  }
  return NAN;
}

static int binary_result_dtype(int op, int da, int db) {
  int p = kiln_promote_types(da, db);
  if (is_cmp(op)) return KILN_BOOL;
  if (op == KILN_OP_DIV && !kiln_dtype_is_float(p)) return KILN_F32;
  return p;
}

/* Operand domains per op: a's and b's [lo, hi] for floats and for integers. */
static void binary_domain(int op, int which, int is_float, double *lo, double *hi) {
  *lo = is_float ? -3 : -10;
  *hi = is_float ? 3 : 10;
  if (op == KILN_OP_POW) {
    if (which == 0) { *lo = is_float ? 0.5 : -5; *hi = is_float ? 2.5 : 5; }
    else { *lo = is_float ? -2 : 0; *hi = is_float ? 2 : 4; }
  }
  /* integer x % 0 is an error (test_integer_corners, which also has the negative operands) */
  if (op == KILN_OP_REMAINDER && !is_float) *lo = 1;
}

static void check_binary_case(int op, struct kiln_tensor *a, struct kiln_tensor *b, const char *layout, int line) {
  struct kiln_tensor *out = kiln_binary(op, a, b);
  int rd = binary_result_dtype(op, a->dtype, b->dtype);
  int ints = !kiln_dtype_is_float(kiln_promote_types(a->dtype, b->dtype)) && op != KILN_OP_DIV;
  int nd;
  int64_t osz[KILN_MAX_DIMS];
  nd = a->ndim > b->ndim ? a->ndim : b->ndim;
  int64_t n = 1;
  for (int d = 0; d < nd; d++) {
    int da = d - (nd - a->ndim), db = d - (nd - b->ndim);
    int64_t sa = da < 0 ? 1 : a->sizes[da], sb = db < 0 ? 1 : b->sizes[db];
    osz[d] = sa == 1 ? sb : sa;
    n *= osz[d];
  }
  char what[128];
  snprintf(what, sizeof what, "%s(%s %s, %s %s) %s", kiln_op_name(op), kiln_dtype_name(a->dtype), kiln_shape_string(a),
           kiln_dtype_name(b->dtype), kiln_shape_string(b), layout);
  check_report(out && out->dtype == rd && same_sizes(out, nd, osz), __FILE__, line, "%s: result %s %s (expected %s): %s", what,
               out ? kiln_dtype_name(out->dtype) : "NULL", out ? kiln_shape_string(out) : "", kiln_dtype_name(rd),
               out ? "" : kiln_error_message());
  double *va = V(a), *vb = V(b), *vo = V(out), *want = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) {
    double x = va[bcast_index(nd, osz, i, a->ndim, a->sizes)], y = vb[bcast_index(nd, osz, i, b->ndim, b->sizes)];
    want[i] = cast_to(rd, ref_binary(op, x, y, ints));
  }
  if (out && out->numel == n) check_arrays(vo, want, n, atol_of(rd), rtol_of(rd), what, __FILE__, line);
  free(va); free(vb); free(vo); free(want);
  kiln_tensor_release(out);
}

static void test_binary(void) {
  static const int pairs[][2] = {
    {KILN_F32, KILN_F32}, {KILN_F64, KILN_F64}, {KILN_F16, KILN_F16}, {KILN_BF16, KILN_BF16}, {KILN_I64, KILN_I64},
    {KILN_I32, KILN_I32}, {KILN_U8, KILN_U8}, {KILN_BOOL, KILN_BOOL}, {KILN_F32, KILN_F64}, {KILN_I32, KILN_F32},
    {KILN_U8, KILN_I64}, {KILN_BOOL, KILN_F16}, {KILN_F16, KILN_BF16}, {KILN_I64, KILN_BF16}, {KILN_U8, KILN_I32},
    {KILN_BOOL, KILN_I32}, {KILN_F64, KILN_I64},
  };
  const int64_t shape[3] = {3, 5, 7};
  for (int op = KILN_OP_ADD; op <= KILN_OP_LOGICAL_OR; op++)
    for (size_t pi = 0; pi < sizeof pairs / sizeof pairs[0]; pi++) {
      int da = pairs[pi][0], db = pairs[pi][1];
      /* bool arithmetic beyond add and mul is not meaningful (PyTorch refuses it) */
      if (da == KILN_BOOL && db == KILN_BOOL && (op == KILN_OP_SUB || op == KILN_OP_POW || op == KILN_OP_REMAINDER || op == KILN_OP_DIV))
        continue;
      /* a bool divisor is mostly 0: integer x % 0 is an error (test_integer_corners) */
      if (op == KILN_OP_REMAINDER && (da == KILN_BOOL || db == KILN_BOOL) && !kiln_dtype_is_float(kiln_promote_types(da, db)))
        continue;
      double alo, ahi, blo, bhi;
      binary_domain(op, 0, kiln_dtype_is_float(da), &alo, &ahi);
      binary_domain(op, 1, kiln_dtype_is_float(db), &blo, &bhi);
      int coarse = is_cmp(op) || op == KILN_OP_MAXIMUM || op == KILN_OP_MINIMUM;
      uint64_t seed = 5000 + (uint64_t)op * 100 + pi * 4;
      /* same shape, contiguous (the fast path) */
      struct kiln_tensor *a = make_layout(CONTIG, shape, da, seed, alo, ahi, coarse);
      struct kiln_tensor *b = make_layout(CONTIG, shape, db, seed + 1, blo, bhi, coarse);
      check_binary_case(op, a, b, "contiguous", __LINE__);
      kiln_tensor_release(a); kiln_tensor_release(b);
      /* same shape, transposed with narrowed */
      a = make_layout(TRANSPOSED, shape, da, seed + 2, alo, ahi, coarse);
      b = make_layout(NARROWED, shape, db, seed + 3, blo, bhi, coarse);
      check_binary_case(op, a, b, "transposed,narrowed", __LINE__);
      kiln_tensor_release(a); kiln_tensor_release(b);
      /* broadcasting [3,1,7] with [5,1] */
      a = make(3, (int64_t[]){3, 1, 7}, da, seed + 4, alo, ahi, coarse);
      b = make(2, (int64_t[]){5, 1}, db, seed + 5, blo, bhi, coarse);
      check_binary_case(op, a, b, "broadcast", __LINE__);
      kiln_tensor_release(a); kiln_tensor_release(b);
      /* an expanded (stride 0) operand against a 0-dim one */
      a = make_layout(EXPANDED, shape, da, seed + 6, alo, ahi, coarse);
      b = make(0, NULL, db, seed + 7, blo, bhi, coarse);
      check_binary_case(op, b, a, "0-dim,expanded", __LINE__);
      kiln_tensor_release(a); kiln_tensor_release(b);
    }

  /* a shape mismatch names both shapes; the process goes on */
  struct kiln_tensor *a = make(2, (int64_t[]){3, 4}, KILN_F32, 1, -1, 1, 0);
  struct kiln_tensor *b = make(2, (int64_t[]){3, 5}, KILN_F32, 2, -1, 1, 0);
  CHECK_ERR(kiln_binary(KILN_OP_ADD, a, b), "[3,4]");
  CHECK_ERR(kiln_binary(KILN_OP_MUL, a, b), "mul: shapes [3,4] and [3,5] do not broadcast");
  CHECK_ERR(kiln_binary(KILN_OP_NEG, a, a), "not a binary op");
  check_binary_case(KILN_OP_ADD, a, a, "after an error", __LINE__);
  kiln_tensor_release(a); kiln_tensor_release(b);

  /* NaN propagates through maximum and minimum from either side */
  a = T(1, (int64_t[]){3}, (double[]){NAN, 1, NAN}, KILN_F32);
  b = T(1, (int64_t[]){3}, (double[]){1, NAN, NAN}, KILN_F32);
  for (int op = KILN_OP_MAXIMUM; op <= KILN_OP_MINIMUM; op++) {
    struct kiln_tensor *m = kiln_binary(op, a, b);
    double *v = V(m);
    CHECK(isnan(v[0]) && isnan(v[1]) && isnan(v[2]));
    free(v); kiln_tensor_release(m);
  }
  kiln_tensor_release(a); kiln_tensor_release(b);
}

/* Integer remainder and pow corner cases, and wrap-around, against known values. */
static void test_integer_corners(void) {
  const double x[] = {7, -7, 7, -7, 0, -9223372036854775808.0, 6, -6};
  const double y[] = {3, 3, -3, -3, 5, -1, -1, 4};
  const double want[] = {1, 2, -2, -1, 0, 0, 0, 2};
  for (int dt = KILN_I64; dt <= KILN_I32; dt++) {
    int n = dt == KILN_I64 ? 8 : 5;   /* INT64_MIN only where it exists */
    struct kiln_tensor *a = T(1, (int64_t[]){n}, x, dt), *b = T(1, (int64_t[]){n}, y, dt);
    struct kiln_tensor *r = kiln_binary(KILN_OP_REMAINDER, a, b);
    double *v = V(r);
    CHECK(r && r->dtype == dt);
    check_arrays(v, want, n, 0, 0, dt == KILN_I64 ? "i64 remainder" : "i32 remainder", __FILE__, __LINE__);
    free(v); kiln_tensor_release(r);
    kiln_tensor_release(a); kiln_tensor_release(b);
  }
  /* float remainder: Python's sign rule; x % 0 is NaN */
  struct kiln_tensor *a = T(1, (int64_t[]){5}, (double[]){5.5, -5.5, 5.5, -5.5, 1}, KILN_F64);
  struct kiln_tensor *b = T(1, (int64_t[]){5}, (double[]){2, 2, -2, -2, 0}, KILN_F64);
  struct kiln_tensor *r = kiln_binary(KILN_OP_REMAINDER, a, b);
  double *v = V(r);
  CHECK_ARRAY_NEAR(v, ((double[]){1.5, 0.5, -0.5, -1.5, NAN}), 5, 0);
  free(v); kiln_tensor_release(r);
  kiln_tensor_release(a); kiln_tensor_release(b);
  /* scalar remainder, both sides */
  a = T(1, (int64_t[]){4}, (double[]){3, -3, 0, 7}, KILN_I64);
  /* integer x % 0 is an error, as a scalar, as a tensor divisor, on either side, in place */
  r = kiln_binary_scalar(KILN_OP_REMAINDER, a, 0, 0);
  CHECK(r == NULL && strstr(kiln_error_message(), "remainder: integer division by zero (the divisor is 0)"));
  r = kiln_binary_scalar(KILN_OP_REMAINDER, a, 7, 1);   /* 7 % x with a zero in x */
  CHECK(r == NULL && strstr(kiln_error_message(), "1 of the 4 divisors in [4] are 0"));
  b = T(1, (int64_t[]){4}, (double[]){1, 0, 0, 2}, KILN_I32);
  r = kiln_binary(KILN_OP_REMAINDER, a, b);
  CHECK(r == NULL && strstr(kiln_error_message(), "2 of the 4 divisors in [4] are 0"));
  CHECK(kiln_binary_(KILN_OP_REMAINDER, a, b) != KILN_OK);
  CHECK(kiln_binary_scalar_(KILN_OP_REMAINDER, a, 0) != KILN_OK);
  kiln_tensor_release(b);
  r = kiln_binary_scalar(KILN_OP_REMAINDER, a, -2, 0);
  v = V(r);
  CHECK_ARRAY_NEAR(v, ((double[]){-1, -1, 0, -1}), 4, 0);
  free(v); kiln_tensor_release(r);
  kiln_tensor_release(a);
  a = T(1, (int64_t[]){4}, (double[]){3, -3, 5, 7}, KILN_I64);
  r = kiln_binary_scalar(KILN_OP_REMAINDER, a, 7, 1);   /* 7 % x */
  v = V(r);
  CHECK_ARRAY_NEAR(v, ((double[]){1, -2, 2, 0}), 4, 0);
  free(v); kiln_tensor_release(r);
  kiln_tensor_release(a);
  /* integer pow: exact, negative exponents of 1 and -1; other negative exponents truncate to 0 */
  a = T(1, (int64_t[]){10}, (double[]){2, 3, -2, 0, 5, 1, -1, -1, 2, 10}, KILN_I64);
  b = T(1, (int64_t[]){10}, (double[]){10, 0, 3, 0, 1, -5, -3, -4, -1, 15}, KILN_I64);
  r = kiln_binary(KILN_OP_POW, a, b);
  v = V(r);
  CHECK(r && r->dtype == KILN_I64);
  CHECK_ARRAY_NEAR(v, ((double[]){1024, 1, -8, 1, 5, 1, -1, 1, 0, 1e15}), 10, 0);
  free(v); kiln_tensor_release(r);
  kiln_tensor_release(a); kiln_tensor_release(b);
  /* u8 wraps around, like PyTorch's uint8 */
  a = T(1, (int64_t[]){3}, (double[]){200, 5, 0}, KILN_U8);
  b = T(1, (int64_t[]){3}, (double[]){100, 10, 1}, KILN_U8);
  r = kiln_binary(KILN_OP_ADD, a, b);
  v = V(r);
  CHECK(r && r->dtype == KILN_U8);
  CHECK_ARRAY_NEAR(v, ((double[]){44, 15, 1}), 3, 0);
  free(v); kiln_tensor_release(r);
  r = kiln_binary(KILN_OP_SUB, b, a);
  v = V(r);
  CHECK_ARRAY_NEAR(v, ((double[]){156, 5, 1}), 3, 0);
  free(v); kiln_tensor_release(r);
  kiln_tensor_release(a); kiln_tensor_release(b);
  /* integer division gives f32 */
  a = T(1, (int64_t[]){3}, (double[]){7, -7, 1}, KILN_I32);
  b = T(1, (int64_t[]){3}, (double[]){2, 2, 0}, KILN_I32);
  r = kiln_binary(KILN_OP_DIV, a, b);
  v = V(r);
  CHECK(r && r->dtype == KILN_F32);
  CHECK_ARRAY_NEAR(v, ((double[]){3.5, -3.5, INFINITY}), 3, 0);
  free(v); kiln_tensor_release(r);
  kiln_tensor_release(a); kiln_tensor_release(b);
}

/* ---- scalar operands ---- */

struct sop { int op; double s; int reverse; };

static void test_scalar(void) {
  static const struct sop sops[] = {
    {KILN_OP_ADD, 2, 0}, {KILN_OP_ADD, 0.5, 0}, {KILN_OP_SUB, 2, 1}, {KILN_OP_SUB, 1.25, 0}, {KILN_OP_MUL, -3, 0},
    {KILN_OP_MUL, 0.5, 1}, {KILN_OP_DIV, 1, 1}, {KILN_OP_DIV, 4, 0}, {KILN_OP_POW, 2, 0}, {KILN_OP_POW, 2, 1},
    {KILN_OP_POW, 0.5, 0}, {KILN_OP_REMAINDER, 3, 0}, {KILN_OP_REMAINDER, -3, 0}, {KILN_OP_REMAINDER, 7, 1},
    {KILN_OP_MAXIMUM, 0, 0}, {KILN_OP_MINIMUM, 1, 1}, {KILN_OP_GT, 0.5, 0}, {KILN_OP_LT, 2, 1}, {KILN_OP_EQ, 1, 0},
    {KILN_OP_NE, 0, 1}, {KILN_OP_GE, -1, 0}, {KILN_OP_LE, 1.5, 0}, {KILN_OP_LOGICAL_AND, 1, 0}, {KILN_OP_LOGICAL_OR, 0, 1},
    {KILN_OP_ADD, INFINITY, 0},
  };
  const int64_t shape[3] = {3, 5, 7};
  for (size_t si = 0; si < sizeof sops / sizeof sops[0]; si++) {
    const struct sop *s = &sops[si];
    for (int di = 0; di < 8; di++) {
      int dt = all_dtypes[di];
      if (dt == KILN_BOOL && (s->op == KILN_OP_SUB || s->op == KILN_OP_POW || s->op == KILN_OP_REMAINDER || s->op == KILN_OP_DIV)) continue;
      int is_float = kiln_dtype_is_float(dt);
      double lo = is_float ? 0.25 : 1, hi = is_float ? 3 : 6;   /* positive: fine for pow, div and remainder */
      if (is_cmp(s->op) || s->op == KILN_OP_MAXIMUM || s->op == KILN_OP_MINIMUM) { lo = is_float ? -2 : -3; hi = is_float ? 2 : 3; }
      for (int lay = CONTIG; lay <= TRANSPOSED; lay++) {
        struct kiln_tensor *a = make_layout(lay, shape, dt, 900 + si * 8 + (uint64_t)di, lo, hi, 1);
        struct kiln_tensor *out = kiln_binary_scalar(s->op, a, s->s, s->reverse);
        /* the scalar is weak: a float tensor keeps its dtype; an integer one keeps it for integral scalars */
        int sd = is_float ? dt : (s->s != floor(s->s) || isinf(s->s)) ? KILN_F32 : dt == KILN_BOOL ? KILN_I64 : dt;
        int rd = binary_result_dtype(s->op, dt, sd);
        int ints = !kiln_dtype_is_float(kiln_promote_types(dt, sd)) && s->op != KILN_OP_DIV;
        double *va = V(a), *vo = V(out), want[105];
        for (int k = 0; k < 105; k++)
          want[k] = cast_to(rd, s->reverse ? ref_binary(s->op, s->s, va[k], ints) : ref_binary(s->op, va[k], s->s, ints));
        char what[96];
        snprintf(what, sizeof what, "%s %s(%s, %g)%s %s", s->reverse ? "reversed" : "", kiln_op_name(s->op),
                 kiln_dtype_name(dt), s->s, s->reverse ? " " : "", layout_names[lay]);
        check_report(out && out->dtype == rd && same_sizes(out, 3, shape), __FILE__, __LINE__, "%s: result %s (expected %s): %s",
                     what, out ? kiln_dtype_name(out->dtype) : "NULL", kiln_dtype_name(rd), out ? "" : kiln_error_message());
        check_arrays(vo, want, 105, atol_of(rd), rtol_of(rd), what, __FILE__, __LINE__);
        free(va); free(vo);
        kiln_tensor_release(out); kiln_tensor_release(a);
      }
    }
  }
  /* known values: 2 - t and 1 / t */
  struct kiln_tensor *t = T(1, (int64_t[]){3}, (double[]){1, 4, -0.5}, KILN_F32);
  struct kiln_tensor *r = kiln_binary_scalar(KILN_OP_SUB, t, 2, 1);
  double *v = V(r);
  CHECK_ARRAY_NEAR(v, ((double[]){1, -2, 2.5}), 3, 0);
  free(v); kiln_tensor_release(r);
  r = kiln_binary_scalar(KILN_OP_DIV, t, 1, 1);
  v = V(r);
  CHECK_ARRAY_NEAR(v, ((double[]){1, 0.25, -2}), 3, 0);
  free(v); kiln_tensor_release(r);
  r = kiln_binary_scalar(KILN_OP_POW, t, 2, 1);   /* 2 ** t */
  v = V(r);
  CHECK_ARRAY_NEAR(v, ((double[]){2, 16, M_SQRT1_2}), 3, 1e-7);
  free(v); kiln_tensor_release(r);
  kiln_tensor_release(t);
  /* an i64 tensor with a fractional scalar gives f32 */
  t = T(1, (int64_t[]){2}, (double[]){3, -3}, KILN_I64);
  r = kiln_binary_scalar(KILN_OP_MUL, t, 0.5, 0);
  v = V(r);
  CHECK(r && r->dtype == KILN_F32);
  CHECK_ARRAY_NEAR(v, ((double[]){1.5, -1.5}), 2, 0);
  free(v); kiln_tensor_release(r);
  kiln_tensor_release(t);
}

/* ---- where, clamp ---- */

static void test_where_clamp(void) {
  struct kiln_tensor *cond = make(3, (int64_t[]){3, 1, 7}, KILN_BOOL, 31, 0, 1, 0);
  struct kiln_tensor *a = make_layout(TRANSPOSED, (int64_t[]){3, 5, 7}, KILN_F32, 32, -3, 3, 0);
  struct kiln_tensor *b = make(2, (int64_t[]){5, 1}, KILN_I64, 33, -10, 10, 0);
  struct kiln_tensor *w = kiln_where(cond, a, b);
  CHECK(w && w->dtype == KILN_F32);
  CHECK_SIZES(w, 3, 5, 7);
  double *vc = V(cond), *va = V(a), *vb = V(b), *vw = V(w), want[105];
  const int64_t os[3] = {3, 5, 7};
  for (int i = 0; i < 105; i++)
    want[i] = vc[bcast_index(3, os, i, 3, cond->sizes)] != 0 ? va[i] : vb[bcast_index(3, os, i, 2, b->sizes)];
  CHECK_ARRAY_NEAR(vw, want, 105, 0);
  free(vc); free(va); free(vb); free(vw);
  kiln_tensor_release(w);
  /* a u8 condition, i32 and i64 branches: i64 result */
  struct kiln_tensor *c8 = T(1, (int64_t[]){4}, (double[]){0, 3, 1, 0}, KILN_U8);
  struct kiln_tensor *x = T(1, (int64_t[]){4}, (double[]){1, 2, 3, 4}, KILN_I32);
  struct kiln_tensor *y = T(0, NULL, (double[]){-9}, KILN_I64);
  w = kiln_where(c8, x, y);
  double *v = V(w);
  CHECK(w && w->dtype == KILN_I64);
  CHECK_ARRAY_NEAR(v, ((double[]){-9, 2, 3, -9}), 4, 0);
  free(v); kiln_tensor_release(w);
  struct kiln_tensor *bad = make(1, (int64_t[]){3}, KILN_BOOL, 1, 0, 1, 0);
  CHECK_ERR(kiln_where(bad, x, y), "[3]");
  kiln_tensor_release(bad);
  kiln_tensor_release(c8); kiln_tensor_release(x); kiln_tensor_release(y);
  kiln_tensor_release(cond); kiln_tensor_release(a); kiln_tensor_release(b);

  /* clamp: both bounds, one bound, on a non-contiguous f64 tensor; NaN stays NaN */
  a = make_layout(NARROWED, (int64_t[]){3, 5, 7}, KILN_F64, 40, -3, 3, 0);
  kiln_tensor_set(a, a->offset, NAN);
  va = V(a);
  static const struct { double lo, hi; int has_lo, has_hi; } cl[] = {{-1, 2, 1, 1}, {-0.5, 0, 1, 0}, {0, 0.25, 0, 1}, {1, -1, 1, 1}};
  for (int k = 0; k < 4; k++) {
    struct kiln_tensor *c = kiln_clamp(a, cl[k].lo, cl[k].hi, cl[k].has_lo, cl[k].has_hi);
    double *vcl = V(c);
    for (int i = 0; i < 105; i++) {
      double t = va[i];   /* PyTorch: min(max(x, lo), hi), so lo > hi gives hi */
      if (cl[k].has_lo && t < cl[k].lo) t = cl[k].lo;
      if (cl[k].has_hi && t > cl[k].hi) t = cl[k].hi;
      want[i] = t;
    }
    CHECK(c && c->dtype == KILN_F64);
    check_arrays(vcl, want, 105, 0, 0, "clamp", __FILE__, __LINE__);
    free(vcl); kiln_tensor_release(c);
  }
  free(va); kiln_tensor_release(a);
  /* integers: integral bounds keep the dtype, a fractional one gives f32 */
  a = T(1, (int64_t[]){5}, (double[]){-5, -1, 0, 3, 9}, KILN_I32);
  struct kiln_tensor *c = kiln_clamp(a, -2, 4, 1, 1);
  v = V(c);
  CHECK(c && c->dtype == KILN_I32);
  CHECK_ARRAY_NEAR(v, ((double[]){-2, -1, 0, 3, 4}), 5, 0);
  free(v); kiln_tensor_release(c);
  c = kiln_clamp(a, -1.5, 0, 1, 0);
  v = V(c);
  CHECK(c && c->dtype == KILN_F32);
  CHECK_ARRAY_NEAR(v, ((double[]){-1.5, -1, 0, 3, 9}), 5, 0);
  free(v); kiln_tensor_release(c);
  CHECK_ERR(kiln_clamp(a, 0, 0, 0, 0), "bound");
  kiln_tensor_release(a);
  a = make(1, (int64_t[]){3}, KILN_BOOL, 3, 0, 1, 0);
  CHECK_ERR(kiln_clamp(a, 0, 1, 1, 1), "bool");
  kiln_tensor_release(a);
}

/* ---- in place ---- */

static void test_inplace(void) {
  /* unary in place on a non-contiguous view writes through to the base */
  struct kiln_tensor *base = make(2, (int64_t[]){4, 6}, KILN_F32, 50, -3, 3, 0);
  double *before = V(base);
  struct kiln_tensor *tv = kiln_transpose(base, 0, 1);
  struct kiln_tensor *nv = kiln_narrow(tv, 0, 1, 3);   /* columns 1..3 of base */
  int64_t ver = base->storage->version;
  CHECK(kiln_unary_(KILN_OP_NEG, nv) == 0);
  CHECK(base->storage->version > ver);
  double *after = V(base), want[24];
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 6; c++) want[r * 6 + c] = c >= 1 && c <= 3 ? -before[r * 6 + c] : before[r * 6 + c];
  CHECK_ARRAY_NEAR(after, want, 24, 0);
  free(after);
  /* binary in place with broadcasting and a wider dtype: a += b computes in f64, stores f32 */
  struct kiln_tensor *b = make(1, (int64_t[]){6}, KILN_F64, 51, -1, 1, 0);
  double *vb = V(b);
  after = V(base);
  CHECK(kiln_binary_(KILN_OP_ADD, base, b) == 0);
  for (int i = 0; i < 24; i++) want[i] = (double)(float)(after[i] + vb[i % 6]);
  free(after);
  after = V(base);
  CHECK_ARRAY_NEAR(after, want, 24, 0);
  CHECK(base->dtype == KILN_F32);
  free(after);
  /* a scalar in place */
  after = V(base);
  CHECK(kiln_binary_scalar_(KILN_OP_MUL, base, -2) == 0);
  for (int i = 0; i < 24; i++) want[i] = after[i] * -2;
  free(after);
  after = V(base);
  CHECK_ARRAY_NEAR(after, want, 24, 0);
  free(after);
  /* into a transposed target, broadcasting along its rows: tv[j][i] += c[i] */
  {
    struct kiln_tensor *tb = make(2, (int64_t[]){3, 5}, KILN_F32, 53, -1, 1, 0), *tt = kiln_transpose(tb, 0, 1);
    struct kiln_tensor *c3 = T(1, (int64_t[]){3}, (double[]){10, 20, 30}, KILN_F64);
    double *v0 = V(tb), w15[15];
    CHECK(kiln_binary_(KILN_OP_ADD, tt, c3) == 0);
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 5; j++) w15[i * 5 + j] = (double)(float)(v0[i * 5 + j] + 10 * (i + 1));
    double *v1 = V(tb);
    CHECK_ARRAY_NEAR(v1, w15, 15, 0);
    free(v0); free(v1);
    kiln_tensor_release(c3); kiln_tensor_release(tt); kiln_tensor_release(tb);
  }
  /* the target must hold the broadcast shape */
  struct kiln_tensor *small = make(1, (int64_t[]){6}, KILN_F32, 52, -1, 1, 0);
  CHECK_ERR(kiln_binary_(KILN_OP_ADD, small, base), "does not broadcast to the in-place target [6]");
  kiln_tensor_release(small);
  kiln_tensor_release(nv); kiln_tensor_release(tv); kiln_tensor_release(b);
  free(before); free(vb);

  /* integers: an integer result may go in (i32 += i64), a float one may not; the tensor is unchanged */
  struct kiln_tensor *ia = T(1, (int64_t[]){4}, (double[]){1, 2, 3, 4}, KILN_I32);
  struct kiln_tensor *ib = T(1, (int64_t[]){4}, (double[]){10, 20, 30, 40}, KILN_I64);
  CHECK(kiln_binary_(KILN_OP_ADD, ia, ib) == 0);
  double *v = V(ia);
  CHECK(ia->dtype == KILN_I32);
  CHECK_ARRAY_NEAR(v, ((double[]){11, 22, 33, 44}), 4, 0);
  free(v);
  CHECK_ERR(kiln_binary_(KILN_OP_DIV, ia, ib), "cannot be stored in place in a i32 tensor");
  CHECK_ERR(kiln_binary_scalar_(KILN_OP_MUL, ia, 0.5), "f32");
  CHECK_ERR(kiln_unary_(KILN_OP_SQRT, ia), "sqrt_");
  struct kiln_tensor *f4 = kiln_tensor_full(1, (int64_t[]){4}, 0.5, KILN_F16, CPU);
  CHECK_ERR(kiln_binary_(KILN_OP_ADD, ia, f4), "the result (f16) cannot be stored in place");
  kiln_tensor_release(f4);
  v = V(ia);
  CHECK_ARRAY_NEAR(v, ((double[]){11, 22, 33, 44}), 4, 0);
  free(v);
  /* in-place integer ops that stay integers */
  CHECK(kiln_binary_scalar_(KILN_OP_REMAINDER, ia, -4) == 0);
  v = V(ia);
  CHECK_ARRAY_NEAR(v, ((double[]){-1, -2, -3, 0}), 4, 0);
  free(v);
  CHECK(kiln_unary_(KILN_OP_ABS, ia) == 0);
  v = V(ia);
  CHECK_ARRAY_NEAR(v, ((double[]){1, 2, 3, 0}), 4, 0);
  free(v);
  /* logical_not in place keeps the dtype and writes 0/1 */
  struct kiln_tensor *f = T(1, (int64_t[]){3}, (double[]){0, 2.5, -1}, KILN_F32);
  CHECK(kiln_unary_(KILN_OP_LOGICAL_NOT, f) == 0);
  v = V(f);
  CHECK(f->dtype == KILN_F32);
  CHECK_ARRAY_NEAR(v, ((double[]){1, 0, 0}), 3, 0);
  free(v);
  /* a comparison in place writes 0/1 in the target's dtype */
  CHECK(kiln_binary_scalar_(KILN_OP_LT, ia, 2) == 0);
  v = V(ia);
  CHECK_ARRAY_NEAR(v, ((double[]){1, 0, 0, 1}), 4, 0);
  free(v);
  kiln_tensor_release(f); kiln_tensor_release(ia); kiln_tensor_release(ib);
  kiln_tensor_release(base);
}

/* ---- empty tensors through elementwise ops ---- */

static void test_elementwise_empty(void) {
  struct kiln_tensor *e = kiln_tensor_empty(3, (int64_t[]){3, 0, 7}, KILN_F32, CPU);
  struct kiln_tensor *r = kiln_unary(KILN_OP_EXP, e);
  CHECK(r && r->numel == 0);
  CHECK_SIZES(r, 3, 0, 7);
  kiln_tensor_release(r);
  struct kiln_tensor *row = kiln_tensor_full(2, (int64_t[]){1, 7}, 1, KILN_F64, CPU);
  r = kiln_binary(KILN_OP_ADD, e, row);
  CHECK(r && r->numel == 0 && r->dtype == KILN_F64);
  CHECK_SIZES(r, 3, 0, 7);
  kiln_tensor_release(r);
  struct kiln_tensor *z = kiln_tensor_empty(2, (int64_t[]){0, 1}, KILN_I32, CPU);
  struct kiln_tensor *c = kiln_tensor_empty(1, (int64_t[]){5}, KILN_I32, CPU);
  r = kiln_binary(KILN_OP_MUL, z, c);
  CHECK_SIZES(r, 0, 5);
  kiln_tensor_release(r);
  r = kiln_binary_scalar(KILN_OP_GT, e, 0, 0);
  CHECK(r && r->dtype == KILN_BOOL && r->numel == 0);
  kiln_tensor_release(r);
  CHECK(kiln_binary_(KILN_OP_ADD, e, row) == 0);
  CHECK(kiln_unary_(KILN_OP_NEG, e) == 0);
  r = kiln_clamp(e, 0, 1, 1, 1);
  CHECK(r && r->numel == 0);
  kiln_tensor_release(r);
  CHECK_ERR(kiln_binary(KILN_OP_ADD, e, c), "do not broadcast");
  kiln_tensor_release(z); kiln_tensor_release(c); kiln_tensor_release(row); kiln_tensor_release(e);
}

/* ---- reductions ---- */

/* Reduce vals (shape nd, sz) over the dims in mask, naively: per output position the reduced
   elements in row-major order, then the statistic in double. */
static void reduce_ref(int op, const double *vals, int nd, const int64_t *sz, int mask, double p, double *out, int64_t *out_n) {
  int64_t M = 1, R = 1, n = 1;
  for (int d = 0; d < nd; d++) {
    n *= sz[d];
    if (mask & (1 << d)) R *= sz[d]; else M *= sz[d];
  }
  double *rows = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) {
    int64_t rem = i, m = 0, r = 0, mst = 1, rst = 1;
    for (int d = nd - 1; d >= 0; d--) {
      int64_t k = rem % sz[d];
      rem /= sz[d];
      if (mask & (1 << d)) { r += k * rst; rst *= sz[d]; }
      else { m += k * mst; mst *= sz[d]; }
    }
    rows[m * R + r] = vals[i];
  }
  for (int64_t m = 0; m < M; m++) {
    const double *x = rows + m * R;
    double s = 0, best = x[0];
    int64_t bi = 0;
    switch (op) {
    case KILN_OP_SUM: for (int64_t i = 0; i < R; i++) s += x[i]; break;
    case KILN_OP_MEAN: for (int64_t i = 0; i < R; i++) s += x[i]; s /= (double)R; break;
    case KILN_OP_PROD: s = 1; for (int64_t i = 0; i < R; i++) s *= x[i]; break;
    case KILN_OP_MAX: case KILN_OP_ARGMAX:
      for (int64_t i = 1; i < R; i++) if (x[i] > best) { best = x[i]; bi = i; }
      s = op == KILN_OP_MAX ? best : (double)bi;
      break;
    case KILN_OP_MIN: case KILN_OP_ARGMIN:
      for (int64_t i = 1; i < R; i++) if (x[i] < best) { best = x[i]; bi = i; }
      s = op == KILN_OP_MIN ? best : (double)bi;
      break;
    case KILN_OP_VAR: case KILN_OP_STD: {
      double mean = 0, q = 0;
      for (int64_t i = 0; i < R; i++) mean += x[i];
      mean /= (double)R;
      for (int64_t i = 0; i < R; i++) q += (x[i] - mean) * (x[i] - mean);
      s = q / ((double)R - p);
      if (op == KILN_OP_STD) s = sqrt(s);
      break;
    }
    case KILN_OP_NORM:
      if (isinf(p)) { for (int64_t i = 0; i < R; i++) s = fmax(s, fabs(x[i])); }
      else if (p == 0) { for (int64_t i = 0; i < R; i++) s += x[i] != 0; }
      else { for (int64_t i = 0; i < R; i++) s += pow(fabs(x[i]), p); s = pow(s, 1 / p); }
      break;
    case KILN_OP_LOGSUMEXP: {
      double mx = -INFINITY;
      for (int64_t i = 0; i < R; i++) mx = fmax(mx, x[i]);
      if (isinf(mx)) { s = mx; break; }
      for (int64_t i = 0; i < R; i++) s += exp(x[i] - mx);
      s = mx + log(s);
      break;
    }
    }
    out[m] = s;
  }
  *out_n = M;
  free(rows);
}

static int reduce_result_dtype(int op, int dt) {
  if (op == KILN_OP_ARGMAX || op == KILN_OP_ARGMIN) return KILN_I64;
  if (op == KILN_OP_MAX || op == KILN_OP_MIN) return dt;
  if (op == KILN_OP_SUM || op == KILN_OP_PROD) return kiln_dtype_is_float(dt) ? dt : KILN_I64;
  return kiln_dtype_is_float(dt) ? dt : KILN_F32;
}

static void check_reduce(int op, struct kiln_tensor *a, int ndims, const int *dims, int keepdim, double p, const char *layout, int line) {
  struct kiln_tensor *r = kiln_reduce(op, a, ndims, dims, keepdim, p);
  int mask = 0;
  for (int i = 0; i < ndims; i++) mask |= 1 << (dims[i] < 0 ? dims[i] + a->ndim : dims[i]);
  if (ndims == 0) mask = (1 << a->ndim) - 1;
  int64_t want_sz[KILN_MAX_DIMS];
  int wn = 0;
  for (int d = 0; d < a->ndim; d++)
    if (!(mask & (1 << d))) want_sz[wn++] = a->sizes[d];
    else if (keepdim) want_sz[wn++] = 1;
  int rd = reduce_result_dtype(op, a->dtype);
  double *va = V(a), *want = malloc(sizeof(double) * (size_t)(a->numel + 1));
  int64_t m = 0;
  reduce_ref(op, va, a->ndim, a->sizes, mask, p, want, &m);
  for (int64_t i = 0; i < m; i++) want[i] = cast_to(rd, want[i]);
  char what[128];
  snprintf(what, sizeof what, "%s(%s %s, mask %d, keepdim %d, p %g) %s", kiln_op_name(op), kiln_dtype_name(a->dtype),
           kiln_shape_string(a), mask, keepdim, p, layout);
  check_report(r && r->dtype == rd && same_sizes(r, wn, want_sz), __FILE__, line, "%s: result %s %s (expected %s %s): %s", what,
               r ? kiln_dtype_name(r->dtype) : "NULL", r ? kiln_shape_string(r) : "", kiln_dtype_name(rd),
               sizes_str(wn, want_sz), r ? "" : kiln_error_message());
  if (r && r->numel == m) {
    double *vr = V(r);
    /* results accumulate in double and are rounded once to the output dtype */
    double rt = kiln_dtype_is_float(rd) ? (rd == KILN_F64 ? 1e-12 : rtol_of(rd)) : 0;
    check_arrays(vr, want, m, rt, rt, what, __FILE__, line);
    free(vr);
  }
  free(va); free(want);
  kiln_tensor_release(r);
}

static void test_reductions(void) {
  const int64_t shape[3] = {3, 5, 7};
  static const struct { int n; int dims[2]; } dimsets[] = {{0, {0}}, {1, {0}}, {1, {1}}, {1, {2}}, {2, {0, 2}}, {2, {-1, 1}}};
  static const struct { int op; double p; } fops[] = {
    {KILN_OP_SUM, 0}, {KILN_OP_MEAN, 0}, {KILN_OP_PROD, 0}, {KILN_OP_MAX, 0}, {KILN_OP_MIN, 0}, {KILN_OP_ARGMAX, 0},
    {KILN_OP_ARGMIN, 0}, {KILN_OP_VAR, 1}, {KILN_OP_VAR, 0}, {KILN_OP_STD, 1}, {KILN_OP_STD, 0}, {KILN_OP_NORM, 1},
    {KILN_OP_NORM, 2}, {KILN_OP_NORM, INFINITY}, {KILN_OP_NORM, 3}, {KILN_OP_NORM, 0}, {KILN_OP_LOGSUMEXP, 0},
  };
  /* floats: every op, every dim set, keepdim or not, three layouts */
  static const int fdt[3] = {KILN_F32, KILN_F64, KILN_F16};
  for (int di = 0; di < 3; di++)
    for (size_t oi = 0; oi < sizeof fops / sizeof fops[0]; oi++)
      for (int lay = CONTIG; lay <= NARROWED; lay++) {
        int op = fops[oi].op;
        double lo = op == KILN_OP_PROD ? 0.5 : -2, hi = op == KILN_OP_PROD ? 1.5 : 2;
        struct kiln_tensor *a = make_layout(lay, shape, fdt[di], 7000 + oi * 10 + (uint64_t)lay + (uint64_t)di * 1000, lo, hi,
                                            fops[oi].op == KILN_OP_NORM && fops[oi].p == 0);
        for (size_t si = 0; si < sizeof dimsets / sizeof dimsets[0]; si++) {
          if ((op == KILN_OP_ARGMAX || op == KILN_OP_ARGMIN) && dimsets[si].n > 1) continue;
          for (int keep = 0; keep <= 1; keep++)
            check_reduce(op, a, dimsets[si].n, dimsets[si].dims, keep, fops[oi].p, layout_names[lay], __LINE__);
        }
        kiln_tensor_release(a);
      }
  /* integers and bool: exact sums, products, extremes; mean and var in f32 */
  static const struct { int dtype, op; double lo, hi; int all_dims; } iops[] = {
    {KILN_I32, KILN_OP_SUM, -10, 10, 1}, {KILN_I64, KILN_OP_SUM, -1000, 1000, 1}, {KILN_U8, KILN_OP_SUM, 0, 255, 1},
    {KILN_BOOL, KILN_OP_SUM, 0, 1, 1}, {KILN_I32, KILN_OP_PROD, 1, 2, 0}, {KILN_I64, KILN_OP_PROD, -2, 2, 0},
    {KILN_I32, KILN_OP_MAX, -10, 10, 1}, {KILN_U8, KILN_OP_MIN, 0, 200, 1}, {KILN_I64, KILN_OP_ARGMAX, -1000, 1000, 1},
    {KILN_I32, KILN_OP_ARGMIN, -1000, 1000, 1}, {KILN_I64, KILN_OP_MEAN, -10, 10, 1}, {KILN_I32, KILN_OP_VAR, -10, 10, 1},
    {KILN_BOOL, KILN_OP_MAX, 0, 1, 1}, {KILN_BF16, KILN_OP_SUM, -2, 2, 1}, {KILN_BF16, KILN_OP_MAX, -2, 2, 1},
  };
  for (size_t oi = 0; oi < sizeof iops / sizeof iops[0]; oi++)
    for (int lay = CONTIG; lay <= TRANSPOSED; lay++) {
      int op = iops[oi].op;
      struct kiln_tensor *a = make_layout(lay, shape, iops[oi].dtype, 8000 + oi * 10 + (uint64_t)lay, iops[oi].lo, iops[oi].hi, 0);
      for (size_t si = 0; si < sizeof dimsets / sizeof dimsets[0]; si++) {
        if ((op == KILN_OP_ARGMAX || op == KILN_OP_ARGMIN) && dimsets[si].n > 1) continue;
        if (!iops[oi].all_dims && dimsets[si].n != 1) continue;
        check_reduce(op, a, dimsets[si].n, dimsets[si].dims, si & 1, op == KILN_OP_VAR ? 1 : 0, layout_names[lay], __LINE__);
      }
      kiln_tensor_release(a);
    }

  /* a long row, past the 32768-element chunk, against a naive sum in double */
  enum { LONG = 100003 };
  double *vals = malloc(sizeof(double) * LONG * 2);
  for (int64_t i = 0; i < LONG * 2; i++) vals[i] = (hashval((uint64_t)i + 77) + 1) / 2;
  vals[99999] = 5;            /* the max of row 0 sits in its fourth chunk */
  vals[40000] = -5;           /* its min in the second */
  vals[LONG + 10] = 7;        /* row 1: a tie across chunks; the first index wins */
  vals[LONG + 70000] = 7;
  struct kiln_tensor *lr = T(2, (int64_t[]){2, LONG}, vals, KILN_F32);
  double *lv = V(lr);   /* the values as f32 holds them */
  for (int row = 0; row < 2; row++) {
    double s = 0;
    for (int64_t i = 0; i < LONG; i++) s += lv[row * LONG + i];
    struct kiln_tensor *r = kiln_reduce(KILN_OP_SUM, lr, 1, (int[]){1}, 0, 0);
    double *v = V(r);
    CHECK_NEAR(v[row], s, fabs(s) * 1e-7);
    free(v); kiln_tensor_release(r);
  }
  for (int op = KILN_OP_SUM; op <= KILN_OP_LOGSUMEXP; op++) {
    check_reduce(op, lr, 1, (int[]){1}, 0, op == KILN_OP_NORM ? 2 : op == KILN_OP_VAR || op == KILN_OP_STD ? 1 : 0, "long rows", __LINE__);
    if (op != KILN_OP_ARGMAX && op != KILN_OP_ARGMIN) check_reduce(op, lr, 0, NULL, 0, op == KILN_OP_NORM ? 3 : 0, "long, all", __LINE__);
  }
  struct kiln_tensor *am = kiln_reduce(KILN_OP_ARGMAX, lr, 1, (int[]){-1}, 0, 0);
  struct kiln_tensor *an = kiln_reduce(KILN_OP_ARGMIN, lr, 1, (int[]){-1}, 1, 0);
  double *v = V(am), *w = V(an);
  CHECK(v[0] == 99999 && v[1] == 10);
  CHECK(w[0] == 40000);
  CHECK_SIZES(an, 2, 1);
  free(v); free(w); kiln_tensor_release(am); kiln_tensor_release(an);
  /* the same rows seen down a column of the transposed tensor */
  struct kiln_tensor *lt = kiln_transpose(lr, 0, 1);
  check_reduce(KILN_OP_SUM, lt, 1, (int[]){0}, 1, 0, "long column", __LINE__);
  check_reduce(KILN_OP_ARGMAX, lt, 1, (int[]){0}, 0, 0, "long column", __LINE__);
  check_reduce(KILN_OP_MEAN, lt, 1, (int[]){1}, 0, 0, "many short rows", __LINE__);
  kiln_tensor_release(lt);
  kiln_tensor_release(lr); free(lv);
  /* i64: exact over the long row */
  for (int64_t i = 0; i < LONG; i++) vals[i] = (double)((i * 7919) % 1000003);
  lr = T(1, (int64_t[]){LONG}, vals, KILN_I64);
  struct kiln_tensor *r = kiln_reduce(KILN_OP_SUM, lr, 0, NULL, 0, 0);
  double s = 0, x = 0;
  for (int64_t i = 0; i < LONG; i++) s += vals[i];
  CHECK(kiln_tensor_item(r, &x) == 0 && x == s && r->dtype == KILN_I64 && r->ndim == 0);
  kiln_tensor_release(r); kiln_tensor_release(lr);
  free(vals);

  /* argmax without dims: an index into the flattened tensor; keepdim keeps every dim as 1 */
  struct kiln_tensor *t = T(2, (int64_t[]){2, 3}, (double[]){3, 1, 3, 0, 1, 0}, KILN_F32);
  r = kiln_reduce(KILN_OP_ARGMAX, t, 0, NULL, 1, 0);
  CHECK_SIZES(r, 1, 1);
  CHECK(kiln_tensor_item(r, &x) == 0 && x == 0);   /* ties: the first */
  kiln_tensor_release(r);
  r = kiln_reduce(KILN_OP_ARGMIN, t, 0, NULL, 0, 0);
  CHECK(r && r->ndim == 0 && kiln_tensor_item(r, &x) == 0 && x == 3);
  kiln_tensor_release(r);
  kiln_tensor_release(t);
  /* NaN wins max and min; argmax points at it */
  t = T(1, (int64_t[]){4}, (double[]){1, NAN, 3, -1}, KILN_F32);
  r = kiln_reduce(KILN_OP_MAX, t, 0, NULL, 0, 0);
  CHECK(kiln_tensor_item(r, &x) == 0 && isnan(x));
  kiln_tensor_release(r);
  r = kiln_reduce(KILN_OP_MIN, t, 0, NULL, 0, 0);
  CHECK(kiln_tensor_item(r, &x) == 0 && isnan(x));
  kiln_tensor_release(r);
  r = kiln_reduce(KILN_OP_ARGMAX, t, 0, NULL, 0, 0);
  CHECK(kiln_tensor_item(r, &x) == 0 && x == 1);
  kiln_tensor_release(r);
  kiln_tensor_release(t);

  /* logsumexp with -inf entries, an all -inf row, a +inf row, and large values */
  const double ls[] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, 0, 1, -INFINITY,
                       1000, 1000, -INFINITY, 999, 1, INFINITY, 2, -INFINITY};
  for (int dt = KILN_F32; dt <= KILN_F64; dt++) {
    t = T(2, (int64_t[]){4, 4}, ls, dt);
    r = kiln_reduce(KILN_OP_LOGSUMEXP, t, 1, (int[]){1}, 0, 0);
    v = V(r);
    double want[4] = {-INFINITY, log(1 + exp(1.0)), 1000 + log(2 + exp(-1.0)), INFINITY};
    CHECK_ARRAY_NEAR(v, want, 4, dt == KILN_F64 ? 1e-12 : 1e-4);
    free(v); kiln_tensor_release(r);
    kiln_tensor_release(t);
  }

  /* empty tensors */
  struct kiln_tensor *e = kiln_tensor_empty(2, (int64_t[]){3, 0}, KILN_F32, CPU);
  r = kiln_reduce(KILN_OP_SUM, e, 1, (int[]){1}, 0, 0);
  v = V(r);
  CHECK_SIZES(r, 3);
  CHECK_ARRAY_NEAR(v, ((double[]){0, 0, 0}), 3, 0);
  free(v); kiln_tensor_release(r);
  static const struct { int op; double want; } empties[] = {
    {KILN_OP_SUM, 0}, {KILN_OP_PROD, 1}, {KILN_OP_MEAN, NAN}, {KILN_OP_NORM, 0}, {KILN_OP_LOGSUMEXP, -INFINITY},
  };
  for (int k = 0; k < 5; k++) {
    r = kiln_reduce(empties[k].op, e, 0, NULL, 0, 2);
    x = 42;
    CHECK(r && r->ndim == 0 && kiln_tensor_item(r, &x) == 0);
    CHECK_NEAR(x, empties[k].want, 0);
    kiln_tensor_release(r);
  }
  /* var and std divide by max(0, n - correction), as PyTorch does: NaN for nothing, inf for too few */
  for (int op = KILN_OP_VAR; op <= KILN_OP_STD; op++) {
    r = kiln_reduce(op, e, 0, NULL, 0, 1);
    CHECK(r && kiln_tensor_item(r, &x) == 0 && isnan(x));
    kiln_tensor_release(r);
    struct kiln_tensor *two = T(1, (int64_t[]){2}, (double[]){1, 3}, KILN_F64);
    r = kiln_reduce(op, two, 0, NULL, 0, 3);
    CHECK(r && kiln_tensor_item(r, &x) == 0 && x == INFINITY);
    kiln_tensor_release(r);
    r = kiln_reduce(op, two, 0, NULL, 0, 2);
    CHECK(r && kiln_tensor_item(r, &x) == 0 && x == INFINITY);
    kiln_tensor_release(r);
    r = kiln_reduce(op, two, 0, NULL, 0, 1);   /* ((1 - 2)^2 + (3 - 2)^2) / 1 */
    CHECK(r && kiln_tensor_item(r, &x) == 0 && x == (op == KILN_OP_VAR ? 2 : sqrt(2)));
    kiln_tensor_release(r);
    kiln_tensor_release(two);
  }
  r = kiln_reduce(KILN_OP_MAX, e, 1, (int[]){0}, 0, 0);   /* [0]: nothing is reduced over an empty dim */
  CHECK(r && r->numel == 0);
  CHECK_SIZES(r, 0);
  kiln_tensor_release(r);
  CHECK_ERR(kiln_reduce(KILN_OP_MAX, e, 1, (int[]){1}, 0, 0), "empty dim");
  CHECK_ERR(kiln_reduce(KILN_OP_ARGMIN, e, 0, NULL, 0, 0), "empty dim");
  CHECK_ERR(kiln_reduce(KILN_OP_MIN, e, 0, NULL, 0, 0), "[3,0]");
  struct kiln_tensor *ei = kiln_tensor_empty(1, (int64_t[]){0}, KILN_I32, CPU);
  r = kiln_reduce(KILN_OP_SUM, ei, 0, NULL, 0, 0);
  CHECK(r && r->dtype == KILN_I64 && kiln_tensor_item(r, &x) == 0 && x == 0);
  kiln_tensor_release(r);
  r = kiln_reduce(KILN_OP_PROD, ei, 0, NULL, 0, 0);
  CHECK(r && kiln_tensor_item(r, &x) == 0 && x == 1);
  kiln_tensor_release(r);
  kiln_tensor_release(ei);
  kiln_tensor_release(e);

  /* misuse */
  t = make(3, shape, KILN_F32, 9, -1, 1, 0);
  CHECK_ERR(kiln_reduce(KILN_OP_ARGMAX, t, 2, (int[]){0, 1}, 0, 0), "one dim");
  CHECK_ERR(kiln_reduce(KILN_OP_SUM, t, 2, (int[]){1, -2}, 0, 0), "given twice");
  CHECK_ERR(kiln_reduce(KILN_OP_SUM, t, 1, (int[]){3}, 0, 0), "dim 3 out of range");
  CHECK_ERR(kiln_reduce(KILN_OP_NORM, t, 0, NULL, 0, -1), "p >= 0");
  CHECK_ERR(kiln_reduce(KILN_OP_ADD, t, 0, NULL, 0, 0), "not a reduction");
  check_reduce(KILN_OP_SUM, t, 0, NULL, 0, 0, "after errors", __LINE__);
  kiln_tensor_release(t);
}

/* ---- matrix products ---- */

/* C[b][i][j] = sum_p A[b][i][p] B[b][p][j] in double, from row-major values. */
static void mm_ref(const double *A, const double *B, double *C, int64_t nb, int64_t n, int64_t k, int64_t m) {
  for (int64_t b = 0; b < nb; b++)
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < m; j++) {
        double s = 0;
        for (int64_t p = 0; p < k; p++) s += A[(b * n + i) * k + p] * B[(b * k + p) * m + j];
        C[(b * n + i) * m + j] = s;
      }
}

static double mm_tol(int dt) { return dt == KILN_F64 ? 1e-12 : dt == KILN_F32 ? 1e-5 : dt == KILN_I64 ? 0 : 4e-3; }

/* a [n,k] @ b [k,m] (2-d, any layout) through kiln_mm, against the reference. */
static void check_mm(struct kiln_tensor *a, struct kiln_tensor *b, const char *what, int line) {
  int64_t n = a->sizes[0], k = a->sizes[1], m = b->sizes[1];
  struct kiln_tensor *c = kiln_mm(a, b);
  double *va = V(a), *vb = V(b), *want = malloc(sizeof(double) * (size_t)(n * m + 1));
  mm_ref(va, vb, want, 1, n, k, m);
  check_report(c && c->dtype == a->dtype && same_sizes(c, 2, (int64_t[]){n, m}), __FILE__, line, "%s: %s", what,
               c ? kiln_shape_string(c) : kiln_error_message());
  if (c) {
    double *vc = V(c);
    check_arrays(vc, want, n * m, mm_tol(a->dtype), mm_tol(a->dtype), what, __FILE__, line);
    free(vc);
  }
  free(va); free(vb); free(want);
  kiln_tensor_release(c);
}

static void test_matmul(void) {
  static const int dts[4] = {KILN_F32, KILN_F64, KILN_F16, KILN_I64};
  for (int di = 0; di < 4; di++) {
    int dt = dts[di];
    double lo = dt == KILN_I64 ? -5 : -1, hi = dt == KILN_I64 ? 5 : 1;
    char what[80];
    /* contiguous */
    struct kiln_tensor *a = make(2, (int64_t[]){5, 7}, dt, 300 + (uint64_t)di, lo, hi, 0);
    struct kiln_tensor *b = make(2, (int64_t[]){7, 3}, dt, 310 + (uint64_t)di, lo, hi, 0);
    snprintf(what, sizeof what, "mm %s contiguous", kiln_dtype_name(dt));
    check_mm(a, b, what, __LINE__);
    /* transposed operands (BLAS reads them transposed) */
    struct kiln_tensor *at0 = make(2, (int64_t[]){7, 5}, dt, 320 + (uint64_t)di, lo, hi, 0), *at = kiln_transpose(at0, 0, 1);
    struct kiln_tensor *bt0 = make(2, (int64_t[]){3, 7}, dt, 330 + (uint64_t)di, lo, hi, 0), *bt = kiln_transpose(bt0, 0, 1);
    snprintf(what, sizeof what, "mm %s transposed", kiln_dtype_name(dt));
    check_mm(at, bt, what, __LINE__);
    check_mm(at, b, what, __LINE__);
    check_mm(a, bt, what, __LINE__);
    /* narrowed (a leading dimension wider than the row) and strided (every other column: copied) */
    struct kiln_tensor *an0 = make(2, (int64_t[]){5, 10}, dt, 340 + (uint64_t)di, lo, hi, 0), *an = kiln_narrow(an0, 1, 2, 7);
    struct kiln_tensor *bs0 = make(3, (int64_t[]){7, 3, 2}, dt, 350 + (uint64_t)di, lo, hi, 0), *bs = kiln_select(bs0, 2, 1);
    snprintf(what, sizeof what, "mm %s narrowed, strided", kiln_dtype_name(dt));
    check_mm(an, bs, what, __LINE__);
    /* an expanded (stride 0) operand */
    struct kiln_tensor *row = make(2, (int64_t[]){1, 7}, dt, 360 + (uint64_t)di, lo, hi, 0);
    struct kiln_tensor *ex = kiln_expand(row, 2, (int64_t[]){4, 7});
    snprintf(what, sizeof what, "mm %s expanded", kiln_dtype_name(dt));
    check_mm(ex, b, what, __LINE__);
    kiln_tensor_release(ex); kiln_tensor_release(row);
    kiln_tensor_release(an); kiln_tensor_release(an0); kiln_tensor_release(bs); kiln_tensor_release(bs0);
    kiln_tensor_release(at); kiln_tensor_release(at0); kiln_tensor_release(bt); kiln_tensor_release(bt0);

    /* 1-d operands */
    struct kiln_tensor *v7 = make(1, (int64_t[]){7}, dt, 370 + (uint64_t)di, lo, hi, 0);
    double *va = V(a), *vb = V(b), *vv = V(v7), want[64];
    struct kiln_tensor *r = kiln_matmul(v7, b);   /* [7] @ [7,3] -> [3] */
    mm_ref(vv, vb, want, 1, 1, 7, 3);
    double *vr = V(r);
    CHECK_SIZES(r, 3);
    check_arrays(vr, want, 3, mm_tol(dt), mm_tol(dt), "1-d @ 2-d", __FILE__, __LINE__);
    free(vr); kiln_tensor_release(r);
    r = kiln_matmul(a, v7);   /* [5,7] @ [7] -> [5] */
    mm_ref(va, vv, want, 1, 5, 7, 1);
    vr = V(r);
    CHECK_SIZES(r, 5);
    check_arrays(vr, want, 5, mm_tol(dt), mm_tol(dt), "2-d @ 1-d", __FILE__, __LINE__);
    free(vr); kiln_tensor_release(r);
    r = kiln_matmul(v7, v7);   /* a dot product: 0-dim */
    mm_ref(vv, vv, want, 1, 1, 7, 1);
    vr = V(r);
    CHECK(r && r->ndim == 0);
    check_arrays(vr, want, 1, mm_tol(dt), mm_tol(dt), "1-d @ 1-d", __FILE__, __LINE__);
    free(vr); kiln_tensor_release(r);
    free(va); free(vb); free(vv);
    kiln_tensor_release(v7);
    kiln_tensor_release(a); kiln_tensor_release(b);

    /* batched, with broadcasting: [2,1,3,4] @ [5,4,2] -> [2,5,3,2] */
    a = make(4, (int64_t[]){2, 1, 3, 4}, dt, 380 + (uint64_t)di, lo, hi, 0);
    b = make(3, (int64_t[]){5, 4, 2}, dt, 390 + (uint64_t)di, lo, hi, 0);
    r = kiln_matmul(a, b);
    CHECK_SIZES(r, 2, 5, 3, 2);
    va = V(a); vb = V(b);
    double bw[2 * 5 * 3 * 2];
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 5; j++) mm_ref(va + i * 12, vb + j * 8, bw + (i * 5 + j) * 6, 1, 3, 4, 2);
    vr = V(r);
    check_arrays(vr, bw, 60, mm_tol(dt), mm_tol(dt), "batched broadcast", __FILE__, __LINE__);
    free(vr); free(va); free(vb); kiln_tensor_release(r);
    kiln_tensor_release(a); kiln_tensor_release(b);

    /* bmm with a transposed batch operand */
    struct kiln_tensor *a0 = make(3, (int64_t[]){4, 5, 3}, dt, 400 + (uint64_t)di, lo, hi, 0);
    a = kiln_transpose(a0, 1, 2);   /* [4,3,5] */
    b = make(3, (int64_t[]){4, 5, 2}, dt, 410 + (uint64_t)di, lo, hi, 0);
    r = kiln_bmm(a, b);
    CHECK_SIZES(r, 4, 3, 2);
    va = V(a); vb = V(b);
    double bb[24];
    mm_ref(va, vb, bb, 4, 3, 5, 2);
    vr = V(r);
    check_arrays(vr, bb, 24, mm_tol(dt), mm_tol(dt), "bmm", __FILE__, __LINE__);
    free(vr); free(va); free(vb); kiln_tensor_release(r);
    kiln_tensor_release(a); kiln_tensor_release(a0); kiln_tensor_release(b);
  }

  /* a 1-d operand against a batch: [4] @ [2,4,3] -> [2,3], [2,3,4] @ [4] -> [2,3] */
  {
    struct kiln_tensor *v4 = make(1, (int64_t[]){4}, KILN_F64, 430, -1, 1, 0);
    struct kiln_tensor *b3 = make(3, (int64_t[]){2, 4, 3}, KILN_F64, 431, -1, 1, 0);
    struct kiln_tensor *a3 = make(3, (int64_t[]){2, 3, 4}, KILN_F64, 432, -1, 1, 0);
    double *vv = V(v4), *vb = V(b3), *va = V(a3), want[6];
    struct kiln_tensor *r = kiln_matmul(v4, b3);
    for (int bi = 0; bi < 2; bi++) mm_ref(vv, vb + bi * 12, want + bi * 3, 1, 1, 4, 3);
    double *vr = V(r);
    CHECK_SIZES(r, 2, 3);
    CHECK_ARRAY_NEAR(vr, want, 6, 1e-12);
    free(vr); kiln_tensor_release(r);
    r = kiln_matmul(a3, v4);
    for (int bi = 0; bi < 2; bi++) mm_ref(va + bi * 12, vv, want + bi * 3, 1, 3, 4, 1);
    vr = V(r);
    CHECK_SIZES(r, 2, 3);
    CHECK_ARRAY_NEAR(vr, want, 6, 1e-12);
    free(vr); kiln_tensor_release(r);
    free(vv); free(vb); free(va);
    kiln_tensor_release(v4); kiln_tensor_release(b3); kiln_tensor_release(a3);
  }

  /* addmm: beta * c + alpha * a @ b with c broadcast from a row */
  for (int dt = KILN_F32; dt <= KILN_F64; dt++) {
    struct kiln_tensor *a = make(2, (int64_t[]){3, 5}, dt, 420, -1, 1, 0), *b = make(2, (int64_t[]){5, 4}, dt, 421, -1, 1, 0);
    struct kiln_tensor *c = make(1, (int64_t[]){4}, dt, 422, -1, 1, 0);
    struct kiln_tensor *r = kiln_addmm(c, a, b, 0.5, 2);
    double *va = V(a), *vb = V(b), *vc = V(c), want[12];
    mm_ref(va, vb, want, 1, 3, 5, 4);
    for (int i = 0; i < 12; i++) want[i] = 0.5 * vc[i % 4] + 2 * want[i];
    double *vr = V(r);
    CHECK_SIZES(r, 3, 4);
    check_arrays(vr, want, 12, mm_tol(dt), mm_tol(dt), "addmm", __FILE__, __LINE__);
    free(vr); kiln_tensor_release(r);
    /* beta = 0: c is ignored, NaN and all */
    struct kiln_tensor *cn = kiln_tensor_full(2, (int64_t[]){3, 4}, NAN, dt, CPU);
    r = kiln_addmm(cn, a, b, 0, 1);
    mm_ref(va, vb, want, 1, 3, 5, 4);
    vr = V(r);
    check_arrays(vr, want, 12, mm_tol(dt), mm_tol(dt), "addmm beta 0", __FILE__, __LINE__);
    free(vr); kiln_tensor_release(r);
    CHECK_ERR(kiln_addmm(a, a, b, 1, 1), "bias [3,5]");
    /* matmul_out into an existing tensor */
    struct kiln_tensor *out = kiln_tensor_full(2, (int64_t[]){3, 4}, 99, dt, CPU);
    CHECK(kiln_matmul_out(out, a, b) == 0);
    vr = V(out);
    check_arrays(vr, want, 12, mm_tol(dt), mm_tol(dt), "matmul_out", __FILE__, __LINE__);
    free(vr);
    CHECK_ERR(kiln_matmul_out(out, b, a), "[5,4] @ [3,5]");
    /* into a transposed (non-contiguous) out */
    struct kiln_tensor *ob = kiln_tensor_full(2, (int64_t[]){4, 3}, 7, dt, CPU), *ot = kiln_transpose(ob, 0, 1);
    CHECK(kiln_matmul_out(ot, a, b) == 0);
    vr = V(ot);
    check_arrays(vr, want, 12, mm_tol(dt), mm_tol(dt), "matmul_out, transposed out", __FILE__, __LINE__);
    free(vr);
    kiln_tensor_release(ot); kiln_tensor_release(ob);
    struct kiln_tensor *bad = kiln_tensor_empty(2, (int64_t[]){4, 3}, dt, CPU);
    CHECK_ERR(kiln_matmul_out(bad, a, b), "expected [3,4]");
    kiln_tensor_release(bad); kiln_tensor_release(out);
    free(va); free(vb); free(vc);
    kiln_tensor_release(cn); kiln_tensor_release(a); kiln_tensor_release(b); kiln_tensor_release(c);

    /* k = 0: the product is zero; addmm leaves beta * c */
    a = kiln_tensor_empty(2, (int64_t[]){3, 0}, dt, CPU);
    b = kiln_tensor_empty(2, (int64_t[]){0, 4}, dt, CPU);
    r = kiln_matmul(a, b);
    vr = V(r);
    CHECK_SIZES(r, 3, 4);
    double zeros[12] = {0};
    CHECK_ARRAY_NEAR(vr, zeros, 12, 0);
    free(vr); kiln_tensor_release(r);
    c = kiln_tensor_full(2, (int64_t[]){3, 4}, 1.5, dt, CPU);
    r = kiln_addmm(c, a, b, 2, 1);
    vr = V(r);
    for (int i = 0; i < 12; i++) want[i] = 3;
    CHECK_ARRAY_NEAR(vr, want, 12, 0);
    free(vr); kiln_tensor_release(r);
    kiln_tensor_release(c); kiln_tensor_release(a); kiln_tensor_release(b);
    /* n = 0 */
    a = kiln_tensor_empty(2, (int64_t[]){0, 5}, dt, CPU);
    b = kiln_tensor_full(2, (int64_t[]){5, 2}, 1, dt, CPU);
    r = kiln_mm(a, b);
    CHECK(r && r->numel == 0);
    CHECK_SIZES(r, 0, 2);
    kiln_tensor_release(r); kiln_tensor_release(a); kiln_tensor_release(b);
  }

  /* misuse: messages name both shapes */
  struct kiln_tensor *a = kiln_tensor_empty(2, (int64_t[]){32, 784}, KILN_F32, CPU);
  struct kiln_tensor *b = kiln_tensor_empty(2, (int64_t[]){512, 256}, KILN_F32, CPU);
  CHECK_ERR(kiln_matmul(a, b), "[32,784]");
  CHECK_ERR(kiln_matmul(a, b), "[512,256]");
  CHECK_ERR(kiln_matmul(a, b), "inner sizes differ (784 vs 512)");
  CHECK_ERR(kiln_mm(a, b), "mm: [32,784] @ [512,256]");
  struct kiln_tensor *b64 = kiln_tensor_empty(2, (int64_t[]){784, 3}, KILN_F64, CPU);
  CHECK_ERR(kiln_matmul(a, b64), "dtypes differ");
  struct kiln_tensor *b3 = kiln_tensor_empty(3, (int64_t[]){2, 784, 3}, KILN_F32, CPU);
  CHECK_ERR(kiln_mm(a, b3), "both must be 2-d");
  struct kiln_tensor *a3 = kiln_tensor_empty(3, (int64_t[]){3, 4, 784}, KILN_F32, CPU);
  CHECK_ERR(kiln_bmm(a3, b3), "batch sizes differ");
  struct kiln_tensor *b2 = kiln_tensor_empty(3, (int64_t[]){2, 784, 1}, KILN_F32, CPU);
  CHECK_ERR(kiln_matmul(a3, b2), "do not broadcast");
  kiln_tensor_release(b2);
  struct kiln_tensor *s = kiln_tensor_full(0, NULL, 1, KILN_F32, CPU);
  CHECK_ERR(kiln_matmul(s, a), "at least 1 dim");
  struct kiln_tensor *bo = kiln_tensor_empty(2, (int64_t[]){2, 2}, KILN_BOOL, CPU);
  CHECK_ERR(kiln_matmul(bo, bo), "bool");
  kiln_tensor_release(bo); kiln_tensor_release(s); kiln_tensor_release(a3); kiln_tensor_release(b3);
  kiln_tensor_release(b64); kiln_tensor_release(a); kiln_tensor_release(b);
}

/* ---- joining ---- */

static void test_cat_stack(void) {
  /* cat along dim 1: f32 [2,3] (transposed storage) with i64 [2,2]: an f32 [2,5] */
  struct kiln_tensor *x0 = T(2, (int64_t[]){3, 2}, (double[]){1, 4, 2, 5, 3, 6}, KILN_F32), *x = kiln_transpose(x0, 0, 1);
  struct kiln_tensor *y = T(2, (int64_t[]){2, 2}, (double[]){7, 8, 9, 10}, KILN_I64);
  struct kiln_tensor *r = kiln_cat(2, (struct kiln_tensor *[]){x, y}, 1);
  double *v = V(r);
  CHECK(r && r->dtype == KILN_F32);
  CHECK_SIZES(r, 2, 5);
  CHECK_ARRAY_NEAR(v, ((double[]){1, 2, 3, 7, 8, 4, 5, 6, 9, 10}), 10, 0);
  free(v); kiln_tensor_release(r);
  r = kiln_cat(2, (struct kiln_tensor *[]){y, x}, -1);
  v = V(r);
  CHECK_ARRAY_NEAR(v, ((double[]){7, 8, 1, 2, 3, 9, 10, 4, 5, 6}), 10, 0);
  free(v); kiln_tensor_release(r);
  /* along dim 0, with a 1-d empty tensor that is skipped whatever its shape */
  struct kiln_tensor *z = kiln_tensor_empty(1, (int64_t[]){0}, KILN_F64, CPU);
  struct kiln_tensor *w = T(2, (int64_t[]){1, 3}, (double[]){-1, -2, -3}, KILN_I32);
  r = kiln_cat(3, (struct kiln_tensor *[]){z, x, w}, 0);
  v = V(r);
  CHECK(r && r->dtype == KILN_F64);   /* the skipped tensor still takes part in promotion, as in PyTorch */
  CHECK_SIZES(r, 3, 3);
  CHECK_ARRAY_NEAR(v, ((double[]){1, 2, 3, 4, 5, 6, -1, -2, -3}), 9, 0);
  free(v); kiln_tensor_release(r);
  /* mismatched sizes name both shapes */
  CHECK_ERR(kiln_cat(2, (struct kiln_tensor *[]){x, y}, 0), "[2,2]");
  CHECK_ERR(kiln_cat(2, (struct kiln_tensor *[]){x, y}, 0), "[2,3]");
  CHECK_ERR(kiln_cat(2, (struct kiln_tensor *[]){x, w}, 2), "out of range");
  struct kiln_tensor *s = kiln_tensor_full(0, NULL, 1, KILN_F32, CPU);
  CHECK_ERR(kiln_cat(1, (struct kiln_tensor *[]){s}, 0), "0-dim");
  CHECK_ERR(kiln_cat(0, NULL, 0), "no tensors");
  /* a single tensor: a copy */
  r = kiln_cat(1, (struct kiln_tensor *[]){x}, 0);
  v = V(r);
  CHECK(r && r->storage != x->storage);
  CHECK_ARRAY_NEAR(v, ((double[]){1, 2, 3, 4, 5, 6}), 6, 0);
  free(v); kiln_tensor_release(r);

  /* stack: a new dim at 0, in the middle, at the end */
  struct kiln_tensor *x2 = kiln_binary_scalar(KILN_OP_ADD, x, 10, 0);
  r = kiln_stack(2, (struct kiln_tensor *[]){x, x2}, 0);
  CHECK_SIZES(r, 2, 2, 3);
  v = V(r);
  CHECK_ARRAY_NEAR(v, ((double[]){1, 2, 3, 4, 5, 6, 11, 12, 13, 14, 15, 16}), 12, 0);
  free(v); kiln_tensor_release(r);
  r = kiln_stack(2, (struct kiln_tensor *[]){x, x2}, 1);
  CHECK_SIZES(r, 2, 2, 3);
  v = V(r);
  CHECK_ARRAY_NEAR(v, ((double[]){1, 2, 3, 11, 12, 13, 4, 5, 6, 14, 15, 16}), 12, 0);
  free(v); kiln_tensor_release(r);
  r = kiln_stack(2, (struct kiln_tensor *[]){x, x2}, -1);
  CHECK_SIZES(r, 2, 3, 2);
  v = V(r);
  CHECK_ARRAY_NEAR(v, ((double[]){1, 11, 2, 12, 3, 13, 4, 14, 5, 15, 6, 16}), 12, 0);
  free(v); kiln_tensor_release(r);
  /* promotion: i32 with f64 */
  struct kiln_tensor *xi = kiln_to_dtype(x, KILN_I32), *xd = kiln_to_dtype(x, KILN_F64);
  r = kiln_stack(2, (struct kiln_tensor *[]){xi, xd}, 0);
  CHECK(r && r->dtype == KILN_F64);
  kiln_tensor_release(r);
  /* stacking scalars gives a vector */
  r = kiln_stack(3, (struct kiln_tensor *[]){s, s, s}, 0);
  CHECK_SIZES(r, 3);
  kiln_tensor_release(r);
  CHECK_ERR(kiln_stack(2, (struct kiln_tensor *[]){x, y}, 0), "all must match");
  CHECK_ERR(kiln_stack(2, (struct kiln_tensor *[]){x, x2}, 3), "out of range");
  kiln_tensor_release(xi); kiln_tensor_release(xd); kiln_tensor_release(x2);
  kiln_tensor_release(s); kiln_tensor_release(z); kiln_tensor_release(w);
  kiln_tensor_release(x); kiln_tensor_release(x0); kiln_tensor_release(y);
}

/* ---- indexing ---- */

static void test_index_select_gather(void) {
  /* a [4,5] seen through a transpose of its [5,4] storage */
  struct kiln_tensor *a0 = make(2, (int64_t[]){5, 4}, KILN_F32, 600, -5, 5, 0), *a = kiln_transpose(a0, 0, 1);
  double *va = V(a);
  struct kiln_tensor *idx = T(1, (int64_t[]){3}, (double[]){3, 0, 3}, KILN_I64);
  struct kiln_tensor *r = kiln_index_select(a, 0, idx);
  CHECK_SIZES(r, 3, 5);
  double *v = V(r), want[40];
  const int rows[3] = {3, 0, 3};
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 5; j++) want[i * 5 + j] = va[rows[i] * 5 + j];
  CHECK_ARRAY_NEAR(v, want, 15, 0);
  free(v); kiln_tensor_release(r);
  struct kiln_tensor *idx32 = T(1, (int64_t[]){2}, (double[]){4, 1}, KILN_I32);
  r = kiln_index_select(a, -1, idx32);
  CHECK_SIZES(r, 4, 2);
  v = V(r);
  for (int i = 0; i < 4; i++) { want[i * 2] = va[i * 5 + 4]; want[i * 2 + 1] = va[i * 5 + 1]; }
  CHECK_ARRAY_NEAR(v, want, 8, 0);
  free(v); kiln_tensor_release(r);
  /* contiguous rows (the memcpy path) */
  struct kiln_tensor *ac = kiln_contiguous(a);
  r = kiln_index_select(ac, 0, idx);
  v = V(r);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 5; j++) want[i * 5 + j] = va[rows[i] * 5 + j];
  CHECK_ARRAY_NEAR(v, want, 15, 0);
  free(v); kiln_tensor_release(r);
  kiln_tensor_release(ac);
  struct kiln_tensor *bad = T(1, (int64_t[]){2}, (double[]){1, 4}, KILN_I64);
  CHECK_ERR(kiln_index_select(a, 0, bad), "index 4 out of range for dim 0 of size 4");
  struct kiln_tensor *neg = T(1, (int64_t[]){1}, (double[]){-1}, KILN_I64);
  CHECK_ERR(kiln_index_select(a, 0, neg), "index -1 out of range");
  struct kiln_tensor *fidx = T(1, (int64_t[]){1}, (double[]){0}, KILN_F32);
  CHECK_ERR(kiln_index_select(a, 0, fidx), "expected i64 or i32");
  struct kiln_tensor *idx2 = kiln_tensor_full(2, (int64_t[]){1, 1}, 0, KILN_I64, CPU);
  CHECK_ERR(kiln_index_select(a, 0, idx2), "must be 1-d");
  struct kiln_tensor *eidx = kiln_tensor_empty(1, (int64_t[]){0}, KILN_I64, CPU);
  r = kiln_index_select(a, 1, eidx);
  CHECK_SIZES(r, 4, 0);
  kiln_tensor_release(r);

  /* gather along dim 1: out[i][j] = a[i][idx[i][j]]; the index itself non-contiguous */
  struct kiln_tensor *g0 = T(2, (int64_t[]){2, 4}, (double[]){0, 4, 2, 2, 3, 1, 1, 0}, KILN_I64), *gi = kiln_transpose(g0, 0, 1);
  double *vg = V(gi);   /* [4,2] */
  r = kiln_gather(a, 1, gi);
  CHECK_SIZES(r, 4, 2);
  v = V(r);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 2; j++) want[i * 2 + j] = va[i * 5 + (int)vg[i * 2 + j]];
  CHECK_ARRAY_NEAR(v, want, 8, 0);
  free(v); kiln_tensor_release(r);
  /* along dim 0: out[i][j] = a[idx[i][j]][j] */
  struct kiln_tensor *gd = T(2, (int64_t[]){2, 3}, (double[]){3, 0, 1, 2, 2, 0}, KILN_I32);
  double *vgd = V(gd);
  r = kiln_gather(a, 0, gd);
  CHECK_SIZES(r, 2, 3);
  v = V(r);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++) want[i * 3 + j] = va[(int)vgd[i * 3 + j] * 5 + j];
  CHECK_ARRAY_NEAR(v, want, 6, 0);
  free(v); kiln_tensor_release(r);
  struct kiln_tensor *gbad = T(2, (int64_t[]){1, 1}, (double[]){5}, KILN_I64);
  CHECK_ERR(kiln_gather(a, 1, gbad), "index 5 out of range for dim 1 of size 5");
  struct kiln_tensor *gbig = kiln_tensor_full(2, (int64_t[]){5, 1}, 0, KILN_I64, CPU);
  CHECK_ERR(kiln_gather(a, 1, gbig), "larger than input");
  CHECK_ERR(kiln_gather(a, 1, idx), "same number of dims");

  kiln_tensor_release(gbig); kiln_tensor_release(gbad); kiln_tensor_release(gd); kiln_tensor_release(g0);
  kiln_tensor_release(gi); kiln_tensor_release(eidx); kiln_tensor_release(idx2); kiln_tensor_release(fidx);
  kiln_tensor_release(neg); kiln_tensor_release(bad); kiln_tensor_release(idx32); kiln_tensor_release(idx);
  free(vg); free(vgd); free(va);
  kiln_tensor_release(a); kiln_tensor_release(a0);
}

static void test_scatter_add(void) {
  for (int dt = KILN_F32; dt <= KILN_I64; dt += KILN_I64 - KILN_F32) {   /* f32 and i64 */
    for (int dim = 0; dim <= 1; dim++) {
      struct kiln_tensor *a = make(2, (int64_t[]){3, 5}, dt, 700 + (uint64_t)dim, -5, 5, 0);
      /* index [3,2] (along dim 1: values < 5; along dim 0: values < 3), with duplicates */
      const double i1[6] = {4, 4, 0, 2, 1, 0}, i0[6] = {2, 2, 0, 1, 2, 0};
      struct kiln_tensor *idx = T(2, (int64_t[]){3, 2}, dim ? i1 : i0, KILN_I64);
      struct kiln_tensor *src = make(2, (int64_t[]){3, 4}, dt, 710 + (uint64_t)dim, -5, 5, 0);   /* larger than the index */
      double *va = V(a), *vs = V(src), want[15];
      memcpy(want, va, sizeof want);
      for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
          int k = (int)(dim ? i1 : i0)[i * 2 + j];
          if (dim) want[i * 5 + k] += vs[i * 4 + j];
          else want[k * 5 + j] += vs[i * 4 + j];
        }
      struct kiln_tensor *r = kiln_scatter_add(a, dim, idx, src);
      double *vr = V(r), *va2 = V(a);
      CHECK(r && r->dtype == dt);
      CHECK_ARRAY_NEAR(vr, want, 15, dt == KILN_F32 ? 1e-5 : 0);
      CHECK_ARRAY_NEAR(va2, va, 15, 0);   /* the out-of-place form leaves a alone */
      free(vr); free(va2); kiln_tensor_release(r);
      /* in place, then a bad index: an error, and the tensor unchanged */
      CHECK(kiln_scatter_add_(a, dim, idx, src) == 0);
      vr = V(a);
      CHECK_ARRAY_NEAR(vr, want, 15, dt == KILN_F32 ? 1e-5 : 0);
      free(vr);
      const double ib[6] = {0, 1, 2, 0, 1, 7};   /* 7 is past both dims; the earlier indices are fine */
      struct kiln_tensor *bidx = T(2, (int64_t[]){3, 2}, ib, KILN_I64);
      CHECK_ERR(kiln_scatter_add_(a, dim, bidx, src), "index 7 out of range");
      vr = V(a);
      CHECK_ARRAY_NEAR(vr, want, 15, dt == KILN_F32 ? 1e-5 : 0);
      free(vr);
      CHECK_ERR(kiln_scatter_add(a, dim, bidx, src), "out of range");
      struct kiln_tensor *small = make(2, (int64_t[]){3, 1}, dt, 1, 0, 1, 0);
      CHECK_ERR(kiln_scatter_add_(a, dim, idx, small), "larger than src");
      kiln_tensor_release(small);
      kiln_tensor_release(bidx);
      free(va); free(vs);
      kiln_tensor_release(a); kiln_tensor_release(idx); kiln_tensor_release(src);
    }
  }
  /* whole rows (one index per row, expanded along dim 1: index_select's backward), with fewer
     index rows than src has, in f32 and f64; then src wider than the index (the general walk),
     and a bad index: an error naming it, nothing written */
  for (int dt = KILN_F32; dt <= KILN_F64; dt++) {   /* f32, f64 */
    for (int wide = 0; wide <= 1; wide++) {
      struct kiln_tensor *a = make(2, (int64_t[]){4, 3}, dt, 720, -5, 5, 0);
      struct kiln_tensor *col = T(2, (int64_t[]){2, 1}, (double[]){3, 1}, KILN_I64);
      struct kiln_tensor *idx = kiln_expand(col, 2, (int64_t[]){2, 3});
      struct kiln_tensor *src = make(2, (int64_t[]){5, wide ? 4 : 3}, dt, 721, -5, 5, 0);
      int64_t sw = wide ? 4 : 3;
      double *va = V(a), *vs = V(src), want[12];
      memcpy(want, va, sizeof want);
      for (int j = 0; j < 3; j++) { want[3 * 3 + j] += vs[0 * sw + j]; want[1 * 3 + j] += vs[1 * sw + j]; }
      CHECK(idx && kiln_scatter_add_(a, 0, idx, src) == 0);
      double *vr = V(a);
      CHECK_ARRAY_NEAR(vr, want, 12, dt == KILN_F32 ? 1e-5 : 0);
      free(vr);
      struct kiln_tensor *bcol = T(2, (int64_t[]){2, 1}, (double[]){0, 4}, KILN_I64);
      struct kiln_tensor *bidx = kiln_expand(bcol, 2, (int64_t[]){2, 3});
      CHECK_ERR(kiln_scatter_add_(a, 0, bidx, src), "index 4 out of range");
      vr = V(a);
      CHECK_ARRAY_NEAR(vr, want, 12, dt == KILN_F32 ? 1e-5 : 0);
      free(vr); free(va); free(vs);
      kiln_tensor_release(bidx); kiln_tensor_release(bcol);
      kiln_tensor_release(a); kiln_tensor_release(col); kiln_tensor_release(idx); kiln_tensor_release(src);
    }
  }
  /* mixed dtypes: f16 target, f32 source */
  struct kiln_tensor *a = kiln_tensor_full(1, (int64_t[]){3}, 1, KILN_F16, CPU);
  struct kiln_tensor *idx = T(1, (int64_t[]){4}, (double[]){2, 0, 2, 2}, KILN_I32);
  struct kiln_tensor *src = T(1, (int64_t[]){4}, (double[]){0.5, 0.25, 1, 2}, KILN_F32);
  CHECK(kiln_scatter_add_(a, 0, idx, src) == 0);
  double *v = V(a);
  CHECK_ARRAY_NEAR(v, ((double[]){1.25, 1, 4.5}), 3, 0);
  free(v);
  kiln_tensor_release(a); kiln_tensor_release(idx); kiln_tensor_release(src);
}

static void test_masked(void) {
  struct kiln_tensor *a = make(2, (int64_t[]){3, 4}, KILN_F32, 800, -5, 5, 0);
  struct kiln_tensor *mask = T(1, (int64_t[]){4}, (double[]){1, 0, 0, 1}, KILN_BOOL);
  double *va = V(a), want[12];
  struct kiln_tensor *r = kiln_masked_fill(a, mask, -1.5);
  for (int i = 0; i < 12; i++) want[i] = (i % 4 == 0 || i % 4 == 3) ? -1.5 : va[i];
  double *v = V(r);
  CHECK(r && r->dtype == KILN_F32);
  CHECK_ARRAY_NEAR(v, want, 12, 0);
  free(v); kiln_tensor_release(r);
  double *va2 = V(a);
  CHECK_ARRAY_NEAR(va2, va, 12, 0);   /* out of place */
  free(va2);
  /* in place through a transposed view, with a u8 mask [4,1] broadcast over its columns */
  struct kiln_tensor *at = kiln_transpose(a, 0, 1);   /* [4,3] */
  struct kiln_tensor *m8 = T(2, (int64_t[]){4, 1}, (double[]){0, 1, 1, 0}, KILN_U8);
  CHECK(kiln_masked_fill_(at, m8, 7) == 0);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++) want[i * 4 + j] = (j == 1 || j == 2) ? 7 : va[i * 4 + j];
  v = V(a);
  CHECK_ARRAY_NEAR(v, want, 12, 0);
  free(v);
  struct kiln_tensor *fm = kiln_tensor_full(1, (int64_t[]){4}, 1, KILN_F32, CPU);
  CHECK_ERR(kiln_masked_fill(a, fm, 0), "expected bool");
  struct kiln_tensor *bigm = kiln_tensor_full(3, (int64_t[]){2, 3, 4}, 1, KILN_BOOL, CPU);
  CHECK_ERR(kiln_masked_fill_(a, bigm, 0), "does not broadcast to the input [3,4]");
  struct kiln_tensor *wm = kiln_tensor_full(1, (int64_t[]){3}, 1, KILN_BOOL, CPU);
  CHECK_ERR(kiln_masked_fill(a, wm, 0), "[3]");
  /* an integer tensor takes the value converted */
  struct kiln_tensor *ai = T(1, (int64_t[]){4}, (double[]){1, 2, 3, 4}, KILN_I32);
  r = kiln_masked_fill(ai, mask, -2.7);
  v = V(r);
  CHECK(r && r->dtype == KILN_I32);
  CHECK_ARRAY_NEAR(v, ((double[]){-2, 2, 3, -2}), 4, 0);
  free(v); kiln_tensor_release(r);

  /* masked_select: the selected elements in row-major order, mask broadcast to a */
  double *vnow = V(a);
  r = kiln_masked_select(a, mask);
  v = V(r);
  CHECK_SIZES(r, 6);
  for (int i = 0, k = 0; i < 3; i++) { want[k++] = vnow[i * 4]; want[k++] = vnow[i * 4 + 3]; }
  CHECK_ARRAY_NEAR(v, want, 6, 0);
  free(v); kiln_tensor_release(r);
  /* and a broadcast to the mask: a [4] with a mask [2,4] */
  struct kiln_tensor *row = T(1, (int64_t[]){4}, (double[]){10, 20, 30, 40}, KILN_I64);
  struct kiln_tensor *m2 = T(2, (int64_t[]){2, 4}, (double[]){1, 1, 0, 0, 0, 1, 0, 1}, KILN_BOOL);
  r = kiln_masked_select(row, m2);
  v = V(r);
  CHECK(r && r->dtype == KILN_I64);
  CHECK_SIZES(r, 4);
  CHECK_ARRAY_NEAR(v, ((double[]){10, 20, 20, 40}), 4, 0);
  free(v); kiln_tensor_release(r);
  /* nothing selected: an empty 1-d tensor */
  struct kiln_tensor *none = kiln_tensor_full(1, (int64_t[]){4}, 0, KILN_BOOL, CPU);
  r = kiln_masked_select(row, none);
  CHECK(r && r->ndim == 1 && r->numel == 0);
  kiln_tensor_release(r);
  CHECK_ERR(kiln_masked_select(a, wm), "do not broadcast");
  kiln_tensor_release(none); kiln_tensor_release(row); kiln_tensor_release(m2);
  free(vnow);
  kiln_tensor_release(ai); kiln_tensor_release(wm); kiln_tensor_release(bigm); kiln_tensor_release(fm);
  kiln_tensor_release(m8); kiln_tensor_release(at);
  free(va);
  kiln_tensor_release(mask); kiln_tensor_release(a);
}

int main(void) {
  struct kiln_memory_stats *ms = kiln_memory_stats(KILN_CPU);
  int64_t live0 = ms->live_bytes;
  test_op_table();
  test_unary();
  test_binary();
  test_integer_corners();
  test_scalar();
  test_where_clamp();
  test_inplace();
  test_elementwise_empty();
  test_reductions();
  test_matmul();
  test_cat_stack();
  test_index_select_gather();
  test_scatter_add();
  test_masked();
  CHECK(ms->live_bytes == live0);   /* every tensor of the tests was released */
  return check_done("test_ops");
}
