/* core/convert.h: the conversions between dtypes as inline bodies: core/dtype.c's kiln_convert and
   f16/bf16 functions, and the copy the CPU kernels compile at their own level (cpu/elementwise.c). */
#ifndef KILN_CONVERT_H
#define KILN_CONVERT_H
#include "internal.h"
#include <math.h>
#include <string.h>

/* f16: 1 sign, 5 exponent, 10 mantissa bits. */
static inline uint16_t convert_f32_to_f16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t mag = u & 0x7fffffffu;
  if (mag >= 0x7f800000u)  /* inf or NaN */
    return (uint16_t)(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u | ((mag >> 13) & 0x3ffu) : 0));
  if (mag >= 0x477ff000u)  /* rounds to a value >= 65520: overflow */
    return (uint16_t)(sign | 0x7c00u);
  if (mag < 0x38800000u) { /* below the smallest normal f16: a subnormal or zero */
    /* value = mag as float; f16 subnormal unit is 2^-24. Scale with exact float arithmetic. */
    float f;
    memcpy(&f, &mag, 4);
    float scaled = f * 16777216.0f;           /* exact: a power of two */
    /* round to nearest even by the FPU (default rounding mode) */
    uint32_t r = (uint32_t)nearbyintf(scaled);
    return (uint16_t)(sign | r);
  }
  uint32_t e = ((mag >> 23) - 112) << 10;     /* rebias 127 -> 15 */
  uint32_t m = mag & 0x7fffffu;
  uint32_t h = e | (m >> 13);
  uint32_t rest = m & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;  /* may carry into the exponent: correct */
  return (uint16_t)(sign | h);
}

static inline float convert_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0) {
    float f = (float)m / 16777216.0f;        /* subnormal: m * 2^-24, exact */
    memcpy(&u, &f, 4);
    u |= sign;
  } else if (e == 31) {
    u = sign | 0x7f800000u | (m << 13);
  } else {
    u = sign | ((e + 112) << 23) | (m << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* nearest even; a NaN stays NaN, made quiet. Both results computed and one selected, so that the
   loops calling it vectorise. */
static inline uint16_t convert_f32_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

static inline float convert_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* The conversions the elementwise iterator needs most, written out so gcc vectorises them: n
   elements of src (dtype sd) into dst (dtype dd). 0 for a pair of dtypes it leaves to
   kiln_convert's loop through double. */
static inline __attribute__((always_inline)) int convert_vectorised(void *dst, int dd, const void *src, int sd, int64_t n) {
  if (n <= 0) return 1;   /* an empty tensor's pointers may be NULL, which memcpy may not be given */
  if (dd == sd) { memcpy(dst, src, (size_t)(n * kiln_dtype_size(dd))); return 1; }
  if (dd == KILN_F32 && sd == KILN_F16) {
    float *o = dst; const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) o[i] = convert_f16_to_f32(s[i]);
  } else if (dd == KILN_F32 && sd == KILN_BF16) {
    float *o = dst; const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) o[i] = convert_bf16_to_f32(s[i]);
  } else if (dd == KILN_F16 && sd == KILN_F32) {
    uint16_t *o = dst; const float *s = src;
    for (int64_t i = 0; i < n; i++) o[i] = convert_f32_to_f16(s[i]);
  } else if (dd == KILN_BF16 && sd == KILN_F32) {
    uint16_t *o = dst; const float *s = src;
    for (int64_t i = 0; i < n; i++) o[i] = convert_f32_to_bf16(s[i]);
  } else if (dd == KILN_F64 && sd == KILN_F32) {
    double *o = dst; const float *s = src;
    for (int64_t i = 0; i < n; i++) o[i] = s[i];
  } else if (dd == KILN_F32 && sd == KILN_F64) {
    float *o = dst; const double *s = src;
    for (int64_t i = 0; i < n; i++) o[i] = (float)s[i];
  } else if (dd == KILN_I64 && sd == KILN_I32) {
    int64_t *o = dst; const int32_t *s = src;
    for (int64_t i = 0; i < n; i++) o[i] = s[i];
  } else if (dd == KILN_I64 && (sd == KILN_U8 || sd == KILN_BOOL)) {
    int64_t *o = dst; const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++) o[i] = sd == KILN_BOOL ? s[i] != 0 : s[i];
  } else if (dd == KILN_F32 && sd == KILN_I64) {
    float *o = dst; const int64_t *s = src;
    for (int64_t i = 0; i < n; i++) o[i] = (float)s[i];
  } else if ((dd == KILN_F32 || dd == KILN_F64 || dd == KILN_I64) && (sd == KILN_BOOL || sd == KILN_U8)) {
    /* masks (a > 0) meet floats in every derivative of a comparison: keep this path vectorised */
    const uint8_t *s = src;
    if (sd == KILN_BOOL) {
      if (dd == KILN_F32) { float *o = dst; for (int64_t i = 0; i < n; i++) o[i] = s[i] != 0; }
      else if (dd == KILN_F64) { double *o = dst; for (int64_t i = 0; i < n; i++) o[i] = s[i] != 0; }
      else { int64_t *o = dst; for (int64_t i = 0; i < n; i++) o[i] = s[i] != 0; }
    } else {
      if (dd == KILN_F32) { float *o = dst; for (int64_t i = 0; i < n; i++) o[i] = s[i]; }
      else if (dd == KILN_F64) { double *o = dst; for (int64_t i = 0; i < n; i++) o[i] = s[i]; }
      else { int64_t *o = dst; for (int64_t i = 0; i < n; i++) o[i] = s[i]; }
    }
  } else if (dd == KILN_F32 && sd == KILN_I32) {
    float *o = dst; const int32_t *s = src;
    for (int64_t i = 0; i < n; i++) o[i] = (float)s[i];
  } else if (dd == KILN_F64 && sd == KILN_I64) {
    double *o = dst; const int64_t *s = src;
    for (int64_t i = 0; i < n; i++) o[i] = (double)s[i];
  } else if (dd == KILN_BOOL && (sd == KILN_F32 || sd == KILN_U8)) {
    uint8_t *o = dst;
    if (sd == KILN_F32) { const float *s = src; for (int64_t i = 0; i < n; i++) o[i] = s[i] != 0; }
    else { const uint8_t *s = src; for (int64_t i = 0; i < n; i++) o[i] = s[i] != 0; }
  } else if (dd == KILN_I64 && sd == KILN_I64) {
    memcpy(dst, src, (size_t)n * 8);
  } else {
    return 0;
  }
  return 1;
}

#endif
