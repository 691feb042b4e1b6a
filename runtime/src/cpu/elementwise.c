/* cpu/elementwise.c: the CPU elementwise engine and its kernels.
   A plan coalesces the operands' dims; each row is cut into blocks, operands that are not
   contiguous in the compute dtype are gathered into small buffers, and one kernel runs on
   contiguous buffers. Kernels exist per compute dtype: f32, f64 and i64. */
#include "../internal.h"
#include "cpu.h"
#include "convert.h"
#include "vexp.h"
#include <math.h>
#include <string.h>

enum { BLOCK = 512, GRAIN = 32768 };

typedef void (*ew_fn)(int64_t n, void *out, const void *const *in, const double *sc);

/* ---- kernels ---- */

/* erfinv: Giles' single-precision approximation ("Approximating the erfinv function", GPU
   Computing Gems, 2011; 2.2e-7 relative), evaluated in double so that it also starts well for
   doubles that round to +-1 in float, then Newton steps on erf in double: one for f32 (within an
   ulp; a float step would not gain, erff(y) - x cancels near +-1), two for f64 (full precision).
   +-1 give +-inf and |x| > 1 NaN, as in PyTorch. */
static inline double erfinv_start(double x) {
  double w = -log((1.0 - x) * (1.0 + x)), p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08; p = 3.43273939e-07 + p * w; p = -3.5233877e-06 + p * w; p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w; p = -0.00125372503 + p * w; p = -0.00417768164 + p * w; p = 0.246640727 + p * w;
    p = 1.50140941 + p * w;
  } else {
    w = sqrt(w) - 3.0;
    p = -0.000200214257; p = 0.000100950558 + p * w; p = 0.00134934322 + p * w; p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w; p = -0.0076224613 + p * w; p = 0.00943887047 + p * w; p = 1.00167406 + p * w;
    p = 2.83297682 + p * w;
  }
  return p * x;
}
static inline double erfinv_newton(double y, double x) { return y - (erf(y) - x) / (1.1283791670955126 * exp(-y * y)); }
static inline float erfinv_float(float x) {
  if (!(fabsf(x) < 1.0f)) return fabsf(x) == 1.0f ? copysignf(INFINITY, x) : NAN;
  return (float)erfinv_newton(erfinv_start(x), x);
}
static inline double erfinv_double(double x) {
  if (!(fabs(x) < 1.0)) return fabs(x) == 1.0 ? copysign(INFINITY, x) : NAN;
  return erfinv_newton(erfinv_newton(erfinv_start(x), x), x);
}

/* The element functions, one switch per compute dtype (f32 and f64 arithmetic stay in their own
   type); each kernel below is written out by name and inlines its switch with the op a constant,
   so that the loop is the op's own and vectorises. */

static inline __attribute__((always_inline)) float unary_f32(int op, float x) {
  switch (op) {
  case KILN_OP_NEG: return -x;
  case KILN_OP_ABS: return fabsf(x);
  case KILN_OP_SIGN: return (float)((x > 0) - (x < 0));
  case KILN_OP_SQRT: return sqrtf(x);
  case KILN_OP_RSQRT: return 1.0f / sqrtf(x);
  case KILN_OP_EXP: return kiln_vexpf(x);
  case KILN_OP_LOG: return logf(x);
  case KILN_OP_LOG1P: return log1pf(x);
  case KILN_OP_EXPM1: return expm1f(x);
  case KILN_OP_SIN: return sinf(x);
  case KILN_OP_COS: return cosf(x);
  case KILN_OP_TANH: return tanhf(x);
  case KILN_OP_SIGMOID: return 1.0f / (1.0f + expf(-x));
  case KILN_OP_RELU: return x < 0 ? 0.0f : x;
  case KILN_OP_FLOOR: return floorf(x);
  case KILN_OP_CEIL: return ceilf(x);
  case KILN_OP_ROUND: return nearbyintf(x);
  case KILN_OP_TRUNC: return truncf(x);
  case KILN_OP_RECIPROCAL: return 1.0f / x;
  case KILN_OP_SQUARE: return x * x;
  case KILN_OP_ERF: return erff(x);
  case KILN_OP_ERFINV: return erfinv_float(x);
  }
  return 0;
}

static inline __attribute__((always_inline)) double unary_f64(int op, double x) {
  switch (op) {
  case KILN_OP_NEG: return -x;
  case KILN_OP_ABS: return fabs(x);
  case KILN_OP_SIGN: return (double)((x > 0) - (x < 0));
  case KILN_OP_SQRT: return sqrt(x);
  case KILN_OP_RSQRT: return 1.0 / sqrt(x);
  case KILN_OP_EXP: return exp(x);
  case KILN_OP_LOG: return log(x);
  case KILN_OP_LOG1P: return log1p(x);
  case KILN_OP_EXPM1: return expm1(x);
  case KILN_OP_SIN: return sin(x);
  case KILN_OP_COS: return cos(x);
  case KILN_OP_TANH: return tanh(x);
  case KILN_OP_SIGMOID: return 1.0 / (1.0 + exp(-x));
  case KILN_OP_RELU: return x < 0 ? 0.0 : x;
  case KILN_OP_FLOOR: return floor(x);
  case KILN_OP_CEIL: return ceil(x);
  case KILN_OP_ROUND: return nearbyint(x);
  case KILN_OP_TRUNC: return trunc(x);
  case KILN_OP_RECIPROCAL: return 1.0 / x;
  case KILN_OP_SQUARE: return x * x;
  case KILN_OP_ERF: return erf(x);
  case KILN_OP_ERFINV: return erfinv_double(x);
  }
  return 0;
}

static inline __attribute__((always_inline)) int64_t unary_i64(int op, int64_t x) {
  switch (op) {
  case KILN_OP_NEG: return (int64_t)(0ull - (uint64_t)x);
  case KILN_OP_ABS: return x < 0 ? (int64_t)(0ull - (uint64_t)x) : x;
  case KILN_OP_SIGN: return (x > 0) - (x < 0);
  case KILN_OP_RELU: return x < 0 ? 0 : x;
  case KILN_OP_FLOOR: return x;
  case KILN_OP_CEIL: return x;
  case KILN_OP_ROUND: return x;
  case KILN_OP_TRUNC: return x;
  case KILN_OP_SQUARE: return (int64_t)((uint64_t)x * (uint64_t)x);
  }
  return 0;
}

/* Signed overflow is undefined in C; integer arithmetic wraps through unsigned. */
static int64_t ipow(int64_t base, int64_t e) {
  if (e < 0) return base == 1 ? 1 : base == -1 ? (e & 1 ? -1 : 1) : 0;
  uint64_t r = 1, b = (uint64_t)base;
  while (e) { if (e & 1) r *= b; b *= b; e >>= 1; }
  return (int64_t)r;
}
static float fremf(float x, float y) { float r = fmodf(x, y); return r != 0 && ((r < 0) != (y < 0)) ? r + y : r; }
static double frem(double x, double y) { double r = fmod(x, y); return r != 0 && ((r < 0) != (y < 0)) ? r + y : r; }
static int64_t irem(int64_t x, int64_t y) {
  if (y == 0 || y == -1) return 0;   /* x % 0 is undefined; x % -1 is 0 (and INT64_MIN % -1 traps) */
  int64_t r = x % y;
  return r != 0 && ((r < 0) != (y < 0)) ? r + y : r;
}

static inline __attribute__((always_inline)) float binary_f32(int op, float x, float y) {
  switch (op) {
  case KILN_OP_ADD: return x + y;
  case KILN_OP_SUB: return x - y;
  case KILN_OP_MUL: return x * y;
  case KILN_OP_DIV: return x / y;
  case KILN_OP_POW: return powf(x, y);
  case KILN_OP_MAXIMUM: return (x != x || x > y) ? x : y;
  case KILN_OP_MINIMUM: return (x != x || x < y) ? x : y;
  case KILN_OP_REMAINDER: return fremf(x, y);
  case KILN_OP_ATAN2: return atan2f(x, y);
  case KILN_OP_RELU_BACKWARD: return y <= 0 ? 0.0f : x;
  }
  return 0;
}

static inline __attribute__((always_inline)) double binary_f64(int op, double x, double y) {
  switch (op) {
  case KILN_OP_ADD: return x + y;
  case KILN_OP_SUB: return x - y;
  case KILN_OP_MUL: return x * y;
  case KILN_OP_DIV: return x / y;
  case KILN_OP_POW: return pow(x, y);
  case KILN_OP_MAXIMUM: return (x != x || x > y) ? x : y;
  case KILN_OP_MINIMUM: return (x != x || x < y) ? x : y;
  case KILN_OP_REMAINDER: return frem(x, y);
  case KILN_OP_ATAN2: return atan2(x, y);
  case KILN_OP_RELU_BACKWARD: return y <= 0 ? 0.0 : x;
  }
  return 0;
}

static inline __attribute__((always_inline)) int64_t binary_i64(int op, int64_t x, int64_t y) {
  switch (op) {
  case KILN_OP_ADD: return (int64_t)((uint64_t)x + (uint64_t)y);
  case KILN_OP_SUB: return (int64_t)((uint64_t)x - (uint64_t)y);
  case KILN_OP_MUL: return (int64_t)((uint64_t)x * (uint64_t)y);
  case KILN_OP_POW: return ipow(x, y);
  case KILN_OP_MAXIMUM: return x > y ? x : y;
  case KILN_OP_MINIMUM: return x < y ? x : y;
  case KILN_OP_REMAINDER: return irem(x, y);
  case KILN_OP_RELU_BACKWARD: return y <= 0 ? 0 : x;
  }
  return 0;
}

static inline __attribute__((always_inline)) uint8_t compare_f32(int op, float x, float y) {
  switch (op) {
  case KILN_OP_EQ: return x == y;
  case KILN_OP_NE: return x != y;
  case KILN_OP_LT: return x < y;
  case KILN_OP_LE: return x <= y;
  case KILN_OP_GT: return x > y;
  case KILN_OP_GE: return x >= y;
  case KILN_OP_LOGICAL_AND: return x != 0 && y != 0;
  case KILN_OP_LOGICAL_OR: return x != 0 || y != 0;
  }
  return 0;
}

static inline __attribute__((always_inline)) uint8_t compare_f64(int op, double x, double y) {
  switch (op) {
  case KILN_OP_EQ: return x == y;
  case KILN_OP_NE: return x != y;
  case KILN_OP_LT: return x < y;
  case KILN_OP_LE: return x <= y;
  case KILN_OP_GT: return x > y;
  case KILN_OP_GE: return x >= y;
  case KILN_OP_LOGICAL_AND: return x != 0 && y != 0;
  case KILN_OP_LOGICAL_OR: return x != 0 || y != 0;
  }
  return 0;
}

static inline __attribute__((always_inline)) uint8_t compare_i64(int op, int64_t x, int64_t y) {
  switch (op) {
  case KILN_OP_EQ: return x == y;
  case KILN_OP_NE: return x != y;
  case KILN_OP_LT: return x < y;
  case KILN_OP_LE: return x <= y;
  case KILN_OP_GT: return x > y;
  case KILN_OP_GE: return x >= y;
  case KILN_OP_LOGICAL_AND: return x != 0 && y != 0;
  case KILN_OP_LOGICAL_OR: return x != 0 || y != 0;
  }
  return 0;
}

/* The loops: out[i] = op(a[i]) or op(a[i], b[i]) over contiguous buffers. */
static inline __attribute__((always_inline)) void unary_loop_f32(int op, int64_t n, void *o_, const void *const *in) {
  float *o = o_;
  const float *a = in[0];
  for (int64_t i = 0; i < n; i++) o[i] = unary_f32(op, a[i]);
}
static inline __attribute__((always_inline)) void binary_loop_f32(int op, int64_t n, void *o_, const void *const *in) {
  float *o = o_;
  const float *a = in[0], *b = in[1];
  for (int64_t i = 0; i < n; i++) o[i] = binary_f32(op, a[i], b[i]);
}
static inline __attribute__((always_inline)) void compare_loop_f32(int op, int64_t n, void *o_, const void *const *in) {
  uint8_t *o = o_;   /* comparisons and logical ops write bool (one byte) */
  const float *a = in[0], *b = in[1];
  for (int64_t i = 0; i < n; i++) o[i] = compare_f32(op, a[i], b[i]);
}

static inline __attribute__((always_inline)) void unary_loop_f64(int op, int64_t n, void *o_, const void *const *in) {
  double *o = o_;
  const double *a = in[0];
  for (int64_t i = 0; i < n; i++) o[i] = unary_f64(op, a[i]);
}
static inline __attribute__((always_inline)) void binary_loop_f64(int op, int64_t n, void *o_, const void *const *in) {
  double *o = o_;
  const double *a = in[0], *b = in[1];
  for (int64_t i = 0; i < n; i++) o[i] = binary_f64(op, a[i], b[i]);
}
static inline __attribute__((always_inline)) void compare_loop_f64(int op, int64_t n, void *o_, const void *const *in) {
  uint8_t *o = o_;   /* comparisons and logical ops write bool (one byte) */
  const double *a = in[0], *b = in[1];
  for (int64_t i = 0; i < n; i++) o[i] = compare_f64(op, a[i], b[i]);
}

static inline __attribute__((always_inline)) void unary_loop_i64(int op, int64_t n, void *o_, const void *const *in) {
  int64_t *o = o_;
  const int64_t *a = in[0];
  for (int64_t i = 0; i < n; i++) o[i] = unary_i64(op, a[i]);
}
static inline __attribute__((always_inline)) void binary_loop_i64(int op, int64_t n, void *o_, const void *const *in) {
  int64_t *o = o_;
  const int64_t *a = in[0], *b = in[1];
  for (int64_t i = 0; i < n; i++) o[i] = binary_i64(op, a[i], b[i]);
}
static inline __attribute__((always_inline)) void compare_loop_i64(int op, int64_t n, void *o_, const void *const *in) {
  uint8_t *o = o_;   /* comparisons and logical ops write bool (one byte) */
  const int64_t *a = in[0], *b = in[1];
  for (int64_t i = 0; i < n; i++) o[i] = compare_i64(op, a[i], b[i]);
}

/* The kernels, by name. */
static void neg_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_NEG, n, o, in); }
static void neg_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_NEG, n, o, in); }
static void neg_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_i64(KILN_OP_NEG, n, o, in); }
static void abs_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_ABS, n, o, in); }
static void abs_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_ABS, n, o, in); }
static void abs_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_i64(KILN_OP_ABS, n, o, in); }
static void sign_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_SIGN, n, o, in); }
static void sign_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_SIGN, n, o, in); }
static void sign_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_i64(KILN_OP_SIGN, n, o, in); }
static void sqrt_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_SQRT, n, o, in); }
static void sqrt_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_SQRT, n, o, in); }
static void rsqrt_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_RSQRT, n, o, in); }
static void rsqrt_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_RSQRT, n, o, in); }
static void exp_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_EXP, n, o, in); }
static void exp_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_EXP, n, o, in); }
static void log_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_LOG, n, o, in); }
static void log_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_LOG, n, o, in); }
static void log1p_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_LOG1P, n, o, in); }
static void log1p_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_LOG1P, n, o, in); }
static void expm1_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_EXPM1, n, o, in); }
static void expm1_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_EXPM1, n, o, in); }
static void sin_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_SIN, n, o, in); }
static void sin_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_SIN, n, o, in); }
static void cos_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_COS, n, o, in); }
static void cos_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_COS, n, o, in); }
static void tanh_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_TANH, n, o, in); }
static void tanh_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_TANH, n, o, in); }
static void sigmoid_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_SIGMOID, n, o, in); }
static void sigmoid_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_SIGMOID, n, o, in); }
static void relu_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_RELU, n, o, in); }
static void relu_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_RELU, n, o, in); }
static void relu_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_i64(KILN_OP_RELU, n, o, in); }
static void floor_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_FLOOR, n, o, in); }
static void floor_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_FLOOR, n, o, in); }
static void floor_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_i64(KILN_OP_FLOOR, n, o, in); }
static void ceil_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_CEIL, n, o, in); }
static void ceil_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_CEIL, n, o, in); }
static void ceil_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_i64(KILN_OP_CEIL, n, o, in); }
static void round_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_ROUND, n, o, in); }
static void round_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_ROUND, n, o, in); }
static void round_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_i64(KILN_OP_ROUND, n, o, in); }
static void trunc_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_TRUNC, n, o, in); }
static void trunc_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_TRUNC, n, o, in); }
static void trunc_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_i64(KILN_OP_TRUNC, n, o, in); }
static void reciprocal_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_RECIPROCAL, n, o, in); }
static void reciprocal_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_RECIPROCAL, n, o, in); }
static void square_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_SQUARE, n, o, in); }
static void square_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_SQUARE, n, o, in); }
static void square_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_i64(KILN_OP_SQUARE, n, o, in); }
static void erf_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_ERF, n, o, in); }
static void erf_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_ERF, n, o, in); }
static void erfinv_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f32(KILN_OP_ERFINV, n, o, in); }
static void erfinv_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; unary_loop_f64(KILN_OP_ERFINV, n, o, in); }
static void atan2_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f32(KILN_OP_ATAN2, n, o, in); }
static void atan2_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f64(KILN_OP_ATAN2, n, o, in); }
static void relu_backward_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f32(KILN_OP_RELU_BACKWARD, n, o, in); }
static void relu_backward_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f64(KILN_OP_RELU_BACKWARD, n, o, in); }
static void relu_backward_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_i64(KILN_OP_RELU_BACKWARD, n, o, in); }
static void add_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f32(KILN_OP_ADD, n, o, in); }
static void add_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f64(KILN_OP_ADD, n, o, in); }
static void add_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_i64(KILN_OP_ADD, n, o, in); }
static void sub_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f32(KILN_OP_SUB, n, o, in); }
static void sub_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f64(KILN_OP_SUB, n, o, in); }
static void sub_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_i64(KILN_OP_SUB, n, o, in); }
static void mul_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f32(KILN_OP_MUL, n, o, in); }
static void mul_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f64(KILN_OP_MUL, n, o, in); }
static void mul_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_i64(KILN_OP_MUL, n, o, in); }
static void div_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f32(KILN_OP_DIV, n, o, in); }
static void div_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f64(KILN_OP_DIV, n, o, in); }
static void pow_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f32(KILN_OP_POW, n, o, in); }
static void pow_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f64(KILN_OP_POW, n, o, in); }
static void pow_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_i64(KILN_OP_POW, n, o, in); }
static void maximum_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f32(KILN_OP_MAXIMUM, n, o, in); }
static void maximum_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f64(KILN_OP_MAXIMUM, n, o, in); }
static void maximum_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_i64(KILN_OP_MAXIMUM, n, o, in); }
static void minimum_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f32(KILN_OP_MINIMUM, n, o, in); }
static void minimum_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f64(KILN_OP_MINIMUM, n, o, in); }
static void minimum_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_i64(KILN_OP_MINIMUM, n, o, in); }
static void remainder_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f32(KILN_OP_REMAINDER, n, o, in); }
static void remainder_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_f64(KILN_OP_REMAINDER, n, o, in); }
static void remainder_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; binary_loop_i64(KILN_OP_REMAINDER, n, o, in); }
static void eq_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_f32(KILN_OP_EQ, n, o, in); }
static void eq_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_f64(KILN_OP_EQ, n, o, in); }
static void eq_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_i64(KILN_OP_EQ, n, o, in); }
static void ne_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_f32(KILN_OP_NE, n, o, in); }
static void ne_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_f64(KILN_OP_NE, n, o, in); }
static void ne_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_i64(KILN_OP_NE, n, o, in); }
static void lt_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_f32(KILN_OP_LT, n, o, in); }
static void lt_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_f64(KILN_OP_LT, n, o, in); }
static void lt_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_i64(KILN_OP_LT, n, o, in); }
static void le_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_f32(KILN_OP_LE, n, o, in); }
static void le_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_f64(KILN_OP_LE, n, o, in); }
static void le_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_i64(KILN_OP_LE, n, o, in); }
static void gt_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_f32(KILN_OP_GT, n, o, in); }
static void gt_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_f64(KILN_OP_GT, n, o, in); }
static void gt_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_i64(KILN_OP_GT, n, o, in); }
static void ge_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_f32(KILN_OP_GE, n, o, in); }
static void ge_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_f64(KILN_OP_GE, n, o, in); }
static void ge_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_i64(KILN_OP_GE, n, o, in); }
static void logical_and_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_f32(KILN_OP_LOGICAL_AND, n, o, in); }
static void logical_and_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_f64(KILN_OP_LOGICAL_AND, n, o, in); }
static void logical_and_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_i64(KILN_OP_LOGICAL_AND, n, o, in); }
static void logical_or_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_f32(KILN_OP_LOGICAL_OR, n, o, in); }
static void logical_or_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_f64(KILN_OP_LOGICAL_OR, n, o, in); }
static void logical_or_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; compare_loop_i64(KILN_OP_LOGICAL_OR, n, o, in); }

/* The tests of one operand, written as bool: logical_not (x is 0), isnan, isinf, isfinite (an
   integer is never NaN nor inf). */
static inline __attribute__((always_inline)) uint8_t test_f32(int op, float x) {
  (void)x;
  switch (op) {
  case KILN_OP_LOGICAL_NOT: return x == 0;
  case KILN_OP_ISNAN: return isnan(x) != 0;
  case KILN_OP_ISINF: return isinf(x) != 0;
  case KILN_OP_ISFINITE: return isfinite(x) != 0;
  }
  return 0;
}
static inline __attribute__((always_inline)) void test_loop_f32(int op, int64_t n, void *o_, const void *const *in) {
  uint8_t *o = o_;
  const float *a = in[0];
  for (int64_t i = 0; i < n; i++) o[i] = test_f32(op, a[i]);
}
static inline __attribute__((always_inline)) uint8_t test_f64(int op, double x) {
  (void)x;
  switch (op) {
  case KILN_OP_LOGICAL_NOT: return x == 0;
  case KILN_OP_ISNAN: return isnan(x) != 0;
  case KILN_OP_ISINF: return isinf(x) != 0;
  case KILN_OP_ISFINITE: return isfinite(x) != 0;
  }
  return 0;
}
static inline __attribute__((always_inline)) void test_loop_f64(int op, int64_t n, void *o_, const void *const *in) {
  uint8_t *o = o_;
  const double *a = in[0];
  for (int64_t i = 0; i < n; i++) o[i] = test_f64(op, a[i]);
}
static inline __attribute__((always_inline)) uint8_t test_i64(int op, int64_t x) {
  (void)x;
  switch (op) {
  case KILN_OP_LOGICAL_NOT: return x == 0;
  case KILN_OP_ISNAN: case KILN_OP_ISINF: return 0;
  case KILN_OP_ISFINITE: return 1;
  }
  return 0;
}
static inline __attribute__((always_inline)) void test_loop_i64(int op, int64_t n, void *o_, const void *const *in) {
  uint8_t *o = o_;
  const int64_t *a = in[0];
  for (int64_t i = 0; i < n; i++) o[i] = test_i64(op, a[i]);
}
static void logical_not_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; test_loop_f32(KILN_OP_LOGICAL_NOT, n, o, in); }
static void logical_not_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; test_loop_f64(KILN_OP_LOGICAL_NOT, n, o, in); }
static void logical_not_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; test_loop_i64(KILN_OP_LOGICAL_NOT, n, o, in); }
static void isnan_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; test_loop_f32(KILN_OP_ISNAN, n, o, in); }
static void isnan_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; test_loop_f64(KILN_OP_ISNAN, n, o, in); }
static void isnan_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; test_loop_i64(KILN_OP_ISNAN, n, o, in); }
static void isinf_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; test_loop_f32(KILN_OP_ISINF, n, o, in); }
static void isinf_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; test_loop_f64(KILN_OP_ISINF, n, o, in); }
static void isinf_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; test_loop_i64(KILN_OP_ISINF, n, o, in); }
static void isfinite_f32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; test_loop_f32(KILN_OP_ISFINITE, n, o, in); }
static void isfinite_f64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; test_loop_f64(KILN_OP_ISFINITE, n, o, in); }
static void isfinite_i64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; test_loop_i64(KILN_OP_ISFINITE, n, o, in); }

static void where_f32(int64_t n, void *o_, const void *const *in, const double *sc) {
  float *o = o_; const float *c = in[0], *a = in[1], *b = in[2]; (void)sc;
  for (int64_t i = 0; i < n; i++) o[i] = c[i] != 0 ? a[i] : b[i];
}
static void where_f64(int64_t n, void *o_, const void *const *in, const double *sc) {
  double *o = o_; const double *c = in[0], *a = in[1], *b = in[2]; (void)sc;
  for (int64_t i = 0; i < n; i++) o[i] = c[i] != 0 ? a[i] : b[i];
}
static void where_i64(int64_t n, void *o_, const void *const *in, const double *sc) {
  int64_t *o = o_; const int64_t *c = in[0], *a = in[1], *b = in[2]; (void)sc;
  for (int64_t i = 0; i < n; i++) o[i] = c[i] != 0 ? a[i] : b[i];
}

static void clamp_f32(int64_t n, void *o_, const void *const *in, const double *sc) {
  float *o = o_; const float *a = in[0]; float lo = (float)sc[0], hi = (float)sc[1];
  for (int64_t i = 0; i < n; i++) { float x = a[i] < lo ? lo : a[i]; o[i] = x > hi ? hi : x; }  /* lo > hi gives hi, as in PyTorch */
}
static void clamp_f64(int64_t n, void *o_, const void *const *in, const double *sc) {
  double *o = o_; const double *a = in[0]; double lo = sc[0], hi = sc[1];
  for (int64_t i = 0; i < n; i++) { double x = a[i] < lo ? lo : a[i]; o[i] = x > hi ? hi : x; }
}
static int64_t bound_i64(double v) { return v <= -9.2e18 ? INT64_MIN : v >= 9.2e18 ? INT64_MAX : (int64_t)v; }
static void clamp_i64(int64_t n, void *o_, const void *const *in, const double *sc) {
  int64_t *o = o_; const int64_t *a = in[0]; int64_t lo = bound_i64(sc[0]), hi = bound_i64(sc[1]);
  for (int64_t i = 0; i < n; i++) { int64_t x = a[i] < lo ? lo : a[i]; o[i] = x > hi ? hi : x; }
}

/* The kernels of each op for the compute dtypes f32, f64 and i64 (NULL: not for integers). */
static const ew_fn kernels[KILN_OP_COUNT][3] = {
  [KILN_OP_NEG] = {neg_f32, neg_f64, neg_i64}, [KILN_OP_ABS] = {abs_f32, abs_f64, abs_i64},
  [KILN_OP_SIGN] = {sign_f32, sign_f64, sign_i64}, [KILN_OP_SQRT] = {sqrt_f32, sqrt_f64, NULL},
  [KILN_OP_RSQRT] = {rsqrt_f32, rsqrt_f64, NULL}, [KILN_OP_EXP] = {exp_f32, exp_f64, NULL},
  [KILN_OP_LOG] = {log_f32, log_f64, NULL}, [KILN_OP_LOG1P] = {log1p_f32, log1p_f64, NULL},
  [KILN_OP_EXPM1] = {expm1_f32, expm1_f64, NULL}, [KILN_OP_SIN] = {sin_f32, sin_f64, NULL},
  [KILN_OP_COS] = {cos_f32, cos_f64, NULL}, [KILN_OP_TANH] = {tanh_f32, tanh_f64, NULL},
  [KILN_OP_SIGMOID] = {sigmoid_f32, sigmoid_f64, NULL}, [KILN_OP_RELU] = {relu_f32, relu_f64, relu_i64},
  [KILN_OP_FLOOR] = {floor_f32, floor_f64, floor_i64}, [KILN_OP_CEIL] = {ceil_f32, ceil_f64, ceil_i64},
  [KILN_OP_ROUND] = {round_f32, round_f64, round_i64}, [KILN_OP_TRUNC] = {trunc_f32, trunc_f64, trunc_i64},
  [KILN_OP_RECIPROCAL] = {reciprocal_f32, reciprocal_f64, NULL},
  [KILN_OP_SQUARE] = {square_f32, square_f64, square_i64}, [KILN_OP_ERF] = {erf_f32, erf_f64, NULL},
  [KILN_OP_LOGICAL_NOT] = {logical_not_f32, logical_not_f64, logical_not_i64},
  [KILN_OP_ADD] = {add_f32, add_f64, add_i64}, [KILN_OP_SUB] = {sub_f32, sub_f64, sub_i64},
  [KILN_OP_MUL] = {mul_f32, mul_f64, mul_i64}, [KILN_OP_DIV] = {div_f32, div_f64, NULL},
  [KILN_OP_POW] = {pow_f32, pow_f64, pow_i64}, [KILN_OP_MAXIMUM] = {maximum_f32, maximum_f64, maximum_i64},
  [KILN_OP_MINIMUM] = {minimum_f32, minimum_f64, minimum_i64},
  [KILN_OP_REMAINDER] = {remainder_f32, remainder_f64, remainder_i64},
  [KILN_OP_EQ] = {eq_f32, eq_f64, eq_i64}, [KILN_OP_NE] = {ne_f32, ne_f64, ne_i64},
  [KILN_OP_LT] = {lt_f32, lt_f64, lt_i64}, [KILN_OP_LE] = {le_f32, le_f64, le_i64},
  [KILN_OP_GT] = {gt_f32, gt_f64, gt_i64}, [KILN_OP_GE] = {ge_f32, ge_f64, ge_i64},
  [KILN_OP_LOGICAL_AND] = {logical_and_f32, logical_and_f64, logical_and_i64},
  [KILN_OP_LOGICAL_OR] = {logical_or_f32, logical_or_f64, logical_or_i64},
  [KILN_OP_WHERE] = {where_f32, where_f64, where_i64}, [KILN_OP_CLAMP] = {clamp_f32, clamp_f64, clamp_i64},
  [KILN_OP_ISNAN] = {isnan_f32, isnan_f64, isnan_i64}, [KILN_OP_ISINF] = {isinf_f32, isinf_f64, isinf_i64},
  [KILN_OP_ISFINITE] = {isfinite_f32, isfinite_f64, isfinite_i64},
  [KILN_OP_ERFINV] = {erfinv_f32, erfinv_f64, NULL}, [KILN_OP_ATAN2] = {atan2_f32, atan2_f64, NULL},
  [KILN_OP_RELU_BACKWARD] = {relu_backward_f32, relu_backward_f64, relu_backward_i64},
};

static int ctype_index(int ctype) { return ctype == KILN_F32 ? 0 : ctype == KILN_F64 ? 1 : 2; }

/* Copy and fill: byte moves of one element size. Each is one body over the size, a constant at
   each call, with a named function per size. */
static inline __attribute__((always_inline)) void move_elements(int64_t n, void *o, const void *in, size_t size) {
  memcpy(o, in, (size_t)n * size);
}
static void move8(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; move_elements(n, o, in[0], 1); }
static void move16(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; move_elements(n, o, in[0], 2); }
static void move32(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; move_elements(n, o, in[0], 4); }
static void move64(int64_t n, void *o, const void *const *in, const double *sc) { (void)sc; move_elements(n, o, in[0], 8); }

/* n copies of the first size bytes of v; with size a constant each copy is one store (of a local,
   which no store to o can change). */
static inline __attribute__((always_inline)) void fill_elements(int64_t n, void *o, const void *v, size_t size) {
  uint64_t bits;
  memcpy(&bits, v, sizeof bits);
  for (int64_t i = 0; i < n; i++) memcpy((char *)o + i * (int64_t)size, &bits, size);
}
static void fill8(int64_t n, void *o, const void *const *in, const double *sc) { (void)in; fill_elements(n, o, sc, 1); }
static void fill16(int64_t n, void *o, const void *const *in, const double *sc) { (void)in; fill_elements(n, o, sc, 2); }
static void fill32(int64_t n, void *o, const void *const *in, const double *sc) { (void)in; fill_elements(n, o, sc, 4); }
static void fill64(int64_t n, void *o, const void *const *in, const double *sc) { (void)in; fill_elements(n, o, sc, 8); }

/* ---- the engine ---- */

struct plan {
  int nin;
  int ndim;
  int64_t sizes[KILN_MAX_DIMS];
  char *base[4];                       /* 0: out, 1..: inputs */
  int dtype[4];
  int64_t strides[4][KILN_MAX_DIMS];
  int constant[4];                     /* input k is the scalar of the call */
  int ctype, octype;
  ew_fn fn;
  const double *sc;
  double scalar;
};

static void plan_operand(struct plan *p, int k, const struct kiln_tensor *t, int ndim, const int64_t *sizes) {
  p->base[k] = t->storage && t->storage->data ? (char *)t->storage->data + t->offset * kiln_dtype_size(t->dtype) : NULL;
  p->dtype[k] = t->dtype;
  int lead = ndim - t->ndim;
  for (int d = 0; d < ndim; d++) {
    int64_t size = d < lead ? 1 : t->sizes[d - lead];
    p->strides[k][d] = (size == 1 && sizes[d] != 1) || d < lead ? 0 : t->strides[d - lead];
  }
}

/* Drop size-1 dims and merge dims that are contiguous with each other in every operand. */
static void plan_coalesce(struct plan *p) {
  int nops = p->nin + 1, n = 0;
  for (int d = 0; d < p->ndim; d++) {
    if (p->sizes[d] == 1) continue;
    if (n > 0) {
      int merge = 1;
      for (int k = 0; k < nops; k++)
        if (p->strides[k][n - 1] != p->strides[k][d] * p->sizes[d]) { merge = 0; break; }
      if (merge) {
        p->sizes[n - 1] *= p->sizes[d];
        for (int k = 0; k < nops; k++) p->strides[k][n - 1] = p->strides[k][d];
        continue;
      }
    }
    p->sizes[n] = p->sizes[d];
    for (int k = 0; k < nops; k++) p->strides[k][n] = p->strides[k][d];
    n++;
  }
  if (n == 0) {
    p->sizes[0] = 1;
    for (int k = 0; k < nops; k++) p->strides[k][0] = 0;
    n = 1;
  }
  p->ndim = n;
}

/* n elements of src (dtype sd) into dst as dtype dd: the common pairs' loops compiled at this
   level (core/convert.h), the rest through kiln_convert. */
static void convert(void *dst, int dd, const void *src, int sd, int64_t n) {
  if (!convert_vectorised(dst, dd, src, sd, n)) kiln_convert(dst, dd, src, sd, n);
}

/* m elements of es bytes from src (element stride ss) to dst (element stride ds), as they are. */
static void move_strided(void *dst, int64_t ds, const void *src, int64_t ss, int es, int64_t m) {
  switch (es) {
  case 1: for (int64_t i = 0; i < m; i++) ((uint8_t *)dst)[i * ds] = ((const uint8_t *)src)[i * ss]; return;
  case 2: for (int64_t i = 0; i < m; i++) ((uint16_t *)dst)[i * ds] = ((const uint16_t *)src)[i * ss]; return;
  case 4: for (int64_t i = 0; i < m; i++) ((uint32_t *)dst)[i * ds] = ((const uint32_t *)src)[i * ss]; return;
  case 8: for (int64_t i = 0; i < m; i++) ((uint64_t *)dst)[i * ds] = ((const uint64_t *)src)[i * ss]; return;
  }
}

/* Read m elements (m <= BLOCK) of src (dtype sd, stride st) into dst as dtype dd: strided ones
   gathered as they are first, then converted in one run (a transposed f32 weight cast to bf16
   under autocast comes this way). */
static void gather(void *dst, int dd, const char *src, int sd, int64_t st, int64_t m) {
  int ss = kiln_dtype_size(sd), ds = kiln_dtype_size(dd);
  if (st == 1) { convert(dst, dd, src, sd, m); return; }
  if (st == 0) {
    convert(dst, dd, src, sd, 1);
    for (int64_t i = 1; i < m; i++) memcpy((char *)dst + i * ds, dst, (size_t)ds);
    return;
  }
  if (sd == dd) { move_strided(dst, 1, src, st, ss, m); return; }
  _Alignas(64) char raw[BLOCK * 8];
  move_strided(raw, 1, src, st, ss, m);
  convert(dst, dd, raw, sd, m);
}

static void scatter(char *dst, int dd, int64_t st, const void *src, int sd, int64_t m) {
  int ds = kiln_dtype_size(dd);
  if (st == 1) { convert(dst, dd, src, sd, m); return; }
  if (sd == dd) { move_strided(dst, st, src, 1, ds, m); return; }
  _Alignas(64) char raw[BLOCK * 8];
  convert(raw, dd, src, sd, m);
  move_strided(dst, st, raw, 1, ds, m);
}

static void run_range(void *ctx, int64_t begin, int64_t end) {
  const struct plan *p = ctx;
  _Alignas(64) char bufs[4][BLOCK * 8];
  int nops = p->nin + 1, nd = p->ndim, csize = kiln_dtype_size(p->ctype);
  int64_t idx[KILN_MAX_DIMS];
  int64_t rem = begin;
  for (int d = nd - 1; d >= 0; d--) { idx[d] = rem % p->sizes[d]; rem /= p->sizes[d]; }
  for (int k = 1; k < nops; k++)
    if (p->constant[k]) {
      kiln_store_f64(bufs[k], p->ctype, p->scalar);
      for (int i = 1; i < BLOCK; i++) memcpy(bufs[k] + i * csize, bufs[k], (size_t)csize);
    }
  int64_t inner = p->sizes[nd - 1];
  while (begin < end) {
    char *ptr[4];
    for (int k = 0; k < nops; k++) {
      int64_t off = 0;
      for (int d = 0; d < nd; d++) off += idx[d] * p->strides[k][d];
      ptr[k] = p->base[k] ? p->base[k] + off * kiln_dtype_size(p->dtype[k]) : NULL;
    }
    int64_t n = inner - idx[nd - 1];
    if (n > end - begin) n = end - begin;
    for (int64_t j = 0; j < n; j += BLOCK) {
      int64_t m = n - j < BLOCK ? n - j : BLOCK;
      const void *in[3] = {0};
      for (int k = 1; k < nops; k++) {
        int64_t st = p->strides[k][nd - 1];
        const char *src = ptr[k] ? ptr[k] + j * st * kiln_dtype_size(p->dtype[k]) : NULL;
        if (p->constant[k]) in[k - 1] = bufs[k];
        else if (p->dtype[k] == p->ctype && st == 1) in[k - 1] = src;
        else { gather(bufs[k], p->ctype, src, p->dtype[k], st, m); in[k - 1] = bufs[k]; }
      }
      int64_t ost = p->strides[0][nd - 1];
      char *dst = ptr[0] + j * ost * kiln_dtype_size(p->dtype[0]);
      int direct = p->dtype[0] == p->octype && ost == 1;
      void *o = direct ? (void *)dst : (void *)bufs[0];
      p->fn(m, o, in, p->sc);
      if (!direct) scatter(dst, p->dtype[0], ost, bufs[0], p->octype, m);
    }
    begin += n;
    idx[nd - 1] += n;
    for (int d = nd - 1; d > 0 && idx[d] >= p->sizes[d]; d--) { idx[d] = 0; idx[d - 1]++; }
  }
}

/* The fast path: every operand contiguous over the same shape, already in the compute dtype. */
struct flat { ew_fn fn; char *out; const char *in[3]; int osize, isize, nin; const double *sc; };
static void run_flat(void *ctx, int64_t begin, int64_t end) {
  const struct flat *f = ctx;
  const void *in[3];
  for (int k = 0; k < f->nin; k++) in[k] = f->in[k] + begin * f->isize;
  f->fn(end - begin, f->out + begin * f->osize, in, f->sc);
}

static int same_shape(const struct kiln_tensor *a, const struct kiln_tensor *b) {
  return a->ndim == b->ndim && memcmp(a->sizes, b->sizes, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

static void execute(struct kiln_tensor *out, const struct kiln_tensor *const *in, int nin, int have_scalar, double scalar,
                    int reverse, int ctype, int octype, ew_fn fn, const double *sc) {
  if (out->numel == 0) return;
  if (!have_scalar && out->dtype == octype && kiln_is_contiguous(out)) {
    int ok = 1;
    for (int k = 0; k < nin && ok; k++) ok = in[k]->dtype == ctype && kiln_is_contiguous(in[k]) && same_shape(in[k], out);
    if (ok) {
      struct flat f = {fn, kiln_tensor_data(out), {0}, kiln_dtype_size(octype), kiln_dtype_size(ctype), nin, sc};
      for (int k = 0; k < nin; k++) f.in[k] = kiln_tensor_data(in[k]);
      kiln_parallel_for(out->numel, GRAIN, run_flat, &f);
      return;
    }
  }
  struct plan p = {.nin = nin + (have_scalar ? 1 : 0), .ndim = out->ndim, .ctype = ctype, .octype = octype, .fn = fn, .sc = sc, .scalar = scalar};
  memcpy(p.sizes, out->sizes, sizeof(int64_t) * (size_t)out->ndim);
  plan_operand(&p, 0, out, out->ndim, out->sizes);
  int k = 1;
  if (have_scalar && reverse) { p.constant[k] = 1; p.dtype[k] = ctype; k++; }
  for (int i = 0; i < nin; i++, k++) plan_operand(&p, k, in[i], out->ndim, out->sizes);
  if (have_scalar && !reverse) { p.constant[k] = 1; p.dtype[k] = ctype; k++; }
  if (p.ndim == 0) { p.ndim = 1; p.sizes[0] = 1; for (int j = 0; j < 4; j++) p.strides[j][0] = 0; }
  plan_coalesce(&p);
  kiln_parallel_for(out->numel, GRAIN, run_range, &p);
}

/* relu and relu_backward of bf16 tensors, contiguous and of one shape (the autocast network's
   activations and their grads), on the bits rather than through f32 and back: the same bits as
   the f32 path gives (a value passed whole or a +0, a NaN quietened as the rounding to bf16 does),
   with no conversion either way. */
struct bf16_job { int op; uint16_t *out; const uint16_t *a, *b; };
static inline uint16_t bf16_quiet(uint16_t u) { return (uint16_t)((u & 0x7fffu) > 0x7f80u ? u | 0x40u : u); }
static void bf16_range(void *ctx, int64_t begin, int64_t end) {
  const struct bf16_job *j = ctx;
  uint16_t *o = j->out;
  const uint16_t *a = j->a, *b = j->b;
  if (j->op == KILN_OP_RELU)   /* x < 0: a negative number other than -0 (-inf included, NaN not) */
    for (int64_t i = begin; i < end; i++) o[i] = a[i] > 0x8000u && a[i] <= 0xff80u ? 0 : bf16_quiet(a[i]);
  else   /* y <= 0: +-0 or a negative number */
    for (int64_t i = begin; i < end; i++) o[i] = b[i] == 0 || (b[i] >= 0x8000u && b[i] <= 0xff80u) ? 0 : bf16_quiet(a[i]);
}
static int bf16_bits(const struct kiln_call *c) {
  if ((c->op != KILN_OP_RELU && c->op != KILN_OP_RELU_BACKWARD) || c->out->dtype != KILN_BF16 || !kiln_is_contiguous(c->out))
    return 0;
  for (int k = 0; k < c->nin; k++)
    if (!c->in[k] || c->in[k]->dtype != KILN_BF16 || !kiln_is_contiguous(c->in[k]) || !same_shape(c->in[k], c->out)) return 0;
  if (c->out->numel == 0) return 1;
  struct bf16_job j = {c->op, kiln_tensor_data(c->out), kiln_tensor_data(c->in[0]), c->nin > 1 ? kiln_tensor_data(c->in[1]) : NULL};
  kiln_parallel_for(c->out->numel, GRAIN, bf16_range, &j);
  return 1;
}

int cpu_elementwise(const struct kiln_call *c) {
  if (bf16_bits(c)) return KILN_OK;
  int ctype = (int)c->ints[0];
  ew_fn fn = kernels[c->op][ctype_index(ctype)];
  if (!fn) return kiln_fail(KILN_ERR_DTYPE, "%s: not defined for %s", kiln_op_name(c->op), kiln_dtype_name(ctype));
  int octype = kiln_op_has(c->op, KILN_OPF_COMPARISON) ? KILN_BOOL : ctype;
  int scalar = c->nin == 2 && c->in[1] == NULL;
  int nin = scalar ? 1 : c->nin;
  execute(c->out, c->in, nin, scalar, c->scalar[0], scalar && c->ints[1], ctype, octype, fn, c->scalar);
  return KILN_OK;
}

/* A copy into a contiguous tensor from a view whose stride-1 dim is not the last (a transpose,
   a permute): element by element, the reads of one output row go down a column of the source
   and touch a cache line each. Copied instead in square tiles over that dim and the last one,
   the lines a tile reads are reused across its rows. */
enum { TILE = 32 };
struct tiled {
  char *dst;
  const char *src;
  int nd, q, esize;
  int64_t sizes[KILN_MAX_DIMS], dstrides[KILN_MAX_DIMS], sstrides[KILN_MAX_DIMS];
  int64_t outer, qtiles;   /* work units: outer index (the dims but q and the last) x tile of dim q */
};

/* One tile: dst[i * dq + j] = src[i + j * sl] for elements of size bytes (a constant at each call:
   each element is one load and one store). */
static inline __attribute__((always_inline)) void tile(size_t size, void *dst, const void *src, int64_t ni, int64_t nj,
                                                       int64_t dq, int64_t sl) {
  for (int64_t j0 = 0; j0 < nj; j0 += TILE) {
    int64_t mj = nj - j0 < TILE ? nj - j0 : TILE;
    for (int64_t i = 0; i < ni; i++)
      for (int64_t j = j0; j < j0 + mj; j++)
        memcpy((char *)dst + (i * dq + j) * (int64_t)size, (const char *)src + (i + j * sl) * (int64_t)size, size);
  }
}
static void tile_u8(uint8_t *dst, const uint8_t *src, int64_t ni, int64_t nj, int64_t dq, int64_t sl) {
  tile(1, dst, src, ni, nj, dq, sl);
}
static void tile_u16(uint16_t *dst, const uint16_t *src, int64_t ni, int64_t nj, int64_t dq, int64_t sl) {
  tile(2, dst, src, ni, nj, dq, sl);
}
static void tile_u64(uint64_t *dst, const uint64_t *src, int64_t ni, int64_t nj, int64_t dq, int64_t sl) {
  tile(8, dst, src, ni, nj, dq, sl);
}

/* 4-byte elements (f32, i32) in 8x8 blocks transposed in registers: each block reads 8 rows of 8
   from the source and writes 8 rows of 8, whole 32-byte pieces on both sides. */
#if defined(__AVX__)
#include "transpose8.h"
static inline void block8_u32(uint32_t *dst, int64_t dq, const uint32_t *src, int64_t sl) {
  __m256 r[8];
  for (int k = 0; k < 8; k++) r[k] = _mm256_loadu_ps((const float *)(src + k * sl));   /* source row k: i = 0..7 */
  kiln_transpose8_store(r, (float *)dst, dq);                                        /* destination row k: j = 0..7 */
}
#else
static inline void block8_u32(uint32_t *dst, int64_t dq, const uint32_t *src, int64_t sl) {
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 8; j++) dst[i * dq + j] = src[i + j * sl];
}
#endif

static void tile_u32(uint32_t *dst, const uint32_t *src, int64_t ni, int64_t nj, int64_t dq, int64_t sl) {
  int64_t i8 = ni & ~(int64_t)7, j8 = nj & ~(int64_t)7;
  for (int64_t j0 = 0; j0 < j8; j0 += 8)
    for (int64_t i0 = 0; i0 < i8; i0 += 8) block8_u32(dst + i0 * dq + j0, dq, src + i0 + j0 * sl, sl);
  for (int64_t i = 0; i < ni; i++)                 /* the edges: rows past i8, columns past j8 */
    for (int64_t j = i < i8 ? j8 : 0; j < nj; j++) dst[i * dq + j] = src[i + j * sl];
}

static void tiled_range(void *ctx, int64_t begin, int64_t end) {
  const struct tiled *t = ctx;
  int last = t->nd - 1;
  for (int64_t u = begin; u < end; u++) {
    int64_t o = u / t->qtiles, i0 = u % t->qtiles * TILE;
    int64_t doff = 0, soff = 0, rest = o;
    for (int d = last - 1; d >= 0; d--) {   /* the outer index, over the dims but q and the last */
      if (d == t->q) continue;
      int64_t k = rest % t->sizes[d];
      rest /= t->sizes[d];
      doff += k * t->dstrides[d];
      soff += k * t->sstrides[d];
    }
    doff += i0 * t->dstrides[t->q];
    soff += i0;                              /* the source's stride along q is 1 */
    int64_t ni = t->sizes[t->q] - i0 < TILE ? t->sizes[t->q] - i0 : TILE, nj = t->sizes[last];
    int64_t dq = t->dstrides[t->q], sl = t->sstrides[last];
    switch (t->esize) {
    case 1: tile_u8((uint8_t *)t->dst + doff, (const uint8_t *)t->src + soff, ni, nj, dq, sl); break;
    case 2: tile_u16((uint16_t *)t->dst + doff, (const uint16_t *)t->src + soff, ni, nj, dq, sl); break;
    case 4: tile_u32((uint32_t *)t->dst + doff, (const uint32_t *)t->src + soff, ni, nj, dq, sl); break;
    default: tile_u64((uint64_t *)t->dst + doff, (const uint64_t *)t->src + soff, ni, nj, dq, sl); break;
    }
  }
}

static int copy_tiled(struct kiln_tensor *dst, const struct kiln_tensor *src) {
  int nd = dst->ndim, last = nd - 1;
  if (nd < 2 || src->dtype != dst->dtype || !same_shape(dst, src) || !kiln_is_contiguous(dst)) return 0;
  if (src->strides[last] == 1 || src->sizes[last] < TILE) return 0;
  int q = -1;
  for (int d = 0; d < last; d++)
    if (src->strides[d] == 1 && src->sizes[d] >= TILE) q = d;
  if (q < 0) return 0;
  struct tiled t = {.dst = kiln_tensor_data(dst), .src = kiln_tensor_data(src), .nd = nd, .q = q,
                    .esize = kiln_dtype_size(dst->dtype), .outer = 1};
  for (int d = 0; d < nd; d++) {
    t.sizes[d] = dst->sizes[d];
    t.dstrides[d] = dst->strides[d];
    t.sstrides[d] = src->strides[d];
    if (d != q && d != last) t.outer *= dst->sizes[d];
  }
  t.qtiles = (dst->sizes[q] + TILE - 1) / TILE;
  kiln_parallel_for(t.outer * t.qtiles, 1 + GRAIN / (TILE * dst->sizes[last]), tiled_range, &t);
  return 1;
}

/* A cast between contiguous tensors of one shape (autocast's casts of weights and their grads):
   each part converted in one run straight into the output, rather than block by block through the
   iterator's buffers and a copy out of them (the same conversion, so the same bits). */
struct cast_job { char *dst; const char *src; int dd, sd; };
static void cast_range(void *ctx, int64_t begin, int64_t end) {
  const struct cast_job *j = ctx;
  convert(j->dst + begin * kiln_dtype_size(j->dd), j->dd, j->src + begin * kiln_dtype_size(j->sd), j->sd, end - begin);
}
static int copy_cast(struct kiln_tensor *dst, const struct kiln_tensor *src) {
  if (src->dtype == dst->dtype || !kiln_is_contiguous(dst) || !kiln_is_contiguous(src) || !same_shape(dst, src)) return 0;
  struct cast_job j = {kiln_tensor_data(dst), kiln_tensor_data(src), dst->dtype, src->dtype};
  kiln_parallel_for(dst->numel, GRAIN, cast_range, &j);
  return 1;
}

int cpu_copy(const struct kiln_call *c) {
  static const ew_fn moves[9] = {[1] = move8, [2] = move16, [4] = move32, [8] = move64};
  if (c->out->numel && (copy_cast(c->out, c->in[0]) || copy_tiled(c->out, c->in[0]))) return KILN_OK;
  int dt = c->out->dtype;
  execute(c->out, c->in, 1, 0, 0, 0, dt, dt, moves[kiln_dtype_size(dt)], NULL);
  return KILN_OK;
}

int cpu_fill(const struct kiln_call *c) {
  static const ew_fn fills[9] = {[1] = fill8, [2] = fill16, [4] = fill32, [8] = fill64};
  int dt = c->out->dtype;
  double bits = 0;   /* the value in the tensor's dtype, carried in the bytes of a double */
  kiln_store_f64(&bits, dt, c->scalar[0]);
  execute(c->out, NULL, 0, 0, 0, 0, dt, dt, fills[kiln_dtype_size(dt)], &bits);
  return KILN_OK;
}

int kiln_cpu_copy(struct kiln_tensor *dst, const struct kiln_tensor *src) {
  struct kiln_call call = {.op = KILN_OP_COPY, .out = dst, .in = {src}, .nin = 1};
  return cpu_copy(&call);
}

int kiln_cpu_fill(struct kiln_tensor *t, double value) {
  struct kiln_call call = {.op = KILN_OP_FILL, .out = t, .scalar = {value}};
  return cpu_fill(&call);
}

struct kiln_tensor *kiln_cpu_contiguous(const struct kiln_tensor *t) {
  if (kiln_is_contiguous(t)) { kiln_tensor_retain((struct kiln_tensor *)t); return (struct kiln_tensor *)t; }
  struct kiln_tensor *c = kiln_tensor_empty(t->ndim, t->sizes, t->dtype, t->device);
  if (c && kiln_cpu_copy(c, t)) { kiln_tensor_release(c); return NULL; }
  return c;
}
