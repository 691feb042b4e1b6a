/* fuzz_idx.c: libFuzzer harness of the IDX reader (plain and gzip). Each input is written to an
   in-memory file and read; a tensor must be complete (every byte readable), a failure must name
   the file. Built by -DKILN_FUZZ=ON with clang; `make fuzz` runs it on tests/fuzz/corpus/idx. */
#define _GNU_SOURCE
#include <kiln/kiln.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int fd = -1;
static char path[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (fd < 0) {
    fd = memfd_create("fuzz.idx", 0);
    if (fd < 0) abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) abort();
  struct kiln_tensor *t = kiln_idx_read(path);
  if (!t) {
    if (!strstr(kiln_error_message(), path)) abort();
    return 0;
  }
  const volatile unsigned char *p = (const unsigned char *)t->storage->data;
  unsigned sum = 0;
  for (int64_t k = 0; k < t->numel * kiln_dtype_size(t->dtype); k++) sum += p[k];
  (void)sum;
  kiln_tensor_release(t);
  return 0;
}
