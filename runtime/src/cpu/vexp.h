/* cpu/vexp.h: exp in f32 without branches or calls, so that loops over it vectorise (the f32
   exp op, the recurrent gates, softmax and the cross-entropy grad). x = n ln2 + r with |r| <= ln2/2
   and a degree-7 Taylor polynomial for e^r, scaled by 2^n in two steps: within 0.92 ulp of exp
   over the whole f32 range, subnormal results included (checked against exp in double at every
   float in [-110, -86] and [87, 90] and a sample between; libm's expf: 0.50 ulp; a vectorised exp
   within 1 ulp, as PyTorch's); 0 below -104, infinity above 88.72284; NaN stays NaN. */
#ifndef KILN_CPU_VEXP_H
#define KILN_CPU_VEXP_H

#include <stdint.h>
#include <string.h>

/* 2^k for -126 <= k <= 127, as float bits */
static inline float kiln_pow2if(int32_t k) {
  uint32_t bits = (uint32_t)(k + 127) << 23;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static inline float kiln_vexpf(float x) {
  float c = x >= -104.0f ? (x > 89.0f ? 89.0f : x) : -104.0f;   /* NaN goes to -104: no NaN reaches the int below */
  float n = __builtin_floorf(c * 1.44269504088896341f + 0.5f);
  float r = c - n * 0.693145751953125f;
  r = r - n * 1.428606765330187e-06f;
  float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720 + r * (1.0f / 5040)))))));
  /* 2^n in two halves, so that results near the top of the range and subnormal ones come out */
  int32_t k = (int32_t)n, k1 = k >> 1;
  float y = p * kiln_pow2if(k1) * kiln_pow2if(k - k1);
  return x != x ? x : x < -104.0f ? 0.0f : x > 88.72284f ? __builtin_inff() : y;
}

#endif
