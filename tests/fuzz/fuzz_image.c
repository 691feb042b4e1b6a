/* fuzz_image.c: libFuzzer harness of the image reader (stb_image behind kiln's checks: PNG, JPEG,
   BMP, GIF, TGA, PNM). Each input is written to an in-memory file and decoded into as many
   channels as its size modulo 5 says (0: the file's own), at 8 bits or, when its size is odd, at
   16 (kiln_image_read_depth, i32 samples 0 to 65535); an image must have every byte readable
   and the declared size within the limit, a failure must name the file. Built by -DKILN_FUZZ=ON
   with clang; `make fuzz` runs it on tests/fuzz/corpus/image. */
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
    fd = memfd_create("fuzz.image", 0);
    if (fd < 0) abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) abort();
  int channels = (int)(size % 5), depth = size % 2 ? 16 : 8;
  struct kiln_tensor *t = kiln_image_read_depth(path, channels, depth);
  if (!t) {
    if (!strstr(kiln_error_message(), path)) abort();
    return 0;
  }
  if (t->ndim != 3 || (channels && t->sizes[0] != channels) || t->numel > KILN_IMAGE_MAX_BYTES) abort();
  if (depth == 16) {
    const volatile int32_t *q = (const int32_t *)t->storage->data;
    for (int64_t k = 0; k < t->numel; k++)
      if (q[k] < 0 || q[k] > 65535) abort();
  } else {
    const volatile unsigned char *p = (const unsigned char *)t->storage->data;
    unsigned sum = 0;
    for (int64_t k = 0; k < t->numel; k++) sum += p[k];
    (void)sum;
  }
  kiln_tensor_release(t);
  return 0;
}
