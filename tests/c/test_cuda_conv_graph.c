/* test_cuda_conv_graph.c: the cuDNN graph (backend) API descriptors of the CUDA convolutions
   (runtime/cuda/conv_graph.c, compiled into this test and linked against libcudnn when CMake found
   cuDNN 9). Without a GPU, cuDNN builds and finalizes tensor, convolution and operation descriptors
   (no handle needed); their attributes are read back with cudnnBackendGetAttribute (where cuDNN 9
   answers: dims, strides, uid, data type; pads, strides, dilations, compute type) and compared with
   values derived here independently. Operations whose output size or weight channels do not fit
   their convolution must not finalize. The operation graph needs a handle (a device): without one it
   is refused with the call named; heuristics, plans and execution are covered by
   tests/gpu/ops_spec.lua. Also checked here: the dtype mapping, buffer alignments, the shape's
   strides, the numerical-note filter that keeps f32 exact (no TF32), and the kiln error code of
   each category of cuDNN status. */
#include "check.h"

#if KILN_TEST_HAVE_CUDNN
#include "conv_graph.h"

static int64_t get_int64(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, int64_t *out, int64_t max) {
  int64_t n = -1;
  cudnnStatus_t s = cudnnBackendGetAttribute(d, name, CUDNN_TYPE_INT64, max, &n, out);
  CHECK(s == CUDNN_STATUS_SUCCESS);
  return s == CUDNN_STATUS_SUCCESS ? n : -1;
}

static void test_types_and_notes(void) {
  cudnnDataType_t d, c;
  CHECK(kiln_conv_graph_types(KILN_F32, &d, &c) == 0 && d == CUDNN_DATA_FLOAT && c == CUDNN_DATA_FLOAT);
  CHECK(kiln_conv_graph_types(KILN_F64, &d, &c) == 0 && d == CUDNN_DATA_DOUBLE && c == CUDNN_DATA_DOUBLE);
  CHECK(kiln_conv_graph_types(KILN_F16, &d, &c) == 0 && d == CUDNN_DATA_HALF && c == CUDNN_DATA_FLOAT);
  CHECK(kiln_conv_graph_types(KILN_BF16, &d, &c) == 0 && d == CUDNN_DATA_BFLOAT16 && c == CUDNN_DATA_FLOAT);
  CHECK(kiln_conv_graph_types(KILN_I64, &d, &c) == -1);
  CHECK(kiln_conv_graph_types(KILN_U8, &d, &c) == -1);

  CHECK(kiln_conv_graph_alignment((void *)(uintptr_t)0x10000) == 16);
  CHECK(kiln_conv_graph_alignment((void *)(uintptr_t)0x10010) == 16);
  CHECK(kiln_conv_graph_alignment((void *)(uintptr_t)0x10008) == 8);
  CHECK(kiln_conv_graph_alignment((void *)(uintptr_t)0x1000c) == 4);
  CHECK(kiln_conv_graph_alignment((void *)(uintptr_t)0x10006) == 2);
  CHECK(kiln_conv_graph_alignment((void *)(uintptr_t)0x10003) == 1);
  CHECK(kiln_conv_graph_alignment(NULL) == 16);

  cudnnBackendNumericalNote_t tc[2] = {CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC, CUDNN_NUMERICAL_NOTE_TENSOR_CORE};
  cudnnBackendNumericalNote_t down[1] = {CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS};
  cudnnBackendNumericalNote_t reduced[1] = {CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION};
  cudnnBackendNumericalNote_t fine[3] = {CUDNN_NUMERICAL_NOTE_FFT, CUDNN_NUMERICAL_NOTE_WINOGRAD,
                                         CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC};
  CHECK(!kiln_conv_graph_exact(KILN_F32, tc, 2));
  CHECK(!kiln_conv_graph_exact(KILN_F32, down, 1));
  CHECK(!kiln_conv_graph_exact(KILN_F32, reduced, 1));
  CHECK(kiln_conv_graph_exact(KILN_F64, tc, 2));    /* f64 tensor cores are IEEE double */
  CHECK(!kiln_conv_graph_exact(KILN_F64, down, 1));
  CHECK(!kiln_conv_graph_exact(KILN_F64, reduced, 1));
  CHECK(kiln_conv_graph_exact(KILN_F32, tc, 1));   /* only the first note counted: nondeterministic alone is fine */
  CHECK(kiln_conv_graph_exact(KILN_F32, fine, 3));
  CHECK(kiln_conv_graph_exact(KILN_F32, NULL, 0));
  CHECK(kiln_conv_graph_exact(KILN_F16, tc, 2));   /* half precision may use tensor cores */
  CHECK(kiln_conv_graph_exact(KILN_BF16, down, 1));
}

/* cuDNN 9 reports a refusal with a specific code of the NOT_SUPPORTED category (3000-3999): each
   is an unsupported case for kiln, not a device fault; allocations are memory errors. */
static void test_error_codes(void) {
  CHECK(kiln_conv_graph_error_code(CUDNN_STATUS_NOT_SUPPORTED) == KILN_ERR_UNSUPPORTED);
  CHECK(kiln_conv_graph_error_code(CUDNN_STATUS_NOT_SUPPORTED_SHAPE) == KILN_ERR_UNSUPPORTED);
  CHECK(kiln_conv_graph_error_code(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT) == KILN_ERR_UNSUPPORTED);
  CHECK(kiln_conv_graph_error_code(CUDNN_STATUS_NOT_SUPPORTED_PADDING) == KILN_ERR_UNSUPPORTED);
  CHECK(kiln_conv_graph_error_code(CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT) == KILN_ERR_UNSUPPORTED);
  CHECK(kiln_conv_graph_error_code(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED) == KILN_ERR_MEMORY);
  CHECK(kiln_conv_graph_error_code(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) == KILN_ERR_MEMORY);
  CHECK(kiln_conv_graph_error_code(CUDNN_STATUS_BAD_PARAM) == KILN_ERR_DEVICE);
  CHECK(kiln_conv_graph_error_code(CUDNN_STATUS_INTERNAL_ERROR) == KILN_ERR_DEVICE);
  CHECK(kiln_conv_graph_error_code(CUDNN_STATUS_EXECUTION_FAILED_CUDART) == KILN_ERR_DEVICE);
}

static void test_shape(void) {
  /* x is the [5,6,9,8] corner of a [5,6,12,10] buffer; w groups 2: [4,3,3,3] */
  const int64_t x[4] = {5, 6, 9, 8}, xs[4] = {6 * 12 * 10, 12 * 10, 10, 1}, w[4] = {4, 3, 3, 3}, y[4] = {5, 4, 4, 3};
  const int64_t ints[7] = {2, 3, 1, 2, 1, 2, 2};
  struct kiln_conv_graph_shape s;
  kiln_conv_graph_shape_make(&s, KILN_CONV_BACKWARD_DATA, KILN_F64, x, xs, w, y, ints, (void *)(uintptr_t)0x1000,
                             (void *)(uintptr_t)0x2008, (void *)(uintptr_t)0x3004);
  CHECK(s.pass == KILN_CONV_BACKWARD_DATA && s.dtype == KILN_F64);
  CHECK(s.xs[0] == 720 && s.xs[1] == 120 && s.xs[2] == 10 && s.xs[3] == 1);
  CHECK(s.ws[0] == 27 && s.ws[1] == 9 && s.ws[2] == 3 && s.ws[3] == 1);
  CHECK(s.ys[0] == 48 && s.ys[1] == 12 && s.ys[2] == 3 && s.ys[3] == 1);
  CHECK(s.align_x == 16 && s.align_w == 8 && s.align_y == 4);
  kiln_conv_graph_shape_make(&s, KILN_CONV_FORWARD, KILN_F32, x, NULL, w, y, ints, NULL, NULL, NULL);
  CHECK(s.xs[0] == 6 * 9 * 8 && s.xs[1] == 72 && s.xs[2] == 8 && s.xs[3] == 1);   /* contiguous x */
  CHECK(s.ints[6] == 2 && s.ints[5] == 2 && s.y[3] == 3);
}

static void test_tensor(void) {
  const int64_t dims[4] = {3, 5, 7, 11}, strides[4] = {5 * 9 * 11, 9 * 11, 11, 1};   /* a corner: rows 9 apart */
  cudnnBackendDescriptor_t t = NULL;
  const char *call = "";
  cudnnStatus_t s = kiln_conv_graph_tensor(&t, KILN_CONV_UID_W, CUDNN_DATA_DOUBLE, dims, strides, 8, &call);
  if (!CHECK(s == CUDNN_STATUS_SUCCESS)) fprintf(stderr, "  %s: %s\n", call, cudnnGetErrorString(s));
  if (s) {
    if (t) cudnnBackendDestroyDescriptor(t);
    return;
  }
  int64_t got[8] = {0}, n;
  n = get_int64(t, CUDNN_ATTR_TENSOR_DIMENSIONS, got, 8);
  CHECK(n == 4 && got[0] == 3 && got[1] == 5 && got[2] == 7 && got[3] == 11);
  n = get_int64(t, CUDNN_ATTR_TENSOR_STRIDES, got, 8);
  CHECK(n == 4 && got[0] == 495 && got[1] == 99 && got[2] == 11 && got[3] == 1);
  n = get_int64(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, got, 1);
  CHECK(n == 1 && got[0] == KILN_CONV_UID_W);
  /* (cuDNN 9 does not read CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT back: CUDNN_STATUS_NOT_SUPPORTED) */
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int64_t count = 0;
  CHECK(cudnnBackendGetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &count, &type) == CUDNN_STATUS_SUCCESS);
  CHECK(count == 1 && type == CUDNN_DATA_DOUBLE);
  cudnnBackendDestroyDescriptor(t);

  /* a negative size is refused at finalize, and the call is named */
  const int64_t bad[4] = {3, -5, 7, 11};
  s = kiln_conv_graph_tensor(&t, 9, CUDNN_DATA_FLOAT, bad, strides, 16, &call);
  CHECK(s != CUDNN_STATUS_SUCCESS);
  CHECK(strstr(call, "cudnnBackendFinalize (tensor)") != NULL);
  if (t) cudnnBackendDestroyDescriptor(t);
}

static void test_convolution(void) {
  const int64_t ints[7] = {2, 3, 1, 4, 5, 6, 2};
  cudnnBackendDescriptor_t c = NULL;
  const char *call = "";
  cudnnStatus_t s = kiln_conv_graph_convolution(&c, CUDNN_DATA_FLOAT, ints, NULL, &call);
  if (!CHECK(s == CUDNN_STATUS_SUCCESS)) fprintf(stderr, "  %s: %s\n", call, cudnnGetErrorString(s));
  if (s) {
    if (c) cudnnBackendDestroyDescriptor(c);
    return;
  }
  int64_t got[4] = {0}, n;
  n = get_int64(c, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, got, 1);
  CHECK(n == 1 && got[0] == 2);
  n = get_int64(c, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, got, 4);
  CHECK(n == 2 && got[0] == 2 && got[1] == 3);
  n = get_int64(c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, got, 4);
  CHECK(n == 2 && got[0] == 1 && got[1] == 4);
  n = get_int64(c, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, got, 4);
  CHECK(n == 2 && got[0] == 1 && got[1] == 4);
  n = get_int64(c, CUDNN_ATTR_CONVOLUTION_DILATIONS, got, 4);
  CHECK(n == 2 && got[0] == 5 && got[1] == 6);
  /* (the mode, CUDNN_CROSS_CORRELATION, is not read back by cuDNN 9: CUDNN_ATTR_CONVOLUTION_CONV_MODE
     answers a bad-parameter status after finalize) */
  cudnnDataType_t comp = CUDNN_DATA_HALF;
  int64_t count = 0;
  CHECK(cudnnBackendGetAttribute(c, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &count, &comp) ==
        CUDNN_STATUS_SUCCESS);
  CHECK(comp == CUDNN_DATA_FLOAT);
  cudnnBackendDestroyDescriptor(c);
}

/* The output extent of a conv, computed here independently of cuDNN. */
static int64_t out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil) {
  return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}

/* Every pass of a grouped, strided, padded, dilated conv on odd sizes, in every dtype, finalizes;
   the operation holds the tensors kiln gave it (read back by uid). */
static void test_operations(void) {
  const int64_t ints[7] = {2, 1, 1, 2, 1, 2, 3};
  const int64_t x[4] = {3, 6, 13, 11}, w[4] = {9, 2, 3, 5};
  int64_t y[4] = {3, 9, out_size(13, 3, 2, 1, 1), out_size(11, 5, 1, 2, 2)};
  CHECK(y[2] == 7 && y[3] == 7);
  const int dtypes[4] = {KILN_F32, KILN_F64, KILN_F16, KILN_BF16};
  for (int pass = 0; pass < 3; pass++)
    for (int d = 0; d < 4; d++) {
      struct kiln_conv_graph_shape s;
      struct kiln_conv_graph g;
      const char *call = "";
      kiln_conv_graph_shape_make(&s, pass, dtypes[d], x, NULL, w, y, ints, NULL, NULL, NULL);
      cudnnStatus_t st = kiln_conv_graph_operation(&g, &s, &call);
      if (!CHECK(st == CUDNN_STATUS_SUCCESS))
        fprintf(stderr, "  pass %d dtype %d: %s: %s\n", pass, dtypes[d], call, cudnnGetErrorString(st));
      CHECK(st || (g.x && g.w && g.y && g.conv && g.op && !g.graph));
      /* the graph needs a device's handle: without one cuDNN refuses it, and the call is named */
      if (!st) {
        cudnnStatus_t gs = kiln_conv_graph_finalize(&g, NULL, &call);
        CHECK(gs != CUDNN_STATUS_SUCCESS);
        CHECK(strstr(call, "CUDNN_ATTR_OPERATIONGRAPH_HANDLE") != NULL);
      }
      kiln_conv_graph_destroy(&g);
      CHECK(g.op == NULL && g.x == NULL && g.graph == NULL);
    }
  /* an output one column too wide for this conv: cuDNN refuses the operation, naming the call */
  for (int pass = 0; pass < 3; pass++) {
    int64_t wrong[4] = {y[0], y[1], y[2], y[3] + 1};
    struct kiln_conv_graph_shape s;
    struct kiln_conv_graph g;
    const char *call = "";
    kiln_conv_graph_shape_make(&s, pass, KILN_F32, x, NULL, w, wrong, ints, NULL, NULL, NULL);
    cudnnStatus_t st = kiln_conv_graph_operation(&g, &s, &call);
    CHECK(st != CUDNN_STATUS_SUCCESS);
    CHECK(strstr(call, "operation") != NULL);
    kiln_conv_graph_destroy(&g);
  }
  /* weights whose channels do not divide x's (6 over 4: no group count fits): refused */
  for (int pass = 0; pass < 3; pass++) {
    const int64_t w4[4] = {9, 4, 3, 5};
    struct kiln_conv_graph_shape s;
    struct kiln_conv_graph g;
    const char *call = "";
    kiln_conv_graph_shape_make(&s, pass, KILN_F32, x, NULL, w4, y, ints, NULL, NULL, NULL);
    CHECK(kiln_conv_graph_operation(&g, &s, &call) != CUDNN_STATUS_SUCCESS);
    kiln_conv_graph_destroy(&g);
  }
  /* a dtype cuDNN does not convolve: refused before any descriptor */
  {
    struct kiln_conv_graph_shape s;
    struct kiln_conv_graph g;
    const char *call = "";
    kiln_conv_graph_shape_make(&s, KILN_CONV_FORWARD, KILN_I64, x, NULL, w, y, ints, NULL, NULL, NULL);
    CHECK(kiln_conv_graph_operation(&g, &s, &call) == CUDNN_STATUS_BAD_PARAM);
    CHECK(g.x == NULL && g.op == NULL);
    kiln_conv_graph_destroy(&g);
  }
}

/* Random geometries (a fixed LCG): with y's size from the formula above, every pass finalizes in
   cuDNN (whose own check applies pads, strides and dilations), also when x is the corner of a taller,
   wider buffer; one row more or less in y is refused. */
static uint64_t lcg_state = 20261201;
static int64_t pick(int64_t lo, int64_t hi) {
  lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
  return lo + (int64_t)((lcg_state >> 33) % (uint64_t)(hi - lo + 1));
}
static void test_random_geometry(void) {
  int tried = 0, ok = 0, refused = 0;
  for (int iter = 0; iter < 300; iter++) {
    int64_t groups = pick(1, 3), cg = pick(1, 3), og = pick(1, 3);
    int64_t ints[7] = {pick(1, 3), pick(1, 3), pick(0, 2), pick(0, 2), pick(1, 3), pick(1, 3), groups};
    int64_t x[4] = {pick(1, 3), groups * cg, pick(1, 12), pick(1, 12)}, w[4] = {groups * og, cg, pick(1, 4), pick(1, 4)};
    int64_t y[4] = {x[0], w[0], out_size(x[2], w[2], ints[0], ints[2], ints[4]), out_size(x[3], w[3], ints[1], ints[3], ints[5])};
    if (x[2] + 2 * ints[2] < ints[4] * (w[2] - 1) + 1 || x[3] + 2 * ints[3] < ints[5] * (w[3] - 1) + 1) continue;
    int64_t xs[4] = {x[1] * (x[2] + 2) * (x[3] + 3), (x[2] + 2) * (x[3] + 3), x[3] + 3, 1};   /* a corner of [N,C,H+2,W+3] */
    tried++;
    for (int pass = 0; pass < 3; pass++)
      for (int corner = 0; corner < 2; corner++) {
        struct kiln_conv_graph_shape s;
        struct kiln_conv_graph g;
        const char *call = "";
        kiln_conv_graph_shape_make(&s, pass, KILN_F32, x, corner ? xs : NULL, w, y, ints, NULL, NULL, NULL);
        cudnnStatus_t st = kiln_conv_graph_operation(&g, &s, &call);
        ok += st == CUDNN_STATUS_SUCCESS;
        if (!CHECK(st == CUDNN_STATUS_SUCCESS))
          fprintf(stderr, "  pass %d x [%lld,%lld,%lld,%lld] w [%lld,%lld,%lld,%lld] ints %lld %lld %lld %lld %lld %lld %lld: %s\n", pass,
                  (long long)x[0], (long long)x[1], (long long)x[2], (long long)x[3], (long long)w[0], (long long)w[1],
                  (long long)w[2], (long long)w[3], (long long)ints[0], (long long)ints[1], (long long)ints[2], (long long)ints[3],
                  (long long)ints[4], (long long)ints[5], (long long)ints[6], call);
        kiln_conv_graph_destroy(&g);
        int64_t wrong[4] = {y[0], y[1], y[2] + (iter % 2 ? 1 : -1), y[3]};
        if (wrong[2] < 1) wrong[2] = y[2] + 1;
        kiln_conv_graph_shape_make(&s, pass, KILN_F32, x, corner ? xs : NULL, w, wrong, ints, NULL, NULL, NULL);
        st = kiln_conv_graph_operation(&g, &s, &call);
        refused += st != CUDNN_STATUS_SUCCESS;
        CHECK(st != CUDNN_STATUS_SUCCESS);
        kiln_conv_graph_destroy(&g);
      }
  }
  CHECK(tried >= 100);
  printf("random geometries: %d shapes, %d passes finalized, %d wrong outputs refused\n", tried, ok, refused);
}

/* The corner of a taller input: conv_transpose2d's passes with an output padding past the stride
   (under dilation) and a padding. Every row the kernel reaches, counted here one tap at a time, lies
   in the corner (a corner that stopped at the rows of the padding-free extent dropped the last pad
   rows: a conv_transpose2d of ones, [1,1,2,1] by [1,1,2,1], stride 1, dilation 2, padding 1, output
   padding 1 is 1, 1, 1, and such a corner gave 1, 1, 0); the corner padded by pad before and post
   after gives y's extent, post is at most the pad, and cuDNN finalizes every pass over it. A pair
   whose kernel meets no row of x at all has no corner: refused (an error on cuda). */
static void test_corner(void) {
  {
    const int64_t x[4] = {1, 1, 3, 1}, w[4] = {1, 1, 2, 1}, y[4] = {1, 1, 2, 1}, ints[7] = {1, 1, 1, 0, 2, 1, 1};
    int64_t sub[4], post[2];
    CHECK(kiln_conv_graph_corner(x, w, y, ints, sub, post) == 1);
    CHECK(sub[0] == 1 && sub[1] == 1 && sub[2] == 3 && sub[3] == 1);   /* all three rows: the third meets the kernel */
    CHECK(post[0] == 0 && post[1] == 0);
    const int64_t full[4] = {1, 1, 2, 1};   /* the conv's own extent: all of it, the pads after as before */
    CHECK(kiln_conv_graph_corner(full, w, y, ints, sub, post) == 0 && sub[2] == 2 && post[0] == 1 && post[1] == 0);
    const int64_t shorter[4] = {1, 1, 1, 1};   /* too short for y */
    CHECK(kiln_conv_graph_corner(shorter, w, (const int64_t[4]){1, 1, 3, 1}, ints, sub, post) == -1);
  }
  int tried = 0, partial = 0, bad = 0;
  for (int iter = 0; iter < 2000; iter++) {
    int64_t ints[7] = {pick(1, 3), pick(1, 3), pick(0, 3), pick(0, 3), pick(1, 4), pick(1, 4), 1};
    int64_t w[4] = {2, 2, pick(1, 4), pick(1, 4)}, y[4] = {2, 2, pick(1, 6), pick(1, 6)}, x[4] = {2, 2, 0, 0};
    for (int i = 0; i < 2; i++) {   /* conv_transpose2d's output extent from y, with an output padding it allows */
      int64_t s = ints[i], d = ints[4 + i], op = pick(0, (s > d ? s : d) - 1);
      x[2 + i] = (y[2 + i] - 1) * s - 2 * ints[2 + i] + d * (w[2 + i] - 1) + 1 + op;
    }
    if (x[2] < 1 || x[3] < 1) continue;
    tried++;
    int64_t sub[4], post[2];
    int r = kiln_conv_graph_corner(x, w, y, ints, sub, post);
    int none = 0;   /* a dim where every tap falls in the padding: no corner describes it */
    for (int i = 0; i < 2; i++) none |= (y[2 + i] - 1) * ints[i] - ints[2 + i] + ints[4 + i] * (w[2 + i] - 1) + 1 < 1;
    if (r == -1) {
      CHECK(none);
      continue;
    }
    int ok = 1;
    partial += r == 1;
    for (int i = 0; ok && i < 2; i++) {
      int64_t s = ints[i], p = ints[2 + i], d = ints[4 + i], span = d * (w[2 + i] - 1) + 1;
      for (int64_t o = 0; o < y[2 + i]; o++)
        for (int64_t k = 0; k < w[2 + i]; k++) {
          int64_t row = o * s - p + k * d;
          if (row >= 0 && row < x[2 + i] && row >= sub[2 + i]) ok = 0;   /* a row the kernel meets, outside the corner */
        }
      ok = ok && sub[2 + i] >= 1 && sub[2 + i] <= x[2 + i] && post[i] >= 0 && post[i] <= p;
      ok = ok && sub[2 + i] + p + post[i] >= span && (sub[2 + i] + p + post[i] - span) / s + 1 == y[2 + i];
    }
    if (ok && r == 1) {
      int64_t xs[4] = {x[1] * x[2] * x[3], x[2] * x[3], x[3], 1};
      for (int pass = 0; pass < 3; pass++) {
        struct kiln_conv_graph_shape sh;
        struct kiln_conv_graph g;
        const char *call = "";
        kiln_conv_graph_shape_make(&sh, pass, KILN_F32, sub, xs, w, y, ints, NULL, NULL, NULL);
        sh.post[0] = post[0];
        sh.post[1] = post[1];
        cudnnStatus_t st = kiln_conv_graph_operation(&g, &sh, &call);
        if (st) {
          ok = 0;
          fprintf(stderr, "  pass %d: %s: %s\n", pass, call, cudnnGetErrorString(st));
        }
        kiln_conv_graph_destroy(&g);
      }
    }
    if (!CHECK(ok) && bad++ < 5)
      fprintf(stderr, "  x [%lld,%lld] w [%lld,%lld] y [%lld,%lld] ints %lld %lld %lld %lld %lld %lld: r %d sub [%lld,%lld] post [%lld,%lld]\n",
              (long long)x[2], (long long)x[3], (long long)w[2], (long long)w[3], (long long)y[2], (long long)y[3], (long long)ints[0],
              (long long)ints[1], (long long)ints[2], (long long)ints[3], (long long)ints[4], (long long)ints[5], r, (long long)sub[2],
              (long long)sub[3], (long long)post[0], (long long)post[1]);
  }
  CHECK(tried >= 500 && partial >= 50);
  printf("corners: %d conv_transpose2d shapes, %d with a taller input\n", tried, partial);
}

/* Without a device: the heuristics of a graph that could not be finalized fail with the call named
   and no plans; running a plan that was never made fails with the call named (no crash). */
static void test_without_device(void) {
  const int64_t ints[7] = {1, 1, 1, 1, 1, 1, 1}, x[4] = {2, 3, 8, 8}, w[4] = {4, 3, 3, 3}, y[4] = {2, 4, 8, 8};
  struct kiln_conv_graph_shape s;
  struct kiln_conv_graph g;
  const char *call = "";
  kiln_conv_graph_shape_make(&s, KILN_CONV_FORWARD, KILN_F32, x, NULL, w, y, ints, NULL, NULL, NULL);
  CHECK(kiln_conv_graph_operation(&g, &s, &call) == CUDNN_STATUS_SUCCESS);
  CHECK(kiln_conv_graph_finalize(&g, NULL, &call) != CUDNN_STATUS_SUCCESS);
  struct kiln_conv_plan plans[2];
  int count = -1;
  call = "";
  CHECK(kiln_conv_graph_plans(&g, NULL, CUDNN_HEUR_MODE_A, KILN_F32, plans, 2, &count, &call) != CUDNN_STATUS_SUCCESS);
  CHECK(count == 0);
  CHECK(strstr(call, "heuristics") != NULL || strstr(call, "ENGINEHEUR") != NULL);
  kiln_conv_graph_destroy(&g);
  struct kiln_conv_plan none = {NULL, NULL, 0, -1};
  call = "";
  CHECK(kiln_conv_plan_execute(&none, NULL, NULL, NULL, NULL, NULL, &call) != CUDNN_STATUS_SUCCESS);
  CHECK(strstr(call, "cudnnBackend") != NULL);
  kiln_conv_plan_destroy(&none);   /* nothing to free: safe */
  CHECK(none.plan == NULL && none.config == NULL);
}

int main(void) {
  CHECK(cudnnGetVersion() >= 90000 && cudnnGetVersion() < 100000);
  test_types_and_notes();
  test_error_codes();
  test_shape();
  test_tensor();
  test_convolution();
  test_operations();
  test_random_geometry();
  test_corner();
  test_without_device();
  return check_done("test_cuda_conv_graph");
}
#else
int main(void) {
  printf("test_cuda_conv_graph: skipped (this build has no cuDNN 9)\n");
  return 0;
}
#endif
