/* test_big_blocks.c: the CPU's cache of large blocks (runtime/src/cpu/big_blocks.c, compiled into
   this test): alignment, small blocks never kept, a freed large block reused for the same size
   rounded to 2 MiB and for no other, the budget and the slot count (the
   least recently freed go first), a block larger than the budget not kept, trimming, and two
   threads sharing the cache without ever being handed the same block; and the kernels' scratch
   buffers (kiln_cpu_scratch, cpu.h): aligned, whole, and NULL for a size no block can have. */
#include "check.h"
#include "cpu/cpu.h"
#include <pthread.h>

#define MiB ((size_t)1 << 20)

static size_t cached(int *blocks, int64_t *hits) {
  size_t bytes;
  kiln_cpu_cache_info(&bytes, blocks, hits);
  return bytes;
}

static void *worker(void *arg) {
  uintptr_t id = (uintptr_t)arg;
  int bad = 0;
  for (int i = 0; i < 200; i++) {
    size_t n = (size_t)(34 + (i + (int)id) % 3 * 2) * MiB;
    volatile uintptr_t *p = kiln_cpu_alloc(n);
    if (!p) return (void *)1;
    /* while this thread holds the block nobody else may write it */
    p[0] = id; p[n / sizeof *p - 1] = id;
    for (volatile int spin = 0; spin < 1000; spin++) {}
    bad += p[0] != id || p[n / sizeof *p - 1] != id;
    kiln_cpu_free((void *)p, n);
  }
  return (void *)(uintptr_t)bad;
}

int main(void) {
  int blocks;
  int64_t hits, hits0;

  /* small blocks: aligned, usable, never kept */
  for (size_t n = 0; n < 5000; n += 777) {
    char *p = kiln_cpu_alloc(n);
    CHECK(p && (uintptr_t)p % 64 == 0);
    if (p && n) { memset(p, 7, n); CHECK(p[n - 1] == 7); }
    kiln_cpu_free(p, n);
  }
  char *mid = kiln_cpu_alloc(8 * MiB);
  CHECK(mid && (uintptr_t)mid % 64 == 0);
  kiln_cpu_free(mid, 8 * MiB);
  CHECK(cached(&blocks, &hits0) == 0 && blocks == 0);

  /* a large block comes back for the same rounded size, whole and aligned */
  size_t n = 40 * MiB + 12345;
  char *a = kiln_cpu_alloc(n);
  CHECK(a && (uintptr_t)a % 64 == 0);
  memset(a, 1, n);
  kiln_cpu_free(a, n);
  CHECK(cached(&blocks, NULL) == 42 * MiB && blocks == 1);   /* rounded to 2 MiB */
  char *b = kiln_cpu_alloc(41 * MiB);
  CHECK(b == a);
  CHECK(cached(&blocks, &hits) == 0 && blocks == 0 && hits == hits0 + 1);
  memset(b, 2, 41 * MiB);
  kiln_cpu_free(b, 41 * MiB);

  /* only the same rounded size: a 42 MiB block does not serve 38 MiB */
  char *c = kiln_cpu_alloc(38 * MiB);
  CHECK(c != NULL && c != a);
  CHECK(cached(&blocks, NULL) == 42 * MiB && blocks == 1);
  kiln_cpu_free(c, 38 * MiB);
  CHECK(cached(&blocks, NULL) == 80 * MiB && blocks == 2);
  char *d = kiln_cpu_alloc(37 * MiB + 1);
  CHECK(d == c);
  kiln_cpu_free(d, 37 * MiB + 1);
  kiln_cpu_trim();
  CHECK(cached(&blocks, NULL) == 0 && blocks == 0);

  /* the budget: three 40 MiB blocks into 100 MiB keep the two freed last */
  kiln_cpu_set_cache_budget(100 * MiB);
  char *x[3];
  for (int i = 0; i < 3; i++) x[i] = kiln_cpu_alloc(40 * MiB);
  CHECK(x[0] && x[1] && x[2]);
  for (int i = 0; i < 3; i++) kiln_cpu_free(x[i], 40 * MiB);
  CHECK(cached(&blocks, NULL) == 80 * MiB && blocks == 2);
  char *y0 = kiln_cpu_alloc(40 * MiB), *y1 = kiln_cpu_alloc(40 * MiB);
  CHECK((y0 == x[1] && y1 == x[2]) || (y0 == x[2] && y1 == x[1]));
  CHECK(cached(&blocks, NULL) == 0);
  kiln_cpu_free(y0, 40 * MiB);
  kiln_cpu_free(y1, 40 * MiB);
  /* a lower budget drops the oldest first */
  kiln_cpu_set_cache_budget(50 * MiB);
  CHECK(cached(&blocks, NULL) == 40 * MiB && blocks == 1);
  char *z = kiln_cpu_alloc(40 * MiB);
  CHECK(z == y1);
  kiln_cpu_free(z, 40 * MiB);
  /* a block larger than the budget is not kept (and does not empty the cache) */
  char *huge = kiln_cpu_alloc(60 * MiB);
  CHECK(huge != NULL);
  kiln_cpu_free(huge, 60 * MiB);
  CHECK(cached(&blocks, NULL) == 40 * MiB && blocks == 1);
  kiln_cpu_trim();

  /* the slots: 20 blocks of 34 MiB under a large budget keep the 16 freed last */
  kiln_cpu_set_cache_budget((size_t)1 << 30);
  char *many[20];
  for (int i = 0; i < 20; i++) many[i] = kiln_cpu_alloc(34 * MiB);
  for (int i = 0; i < 20; i++) kiln_cpu_free(many[i], 34 * MiB);
  CHECK(cached(&blocks, NULL) == 16 * 34 * MiB && blocks == 16);
  int kept = 0;
  char *again[16];
  for (int i = 0; i < 16; i++) {
    again[i] = kiln_cpu_alloc(34 * MiB);
    for (int k = 4; k < 20; k++) kept += again[i] == many[k];
  }
  CHECK(kept == 16);
  for (int i = 0; i < 16; i++) kiln_cpu_free(again[i], 34 * MiB);
  kiln_cpu_trim();

  /* two threads: never the same block at once */
  pthread_t th[2];
  for (uintptr_t i = 0; i < 2; i++) pthread_create(&th[i], NULL, worker, (void *)(i + 1));
  for (int i = 0; i < 2; i++) {
    void *bad;
    pthread_join(th[i], &bad);
    CHECK(bad == NULL);
  }
  CHECK(cached(&blocks, &hits) <= (size_t)1 << 30 && blocks >= 1 && blocks <= 16);
  kiln_cpu_trim();
  CHECK(cached(&blocks, NULL) == 0 && blocks == 0);

  /* scratch buffers: 64-byte aligned at every size, every byte writable; a size that rounding up
     would wrap is refused, as malloc refuses it */
  const size_t sizes[] = {0, 1, 16, 63, 64, 65, 1000, 4097, 777777};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    unsigned char *p = kiln_cpu_scratch(sizes[i]);
    CHECK(p && (uintptr_t)p % 64 == 0);
    if (p && sizes[i]) { memset(p, 5, sizes[i]); CHECK(p[0] == 5 && p[sizes[i] - 1] == 5); }
    free(p);
  }
  CHECK(kiln_cpu_scratch(SIZE_MAX) == NULL && kiln_cpu_scratch(SIZE_MAX - 10) == NULL);
  return check_done("test_big_blocks");
}
