/* fake_cuda_backend.c: a stand-in for libkiln_cuda.so that speaks another API version, so that
   test_cuda_loader can check the loader refuses it with a clear message instead of crashing. */
#include <stdio.h>
#include <stddef.h>

struct kiln_backend;
struct kiln_cuda_host;

__attribute__((visibility("default"))) int kiln_cuda_backend_open(int api_version, const struct kiln_cuda_host *host,
                                                                  const struct kiln_backend **out, int *device_count,
                                                                  char *err, size_t errlen) {
  (void)host;
  *out = NULL;
  *device_count = 0;
  snprintf(err, errlen, "libkiln_cuda.so speaks kiln API 999, libkiln %d: build them from the same sources", api_version);
  return 9;
}
