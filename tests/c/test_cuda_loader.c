/* test_cuda_loader.c: libkiln without a usable CUDA device: every kiln/cuda.h call answers cleanly,
   tensors on "cuda" fail with "no CUDA device: ...", the CUDA table's coverage can still be asked,
   and the CPU keeps working. Run as `test_cuda_loader` (the backend next to libkiln, if built),
   `test_cuda_loader missing` ($KILN_CUDA_LIB names no file) and `test_cuda_loader mismatch`
   ($KILN_CUDA_LIB names a backend of another API version). On a machine with a GPU it checks the
   device is reported and skips the rest. */
#include "check.h"

#ifndef KILN_TEST_HAVE_CUDA_BACKEND
#define KILN_TEST_HAVE_CUDA_BACKEND 0
#endif

static int has(const char *s, const char *sub) { return s && strstr(s, sub) != NULL; }

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "default";
  int expect_backend = strcmp(mode, "default") == 0 && KILN_TEST_HAVE_CUDA_BACKEND;
  struct kiln_device cuda0 = {KILN_CUDA, 0};

  if (kiln_cuda_is_available()) {   /* a GPU machine: only the basics */
    CHECK(kiln_cuda_device_count() > 0 && kiln_cuda_unavailable_reason() == NULL && kiln_cuda_init() == KILN_OK);
    CHECK(kiln_device_available(cuda0) && kiln_cuda_backend_loaded());
    printf("test_cuda_loader: %d CUDA device(s); the no-device checks are skipped\n", kiln_cuda_device_count());
    return check_done("test_cuda_loader");
  }

  const char *reason = kiln_cuda_unavailable_reason();
  printf("test_cuda_loader (%s): %s\n", mode, reason ? reason : "(null)");
  CHECK(kiln_cuda_device_count() == 0);
  CHECK(has(reason, "no CUDA device: "));
  CHECK(kiln_cuda_unavailable_reason() == reason);   /* one attempt per process, cached */
  CHECK(kiln_cuda_backend_loaded() == expect_backend);
  if (strcmp(mode, "missing") == 0) CHECK(has(reason, "KILN_CUDA_LIB"));
  if (strcmp(mode, "mismatch") == 0) CHECK(has(reason, "API"));
  if (strcmp(mode, "default") == 0 && !KILN_TEST_HAVE_CUDA_BACKEND) CHECK(has(reason, "built without its CUDA backend"));
  if (expect_backend) CHECK(has(reason, "cudaGetDeviceCount") || has(reason, "no CUDA device: the driver reports"));

  CHECK_ERR(kiln_cuda_init(), "no CUDA device: ");
  CHECK(!kiln_device_available(cuda0));
  CHECK_ERR(kiln_tensor_empty(1, (int64_t[]){4}, KILN_F32, cuda0), "no CUDA device");
  CHECK_ERR(kiln_tensor_empty(1, (int64_t[]){4}, KILN_F32, cuda0), "cuda:0");
  struct kiln_tensor *t = kiln_tensor_full(2, (int64_t[]){2, 3}, 1.5, KILN_F32, CPU);
  CHECK_ERR(kiln_to_device(t, cuda0), "to: no CUDA device");
  CHECK_ERR(kiln_cuda_synchronize(0), "no CUDA device");
  struct kiln_cuda_memory m;
  memset(&m, 0xff, sizeof m);
  CHECK(kiln_cuda_memory_stats(0, &m) == KILN_OK && m.allocated == 0 && m.reserved == 0 && m.device_allocs == 0);
  CHECK(kiln_cuda_empty_cache() == KILN_OK);

  /* Coverage: the table answers even without a device; dispatch still refuses. */
  CHECK(kiln_cuda_op_supported(KILN_OP_ADD) == expect_backend);
  CHECK(kiln_cuda_op_supported(KILN_OP_GEMM) == expect_backend);
  CHECK(kiln_cuda_op_supported(KILN_OP_SUM) == expect_backend);
  CHECK(kiln_cuda_op_supported(KILN_OP_CONV2D) == (expect_backend && KILN_TEST_HAVE_CUDNN));   /* cuDNN */
  CHECK(kiln_cuda_op_supported(KILN_OP_RNN) == expect_backend);
  CHECK(kiln_cuda_op_supported(KILN_OP_CTC_LOSS) == expect_backend);
  CHECK(kiln_cuda_op_supported(KILN_OP_CTC_LOSS_BACKWARD) == expect_backend);
  CHECK(kiln_cuda_op_supported(-1) == 0 && kiln_cuda_op_supported(KILN_OP_COUNT) == 0);
  CHECK(kiln_op_supported(KILN_OP_ADD, KILN_CUDA) == 0);
  CHECK(kiln_op_supported(KILN_OP_ADD, KILN_CPU) == 1);

  /* The process goes on: CPU work is unaffected. */
  struct kiln_tensor *u = kiln_binary_scalar(KILN_OP_MUL, t, 2.0, 0);
  double v = 0;
  struct kiln_tensor *s = u ? kiln_reduce(KILN_OP_SUM, u, 0, NULL, 0, 0) : NULL;
  CHECK(s && kiln_tensor_item(s, &v) == 0 && v == 18.0);
  kiln_tensor_release(t);
  kiln_tensor_release(u);
  kiln_tensor_release(s);
  return check_done("test_cuda_loader");
}
