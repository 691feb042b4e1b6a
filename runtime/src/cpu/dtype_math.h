/* cpu/dtype_math.h: f32 and f64 arithmetic for kernels written once over the dtype.
   A kernel body takes `int dt` (KILN_F32 or KILN_F64, a constant at each call of its named
   per-dtype wrappers) and holds its values in double; every + - * / and sqrt goes through one of
   these helpers, which rounds the result to float when dt is f32. One such operation computed in
   binary64 and rounded to binary32 gives the float result exactly, and gcc narrows the pair back to
   the float instruction (and contracts a multiply and an add into an FMA as it would in float), so
   the f32 code is the float code, bit for bit and instruction for instruction. A value carried
   across loop iterations in double is not narrowed: keep such accumulators in their own type.
   Where two products meet in one sum, compute them into locals in the order of the expression
   written in T: gcc fuses the first product computed into an FMA with the add, and it does not
   compute a call's arguments in the order they are written. */
#ifndef KILN_CPU_DTYPE_MATH_H
#define KILN_CPU_DTYPE_MATH_H
#include "../internal.h"
#include <math.h>

/* Element i of an f32 or f64 buffer, as double; a value stored back in the buffer's dtype. */
static inline __attribute__((always_inline)) double dt_load(const void *x, int dt, int64_t i) {
  return dt == KILN_F32 ? (double)((const float *)x)[i] : ((const double *)x)[i];
}
static inline __attribute__((always_inline)) void dt_store(void *x, int dt, int64_t i, double v) {
  if (dt == KILN_F32) ((float *)x)[i] = (float)v;
  else ((double *)x)[i] = v;
}

/* The size of an element, and the address of element i of an f32 or f64 buffer. */
static inline __attribute__((always_inline)) size_t dt_size(int dt) { return dt == KILN_F32 ? sizeof(float) : sizeof(double); }
static inline __attribute__((always_inline)) void *dt_at(const void *x, int dt, int64_t i) {
  return dt == KILN_F32 ? (void *)((const float *)x + i) : (void *)((const double *)x + i);
}

/* x[i], or the value given where x is NULL (an optional weight or bias), chosen in the dtype: so
   the arithmetic that uses it stays in the dtype. */
static inline __attribute__((always_inline)) double dt_load_or(const void *x, int dt, int64_t i, double otherwise) {
  if (dt == KILN_F32) {
    float v = x ? ((const float *)x)[i] : (float)otherwise;
    return v;
  }
  return x ? ((const double *)x)[i] : otherwise;
}

/* v rounded to the dtype: a scalar argument as the kernel's T would hold it. Round a negated scalar
   here (dt_round(dt, -lr)), not in the loop: gcc does not narrow the negation of a converted value. */
static inline __attribute__((always_inline)) double dt_round(int dt, double v) {
  return dt == KILN_F32 ? (double)(float)v : v;
}

static inline __attribute__((always_inline)) double dt_add(int dt, double a, double b) { return dt_round(dt, a + b); }
static inline __attribute__((always_inline)) double dt_sub(int dt, double a, double b) { return dt_round(dt, a - b); }
static inline __attribute__((always_inline)) double dt_mul(int dt, double a, double b) { return dt_round(dt, a * b); }
static inline __attribute__((always_inline)) double dt_div(int dt, double a, double b) { return dt_round(dt, a / b); }

/* c ? a : b, met in the dtype: a value chosen inside a loop must meet in the dtype's own type, where
   gcc keeps narrowing the arithmetic that uses it (it does not narrow a double chosen between two).
   Both are rounded before the choice, so that the choice is a select gcc can vectorise. */
static inline __attribute__((always_inline)) double dt_select(int dt, int c, double a, double b) {
  if (dt == KILN_F32) {
    float fa = (float)a, fb = (float)b;
    return c ? fa : fb;
  }
  return c ? a : b;
}

/* sqrt in the dtype: sqrtf for f32 (libm stays the dtype's own). */
static inline __attribute__((always_inline)) double dt_sqrt(int dt, double a) {
  return dt == KILN_F32 ? (double)sqrtf((float)a) : sqrt(a);
}

#endif
