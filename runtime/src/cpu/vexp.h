/* cpu/vexp.h: exp in f32 without branches or calls, so that loops over it vectorise (the f32
   recurrent gates, softmax and the cross-entropy grad). x = n ln2 + r with |r| <= ln2/2 and a
   degree-6 Taylor polynomial for e^r: relative error below 3e-7 over [-87, 88]; 0 below -87
   (e^-87 = 1.6e-38), e^88 up to 88.72 and infinity past it; NaN stays NaN. */
#ifndef KILN_CPU_VEXP_H
#define KILN_CPU_VEXP_H

#include <stdint.h>
#include <string.h>

static inline float kiln_vexpf(float x) {
  float c = x >= -87.0f ? (x > 88.0f ? 88.0f : x) : -87.0f;   /* NaN goes to -87: no NaN reaches the int below */
  float n = __builtin_floorf(c * 1.44269504088896341f + 0.5f);
  float r = c - n * 0.693145751953125f;
  r = r - n * 1.428606765330187e-06f;
  float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
  uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return x != x ? x : x < -87.0f ? 0.0f : x > 88.7228f ? __builtin_inff() : p * scale;
}

#endif
