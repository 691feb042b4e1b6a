/* sweep.h: what the randomized sweeps of the C++ host tests (test_cuda_*.cu) share: a seeded
   generator, so that CI draws the same cases every run, and KILN_TEST_SWEEP=N, which draws N times
   as many (the first ones unchanged) for longer runs by hand. */
#ifndef KILN_TEST_SWEEP_H
#define KILN_TEST_SWEEP_H
#include <stdint.h>
#include <stdlib.h>

struct sweep_rng {
  uint64_t s;
  uint64_t next() {   /* splitmix64 */
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int64_t in(int64_t lo, int64_t hi) { return lo + (int64_t)(next() % (uint64_t)(hi - lo + 1)); }
  bool one_in(int n) { return next() % (uint64_t)n == 0; }
  double uniform() { return (double)(next() >> 11) * 0x1p-53; }
};

static inline int sweep_times() {
  const char *e = getenv("KILN_TEST_SWEEP");
  long n = e ? strtol(e, NULL, 10) : 1;
  return n < 1 ? 1 : n > 100000 ? 100000 : (int)n;
}

#endif
