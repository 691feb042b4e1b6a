/* kiln/random.h: the seeded, counter-based generator (Philox 4x32-10).
   Element i of a draw depends only on (seed, offset, i): never on the thread count. */
#ifndef KILN_RANDOM_H
#define KILN_RANDOM_H
#include <stdint.h>

struct kiln_tensor;

void kiln_manual_seed(uint64_t seed);
uint64_t kiln_initial_seed(void);
/* The generator's whole state is (seed, offset): save both to resume a run. */
uint64_t kiln_random_offset(void);
void kiln_random_set_state(uint64_t seed, uint64_t offset);

/* Fill t in place: uniform in [lo, hi), normal(mean, std), integers in [lo, hi). */
int kiln_uniform_(struct kiln_tensor *t, double lo, double hi);
int kiln_normal_(struct kiln_tensor *t, double mean, double std);
int kiln_randint_(struct kiln_tensor *t, int64_t lo, int64_t hi);

#endif
