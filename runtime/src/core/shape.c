/* shape.c: shapes that meet: broadcasting. */
#include "internal.h"

int kiln_broadcast_shapes(const char *op, int na, const int64_t *sa, int nb, const int64_t *sb, int *out_ndim, int64_t *out) {
  int n = na > nb ? na : nb;
  for (int i = 0; i < n; i++) {
    int64_t x = i < n - na ? 1 : sa[i - (n - na)];
    int64_t y = i < n - nb ? 1 : sb[i - (n - nb)];
    if (x == y || y == 1) out[i] = x;
    else if (x == 1) out[i] = y;
    else
      return kiln_fail(KILN_ERR_SHAPE, "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)", op,
                       kiln_sizes_string(na, sa), kiln_sizes_string(nb, sb), i, (long long)x, (long long)y);
  }
  *out_ndim = n;
  return KILN_OK;
}
