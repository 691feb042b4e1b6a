/* fuzz_safetensors.c: libFuzzer harness of the safetensors reader. Each input is written to an
   in-memory file and opened twice (mapped, then read into memory); whatever opens must give
   tensors whose every byte can be read, and whatever fails must fail with a message naming the
   file. Built by -DKILN_FUZZ=ON with clang; `make fuzz` runs it on tests/fuzz/corpus/safetensors. */
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
    fd = memfd_create("fuzz.safetensors", 0);
    if (fd < 0) abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) abort();
  for (int flags = 0; flags <= KILN_SAFETENSORS_NO_MMAP; flags += KILN_SAFETENSORS_NO_MMAP) {
    struct kiln_safetensors *f = kiln_safetensors_open(path, flags);
    if (!f) {
      if (!strstr(kiln_error_message(), path)) abort();   /* every error names the file */
      continue;
    }
    for (int i = 0; i < kiln_safetensors_count(f); i++) {
      if (!kiln_safetensors_name(f, i)) abort();
      struct kiln_tensor *t = kiln_safetensors_tensor(f, i);
      if (!t) abort();   /* a validated entry always gives a tensor */
      const volatile unsigned char *p = (const unsigned char *)t->storage->data;
      unsigned sum = 0;
      for (int64_t k = 0; k < t->numel * kiln_dtype_size(t->dtype); k++) sum += p[k];
      (void)sum;
      kiln_tensor_release(t);
    }
    for (int i = 0; i < kiln_safetensors_meta_count(f); i++)
      if (!kiln_safetensors_meta_key(f, i) || !kiln_safetensors_meta_value(f, i)) abort();
    kiln_safetensors_close(f);
  }
  return 0;
}
