/* kiln/dtype.h: element types, their sizes and names, and type promotion.
   f16 and bf16 are storage types: arithmetic on them runs in f32. */
#ifndef KILN_DTYPE_H
#define KILN_DTYPE_H
#include <stdint.h>

enum kiln_dtype {
  KILN_F32 = 0,
  KILN_F64 = 1,
  KILN_F16 = 2,
  KILN_BF16 = 3,
  KILN_I64 = 4,
  KILN_I32 = 5,
  KILN_U8 = 6,
  KILN_BOOL = 7,
  KILN_DTYPE_COUNT = 8
};

int kiln_dtype_size(int dtype);
const char *kiln_dtype_name(int dtype);       /* "f32"; "?" for a bad value */
int kiln_dtype_from_name(const char *name);   /* -1 when unknown; takes "float32", "float", ... too */
int kiln_dtype_is_float(int dtype);
/* The dtype of a op b, as in NumPy and PyTorch: bool < u8 < i32 < i64 < f16, bf16 < f32 < f64;
   f16 with bf16 gives f32. */
int kiln_promote_types(int a, int b);
/* The dtype of a tensor of dtype a with a number s (a weak scalar, as in PyTorch): a float dtype
   stays; an integer or bool one becomes f32 when s has a fraction or is not finite, else stays
   (bool: i64). */
int kiln_scalar_type(int a, double s);

/* Round to nearest, ties to even; NaN stays NaN, overflow goes to infinity. */
uint16_t kiln_f32_to_f16(float x);
float kiln_f16_to_f32(uint16_t h);
uint16_t kiln_f32_to_bf16(float x);
float kiln_bf16_to_f32(uint16_t h);

#endif
