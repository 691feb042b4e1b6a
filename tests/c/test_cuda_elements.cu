/* test_cuda_elements.cu: the CUDA kernels' element functions (runtime/cuda/kernels/elements.cuh), which
   are __host__ __device__, run here on the CPU (no GPU needed) against libkiln's CPU kernels:
   every dtype conversion bit for bit, every elementwise op's semantics on edge values (NaN, inf,
   -0, integer wrap-around and division by zero), clamp and where, and the Philox mapping of the
   random fills. The device build of the same source may differ only where the device's math
   library does (exp, log, sin, ... within an ulp or two); tests/gpu checks that part.
   A randomized sweep replays the flat kernels of elementwise.cuh's launch() on 400 cases drawn
   from a fixed seed (the same on every run): random lengths, and operands at random element
   offsets into their buffers, so that kiln_cuda_vector_width picks the vector words or not from
   real addresses; every word must be aligned as the device needs it, every element written
   once and nothing around the output. KILN_TEST_SWEEP=N draws N times as many, for a longer run
   by hand (N = 1000: about 6 s). */
#include "sweep.h"
#include "elements.cuh"
#include "elementwise.cuh"
#include "vector.cuh"
extern "C" {
#include "internal.h"
#include "geometry.h"
}
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>

using namespace kiln_el;
using namespace kiln_ew;

static int checks, failures;
static void report(bool ok, int line, const char *what) {
  checks++;
  if (!ok) {
    failures++;
    fprintf(stderr, "test_cuda_elements.cu:%d: FAILED: %s\n", line, what);
  }
}
#define CHECK(cond) report((cond), __LINE__, #cond)

static const struct kiln_device CPU = {KILN_CPU, 0};

/* A 1-d CPU tensor of dtype holding raw elements. */
static struct kiln_tensor *raw_tensor(int dtype, const std::vector<unsigned char> &bytes) {
  int64_t n = (int64_t)bytes.size() / kiln_dtype_size(dtype);
  struct kiln_tensor *t = kiln_tensor_empty(1, &n, dtype, CPU);
  if (t && n) memcpy(kiln_tensor_data(t), bytes.data(), bytes.size());
  return t;
}

/* Edge values of each dtype, as raw bytes. */
static std::vector<unsigned char> edge_values(int dtype) {
  const double floats[] = {0.0, -0.0, 1.0, -1.0, 0.5, 1.5, 2.5, -2.5, 0.1, 1.0 / 3, 255, 256, -129, 65504, 65519, 65520,
                           1e-8, 6e-5, 6.1e-5, 3e-45, 3.4e38, 1e39, -1e39, 1e300, INFINITY, -INFINITY, NAN, -NAN,
                           2147483648.0, -2147483649.0, 9007199254740993.0, 9.3e18, -9.3e18, 123456789.123, -7.75, 3.0};
  const int64_t ints[] = {0, 1, -1, 2, -2, 3, 7, -7, 127, 128, 255, 256, -128, -129, 65504, 2147483647, -2147483648LL,
                          4294967296LL, 9007199254740993LL, (int64_t)1 << 62, INT64_MAX, INT64_MIN, INT64_MIN + 1,
                          ((int64_t)1 << 60) + ((int64_t)1 << 36) + 1};   /* the last rounds differently through double */
  std::vector<unsigned char> out;
  int es = kiln_dtype_size(dtype);
  unsigned char buf[8];
  if (kiln_dtype_is_float(dtype)) {
    for (double v : floats) { store_f64(buf, dtype, v); out.insert(out.end(), buf, buf + es); }
    if (dtype == KILN_F16) {   /* subnormals, the largest, a NaN with payload */
      for (uint16_t h : {(uint16_t)0x0001, (uint16_t)0x03ff, (uint16_t)0x7bff, (uint16_t)0x7e01, (uint16_t)0xfc00}) {
        memcpy(buf, &h, 2); out.insert(out.end(), buf, buf + 2);
      }
    }
    if (dtype == KILN_F32) {   /* NaN payloads, f16 and bf16 rounding ties (to even, both ways), subnormal edges */
      for (uint32_t u : {0x7fc00001u, 0xffa00000u, 0x7f800001u, 0x387fe000u, 0x33000001u, 0x3f808000u, 0x3f818000u,
                         0x3f801000u, 0x3f803000u, 0x33800000u, 0x33000000u}) {
        memcpy(buf, &u, 4); out.insert(out.end(), buf, buf + 4);
      }
    }
  } else if (dtype == KILN_BOOL) {
    for (unsigned char b : {0, 1, 2, 255}) out.push_back(b);   /* 2 and 255: bytes some writers leave */
  } else {
    for (int64_t v : ints) {
      if (dtype == KILN_I64) memcpy(buf, &v, 8);
      else if (dtype == KILN_I32) { int32_t w = (int32_t)(uint32_t)(uint64_t)v; memcpy(buf, &w, 4); }
      else buf[0] = (unsigned char)(uint64_t)v;
      out.insert(out.end(), buf, buf + es);
    }
  }
  return out;
}

static void test_conversions() {
  int bad = 0;
  for (int sd = 0; sd < KILN_DTYPE_COUNT; sd++)
    for (int dd = 0; dd < KILN_DTYPE_COUNT; dd++) {
      std::vector<unsigned char> src = edge_values(sd);
      struct kiln_tensor *t = raw_tensor(sd, src);
      struct kiln_tensor *c = kiln_to_dtype(t, dd);   /* the CPU's conversion */
      int ss = kiln_dtype_size(sd), ds = kiln_dtype_size(dd);
      for (int64_t i = 0; c && i < t->numel; i++) {
        unsigned char got[8] = {0};
        convert(got, dd, src.data() + i * ss, sd);
        const unsigned char *want = (const unsigned char *)kiln_tensor_data(c) + i * ds;
        if (memcmp(got, want, (size_t)ds) != 0 && bad++ < 10) {
          double x = load_f64(src.data() + i * ss, sd);
          fprintf(stderr, "convert %s -> %s of element %lld (%.17g): bytes differ from the CPU's\n", kiln_dtype_name(sd),
                  kiln_dtype_name(dd), (long long)i, x);
        }
      }
      CHECK(c != NULL);
      kiln_tensor_release(t);
      kiln_tensor_release(c);
    }
  CHECK(bad == 0);
}

/* The values each compute dtype is tried on. */
template <class C> static std::vector<C> op_values() {
  std::vector<C> v;
  if constexpr (std::is_same<C, int64_t>::value) {
    for (int64_t x : {0LL, 1LL, -1LL, 2LL, -3LL, 7LL, -8LL, 63LL, 64LL, 1000003LL, -1000003LL, (long long)INT64_MAX,
                      (long long)INT64_MIN, (long long)INT64_MIN + 1, 4294967296LL})
      v.push_back((C)x);
  } else {
    for (double x : {0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, -7.25, 0.1, 100.0, 1e-3, 88.5, -88.5, 1e30,
                     -1e30, (double)INFINITY, -(double)INFINITY, (double)NAN})
      v.push_back((C)x);
  }
  return v;
}

static bool same_value(double a, double b, double rtol) {
  if (a != a || b != b) return a != a && b != b;
  if (a == b) return true;
  return rtol > 0 && fabs(a - b) <= rtol * fabs(b);
}

/* Ops whose C library functions may differ between builds by an ulp. */
static bool transcendental(int op) {
  switch (op) {
  case KILN_OP_EXP: case KILN_OP_LOG: case KILN_OP_LOG1P: case KILN_OP_EXPM1: case KILN_OP_SIN: case KILN_OP_COS:
  case KILN_OP_TANH: case KILN_OP_SIGMOID: case KILN_OP_ERF: case KILN_OP_POW:
    return true;
  }
  return false;
}

template <class C> static double rtol_for(int op) {
  return transcendental(op) ? (std::is_same<C, float>::value ? 2e-7 : 4e-16) : 0.0;
}

template <int OP, class C> static void check_unary() {
  std::vector<C> xs = op_values<C>();
  std::vector<double> d(xs.begin(), xs.end());
  int64_t n = (int64_t)xs.size();
  struct kiln_tensor *t = kiln_tensor_empty(1, &n, dtype_of<C>(), CPU);
  memcpy(kiln_tensor_data(t), xs.data(), sizeof(C) * xs.size());
  struct kiln_tensor *r = kiln_unary(OP, t);
  int bad = 0;
  for (int64_t i = 0; r && i < n; i++) {
    double want = kiln_tensor_get(r, i);
    double got = (double)unary<OP, C>(xs[(size_t)i]);
    if (!same_value(got, want, rtol_for<C>(OP)) && bad++ < 3)
      fprintf(stderr, "%s(%s %.17g): %.17g, the CPU gives %.17g\n", kiln_op_name(OP), kiln_dtype_name(dtype_of<C>()),
              (double)xs[(size_t)i], got, want);
  }
  report(r && bad == 0, __LINE__, kiln_op_name(OP));
  kiln_tensor_release(t);
  kiln_tensor_release(r);
}

template <int OP> static void check_unary_all() {
  check_unary<OP, float>();
  check_unary<OP, double>();
  if constexpr (takes_integers<OP>()) check_unary<OP, int64_t>();
}

template <int OP, class C> static void check_binary() {
  std::vector<C> vs = op_values<C>();
  std::vector<C> xs, ys;
  /* integer x % 0 is refused by the front end on every device, before any kernel runs */
  const bool int_rem = OP == KILN_OP_REMAINDER && !kiln_dtype_is_float(dtype_of<C>());
  bool zero_x = false;
  for (C x : vs)
    for (C y : vs) {
      if (int_rem && y == C(0)) continue;
      xs.push_back(x); ys.push_back(y);
      zero_x = zero_x || x == C(0);
    }
  int64_t n = (int64_t)xs.size();
  struct kiln_tensor *a = kiln_tensor_empty(1, &n, dtype_of<C>(), CPU), *b = kiln_tensor_empty(1, &n, dtype_of<C>(), CPU);
  memcpy(kiln_tensor_data(a), xs.data(), sizeof(C) * xs.size());
  memcpy(kiln_tensor_data(b), ys.data(), sizeof(C) * ys.size());
  struct kiln_tensor *r = kiln_binary(OP, a, b);
  int bad = 0;
  for (int64_t i = 0; r && i < n; i++) {
    double want = kiln_tensor_get(r, i);
    double got = (double)binary<OP, C>(xs[(size_t)i], ys[(size_t)i]);
    if (!same_value(got, want, rtol_for<C>(OP)) && bad++ < 3)
      fprintf(stderr, "%s(%s %.17g, %.17g): %.17g, the CPU gives %.17g\n", kiln_op_name(OP), kiln_dtype_name(dtype_of<C>()),
              (double)xs[(size_t)i], (double)ys[(size_t)i], got, want);
  }
  /* a scalar on either side, as kiln_binary_scalar sends it (integral scalars keep i64) */
  for (double s : {3.0, -2.0, 0.0}) {
    for (int reverse = 0; reverse < 2; reverse++) {
      struct kiln_tensor *q = kiln_binary_scalar(OP, a, s, reverse);
      if (int_rem && (reverse ? zero_x : s == 0)) {   /* a zero divisor: the clear error */
        if (q || !strstr(kiln_error_message(), "integer division by zero")) bad++;
        kiln_tensor_release(q);
        continue;
      }
      C sc = scalar_as<C>(s);
      for (int64_t i = 0; q && i < n; i++) {
        double want = kiln_tensor_get(q, i);
        C x = xs[(size_t)i];
        double got = (double)(reverse ? binary<OP, C>(sc, x) : binary<OP, C>(x, sc));
        if (!same_value(got, want, rtol_for<C>(OP)) && bad++ < 3)
          fprintf(stderr, "%s(%s %.17g, scalar %g, reverse %d): %.17g, the CPU gives %.17g\n", kiln_op_name(OP),
                  kiln_dtype_name(dtype_of<C>()), (double)x, s, reverse, got, want);
      }
      if (!q) bad++;
      kiln_tensor_release(q);
    }
  }
  report(r && bad == 0, __LINE__, kiln_op_name(OP));
  kiln_tensor_release(a);
  kiln_tensor_release(b);
  kiln_tensor_release(r);
}

template <int OP> static void check_binary_all() {
  check_binary<OP, float>();
  check_binary<OP, double>();
  if constexpr (takes_integers<OP>()) check_binary<OP, int64_t>();
}

template <class C> static void check_clamp_where() {
  std::vector<C> xs = op_values<C>();
  int64_t n = (int64_t)xs.size();
  struct kiln_tensor *t = kiln_tensor_empty(1, &n, dtype_of<C>(), CPU);
  memcpy(kiln_tensor_data(t), xs.data(), sizeof(C) * xs.size());
  int bad = 0;
  const double bounds[][2] = {{-1, 2}, {0.5, 0.25}, {-INFINITY, 3}, {-2, INFINITY}, {-1e20, 1e20}};
  for (auto &bd : bounds) {
    if (std::is_same<C, int64_t>::value && (bd[0] != floor(bd[0]) || bd[1] != floor(bd[1]))) continue;
    struct kiln_tensor *r = kiln_clamp(t, bd[0], bd[1], 1, 1);
    C lo = clamp_bound<C>(bd[0]), hi = clamp_bound<C>(bd[1]);
    for (int64_t i = 0; r && i < n; i++) {
      double want = kiln_tensor_get(r, i), got = (double)clamp<C>(xs[(size_t)i], lo, hi);
      if (!same_value(got, want, 0) && bad++ < 3)
        fprintf(stderr, "clamp(%.17g, %g, %g): %.17g, the CPU gives %.17g\n", (double)xs[(size_t)i], bd[0], bd[1], got, want);
    }
    if (!r) bad++;
    kiln_tensor_release(r);
  }
  /* where(cond, a, b) with cond a tensor of the same values: 0 and -0 are false, NaN is true */
  struct kiln_tensor *b = kiln_unary(KILN_OP_NEG, t);
  struct kiln_tensor *w = kiln_where(t, t, b);
  for (int64_t i = 0; w && b && i < n; i++) {
    C x = xs[(size_t)i];
    double want = kiln_tensor_get(w, i), got = (double)where(x, x, unary<KILN_OP_NEG, C>(x));
    if (!same_value(got, want, 0) && bad++ < 3) fprintf(stderr, "where(%.17g): %.17g, the CPU gives %.17g\n", (double)x, got, want);
  }
  report(w && bad == 0, __LINE__, "clamp and where");
  kiln_tensor_release(t);
  kiln_tensor_release(b);
  kiln_tensor_release(w);
}

static void test_ops() {
  check_unary_all<KILN_OP_NEG>(); check_unary_all<KILN_OP_ABS>(); check_unary_all<KILN_OP_SIGN>();
  check_unary_all<KILN_OP_SQRT>(); check_unary_all<KILN_OP_RSQRT>(); check_unary_all<KILN_OP_EXP>();
  check_unary_all<KILN_OP_LOG>(); check_unary_all<KILN_OP_LOG1P>(); check_unary_all<KILN_OP_EXPM1>();
  check_unary_all<KILN_OP_SIN>(); check_unary_all<KILN_OP_COS>(); check_unary_all<KILN_OP_TANH>();
  check_unary_all<KILN_OP_SIGMOID>(); check_unary_all<KILN_OP_RELU>(); check_unary_all<KILN_OP_FLOOR>();
  check_unary_all<KILN_OP_CEIL>(); check_unary_all<KILN_OP_ROUND>(); check_unary_all<KILN_OP_TRUNC>();
  check_unary_all<KILN_OP_RECIPROCAL>(); check_unary_all<KILN_OP_SQUARE>(); check_unary_all<KILN_OP_ERF>();
  check_unary_all<KILN_OP_LOGICAL_NOT>();
  check_binary_all<KILN_OP_ADD>(); check_binary_all<KILN_OP_SUB>(); check_binary_all<KILN_OP_MUL>();
  check_binary_all<KILN_OP_DIV>(); check_binary_all<KILN_OP_POW>(); check_binary_all<KILN_OP_MAXIMUM>();
  check_binary_all<KILN_OP_MINIMUM>(); check_binary_all<KILN_OP_REMAINDER>(); check_binary_all<KILN_OP_EQ>();
  check_binary_all<KILN_OP_NE>(); check_binary_all<KILN_OP_LT>(); check_binary_all<KILN_OP_LE>();
  check_binary_all<KILN_OP_GT>(); check_binary_all<KILN_OP_GE>(); check_binary_all<KILN_OP_LOGICAL_AND>();
  check_binary_all<KILN_OP_LOGICAL_OR>(); check_binary_all<KILN_OP_ATAN2>();
  check_binary_all<KILN_OP_RELU_BACKWARD>();
  check_clamp_where<float>();
  check_clamp_where<double>();
  check_clamp_where<int64_t>();
}

/* The random fills: element i of random_element against the CPU's fill at the same state. */
static void check_random(int op, int dtype, double p0, double p1, int64_t lo, int64_t hi) {
  const uint64_t seed = 0x123456789abcdefull, offset = 977;
  int64_t n = 20000;
  struct kiln_tensor *t = kiln_tensor_empty(1, &n, dtype, CPU);
  kiln_random_set_state(seed, offset);
  int rc = op == KILN_OP_UNIFORM ? kiln_uniform_(t, p0, p1) : op == KILN_OP_NORMAL ? kiln_normal_(t, p0, p1)
                                                                                  : kiln_randint_(t, lo, hi);
  int es = kiln_dtype_size(dtype), bad = 0;
  for (int64_t i = 0; rc == 0 && i < n; i++) {
    unsigned char got[8] = {0};
    random_element(op, got, dtype, seed, offset, i, p0, p1, lo, hi);
    const unsigned char *want = (const unsigned char *)kiln_tensor_data(t) + i * es;
    if (memcmp(got, want, (size_t)es) != 0 && bad++ < 3)
      fprintf(stderr, "%s %s element %lld: %.17g, the CPU gives %.17g\n", kiln_op_name(op), kiln_dtype_name(dtype),
              (long long)i, load_f64(got, dtype), load_f64(want, dtype));
  }
  char what[64];
  snprintf(what, sizeof what, "%s %s bit for bit", kiln_op_name(op), kiln_dtype_name(dtype));
  report(rc == 0 && bad == 0, __LINE__, what);
  kiln_tensor_release(t);
}

static void test_random() {
  for (int dt : {KILN_F32, KILN_F64, KILN_F16, KILN_BF16}) {
    check_random(KILN_OP_UNIFORM, dt, 0, 1, 0, 0);
    check_random(KILN_OP_UNIFORM, dt, -3.7, 11.1, 0, 0);
    check_random(KILN_OP_UNIFORM, dt, 0.999, 1.0, 0, 0);   /* draws that round up to hi */
    check_random(KILN_OP_NORMAL, dt, 0.5, 2, 0, 0);
  }
  for (int dt : {KILN_I64, KILN_I32, KILN_U8, KILN_F32, KILN_F64}) check_random(KILN_OP_RANDINT, dt, -5, 200, -5, 200);
  check_random(KILN_OP_RANDINT, KILN_I64, 0, 0, INT64_MIN / 2, INT64_MAX / 2 + 12345);
  check_random(KILN_OP_RANDINT, KILN_BOOL, 0, 2, 0, 2);
}

/* The flat kernels' vector words (vector.cuh) against their element-by-element form: the same
   results bit for bit, each lane from its own elements, for a vector-vector op, an op with the
   scalar on either side, a bool result and f64; W-element words over the first n / W * W
   elements, then the tail one by one, as elementwise_vector_kernel does. */
template <int OP, class C> struct test_binary_fn {
  using out_t = result_t<OP, C>;
  static constexpr int nin = 2;
  KILN_EL out_t operator()(const C *x) const { return binary<OP, C>(x[0], x[1]); }
};

template <int OP, class C, int W> static void check_vector_words(int64_t n, int scalar_side) {
  using Fn = test_binary_fn<OP, C>;
  using O = typename Fn::out_t;
  enum { WORDS = 1100 / W };
  static pack<C, W> xa[WORDS], ya[WORDS];
  static pack<result_t<OP, C>, W> got[WORDS], want[WORDS];
  C *x = reinterpret_cast<C *>(xa), *y = reinterpret_cast<C *>(ya);
  for (int64_t i = 0; i < n; i++) {
    x[i] = (C)(((i * 37) % 23) - 11) / (C)4;
    y[i] = (C)(((i * 53) % 19) - 9) / (C)2;
  }
  flat_inputs<C> p = {{scalar_side == 0 ? (const C *)NULL : x, scalar_side == 1 ? (const C *)NULL : y, NULL}};
  C sc = (C)1.5;
  O *g = reinterpret_cast<O *>(got), *w = reinterpret_cast<O *>(want);
  Fn fn;
  for (int64_t i = 0; i < n / W; i++) flat_vector<C, Fn, W>(g, p, fn, sc, i);
  for (int64_t i = n / W * W; i < n; i++) flat_element(g, p, fn, sc, i);
  for (int64_t i = 0; i < n; i++) flat_element(w, p, fn, sc, i);
  bool same = memcmp(g, w, sizeof(O) * (size_t)n) == 0;
  for (int64_t i = 0; i < n && same; i++) {   /* and each lane from its own elements */
    C a = scalar_side == 0 ? sc : x[i], b = scalar_side == 1 ? sc : y[i];
    O r = binary<OP, C>(a, b);
    same = memcmp(&g[i], &r, sizeof(O)) == 0;
  }
  report(same, __LINE__, "flat_vector words == element by element");
}

static void test_vector_words() {
  for (int64_t n : {0, 1, 3, 4, 5, 8, 1023, 1024, 1027}) {
    for (int side = 0; side < 3; side++) {   /* 0: scalar first, 1: scalar second, 2: two tensors */
      check_vector_words<KILN_OP_SUB, float, 4>(n, side);
      check_vector_words<KILN_OP_DIV, double, 2>(n, side);
      check_vector_words<KILN_OP_LT, float, 4>(n, side);
      check_vector_words<KILN_OP_MUL, int64_t, 2>(n, side);
    }
  }
}

/* ---- randomized sweep of the flat kernels: lengths and operand offsets drawn from a fixed seed
   (the same on every run); KILN_TEST_SWEEP=N draws N times as many (the first ones unchanged). A
   failing case prints its op, compute dtype, length, offsets and case number. ---- */


static int sweep_vectorised, sweep_looped, sweep_in_place;

/* One flat launch of elementwise.cuh's launch(), replayed on the CPU: out and the inputs are 1-d
   views of n elements at element offsets off[0] (out) and off[1 + j] into their own buffers (the
   input 0's when in_place), the scalar in place of input `scalar_at` (-1: none); the vector
   kernel (W-element words, then the tail one by one) when kiln_cuda_vector_width allows W lanes
   for those addresses, else the flat kernel, each a grid of `threads` striding threads; every
   word must be aligned as the device needs it, every element of out written, nothing around it.
   cpu(views, scalar) gives the CPU's result. */
template <class C, class Fn, class Cpu>
static void check_flat_launch(const char *name, const Fn &fn, int64_t n, const int64_t *off, int scalar_at, double scalar,
                              bool in_place, int64_t threads, sweep_rng &r, int case_no, Cpu cpu) {
  using O = typename Fn::out_t;
  constexpr int W = vector_lanes<C>(), NIN = Fn::nin;
  const int64_t spare = 5;   /* elements past the view in every buffer */
  struct kiln_tensor *base[NIN] = {}, *view[NIN] = {};
  for (int j = 0; j < NIN; j++) {
    if (j == scalar_at) continue;
    int64_t len = off[1 + j] + n + spare;
    if (in_place && j == 0) len = (off[0] > off[1] ? off[0] : off[1]) + n + spare;
    base[j] = kiln_tensor_empty(1, &len, dtype_of<C>(), CPU);
    C *v = (C *)kiln_tensor_data(base[j]);
    std::vector<C> vals = op_values<C>();
    for (int64_t i = 0; i < len; i++) v[i] = r.one_in(3) ? vals[(size_t)r.in(0, (int64_t)vals.size() - 1)] : (C)(r.in(-400, 400)) / (C)8;
    view[j] = kiln_narrow(base[j], 0, off[1 + j], n);
  }
  if (in_place && scalar_at != 0) {   /* out is input 0's own elements: as kiln_binary_ / kiln_unary_ */
    kiln_tensor_release(view[0]);
    view[0] = kiln_narrow(base[0], 0, off[0], n);
  }
  const struct kiln_tensor *cviews[NIN];
  for (int j = 0; j < NIN; j++) cviews[j] = view[j];
  struct kiln_tensor *want = cpu(cviews, scalar);   /* before an in-place replay overwrites input 0 */
  int64_t olen = off[0] + n + spare;
  struct kiln_tensor *obase = in_place ? NULL : kiln_tensor_empty(1, &olen, dtype_of<O>(), CPU);
  std::vector<unsigned char> before;
  if (obase) memset(kiln_tensor_data(obase), 0xA5, sizeof(O) * (size_t)olen);
  unsigned char *ob = (unsigned char *)kiln_tensor_data(in_place ? base[0] : obase);
  int64_t oblen = in_place ? base[0]->numel : olen;
  before.assign(ob, ob + sizeof(O) * (size_t)oblen);
  O *out = (O *)ob + off[0];
  flat_inputs<C> p = {{NULL, NULL, NULL}};
  uintptr_t addr[4] = {(uintptr_t)out};
  int size[4] = {(int)sizeof(O)}, count = 1;
  for (int j = 0; j < NIN; j++) {
    p.in[j] = view[j] && j != scalar_at ? (const C *)kiln_tensor_data(view[j]) : NULL;
    if (p.in[j]) { addr[count] = (uintptr_t)p.in[j]; size[count++] = (int)sizeof(C); }
  }
  C sc = scalar_as<C>(scalar);
  bool vector = W > 1 && kiln_cuda_vector_width(n, count, addr, size) >= W, aligned = true;
  std::vector<int> writes((size_t)n, 0);
  if (vector) {
    aligned = (uintptr_t)out % sizeof(pack<O, W>) == 0;
    for (int j = 0; j < NIN; j++) aligned = aligned && (!p.in[j] || (uintptr_t)p.in[j] % sizeof(pack<C, W>) == 0);
  }
  if (vector && aligned) {   /* elementwise_vector_kernel (a misaligned word would fault here as on the device) */
    int64_t words = n / W;
    for (int64_t id = 0; id < threads; id++) {
      for (int64_t i = id; i < words; i += threads) {
        flat_vector<C, Fn, W>(out, p, fn, sc, i);
        for (int k = 0; k < W; k++) writes[(size_t)(i * W + k)]++;
      }
      for (int64_t i = words * W + id; i < n; i += threads) { flat_element(out, p, fn, sc, i); writes[(size_t)i]++; }
    }
    sweep_vectorised++;
    sweep_looped += words > threads;
  } else if (!vector) {   /* elementwise_flat_kernel */
    for (int64_t id = 0; id < threads; id++)
      for (int64_t i = id; i < n; i += threads) { flat_element(out, p, fn, sc, i); writes[(size_t)i]++; }
    sweep_looped += n > threads;
  }
  sweep_in_place += in_place;
  char ins[96] = "", what[256];
  for (int j = 0; j < NIN; j++)
    snprintf(ins + strlen(ins), sizeof ins - strlen(ins), "%s%s", j ? ", " : "",
             j == scalar_at ? "the scalar" : in_place && j == 0 ? "out's" : std::to_string(off[1 + j]).c_str());
  snprintf(what, sizeof what, "sweep case %d: %s %s, n %lld, offset of out %lld, of the inputs %s%s, %lld threads, %s", case_no,
           name, kiln_dtype_name(dtype_of<C>()), (long long)n, (long long)off[0], ins, in_place ? " (in place)" : "",
           (long long)threads, vector ? "vector words" : "element by element");
  bool ok = want && want->numel == n && kiln_dtype_size(want->dtype) == (int)sizeof(O);
  if (!aligned) fprintf(stderr, "%s: a word of an operand is not aligned for the device\n", what);
  ok = ok && aligned;
  for (int64_t i = 0; i < n && ok; i++)
    if (writes[(size_t)i] != 1) {
      fprintf(stderr, "%s: element %lld written %d times\n", what, (long long)i, writes[(size_t)i]);
      ok = false;
    }
  for (int64_t b = 0; b < (int64_t)sizeof(O) * oblen && ok; b++) {   /* around out: untouched */
    int64_t e = b / (int64_t)sizeof(O);
    if ((e < off[0] || e >= off[0] + n) && ob[b] != before[(size_t)b]) {
      fprintf(stderr, "%s: element %lld of the output's buffer (outside it) changed\n", what, (long long)e);
      ok = false;
    }
  }
  for (int64_t i = 0; i < n && ok; i++) {
    const unsigned char *w = (const unsigned char *)kiln_tensor_data(want) + i * (int64_t)sizeof(O);
    O wv;
    memcpy(&wv, w, sizeof wv);
    bool same = std::is_integral<O>::value ? memcmp(&wv, &out[i], sizeof wv) == 0
                                           : same_value((double)out[i], (double)wv, 0);
    if (!same) {
      fprintf(stderr, "%s: element %lld is %.17g, the CPU gives %.17g\n", what, (long long)i, (double)out[i], (double)wv);
      ok = false;
    }
  }
  report(ok, __LINE__, what);
  kiln_error_clear();
  for (int j = 0; j < NIN; j++) { kiln_tensor_release(base[j]); kiln_tensor_release(view[j]); }
  kiln_tensor_release(obase);
  kiln_tensor_release(want);
}

/* Case i: an op (unary, binary with two tensors or a scalar on either side, where, clamp; some
   in place), a compute dtype (f32, f64, i64), a length (0 to 40, now and then hundreds or tens of
   thousands, so that the grid's threads loop), the operands at element offsets 0 to 9 (the
   vector words where they are aligned), a grid of 1 to 4 blocks of 256 threads. */
template <class C> static void sweep_flat_case(sweep_rng &r, int i) {
  int64_t n = r.one_in(5) ? r.in(100, 1100) : r.one_in(12) ? r.in(2000, 20000) : r.in(0, 40);
  int64_t off[4];
  for (int k = 0; k < 4; k++) off[k] = r.one_in(2) ? 0 : r.in(0, 9);
  int64_t threads = 256 * r.in(1, 4);
  bool in_place = r.one_in(4);
  constexpr bool I = std::is_same<C, int64_t>::value;
  int kind = (int)r.in(0, 9);
  double sc = I ? (double)r.in(-3, 3) : (double)r.in(-12, 12) / 4;
  int side = (int)r.in(-1, 1);   /* the scalar's place in a binary op: none, first, second */
  auto bin = [&](auto op_tag, const char *name) {
    constexpr int OP = decltype(op_tag)::value;
    bool ip = in_place && !gives_bool<OP>() && side != 0;
    check_flat_launch<C>(name, binary_fn<OP, C>(), n, off, side == -1 ? -1 : side, sc, ip, threads, r, i,
                         [&](const struct kiln_tensor *const *v, double s) {
                           return side == -1 ? kiln_binary(OP, v[0], v[1]) : side == 0 ? kiln_binary_scalar(OP, v[1], s, 1)
                                                                                      : kiln_binary_scalar(OP, v[0], s, 0);
                         });
  };
  auto un = [&](auto op_tag, const char *name) {
    constexpr int OP = decltype(op_tag)::value;
    check_flat_launch<C>(name, unary_fn<OP, C>(), n, off, -1, 0, in_place && !gives_bool<OP>(), threads, r, i,
                         [&](const struct kiln_tensor *const *v, double) { return kiln_unary(OP, v[0]); });
  };
  switch (kind) {
  case 0: bin(std::integral_constant<int, KILN_OP_ADD>(), "add"); break;
  case 1: bin(std::integral_constant<int, KILN_OP_MUL>(), "mul"); break;
  case 2: bin(std::integral_constant<int, KILN_OP_SUB>(), "sub"); break;
  case 3: bin(std::integral_constant<int, KILN_OP_MAXIMUM>(), "maximum"); break;
  case 4: bin(std::integral_constant<int, KILN_OP_LT>(), "lt"); break;
  case 5: bin(std::integral_constant<int, KILN_OP_NE>(), "ne"); break;
  case 6:
    if constexpr (I) un(std::integral_constant<int, KILN_OP_ABS>(), "abs");
    else un(std::integral_constant<int, KILN_OP_SQRT>(), "sqrt");
    break;
  case 7: un(std::integral_constant<int, KILN_OP_NEG>(), "neg"); break;
  case 8:
    check_flat_launch<C>("where", where_fn<C>(), n, off, -1, 0, false, threads, r, i,
                         [&](const struct kiln_tensor *const *v, double) { return kiln_where(v[0], v[1], v[2]); });
    break;
  default: {
    clamp_fn<C> fn;
    double lo = I ? -2 : -1.5, hi = I ? 7 : 2.25;
    fn.lo = clamp_bound<C>(lo);
    fn.hi = clamp_bound<C>(hi);
    check_flat_launch<C>("clamp", fn, n, off, -1, 0, in_place, threads, r, i,
                         [&](const struct kiln_tensor *const *v, double) { return kiln_clamp(v[0], lo, hi, 1, 1); });
  }
  }
}

static void sweep_flat(int n) {
  int before = failures;
  for (int i = 0; i < n; i++) {
    sweep_rng h = {(uint64_t)8 << 32 | (uint64_t)(uint32_t)i};
    sweep_rng r = {h.next()};
    switch (r.in(0, 2)) {
    case 0: sweep_flat_case<float>(r, i); break;
    case 1: sweep_flat_case<double>(r, i); break;
    default: sweep_flat_case<int64_t>(r, i);
    }
  }
  printf("sweep flat elementwise: %d cases, %d failed (vector words: %d; threads looping: %d; in place: %d)\n", n,
         failures - before, sweep_vectorised, sweep_looped, sweep_in_place);
}

/* elements.cuh's compile-time facts, which the templates need, against the op table (kiln_op_describe)
   for every op with a CUDA elementwise kernel: gives_bool is the table's comparison flag, and
   takes_integers holds where the front end can call the kernel on i64 (a unary op that keeps
   integers, a comparison, a binary op that does not need a float). */
template <int OP> static void check_facts() {
  struct kiln_op_desc d;
  if (kiln_op_describe(OP, &d) == 0 && d.dtypes_cuda != 0) {
    std::string family = d.family;
    bool elementwise = family == "unary" || family == "binary" || family == "comparison";
    if (elementwise) {
      bool ints = d.keeps_integers || d.comparison || (family != "unary" && !d.needs_float);
      std::string what = std::string(d.name) + ": gives_bool against the table's comparison flag";
      report(gives_bool<OP>() == (d.comparison != 0), __LINE__, what.c_str());
      what = std::string(d.name) + ": takes_integers against the table's flags";
      report(takes_integers<OP>() == ints, __LINE__, what.c_str());
    }
  }
  if constexpr (OP + 1 < KILN_OP_COUNT) check_facts<OP + 1>();
}

int main() {
  check_facts<0>();
  test_conversions();
  test_ops();
  test_random();
  test_vector_words();
  sweep_flat(400 * sweep_times());
  printf("test_cuda_elements: %d checks, %d failed\n", checks, failures);
  return failures != 0 || checks == 0;
}
