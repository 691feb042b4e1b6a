/* cuda/elements.cuh: what the CUDA kernels do to one element, as __host__ __device__ functions so
   that tests/c/test_cuda_elements.cu runs the very same code on the CPU against libkiln's kernels:
   dtype conversions (exactly those of dtype.c, saturating and rounding alike), the elementwise
   ops with the CPU's semantics (integer wrap-around, remainder's sign, NaN in maximum), and the
   Philox 4x32-10 mapping of cpu/random.c. */
#ifndef KILN_CUDA_ELEMENTS_CUH
#define KILN_CUDA_ELEMENTS_CUH
extern "C" {
#include <kiln/kiln.h>
}
#include "philox.h"
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>

#define KILN_EL __host__ __device__ __forceinline__

namespace kiln_el {

/* ---- bits ---- */

KILN_EL uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
KILN_EL float bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* f16 and bf16 as in dtype.c: round to nearest even, NaN kept (with its top payload bits). */
KILN_EL uint16_t f32_to_f16(float x) {
  uint32_t u = f32_bits(x);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t mag = u & 0x7fffffffu;
  if (mag >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u | ((mag >> 13) & 0x3ffu) : 0));
  if (mag >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
  if (mag < 0x38800000u) {
    float scaled = bits_f32(mag) * 16777216.0f;   /* exact: a power of two */
    return (uint16_t)(sign | (uint32_t)rintf(scaled));
  }
  uint32_t e = ((mag >> 23) - 112) << 10;
  uint32_t m = mag & 0x7fffffu;
  uint32_t h = e | (m >> 13);
  uint32_t rest = m & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

KILN_EL float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0) u = f32_bits((float)m / 16777216.0f) | sign;
  else if (e == 31) u = sign | 0x7f800000u | (m << 13);
  else u = sign | ((e + 112) << 23) | (m << 13);
  return bits_f32(u);
}

KILN_EL uint16_t f32_to_bf16(float x) {
  uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

KILN_EL float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

/* Float to integer saturates (NaN gives 0), as dtype.c's f64_to_i64. */
KILN_EL int64_t f64_to_i64(double v) {
  if (v != v) return 0;
  if (v >= 9223372036854775807.0) return INT64_MAX;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

/* ---- loads and stores through double: kiln_load_f64 and kiln_store_f64 ---- */

KILN_EL double load_f64(const void *p, int dtype) {
  switch (dtype) {
  case KILN_F32: return *(const float *)p;
  case KILN_F64: return *(const double *)p;
  case KILN_F16: return f16_to_f32(*(const uint16_t *)p);
  case KILN_BF16: return bf16_to_f32(*(const uint16_t *)p);
  case KILN_I64: return (double)*(const int64_t *)p;
  case KILN_I32: return *(const int32_t *)p;
  case KILN_U8: return *(const uint8_t *)p;
  case KILN_BOOL: return *(const uint8_t *)p != 0;
  }
  return 0;
}

KILN_EL void store_f64(void *p, int dtype, double v) {
  switch (dtype) {
  case KILN_F32: *(float *)p = (float)v; break;
  case KILN_F64: *(double *)p = v; break;
  case KILN_F16: *(uint16_t *)p = f32_to_f16((float)v); break;
  case KILN_BF16: *(uint16_t *)p = f32_to_bf16((float)v); break;
  case KILN_I64: *(int64_t *)p = f64_to_i64(v); break;
  case KILN_I32: *(int32_t *)p = (int32_t)(uint32_t)f64_to_i64(v); break;
  case KILN_U8: *(uint8_t *)p = (uint8_t)f64_to_i64(v); break;
  case KILN_BOOL: *(uint8_t *)p = v != 0; break;
  }
}

KILN_EL int dtype_size(int dtype) {
  switch (dtype) {
  case KILN_F64: case KILN_I64: return 8;
  case KILN_F32: case KILN_I32: return 4;
  case KILN_F16: case KILN_BF16: return 2;
  default: return 1;
  }
}

KILN_EL bool is_float(int dtype) { return dtype == KILN_F32 || dtype == KILN_F64 || dtype == KILN_F16 || dtype == KILN_BF16; }

/* One element of dtype sd at src into dtype dd at dst, as kiln_convert does it: through double,
   except the pairs dtype.c writes out whose result differs from that (i64 to f32 rounds once). */
KILN_EL void convert(void *dst, int dd, const void *src, int sd) {
  if (dd == sd) { memcpy(dst, src, (size_t)dtype_size(dd)); return; }
  if (dd == KILN_F32 && sd == KILN_I64) { *(float *)dst = (float)*(const int64_t *)src; return; }
  if (dd == KILN_I64 && !is_float(sd)) { *(int64_t *)dst = (int64_t)load_f64(src, sd); return; }
  store_f64(dst, dd, load_f64(src, sd));
}

/* The compute-dtype value of an element (what cpu/elementwise.c's gather makes of it). */
template <class C> KILN_EL C load_as(const void *p, int sd) {
  C v;
  convert(&v, std::is_same<C, float>::value ? KILN_F32 : std::is_same<C, double>::value ? KILN_F64 : KILN_I64, p, sd);
  return v;
}

/* Store a result (compute dtype, or uint8_t for bool results) into dtype dd. */
template <class O> KILN_EL void store_as(void *p, int dd, O v) {
  convert(p, dd, &v,
          std::is_same<O, float>::value ? KILN_F32 : std::is_same<O, double>::value ? KILN_F64
          : std::is_same<O, uint8_t>::value ? KILN_BOOL : KILN_I64);
}

/* A scalar operand in the compute dtype (kiln_store_f64 of the call's double). */
template <class C> KILN_EL C scalar_as(double s) {
  C v;
  store_f64(&v, std::is_same<C, float>::value ? KILN_F32 : std::is_same<C, double>::value ? KILN_F64 : KILN_I64, s);
  return v;
}

/* ---- the ops ---- */

KILN_EL int64_t wrap_add(int64_t x, int64_t y) { return (int64_t)((uint64_t)x + (uint64_t)y); }
KILN_EL int64_t wrap_sub(int64_t x, int64_t y) { return (int64_t)((uint64_t)x - (uint64_t)y); }
KILN_EL int64_t wrap_mul(int64_t x, int64_t y) { return (int64_t)((uint64_t)x * (uint64_t)y); }
KILN_EL int64_t wrap_neg(int64_t x) { return (int64_t)(0ull - (uint64_t)x); }

KILN_EL int64_t ipow(int64_t base, int64_t e) {
  if (e < 0) return base == 1 ? 1 : base == -1 ? (e & 1 ? -1 : 1) : 0;
  uint64_t r = 1, b = (uint64_t)base;
  while (e) { if (e & 1) r *= b; b *= b; e >>= 1; }
  return (int64_t)r;
}
KILN_EL float fremf_(float x, float y) { float r = fmodf(x, y); return r != 0 && ((r < 0) != (y < 0)) ? r + y : r; }
KILN_EL double frem_(double x, double y) { double r = fmod(x, y); return r != 0 && ((r < 0) != (y < 0)) ? r + y : r; }
KILN_EL int64_t irem(int64_t x, int64_t y) {
  if (y == 0 || y == -1) return 0;
  int64_t r = x % y;
  return r != 0 && ((r < 0) != (y < 0)) ? r + y : r;
}
KILN_EL int64_t bound_i64(double v) { return v <= -9.2e18 ? INT64_MIN : v >= 9.2e18 ? INT64_MAX : (int64_t)v; }

/* Ops taking integers in cpu/elementwise.c's table (the others are defined for f32 and f64). */
template <int OP> constexpr bool takes_integers() {
  return OP == KILN_OP_NEG || OP == KILN_OP_ABS || OP == KILN_OP_SIGN || OP == KILN_OP_RELU || OP == KILN_OP_FLOOR ||
         OP == KILN_OP_CEIL || OP == KILN_OP_ROUND || OP == KILN_OP_TRUNC || OP == KILN_OP_SQUARE ||
         OP == KILN_OP_LOGICAL_NOT || (OP >= KILN_OP_ADD && OP <= KILN_OP_LOGICAL_OR && OP != KILN_OP_DIV) ||
         OP == KILN_OP_WHERE || OP == KILN_OP_CLAMP || OP == KILN_OP_RELU_BACKWARD;
}
/* Ops whose result is bool. */
template <int OP> constexpr bool gives_bool() {
  return OP == KILN_OP_LOGICAL_NOT || (OP >= KILN_OP_EQ && OP <= KILN_OP_LOGICAL_OR);
}
template <int OP, class C> using result_t = typename std::conditional<gives_bool<OP>(), uint8_t, C>::type;

/* The f32 or f64 function of the C library, as the CPU kernel calls it. */
#define KILN_EL_MATH(f32, f64) return F ? (C)f32((float)x) : (C)f64((double)x)

template <int OP, class C> KILN_EL result_t<OP, C> unary(C x) {
  constexpr bool I = std::is_same<C, int64_t>::value, F = std::is_same<C, float>::value;
  if constexpr (OP == KILN_OP_NEG) { if constexpr (I) return wrap_neg(x); else return -x; }
  else if constexpr (OP == KILN_OP_ABS) { if constexpr (I) return x < 0 ? wrap_neg(x) : x; else KILN_EL_MATH(fabsf, fabs); }
  else if constexpr (OP == KILN_OP_SIGN) return (C)((x > 0) - (x < 0));
  else if constexpr (OP == KILN_OP_RELU) return x < 0 ? (C)0 : x;
  else if constexpr (OP == KILN_OP_FLOOR) { if constexpr (I) return x; else KILN_EL_MATH(floorf, floor); }
  else if constexpr (OP == KILN_OP_CEIL) { if constexpr (I) return x; else KILN_EL_MATH(ceilf, ceil); }
  else if constexpr (OP == KILN_OP_ROUND) { if constexpr (I) return x; else KILN_EL_MATH(rintf, rint); }  /* half to even */
  else if constexpr (OP == KILN_OP_TRUNC) { if constexpr (I) return x; else KILN_EL_MATH(truncf, trunc); }
  else if constexpr (OP == KILN_OP_SQUARE) { if constexpr (I) return wrap_mul(x, x); else return x * x; }
  else if constexpr (OP == KILN_OP_LOGICAL_NOT) return (uint8_t)(x == 0);
  else if constexpr (OP == KILN_OP_SQRT) KILN_EL_MATH(sqrtf, sqrt);
  else if constexpr (OP == KILN_OP_RSQRT) return (C)1 / (F ? (C)sqrtf((float)x) : (C)sqrt((double)x));
  else if constexpr (OP == KILN_OP_EXP) KILN_EL_MATH(expf, exp);
  else if constexpr (OP == KILN_OP_LOG) KILN_EL_MATH(logf, log);
  else if constexpr (OP == KILN_OP_LOG1P) KILN_EL_MATH(log1pf, log1p);
  else if constexpr (OP == KILN_OP_EXPM1) KILN_EL_MATH(expm1f, expm1);
  else if constexpr (OP == KILN_OP_SIN) KILN_EL_MATH(sinf, sin);
  else if constexpr (OP == KILN_OP_COS) KILN_EL_MATH(cosf, cos);
  else if constexpr (OP == KILN_OP_TANH) KILN_EL_MATH(tanhf, tanh);
  else if constexpr (OP == KILN_OP_SIGMOID) { if constexpr (F) return 1.0f / (1.0f + expf(-x)); else return 1.0 / (1.0 + exp(-x)); }
  else if constexpr (OP == KILN_OP_RECIPROCAL) return (C)1 / x;
  else if constexpr (OP == KILN_OP_ERF) KILN_EL_MATH(erff, erf);
  else if constexpr (OP == KILN_OP_ERFINV) KILN_EL_MATH(erfinvf, erfinv);
  else static_assert(OP < 0, "not a unary op");
}

template <int OP, class C> KILN_EL result_t<OP, C> binary(C x, C y) {
  constexpr bool I = std::is_same<C, int64_t>::value, F = std::is_same<C, float>::value;
  if constexpr (OP == KILN_OP_ADD) { if constexpr (I) return wrap_add(x, y); else return x + y; }
  else if constexpr (OP == KILN_OP_SUB) { if constexpr (I) return wrap_sub(x, y); else return x - y; }
  else if constexpr (OP == KILN_OP_MUL) { if constexpr (I) return wrap_mul(x, y); else return x * y; }
  else if constexpr (OP == KILN_OP_DIV) return x / y;
  else if constexpr (OP == KILN_OP_POW) {
    if constexpr (I) return ipow(x, y);
    else if constexpr (F) return powf(x, y);
    else return pow(x, y);
  }
  else if constexpr (OP == KILN_OP_MAXIMUM) { if constexpr (I) return x > y ? x : y; else return (x != x || x > y) ? x : y; }
  else if constexpr (OP == KILN_OP_MINIMUM) { if constexpr (I) return x < y ? x : y; else return (x != x || x < y) ? x : y; }
  else if constexpr (OP == KILN_OP_REMAINDER) {
    if constexpr (I) return irem(x, y);
    else if constexpr (F) return fremf_(x, y);
    else return frem_(x, y);
  }
  else if constexpr (OP == KILN_OP_ATAN2) {
    if constexpr (F) return atan2f(x, y);
    else return atan2((double)x, (double)y);
  }
  else if constexpr (OP == KILN_OP_RELU_BACKWARD) return y <= (C)0 ? (C)0 : x;   /* x masked by y > 0 (or NaN) */
  else if constexpr (OP == KILN_OP_EQ) return (uint8_t)(x == y);
  else if constexpr (OP == KILN_OP_NE) return (uint8_t)(x != y);
  else if constexpr (OP == KILN_OP_LT) return (uint8_t)(x < y);
  else if constexpr (OP == KILN_OP_LE) return (uint8_t)(x <= y);
  else if constexpr (OP == KILN_OP_GT) return (uint8_t)(x > y);
  else if constexpr (OP == KILN_OP_GE) return (uint8_t)(x >= y);
  else if constexpr (OP == KILN_OP_LOGICAL_AND) return (uint8_t)(x != 0 && y != 0);
  else if constexpr (OP == KILN_OP_LOGICAL_OR) return (uint8_t)(x != 0 || y != 0);
  else static_assert(OP < 0, "not a binary op");
}

KILN_EL float where(float c, float a, float b) { return c != 0 ? a : b; }
KILN_EL double where(double c, double a, double b) { return c != 0 ? a : b; }
KILN_EL int64_t where(int64_t c, int64_t a, int64_t b) { return c != 0 ? a : b; }

/* lo > hi gives hi, as in PyTorch. Bounds arrive converted: (float) for f32, bound_i64 for i64. */
template <class C> KILN_EL C clamp(C x, C lo, C hi) { C v = x < lo ? lo : x; return v > hi ? hi : v; }
template <class C> KILN_EL C clamp_bound(double v) {
  if constexpr (std::is_same<C, int64_t>::value) return bound_i64(v);
  else return (C)v;
}

/* ---- Philox 4x32-10 (runtime/src/core/philox.h, shared with cpu/random.c): counter (ctr, 0), key = seed ---- */

KILN_EL void philox(uint64_t ctr, uint64_t key, uint32_t out[4]) { kiln_philox4x32(ctr, key, out); }

KILN_EL double unit53(const uint32_t r[4]) { return kiln_philox_unit53(r); }

/* The largest f16 or bf16 value below hi (cpu/random.c's `below`). */
KILN_EL uint16_t below(double hi, int dtype) {
  uint16_t h;
  store_f64(&h, dtype, hi);
  while (load_f64(&h, dtype) >= hi) {
    if (h == 0x0000) h = 0x8001;
    else if (h & 0x8000) h++;
    else h--;
  }
  return h;
}

/* Element i of a random fill into dst (dtype), exactly as cpu/random.c's fill_range, arithmetic
   included: the uniform's affine map in double (fused, as gcc -march=native builds it on any CPU
   with FMA), then rounding to the dtype. Normal draws differ from the CPU's by the last bits of
   the device's log and cos. */
KILN_EL void random_element(int op, void *dst, int dtype, uint64_t seed, uint64_t offset, int64_t i, double p0,
                            double p1, int64_t lo, int64_t hi) {
  uint32_t r[4];
  philox(offset + (uint64_t)i, seed, r);
  double v;
  if (op == KILN_OP_UNIFORM) {
    double u = dtype == KILN_F64 ? unit53(r) : (double)(r[0] >> 8) * 0x1p-24;
    /* One rounding, as cpu/random.c's fma at every CPU level. */
    v = fma(p1 - p0, u, p0);
    if (v >= p1 && p1 > p0) v = nextafter(p1, p0);
    if (dtype != KILN_F64 && (float)v >= (float)p1 && p1 > p0) v = nextafterf((float)p1, (float)p0);
  } else if (op == KILN_OP_NORMAL) {
    double u1 = 1.0 - unit53(r);
    double u2 = (double)(((uint64_t)r[2] << 21) ^ (r[3] >> 11)) * 0x1p-53;
    v = fma(p1 * sqrt(-2.0 * log(u1)), cos(2.0 * 3.14159265358979323846 * u2), p0);   /* as on the CPU */
  } else {
    uint64_t range = (uint64_t)hi - (uint64_t)lo;
    uint64_t x = ((uint64_t)r[0] << 32) | r[1];
    int64_t k = (int64_t)((uint64_t)lo + x % range);
    if (dtype == KILN_I64) { *(int64_t *)dst = k; return; }
    v = (double)k;
  }
  store_f64(dst, dtype, v);
  if (op == KILN_OP_UNIFORM && (dtype == KILN_F16 || dtype == KILN_BF16) && p1 > p0 && load_f64(dst, dtype) >= p1)
    *(uint16_t *)dst = below(p1, dtype);
}

}  // namespace kiln_el

#endif
