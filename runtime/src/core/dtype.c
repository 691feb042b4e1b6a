/* dtype.c: element sizes, names, promotion, and the conversions between dtypes. */
#include "internal.h"
#include <string.h>
#include <math.h>

static const int dtype_sizes[KILN_DTYPE_COUNT] = {
  [KILN_F32] = 4, [KILN_F64] = 8, [KILN_F16] = 2, [KILN_BF16] = 2,
  [KILN_I64] = 8, [KILN_I32] = 4, [KILN_U8] = 1, [KILN_BOOL] = 1,
};
static const char *const dtype_names[KILN_DTYPE_COUNT] = {
  [KILN_F32] = "f32", [KILN_F64] = "f64", [KILN_F16] = "f16", [KILN_BF16] = "bf16",
  [KILN_I64] = "i64", [KILN_I32] = "i32", [KILN_U8] = "u8", [KILN_BOOL] = "bool",
};
_Static_assert(sizeof dtype_names / sizeof dtype_names[0] == KILN_DTYPE_COUNT, "a dtype lacks a name");

KILN_API int kiln_dtype_size(int dtype) {
  return dtype >= 0 && dtype < KILN_DTYPE_COUNT ? dtype_sizes[dtype] : 0;
}

KILN_API const char *kiln_dtype_name(int dtype) {
  return dtype >= 0 && dtype < KILN_DTYPE_COUNT ? dtype_names[dtype] : "?";
}

KILN_API int kiln_dtype_from_name(const char *name) {
  static const struct { const char *name; int dtype; } aliases[] = {
    {"float32", KILN_F32}, {"float", KILN_F32}, {"float64", KILN_F64}, {"double", KILN_F64},
    {"float16", KILN_F16}, {"half", KILN_F16}, {"bfloat16", KILN_BF16}, {"int64", KILN_I64},
    {"long", KILN_I64}, {"int32", KILN_I32}, {"int", KILN_I32}, {"uint8", KILN_U8}, {"byte", KILN_U8},
  };
  if (!name) return -1;
  for (int d = 0; d < KILN_DTYPE_COUNT; d++)
    if (strcmp(name, dtype_names[d]) == 0) return d;
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(name, aliases[i].name) == 0) return aliases[i].dtype;
  return -1;
}

KILN_API int kiln_dtype_is_float(int dtype) {
  return dtype == KILN_F32 || dtype == KILN_F64 || dtype == KILN_F16 || dtype == KILN_BF16;
}

/* Rank in the promotion lattice; f16 and bf16 share a rank and meet at f32. */
static int dtype_rank(int d) {
  switch (d) {
  case KILN_BOOL: return 0;
  case KILN_U8: return 1;
  case KILN_I32: return 2;
  case KILN_I64: return 3;
  case KILN_F16: case KILN_BF16: return 4;
  case KILN_F32: return 5;
  default: return 6;
  }
}

KILN_API int kiln_scalar_type(int a, double s) {
  if (kiln_dtype_is_float(a)) return a;
  if (s != floor(s) || !isfinite(s)) return KILN_F32;
  return a == KILN_BOOL ? KILN_I64 : a;
}

KILN_API int kiln_promote_types(int a, int b) {
  if (a == b) return a;
  int ra = dtype_rank(a), rb = dtype_rank(b);
  if (ra == rb) return KILN_F32;   /* f16 with bf16 */
  return ra > rb ? a : b;
}

/* f16: 1 sign, 5 exponent, 10 mantissa bits. */
KILN_API uint16_t kiln_f32_to_f16(float x) {
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

KILN_API float kiln_f16_to_f32(uint16_t h) {
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

KILN_API uint16_t kiln_f32_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

KILN_API float kiln_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

double kiln_load_f64(const void *p, int dtype) {
  switch (dtype) {
  case KILN_F32: return *(const float *)p;
  case KILN_F64: return *(const double *)p;
  case KILN_F16: return kiln_f16_to_f32(*(const uint16_t *)p);
  case KILN_BF16: return kiln_bf16_to_f32(*(const uint16_t *)p);
  case KILN_I64: return (double)*(const int64_t *)p;
  case KILN_I32: return *(const int32_t *)p;
  case KILN_U8: return *(const uint8_t *)p;
  case KILN_BOOL: return *(const uint8_t *)p != 0;
  }
  return 0;
}

/* Float to integer conversions saturate instead of invoking undefined behaviour. */
static int64_t f64_to_i64(double v) {
  if (v != v) return 0;
  if (v >= 9223372036854775807.0) return INT64_MAX;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

void kiln_store_f64(void *p, int dtype, double v) {
  switch (dtype) {
  case KILN_F32: *(float *)p = (float)v; break;
  case KILN_F64: *(double *)p = v; break;
  case KILN_F16: *(uint16_t *)p = kiln_f32_to_f16((float)v); break;
  case KILN_BF16: *(uint16_t *)p = kiln_f32_to_bf16((float)v); break;
  case KILN_I64: *(int64_t *)p = f64_to_i64(v); break;
  case KILN_I32: { int64_t i = f64_to_i64(v); *(int32_t *)p = (int32_t)(uint32_t)i; break; }
  case KILN_U8: { int64_t i = f64_to_i64(v); *(uint8_t *)p = (uint8_t)i; break; }
  case KILN_BOOL: *(uint8_t *)p = v != 0; break;
  }
}

/* f32 <-> bf16 over arrays, for mixed precision's conversions: the same rounding as
   kiln_f32_to_bf16 (nearest even, NaN kept quiet), branch-free so that gcc vectorises it. */
__attribute__((optimize("O3")))
static void f32_to_bf16_array(uint16_t *o, const float *s, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &s[i], 4);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
    o[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
  }
}
__attribute__((optimize("O3")))
static void bf16_to_f32_array(float *o, const uint16_t *s, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)s[i] << 16;
    memcpy(&o[i], &u, 4);
  }
}

/* The conversions the elementwise iterator needs most are written out so gcc vectorises them;
   the rest go through double, which is exact for every dtype but i64 beyond 2^53. */
void kiln_convert(void *dst, int dd, const void *src, int sd, int64_t n) {
  if (n <= 0) return;   /* an empty tensor's pointers may be NULL, which memcpy may not be given */
  if (dd == sd) { memcpy(dst, src, (size_t)(n * kiln_dtype_size(dd))); return; }
  if (dd == KILN_F32 && sd == KILN_F16) {
    float *o = dst; const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) o[i] = kiln_f16_to_f32(s[i]);
  } else if (dd == KILN_F32 && sd == KILN_BF16) {
    bf16_to_f32_array(dst, src, n);
  } else if (dd == KILN_F16 && sd == KILN_F32) {
    uint16_t *o = dst; const float *s = src;
    for (int64_t i = 0; i < n; i++) o[i] = kiln_f32_to_f16(s[i]);
  } else if (dd == KILN_BF16 && sd == KILN_F32) {
    f32_to_bf16_array(dst, src, n);
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
    int ds = kiln_dtype_size(dd), ss = kiln_dtype_size(sd);
    char *o = dst; const char *s = src;
    if (dd == KILN_I64 && sd != KILN_F32 && sd != KILN_F64 && sd != KILN_F16 && sd != KILN_BF16) {
      for (int64_t i = 0; i < n; i++) ((int64_t *)dst)[i] = (int64_t)kiln_load_f64(s + i * ss, sd);
      return;
    }
    for (int64_t i = 0; i < n; i++) kiln_store_f64(o + i * ds, dd, kiln_load_f64(s + i * ss, sd));
  }
}
