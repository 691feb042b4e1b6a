/* check.h: the tiny harness of the C unit tests: CHECK, CHECK_NEAR, CHECK_ERR and a summary.
   A failed check prints its file, line and values and the test goes on; main returns check_done(). */
#ifndef KILN_TEST_CHECK_H
#define KILN_TEST_CHECK_H
#include <kiln/kiln.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_count, check_failed;

static inline int check_report(int ok, const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static inline int check_report(int ok, const char *file, int line, const char *fmt, ...) {
  check_count++;
  if (ok) return 1;
  check_failed++;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s:%d: FAILED: ", file, line);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  return 0;
}

/* Equal within tol; two NaNs, or two infinities of one sign, are equal. */
static inline int check_near_ok(double a, double b, double tol) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
  if (isinf(a) || isinf(b)) return a == b;
  return fabs(a - b) <= tol;
}

#define CHECK(cond) check_report(!!(cond), __FILE__, __LINE__, "%s", #cond)

#define CHECK_NEAR(a, b, tol)                                                                              \
  do {                                                                                                     \
    double check_a_ = (double)(a), check_b_ = (double)(b), check_t_ = (double)(tol);                      \
    check_report(check_near_ok(check_a_, check_b_, check_t_), __FILE__, __LINE__,                          \
                 "%s = %.17g, %s = %.17g (tolerance %g)", #a, check_a_, #b, check_b_, check_t_);           \
  } while (0)

/* got[i] against want[i] for n elements, within tol + rtol * |want[i]|; one check for the array,
   the message names the first element that differs. */
static inline int check_arrays(const double *got, const double *want, int64_t n, double tol, double rtol, const char *what,
                        const char *file, int line) {
  for (int64_t i = 0; i < n; i++)
    if (!check_near_ok(got[i], want[i], tol + rtol * fabs(want[i])))
      return check_report(0, file, line, "%s: element %lld is %.17g, expected %.17g (%lld elements, tol %g, rtol %g)", what,
                          (long long)i, got[i], want[i], (long long)n, tol, rtol);
  return check_report(1, file, line, "%s", what);
}
#define CHECK_ARRAY_NEAR(got, want, n, tol) check_arrays((got), (want), (n), (tol), 0, #got, __FILE__, __LINE__)
#define CHECK_ARRAY_CLOSE(got, want, n, rtol) check_arrays((got), (want), (n), 0, (rtol), #got, __FILE__, __LINE__)

/* CHECK_ERR(expr, substring): expr returns a tensor (must be NULL) or a status (must be non-zero),
   and kiln_error_message() must contain substring. A tensor that came back anyway is released. */
static inline int check_failed_ptr(struct kiln_tensor *t) {
  if (!t) return 1;
  kiln_tensor_release(t);
  return 0;
}
static inline int check_failed_int(int rc) { return rc != 0; }
#define CHECK_FAILED_(expr) _Generic((expr), struct kiln_tensor *: check_failed_ptr, default: check_failed_int)(expr)

#define CHECK_ERR(expr, substring)                                                                         \
  do {                                                                                                     \
    kiln_error_clear();                                                                                    \
    int check_f_ = CHECK_FAILED_(expr);                                                                    \
    const char *check_m_ = kiln_error_message();                                                           \
    check_report(check_f_ && strstr(check_m_, (substring)) != NULL, __FILE__, __LINE__,                   \
                 "%s: %s; message \"%s\" should contain \"%s\"", #expr,                                    \
                 check_f_ ? "failed as expected" : "did not fail", check_m_, (substring));                 \
  } while (0)

/* The last line of every test: "N checks, M failed", and the exit status. */
static inline int check_done(const char *name) {
  printf("%s: %d checks, %d failed\n", name, check_count, check_failed);
  return check_failed != 0 || check_count == 0;
}

/* ---- kiln helpers shared by the tests ---- */

static const struct kiln_device CPU __attribute__((unused)) = {KILN_CPU, 0};

/* A tensor of dtype from row-major values; NULL is reported as a failed check by the caller's use. */
static inline struct kiln_tensor *T(int ndim, const int64_t *sizes, const double *values, int dtype) {
  struct kiln_tensor *t = kiln_tensor_from_f64(ndim, sizes, values, dtype, CPU);
  if (!t) fprintf(stderr, "from_f64 failed: %s\n", kiln_error_message());
  return t;
}

/* Every element of t in row-major order (a malloc'd buffer of at least one double; NaN-filled
   when t is NULL or cannot be read, so that comparisons fail). */
static inline double *V(const struct kiln_tensor *t) {
  int64_t n = t ? t->numel : 1;
  double *v = (double *)malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));   /* the cast: check.h is C++ too */
  if (!v) abort();
  if (!t || kiln_tensor_to_f64(t, v)) {
    for (int64_t i = 0; i < (n > 0 ? n : 1); i++) v[i] = NAN;
    if (t) fprintf(stderr, "to_f64 failed: %s\n", kiln_error_message());
  }
  return v;
}

static inline int same_sizes(const struct kiln_tensor *t, int ndim, const int64_t *sizes) {
  if (!t || t->ndim != ndim) return 0;
  for (int d = 0; d < ndim; d++)
    if (t->sizes[d] != sizes[d]) return 0;
  return 1;
}
static inline const char *check_strides_string(const struct kiln_tensor *t) {
  static char buf[200];
  int n = snprintf(buf, sizeof buf, "[");
  for (int d = 0; d < t->ndim; d++) n += snprintf(buf + n, sizeof buf - (size_t)n, d ? ",%lld" : "%lld", (long long)t->strides[d]);
  snprintf(buf + n, sizeof buf - (size_t)n, "]");
  return buf;
}
static inline int same_strides(const struct kiln_tensor *t, int ndim, const int64_t *strides) {
  if (!t || t->ndim != ndim) return 0;
  for (int d = 0; d < ndim; d++)
    if (t->strides[d] != strides[d]) return 0;
  return 1;
}
#define CHECK_SIZES(t, ...)                                                                                \
  do {                                                                                                     \
    const int64_t check_s_[] = {__VA_ARGS__};                                                              \
    int check_n_ = (int)(sizeof check_s_ / sizeof check_s_[0]);                                            \
    check_report(same_sizes((t), check_n_, check_s_), __FILE__, __LINE__, "%s has shape %s", #t,           \
                 (t) ? kiln_shape_string(t) : "(null)");                                                   \
  } while (0)
#define CHECK_STRIDES(t, ...)                                                                              \
  do {                                                                                                     \
    const int64_t check_s_[] = {__VA_ARGS__};                                                              \
    int check_n_ = (int)(sizeof check_s_ / sizeof check_s_[0]);                                            \
    check_report(same_strides((t), check_n_, check_s_), __FILE__, __LINE__, "%s has strides %s", #t,       \
                 (t) ? check_strides_string(t) : "(null)");                                                \
  } while (0)

/* A deterministic pseudo-random double in [-1, 1) from an index (for test data, independent of kiln's RNG). */
static inline double hashval(uint64_t i) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27; x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return (double)(x >> 11) * 0x1p-52 - 1.0;
}

#endif
