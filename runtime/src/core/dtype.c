/* dtype.c: element sizes, names, promotion, and the conversions between dtypes. */
#include "internal.h"
#include "convert.h"
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

KILN_API uint16_t kiln_f32_to_f16(float x) { return convert_f32_to_f16(x); }
KILN_API float kiln_f16_to_f32(uint16_t h) { return convert_f16_to_f32(h); }
KILN_API uint16_t kiln_f32_to_bf16(float x) { return convert_f32_to_bf16(x); }
KILN_API float kiln_bf16_to_f32(uint16_t h) { return convert_bf16_to_f32(h); }

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

/* The pairs convert_vectorised (core/convert.h) leaves go through double, which is exact for every
   dtype but i64 beyond 2^53. */
void kiln_convert(void *dst, int dd, const void *src, int sd, int64_t n) {
  if (convert_vectorised(dst, dd, src, sd, n)) return;
  int ds = kiln_dtype_size(dd), ss = kiln_dtype_size(sd);
  char *o = dst; const char *s = src;
  if (dd == KILN_I64 && sd != KILN_F32 && sd != KILN_F64 && sd != KILN_F16 && sd != KILN_BF16) {
    for (int64_t i = 0; i < n; i++) ((int64_t *)dst)[i] = (int64_t)kiln_load_f64(s + i * ss, sd);
    return;
  }
  for (int64_t i = 0; i < n; i++) kiln_store_f64(o + i * ds, dd, kiln_load_f64(s + i * ss, sd));
}
