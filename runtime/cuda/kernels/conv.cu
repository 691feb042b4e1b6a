/* cuda/conv.cu: KILN_OP_CONV2D and KILN_OP_CONV2D_BACKWARD on CUDA through cuDNN 9. Each pass
   (forward, backward-data, backward-filter) goes through cuDNN's graph (backend) API by default
   (conv_graph.h: operation graph, engine heuristics of mode A then FALLBACK, finalized execution
   plans, cudnnBackendExecute), or through the legacy convolution API (cudnnConvolutionForward /
   BackwardData / BackwardFilter) with KILN_CUDNN_API=legacy; a shape the graph API cannot plan
   goes to the legacy API (said once on stderr, with the shape and cuDNN's status). Bias terms use
   cudnnAddTensor and cudnnConvolutionBackwardBias either way. f32, f64, and f16 and bf16 (for autocast:
   tensor cores, f32 accumulation, cudnnDataType's compute type FLOAT); f32 is exact: the legacy
   descriptors ask for CUDNN_FMA_MATH and skip algorithms reported with tensor-op (TF32) math, the
   graph API skips engines whose numerical notes say DOWN_CONVERT_INPUTS, REDUCED_PRECISION_REDUCTION
   or, for f32, TENSOR_CORE (TF32; f64's tensor cores are IEEE double). Groups, stride, padding and dilation go to the descriptors. The
   algorithm or plan of each shape key is chosen once per process (conv_cache.h): by cuDNN's
   heuristics, or, with KILN_CUDNN_BENCHMARK=1, by timing the candidates on the call's own buffers
   and keeping the fastest. Both settings are read at every convolution, so a script may switch
   them (kiln.cuda.set_conv_api, kiln.cuda.set_cudnn_benchmark). One cuDNN handle and one workspace
   per device, on the device's stream; the workspace, a block of the device's caching allocator,
   grows to the largest request.
   Built only when CMake found cuDNN (KILN_HAVE_CUDNN); the table's entries stay NULL otherwise. */
#include "common.h"
#include "conv_cache.h"
#include "conv_graph.h"
#include "allocator.h"
#include "nn_calls.h"
#include <cudnn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_ALGOS = 16, MAX_PLANS = 8, TIMED_RUNS = 3 };
static const size_t BENCHMARK_WORKSPACE_CAP = (size_t)1 << 30;   /* the most a timed candidate may ask for */

static int dnn_check(cudnnStatus_t s, const char *op, const char *call) {
  if (s == CUDNN_STATUS_SUCCESS) return KILN_OK;
  return cuda_fail(kiln_conv_graph_error_code(s), "%s: %s: %s (cuDNN status %d)", op, call, cudnnGetErrorString(s), (int)s);
}

static pthread_mutex_t dnn_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kiln_conv_cache *choices;   /* the process's algorithm and plan table, made at the first conv */

/* The API and the search of this call (KILN_CUDNN_API, KILN_CUDNN_BENCHMARK, read each time), and
   KILN_CUDNN_GRAPH_STRICT=1: a shape the graph API cannot plan is an error instead of going to the
   legacy API (for tests that must know the graph API ran). */
struct conv_mode {
  int api, benchmark, strict;
};
static int flag(const char *name) {
  const char *v = getenv(name);
  return v && *v && strcmp(v, "0") != 0;
}
static int conv_mode_read(const char *op, struct conv_mode *m) {
  const char *api = getenv("KILN_CUDNN_API");
  m->benchmark = flag("KILN_CUDNN_BENCHMARK");
  m->strict = flag("KILN_CUDNN_GRAPH_STRICT");
  m->api = kiln_conv_api_parse(api);
  if (m->api < 0)
    return cuda_fail(KILN_ERR_ARGUMENT, "%s: KILN_CUDNN_API='%s': expected 'graph' (the default) or 'legacy'", op, api);
  return KILN_OK;
}

/* The workspace's blocks come from the device's caching allocator, on the device's stream: a
   block given back when the workspace grows is reused only by work queued after the convolutions
   that used it, and memory_stats counts the workspace. */
struct pool {
  struct cuda_device *dev;
  const char *op;
};
static int pool_alloc(void *ctx, size_t bytes, void **out) {
  struct pool *p = (struct pool *)ctx;
  char err[512];
  if (kiln_caching_alloc(p->dev->allocator, (uintptr_t)p->dev->stream, (int64_t)bytes, out, err, sizeof err))
    return cuda_fail(KILN_ERR_MEMORY, "%s: cuDNN workspace: %s", p->op, err);
  return KILN_OK;
}
static void pool_free(void *ctx, void *ptr) {
  struct pool *p = (struct pool *)ctx;
  kiln_caching_free(p->dev->allocator, ptr);
}

/* The device's cuDNN handle (made on its first conv) and the process's table. */
static int dnn_handle(struct cuda_device *dev, const char *op, cudnnHandle_t *out, struct conv_mode *mode) {
  if (conv_mode_read(op, mode)) return kiln_error_code();
  int rc = KILN_OK;
  pthread_mutex_lock(&dnn_lock);
  if (!choices) {
    choices = kiln_conv_cache_new();
    if (!choices) rc = cuda_fail(KILN_ERR_MEMORY, "%s: out of host memory for the cuDNN algorithm table", op);
  }
  if (!rc && !dev->dnn) {
    cudnnHandle_t h = NULL;
    rc = dnn_check(cudnnCreate(&h), op, "cudnnCreate");
    if (!rc) rc = dnn_check(cudnnSetStream(h, dev->stream), op, "cudnnSetStream");
    if (rc && h) cudnnDestroy(h);
    if (!rc) dev->dnn = h;
  }
  pthread_mutex_unlock(&dnn_lock);
  *out = (cudnnHandle_t)dev->dnn;
  return rc;
}

/* The device's workspace with at least need bytes, or NULL (need 0) with KILN_OK. */
static int workspace(struct cuda_device *dev, const char *op, size_t need, void **ptr, size_t *bytes) {
  pthread_mutex_lock(&dnn_lock);
  struct pool pool = {dev, op};
  struct kiln_conv_workspace ws = {dev->dnn_workspace, dev->dnn_workspace_bytes, pool_alloc, pool_free, &pool};
  int rc = kiln_conv_workspace_reserve(&ws, need) ? kiln_error_code() : KILN_OK;
  dev->dnn_workspace = ws.ptr;
  dev->dnn_workspace_bytes = ws.bytes;
  *ptr = ws.ptr;
  *bytes = ws.bytes;
  pthread_mutex_unlock(&dnn_lock);
  return rc;
}

/* The workspace for timing candidates that need at most most bytes: when that much cannot be had,
   the one there is (KILN_OK), and only the candidates that fit it are timed. */
static int benchmark_workspace(struct cuda_device *dev, const char *op, size_t most, void **ws, size_t *wsb) {
  int rc = workspace(dev, op, most, ws, wsb);
  return rc == KILN_ERR_MEMORY ? KILN_OK : rc;
}

/* ---- descriptors ---- */

struct descs {
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
  cudnnDataType_t type;
};

/* cuDNN's data type for a kiln dtype; f16 and bf16 compute in f32. */
static cudnnDataType_t dnn_type(int dtype) {
  return dtype == KILN_F64 ? CUDNN_DATA_DOUBLE : dtype == KILN_F16 ? CUDNN_DATA_HALF
         : dtype == KILN_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}
static int low_precision(cudnnDataType_t t) { return t == CUDNN_DATA_HALF || t == CUDNN_DATA_BFLOAT16; }
static const char *dnn_type_name(cudnnDataType_t t) {
  return t == CUDNN_DATA_DOUBLE ? "f64" : t == CUDNN_DATA_HALF ? "f16" : t == CUDNN_DATA_BFLOAT16 ? "bf16" : "f32";
}

static void descs_destroy(struct descs *d) {
  if (d->x) cudnnDestroyTensorDescriptor(d->x);
  if (d->y) cudnnDestroyTensorDescriptor(d->y);
  if (d->w) cudnnDestroyFilterDescriptor(d->w);
  if (d->conv) cudnnDestroyConvolutionDescriptor(d->conv);
}

static int fits_int(const int64_t *v, int n) {
  for (int i = 0; i < n; i++)
    if (v[i] < 0 || v[i] > INT_MAX) return 0;
  return 1;
}

/* x [N,C,H,W] with strides xs (contiguous when NULL), w [O,C/g,kh,kw], y [N,O,OH,OW]; symmetric:
   whether the pads alike before and after fit x (fit_input). */
static int descs_make(struct descs *d, const char *op, int dtype, const int64_t *x, const int64_t *xs, int symmetric,
                      const int64_t *w, const int64_t *y, const int64_t *ints) {
  memset(d, 0, sizeof *d);
  d->type = dnn_type(dtype);
  if (!symmetric)
    return cuda_fail(KILN_ERR_UNSUPPORTED, "%s: the [%lld,%lld] corner of a taller input for output [%lld,%lld,%lld,%lld] "
                     "needs less padding after it than before (padding %lldx%lld, stride %lldx%lld), which cuDNN's legacy "
                     "API cannot describe: not implemented on cuda with the legacy API (the graph API runs it)", op,
                     (long long)x[2], (long long)x[3], (long long)y[0], (long long)y[1], (long long)y[2], (long long)y[3],
                     (long long)ints[2], (long long)ints[3], (long long)ints[0], (long long)ints[1]);
  int64_t xn = x[0] * x[1] * x[2] * x[3], yn = y[0] * y[1] * y[2] * y[3];
  if (!fits_int(x, 4) || !fits_int(w, 4) || !fits_int(y, 4) || !fits_int(ints, 7) || xn > INT_MAX || yn > INT_MAX ||
      (xs && !fits_int(xs, 4)))
    return cuda_fail(KILN_ERR_UNSUPPORTED, "%s: sizes beyond cuDNN's 32-bit descriptors (input [%lld,%lld,%lld,%lld], output "
                     "[%lld,%lld,%lld,%lld])", op, (long long)x[0], (long long)x[1], (long long)x[2], (long long)x[3],
                     (long long)y[0], (long long)y[1], (long long)y[2], (long long)y[3]);
  int rc = dnn_check(cudnnCreateTensorDescriptor(&d->x), op, "cudnnCreateTensorDescriptor");
  if (!rc) rc = dnn_check(cudnnCreateTensorDescriptor(&d->y), op, "cudnnCreateTensorDescriptor");
  if (!rc) rc = dnn_check(cudnnCreateFilterDescriptor(&d->w), op, "cudnnCreateFilterDescriptor");
  if (!rc) rc = dnn_check(cudnnCreateConvolutionDescriptor(&d->conv), op, "cudnnCreateConvolutionDescriptor");
  if (rc) return rc;
  if (xs)
    rc = dnn_check(cudnnSetTensor4dDescriptorEx(d->x, d->type, (int)x[0], (int)x[1], (int)x[2], (int)x[3], (int)xs[0],
                                                (int)xs[1], (int)xs[2], (int)xs[3]),
                   op, "cudnnSetTensor4dDescriptorEx (input)");
  else
    rc = dnn_check(cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NCHW, d->type, (int)x[0], (int)x[1], (int)x[2], (int)x[3]),
                   op, "cudnnSetTensor4dDescriptor (input)");
  if (!rc)
    rc = dnn_check(cudnnSetTensor4dDescriptor(d->y, CUDNN_TENSOR_NCHW, d->type, (int)y[0], (int)y[1], (int)y[2], (int)y[3]),
                   op, "cudnnSetTensor4dDescriptor (output)");
  if (!rc)
    rc = dnn_check(cudnnSetFilter4dDescriptor(d->w, d->type, CUDNN_TENSOR_NCHW, (int)w[0], (int)w[1], (int)w[2], (int)w[3]),
                   op, "cudnnSetFilter4dDescriptor");
  if (!rc)
    rc = dnn_check(cudnnSetConvolution2dDescriptor(d->conv, (int)ints[2], (int)ints[3], (int)ints[0], (int)ints[1],
                                                   (int)ints[4], (int)ints[5], CUDNN_CROSS_CORRELATION,
                                                   low_precision(d->type) ? CUDNN_DATA_FLOAT : d->type),
                   op, "cudnnSetConvolution2dDescriptor");
  if (!rc) rc = dnn_check(cudnnSetConvolutionGroupCount(d->conv, (int)ints[6]), op, "cudnnSetConvolutionGroupCount");
  /* exact f32: plain FMA kernels, never TF32 tensor cores; f16 and bf16 on tensor cores */
  if (!rc) rc = dnn_check(cudnnSetConvolutionMathType(d->conv, low_precision(d->type) ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH),
                          op, "cudnnSetConvolutionMathType");
  return rc;
}

/* The part of an input x [N,C,H,W] (contiguous) that cuDNN is told about, for an output of y's
   extent (kiln_conv_graph_corner): all of it when its conv gives that extent, else the [H', W']
   corner up to the last row and column the kernel reaches, with less padding after it than
   before. Sizes come from the tensors (nn_calls.h), so the input may be taller than the conv of
   y's size needs: a conv_transpose2d whose output padding exceeds its stride (possible under
   dilation) hands its backward such pairs. *sub gets the sizes, *strides x's own (NULL when all of
   x is used), *post the padding after the corner; symmetric says whether the pads alike on both
   sides (all the legacy API describes) give y's extent from the corner too. KILN_OK, or an error
   when not even the corner fits. */
struct corner {
  int64_t sub[4], strides[4], post[2];
  int partial, symmetric;
};
static int fit_input(const char *op, const int64_t *x, const int64_t *w, const int64_t *y, const int64_t *ints, struct corner *c) {
  int r = kiln_conv_graph_corner(x, w, y, ints, c->sub, c->post);
  c->strides[0] = x[1] * x[2] * x[3]; c->strides[1] = x[2] * x[3]; c->strides[2] = x[3]; c->strides[3] = 1;
  c->partial = r == 1;
  /* pad before, post after, with post <= pad: the pad after as well keeps y's extent while the
     difference stays under the stride */
  c->symmetric = ints[2] - c->post[0] < ints[0] && ints[3] - c->post[1] < ints[1];
  if (r < 0)
    return cuda_fail(KILN_ERR_UNSUPPORTED, "%s: input [%lld,%lld,%lld,%lld] for output [%lld,%lld,%lld,%lld]: sizes a "
                     "convolution of these parameters cannot join; not implemented on cuda", op, (long long)x[0],
                     (long long)x[1], (long long)x[2], (long long)x[3], (long long)y[0], (long long)y[1], (long long)y[2],
                     (long long)y[3]);
  return KILN_OK;
}

/* ---- choosing an algorithm ---- */

/* Math that keeps the data type's precision: FMA for f32 and f64 (no TF32), tensor cores too for f16 and bf16. */
static int exact_math(cudnnDataType_t t, cudnnMathType_t m) {
  return m == CUDNN_DEFAULT_MATH || m == CUDNN_FMA_MATH || (low_precision(t) && m == CUDNN_TENSOR_OP_MATH);
}

/* The buffers FindEx runs the candidates on (it writes the pass's output). */
struct bufs {
  const void *x, *w, *y;   /* inputs of the pass */
  void *out;               /* y, gx or gw */
};

/* The first usable entry of cuDNN's ranked list, as a choice. */
#define PICK(perf, n)                                                     \
  do {                                                                    \
    for (int i_ = 0; i_ < (n); i_++)                                      \
      if ((perf)[i_].status == CUDNN_STATUS_SUCCESS && exact_math(d->type, (perf)[i_].mathType)) { \
        ch->algo = (int)(perf)[i_].algo;                                  \
        ch->workspace = (perf)[i_].memory;                                \
        found = 1;                                                        \
        break;                                                            \
      }                                                                   \
  } while (0)

/* The workspace cudnnFind*AlgorithmEx times the ranked algorithms with: the hungriest usable one's
   (at most BENCHMARK_WORKSPACE_CAP); when that cannot be had, the one there is (Find then tries
   only the algorithms that fit it). Sets rc, ws and wsb. */
#define BENCHMARK_WORKSPACE(perf, n)                                                                       \
  do {                                                                                                    \
    size_t most_ = 0;                                                                                     \
    for (int i_ = 0; i_ < (n); i_++)                                                                      \
      if ((perf)[i_].status == CUDNN_STATUS_SUCCESS && (perf)[i_].memory <= BENCHMARK_WORKSPACE_CAP &&    \
          (perf)[i_].memory > most_)                                                                      \
        most_ = (perf)[i_].memory;                                                                        \
    rc = benchmark_workspace(dev, op, most_, &ws, &wsb);                                                  \
  } while (0)

static int search(cudnnHandle_t h, struct cuda_device *dev, const struct descs *d, int pass, const struct bufs *b,
                  const char *op, int benchmark_mode, struct kiln_conv_choice *ch) {
  int n = 0, found = 0, rc = KILN_OK;
  void *ws = NULL;
  size_t wsb = 0;
  if (pass == KILN_CONV_FORWARD) {
    cudnnConvolutionFwdAlgoPerf_t perf[MAX_ALGOS];
    rc = dnn_check(cudnnGetConvolutionForwardAlgorithm_v7(h, d->x, d->w, d->conv, d->y, MAX_ALGOS, &n, perf), op,
                   "cudnnGetConvolutionForwardAlgorithm_v7");
    if (!rc && benchmark_mode) {
      BENCHMARK_WORKSPACE(perf, n);
      if (!rc) rc = dnn_check(cudnnFindConvolutionForwardAlgorithmEx(h, d->x, b->x, d->w, b->w, d->conv, d->y, b->out, MAX_ALGOS,
                                                                      &n, perf, ws, wsb),
                              op, "cudnnFindConvolutionForwardAlgorithmEx");
    }
    if (!rc) PICK(perf, n);
  } else if (pass == KILN_CONV_BACKWARD_DATA) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[MAX_ALGOS];
    rc = dnn_check(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d->w, d->y, d->conv, d->x, MAX_ALGOS, &n, perf), op,
                   "cudnnGetConvolutionBackwardDataAlgorithm_v7");
    if (!rc && benchmark_mode) {
      BENCHMARK_WORKSPACE(perf, n);
      if (!rc) rc = dnn_check(cudnnFindConvolutionBackwardDataAlgorithmEx(h, d->w, b->w, d->y, b->y, d->conv, d->x, b->out,
                                                                           MAX_ALGOS, &n, perf, ws, wsb),
                              op, "cudnnFindConvolutionBackwardDataAlgorithmEx");
    }
    if (!rc) PICK(perf, n);
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[MAX_ALGOS];
    rc = dnn_check(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d->x, d->y, d->conv, d->w, MAX_ALGOS, &n, perf), op,
                   "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
    if (!rc && benchmark_mode) {
      BENCHMARK_WORKSPACE(perf, n);
      if (!rc) rc = dnn_check(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, d->x, b->x, d->y, b->y, d->conv, d->w, b->out,
                                                                             MAX_ALGOS, &n, perf, ws, wsb),
                              op, "cudnnFindConvolutionBackwardFilterAlgorithmEx");
    }
    if (!rc) PICK(perf, n);
  }
  if (rc) return rc;
  if (found) {   /* what the chosen algorithm needs, asked directly (the ranked list's figure is an estimate) */
    size_t need = 0;
    if (pass == KILN_CONV_FORWARD)
      rc = dnn_check(cudnnGetConvolutionForwardWorkspaceSize(h, d->x, d->w, d->conv, d->y, (cudnnConvolutionFwdAlgo_t)ch->algo, &need),
                     op, "cudnnGetConvolutionForwardWorkspaceSize");
    else if (pass == KILN_CONV_BACKWARD_DATA)
      rc = dnn_check(cudnnGetConvolutionBackwardDataWorkspaceSize(h, d->w, d->y, d->conv, d->x, (cudnnConvolutionBwdDataAlgo_t)ch->algo,
                                                                  &need),
                     op, "cudnnGetConvolutionBackwardDataWorkspaceSize");
    else
      rc = dnn_check(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d->x, d->y, d->conv, d->w,
                                                                    (cudnnConvolutionBwdFilterAlgo_t)ch->algo, &need),
                     op, "cudnnGetConvolutionBackwardFilterWorkspaceSize");
    if (rc) return rc;
    if (need > ch->workspace) ch->workspace = need;
  }
  if (!found)
    return cuda_fail(KILN_ERR_UNSUPPORTED, "%s: cuDNN offers no exact (non-TF32) %s algorithm for this shape in %s: not implemented "
                     "for %s on cuda", op, pass == KILN_CONV_FORWARD ? "forward" : pass == KILN_CONV_BACKWARD_DATA ? "backward-data" : "backward-filter",
                     dnn_type_name(d->type), dnn_type_name(d->type));
  return KILN_OK;
}

/* The algorithm for key k (searched on a miss) and a workspace large enough for it. */
static int choose(cudnnHandle_t h, struct cuda_device *dev, const struct descs *d, const struct kiln_conv_key *k,
                  const struct bufs *b, const char *op, struct kiln_conv_choice *ch, void **ws, size_t *wsb) {
  if (!kiln_conv_cache_get(choices, k, ch)) {
    memset(ch, 0, sizeof *ch);
    if (search(h, dev, d, k->pass, b, op, k->benchmark, ch)) return kiln_error_code();
    kiln_conv_cache_put(choices, k, ch);   /* out of host memory: searched again next time */
  }
  return workspace(dev, op, ch->workspace, ws, wsb);
}

/* ---- the graph API ---- */

/* A cached plan with the descriptors it was made from (kept for the life of the process). */
struct graph_entry {
  struct kiln_conv_graph g;
  struct kiln_conv_plan p;
};

static const char *pass_name(int pass) {
  return pass == KILN_CONV_FORWARD ? "forward" : pass == KILN_CONV_BACKWARD_DATA ? "backward-data" : "backward-filter";
}

/* The index of the fastest of plans[0..n) run on the call's buffers (TIMED_RUNS each after one
   untimed run), skipping those that need more than BENCHMARK_WORKSPACE_CAP or fail to run; -1
   when none ran. */
static int fastest(cudnnHandle_t h, struct cuda_device *dev, const char *op, const struct kiln_conv_plan *plans, int n, void *px,
                   void *pw, void *py, int *best) {
  size_t most = 0;
  for (int i = 0; i < n; i++)
    if ((size_t)plans[i].workspace <= BENCHMARK_WORKSPACE_CAP && (size_t)plans[i].workspace > most) most = (size_t)plans[i].workspace;
  void *ws = NULL;
  size_t wsb = 0;
  int rc = benchmark_workspace(dev, op, most, &ws, &wsb);   /* the loop skips candidates that do not fit */
  cudaEvent_t start = NULL, stop = NULL;
  if (!rc) rc = cuda_check(cudaEventCreate(&start), op, "cudaEventCreate (timing cuDNN plans)");
  if (!rc) rc = cuda_check(cudaEventCreate(&stop), op, "cudaEventCreate (timing cuDNN plans)");
  float best_ms = 0;
  *best = -1;
  for (int i = 0; !rc && i < n; i++) {
    if ((size_t)plans[i].workspace > wsb) continue;
    const char *call = "";
    int ok = kiln_conv_plan_execute(&plans[i], h, px, pw, py, ws, &call) == CUDNN_STATUS_SUCCESS;
    ok = ok && cudaEventRecord(start, dev->stream) == cudaSuccess;
    for (int r = 0; ok && r < TIMED_RUNS; r++) ok = kiln_conv_plan_execute(&plans[i], h, px, pw, py, ws, &call) == CUDNN_STATUS_SUCCESS;
    ok = ok && cudaEventRecord(stop, dev->stream) == cudaSuccess && cudaEventSynchronize(stop) == cudaSuccess;
    float ms = 0;
    ok = ok && cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
    if (!ok) {   /* a plan that does not run here is not a candidate; a fault of the device is reported */
      cudaError_t e = cudaStreamSynchronize(dev->stream);
      if (e != cudaSuccess) rc = cuda_check(e, op, "cudnnBackendExecute (timing cuDNN plans)");
      cudaGetLastError();
      continue;
    }
    if (*best < 0 || ms < best_ms) {
      *best = i;
      best_ms = ms;
    }
  }
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  return rc;
}

/* Plan s on h: the chosen plan in ch->plan, or ch->legacy when cuDNN cannot plan it (why says
   what failed, with the shape). An error only for what the legacy API could not survive either
   (memory, the device). */
static int graph_plan(cudnnHandle_t h, struct cuda_device *dev, const char *op, const struct kiln_conv_graph_shape *s,
                      int benchmark, void *px, void *pw, void *py, struct kiln_conv_choice *ch, char *why, size_t whylen) {
  memset(ch, 0, sizeof *ch);
  struct graph_entry *e = (struct graph_entry *)calloc(1, sizeof *e);
  if (!e) return cuda_fail(KILN_ERR_MEMORY, "%s: out of host memory for a cuDNN plan", op);
  struct kiln_conv_plan plans[MAX_PLANS];
  int n = 0, max = benchmark ? MAX_PLANS : 1, pick = 0, rc = KILN_OK;
  const char *call = "";
  cudnnStatus_t st = kiln_conv_graph_operation(&e->g, s, &call);
  if (!st) st = kiln_conv_graph_finalize(&e->g, h, &call);
  if (!st) {   /* mode A's ranking; FALLBACK's engines when A fails or offers no exact plan */
    const char *call_a = "";
    cudnnStatus_t sa = kiln_conv_graph_plans(&e->g, h, CUDNN_HEUR_MODE_A, s->dtype, plans, max, &n, &call_a);
    if (sa || n == 0) {
      st = kiln_conv_graph_plans(&e->g, h, CUDNN_HEUR_MODE_FALLBACK, s->dtype, plans, max, &n, &call);
      if (!st && n == 0 && sa) {
        st = sa;
        call = call_a;
      }
    }
  }
  if (!st && n == 0) {
    st = CUDNN_STATUS_NOT_SUPPORTED;
    call = "no engine of heuristics mode A or FALLBACK gives an exact plan";
  }
  if (st == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED || st == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {
    rc = dnn_check(st, op, call);
  } else if (st) {
    snprintf(why, whylen, "cuDNN's graph API cannot plan this %s %s pass (x [%lld,%lld,%lld,%lld] strides [%lld,%lld,%lld,%lld], "
             "w [%lld,%lld,%lld,%lld], y [%lld,%lld,%lld,%lld], stride %lldx%lld, padding %lldx%lld (after: %lldx%lld), "
             "dilation %lldx%lld): %s: %s "
             "(cuDNN status %d)", kiln_dtype_name(s->dtype),
             pass_name(s->pass), (long long)s->x[0], (long long)s->x[1], (long long)s->x[2], (long long)s->x[3], (long long)s->xs[0],
             (long long)s->xs[1], (long long)s->xs[2], (long long)s->xs[3], (long long)s->w[0], (long long)s->w[1], (long long)s->w[2],
             (long long)s->w[3], (long long)s->y[0], (long long)s->y[1], (long long)s->y[2], (long long)s->y[3], (long long)s->ints[0],
             (long long)s->ints[1], (long long)s->ints[2], (long long)s->ints[3], (long long)s->post[0], (long long)s->post[1],
             (long long)s->ints[4], (long long)s->ints[5], call,
             cudnnGetErrorString(st), (int)st);
    ch->legacy = 1;
  } else if (n > 1) {
    rc = fastest(h, dev, op, plans, n, px, pw, py, &pick);
    if (!rc && pick < 0) pick = 0;   /* none ran in the timing: the heuristics' first, whose error the call will report */
  }
  if (!st && !rc) {
    e->p = plans[pick];
    ch->plan = e;
    ch->workspace = (size_t)e->p.workspace;
  }
  for (int i = 0; i < n; i++)
    if (st || rc || i != pick) kiln_conv_plan_destroy(&plans[i]);
  if (!ch->plan) {
    kiln_conv_graph_destroy(&e->g);
    free(e);
  }
  return rc;
}

static void graph_entry_free(struct graph_entry *e) {
  kiln_conv_plan_destroy(&e->p);
  kiln_conv_graph_destroy(&e->g);
  free(e);
}

/* One pass through the graph API: x (the corner cx of a tensor of sizes xfull), w, y, by role.
   *done is 0 when the shape goes to the legacy API instead. */
static int graph_pass(cudnnHandle_t h, struct cuda_device *dev, const char *op, int pass, int dt, const struct conv_mode *mode,
                      const int64_t *xfull, const struct corner *cx, const int64_t *w, const int64_t *y, const int64_t *ints,
                      void *px, void *pw, void *py, int *done) {
  int benchmark = mode->benchmark;
  struct kiln_conv_graph_shape s;
  kiln_conv_graph_shape_make(&s, pass, dt, cx->sub, cx->partial ? cx->strides : NULL, w, y, ints, px, pw, py);
  s.post[0] = cx->post[0];
  s.post[1] = cx->post[1];
  struct kiln_conv_key k;
  kiln_conv_key_make(&k, pass, dt, dev->index, benchmark, xfull, w, y, ints);
  k.api = KILN_CONV_API_GRAPH;
  k.align_x = (int32_t)s.align_x; k.align_w = (int32_t)s.align_w; k.align_y = (int32_t)s.align_y;
  struct kiln_conv_choice ch;
  struct graph_entry *own = NULL;   /* a plan the table did not take: freed after this call */
  *done = 0;
  if (!kiln_conv_cache_get(choices, &k, &ch)) {
    char why[1024];
    if (graph_plan(h, dev, op, &s, benchmark, px, pw, py, &ch, why, sizeof why)) return kiln_error_code();
    if (ch.legacy && mode->strict)   /* not cached: without the flag, the fallback is taken and said */
      return cuda_fail(KILN_ERR_UNSUPPORTED, "%s: %s; KILN_CUDNN_GRAPH_STRICT=1 forbids the legacy API's fallback", op, why);
    if (ch.legacy) fprintf(stderr, "kiln: %s: %s; this shape uses the legacy convolution API\n", op, why);
    struct kiln_conv_choice kept;
    if (kiln_conv_cache_put(choices, &k, &ch) || !kiln_conv_cache_get(choices, &k, &kept)) {
      own = (struct graph_entry *)ch.plan;   /* out of host memory: planned again next time */
    } else if (kept.plan != ch.plan || kept.legacy != ch.legacy) {   /* another thread planned it first */
      if (ch.plan) graph_entry_free((struct graph_entry *)ch.plan);
      ch = kept;
    }
  }
  if (ch.legacy && mode->strict)
    return cuda_fail(KILN_ERR_UNSUPPORTED, "%s: this %s %s pass went to the legacy API earlier (cuDNN's graph API could not plan "
                     "it); KILN_CUDNN_GRAPH_STRICT=1 forbids that", op, kiln_dtype_name(dt), pass_name(pass));
  if (ch.legacy) return KILN_OK;
  const struct graph_entry *e = (const struct graph_entry *)ch.plan;
  void *ws = NULL;
  size_t wsb = 0;
  int rc = workspace(dev, op, ch.workspace, &ws, &wsb);
  const char *call = "";
  cudnnStatus_t st = rc ? CUDNN_STATUS_SUCCESS : kiln_conv_plan_execute(&e->p, h, px, pw, py, ws, &call);
  if (st) {   /* the call, with the pass and shapes it ran */
    char what[512];
    snprintf(what, sizeof what, "%s (cuDNN engine %lld, %s %s pass: x [%lld,%lld,%lld,%lld], w [%lld,%lld,%lld,%lld], "
             "y [%lld,%lld,%lld,%lld] on cuda:%d)", call, (long long)e->p.engine, kiln_dtype_name(dt), pass_name(pass),
             (long long)s.x[0], (long long)s.x[1], (long long)s.x[2], (long long)s.x[3], (long long)w[0], (long long)w[1],
             (long long)w[2], (long long)w[3], (long long)y[0], (long long)y[1], (long long)y[2], (long long)y[3], dev->index);
    rc = dnn_check(st, op, what);
  }
  if (!rc) rc = cuda_launched(op, "cudnnBackendExecute");
  if (own) graph_entry_free(own);   /* cudnnBackendExecute has queued its kernels; the plan is not needed to run them */
  *done = !rc;
  return rc;
}

/* ---- helpers ---- */

/* A contiguous tensor shaped like t to write into: t (retained) when it is contiguous. */
static struct kiln_tensor *target(struct kiln_tensor *t) {
  if (kiln_is_contiguous(t)) {
    kiln_tensor_retain(t);
    return t;
  }
  return kiln_tensor_empty(t->ndim, t->sizes, t->dtype, t->device);
}

/* Copy tmp back into t when target made a new tensor; releases tmp. */
static int settle(struct kiln_tensor *t, struct kiln_tensor *tmp, int rc) {
  if (!rc && tmp != t) {
    struct kiln_call call;
    memset(&call, 0, sizeof call);
    call.op = KILN_OP_COPY;
    call.out = t;
    call.in[0] = tmp;
    call.nin = 1;
    rc = cuda_copy(&call);
  }
  kiln_tensor_release(tmp);
  return rc;
}

static int zero(struct cuda_device *dev, const char *op, struct kiln_tensor *t) {
  if (t->numel == 0) return KILN_OK;
  struct kiln_tensor *d = target(t);
  if (!d) return kiln_error_code();
  int rc = cuda_check(cudaMemsetAsync(kiln_tensor_data(d), 0, (size_t)(d->numel * kiln_dtype_size(d->dtype)), dev->stream), op,
                      "cudaMemsetAsync");
  return settle(t, d, rc);
}

static int float_only(const char *op, const struct kiln_tensor *t) {
  if (kiln_dtype_is_float(t->dtype)) return KILN_OK;
  return cuda_fail(KILN_ERR_DTYPE, "%s: %s is not implemented on cuda (cuDNN convolutions take f32, f64, f16 or bf16; got %s)", op,
                   kiln_dtype_name(t->dtype), kiln_shape_string(t));
}

/* t [N,C,H,W] (contiguous) += b [C], broadcast. */
static int add_bias(cudnnHandle_t h, const char *op, struct kiln_tensor *t, const struct kiln_tensor *b) {
  cudnnDataType_t type = dnn_type(t->dtype);
  double one64 = 1;
  float one32 = 1;
  const void *one = t->dtype == KILN_F64 ? (const void *)&one64 : (const void *)&one32;
  cudnnTensorDescriptor_t td = NULL, bd = NULL;
  int rc = dnn_check(cudnnCreateTensorDescriptor(&td), op, "cudnnCreateTensorDescriptor");
  if (!rc) rc = dnn_check(cudnnCreateTensorDescriptor(&bd), op, "cudnnCreateTensorDescriptor");
  if (!rc) rc = dnn_check(cudnnSetTensor4dDescriptor(td, CUDNN_TENSOR_NCHW, type, (int)t->sizes[0], (int)t->sizes[1],
                                                     (int)t->sizes[2], (int)t->sizes[3]), op, "cudnnSetTensor4dDescriptor");
  if (!rc) rc = dnn_check(cudnnSetTensor4dDescriptor(bd, CUDNN_TENSOR_NCHW, type, 1, (int)t->sizes[1], 1, 1), op,
                          "cudnnSetTensor4dDescriptor (bias)");
  if (!rc) rc = dnn_check(cudnnAddTensor(h, one, bd, kiln_tensor_data(b), one, td, kiln_tensor_data(t)), op, "cudnnAddTensor (bias)");
  if (td) cudnnDestroyTensorDescriptor(td);
  if (bd) cudnnDestroyTensorDescriptor(bd);
  return rc;
}

/* ---- CONV2D: y = conv(x, w) + bias ---- */

extern "C" int cuda_conv2d(const struct kiln_call *c) {
  const char *op = "conv2d";
  struct kiln_tensor *y = c->out;
  struct cuda_device *dev = cuda_device_enter(y->device.index, op);
  if (!dev) return kiln_error_code();
  if (float_only(op, c->in[0])) return kiln_error_code();
  if (y->numel == 0) return KILN_OK;
  cudnnHandle_t h;
  struct conv_mode mode;
  if (dnn_handle(dev, op, &h, &mode)) return kiln_error_code();
  int dt = y->dtype;
  struct kiln_tensor *x = cuda_contiguous_as(c->in[0], dt, op), *w = cuda_contiguous_as(c->in[1], dt, op);
  struct kiln_tensor *b = c->in[2] ? cuda_contiguous_as(c->in[2], dt, op) : NULL, *yo = target(y);
  struct descs d;
  memset(&d, 0, sizeof d);
  int rc = !x || !w || (c->in[2] && !b) || !yo ? kiln_error_code() : KILN_OK;
  if (!rc && x->numel == 0) {   /* no input channels: y is the bias alone */
    rc = cuda_check(cudaMemsetAsync(kiln_tensor_data(yo), 0, (size_t)(yo->numel * kiln_dtype_size(dt)), dev->stream), op, "cudaMemsetAsync");
    if (!rc && b) rc = add_bias(h, op, yo, b);
    kiln_tensor_release(x); kiln_tensor_release(w); kiln_tensor_release(b);
    return settle(y, yo, rc);
  }
  struct corner cx;
  int done = 0;
  if (!rc) rc = fit_input(op, x->sizes, w->sizes, y->sizes, c->ints, &cx);
  if (!rc && mode.api == KILN_CONV_API_GRAPH)
    rc = graph_pass(h, dev, op, KILN_CONV_FORWARD, dt, &mode, x->sizes, &cx, w->sizes, y->sizes, c->ints,
                    kiln_tensor_data(x), kiln_tensor_data(w), kiln_tensor_data(yo), &done);
  if (!rc && !done) rc = descs_make(&d, op, dt, cx.sub, cx.partial ? cx.strides : NULL, cx.symmetric, w->sizes, y->sizes, c->ints);
  struct kiln_conv_key k;
  struct kiln_conv_choice ch;
  void *ws = NULL;
  size_t wsb = 0;
  if (!rc && !done) {
    kiln_conv_key_make(&k, KILN_CONV_FORWARD, dt, dev->index, mode.benchmark, x->sizes, w->sizes, y->sizes, c->ints);
    struct bufs bf = {kiln_tensor_data(x), kiln_tensor_data(w), NULL, kiln_tensor_data(yo)};
    rc = choose(h, dev, &d, &k, &bf, op, &ch, &ws, &wsb);
  }
  double one64 = 1, zero64 = 0;
  float one32 = 1, zero32 = 0;
  const void *one = dt == KILN_F64 ? (const void *)&one64 : (const void *)&one32;
  const void *zr = dt == KILN_F64 ? (const void *)&zero64 : (const void *)&zero32;
  if (!rc && !done)
    rc = dnn_check(cudnnConvolutionForward(h, one, d.x, kiln_tensor_data(x), d.w, kiln_tensor_data(w), d.conv,
                                           (cudnnConvolutionFwdAlgo_t)ch.algo, ws, wsb, zr, d.y, kiln_tensor_data(yo)),
                   op, "cudnnConvolutionForward");
  if (!rc && !done) rc = cuda_launched(op, "cudnnConvolutionForward");
  if (!rc && b) rc = add_bias(h, op, yo, b);
  if (!rc && b) rc = cuda_launched(op, "cudnnAddTensor (bias)");
  descs_destroy(&d);
  kiln_tensor_release(x); kiln_tensor_release(w); kiln_tensor_release(b);
  return yo ? settle(y, yo, rc) : rc;
}

/* ---- CONV2D_BACKWARD: gx (+ bias, for conv_transpose2d), gw, gb ---- */

/* gx = conv's input-gradient. gx may be taller or wider than the conv of gy's size needs
   (conv_transpose2d's output padding): cuDNN then writes the [H', W'] corner it reaches, through
   gx's strides, and the rest stays zero. */
static int backward_data(cudnnHandle_t h, struct cuda_device *dev, const struct conv_mode *mode, const struct kiln_call *c,
                         struct kiln_tensor *gx, const struct kiln_tensor *gy, const struct kiln_tensor *w,
                         const struct kiln_tensor *b) {
  const char *op = "conv2d_backward";
  const int64_t *ints = c->ints;
  int dt = gx->dtype;
  const int64_t *xs = gx->sizes;
  struct corner cx;
  if (fit_input(op, xs, w->sizes, gy->sizes, ints, &cx)) return kiln_error_code();
  struct kiln_tensor *o = target(gx);
  if (!o) return kiln_error_code();
  int rc = KILN_OK;
  if (cx.partial) rc = cuda_check(cudaMemsetAsync(kiln_tensor_data(o), 0, (size_t)(o->numel * kiln_dtype_size(dt)), dev->stream), op, "cudaMemsetAsync");
  struct descs d;
  memset(&d, 0, sizeof d);
  int done = 0;
  /* keyed by gx's full sizes: with gy, w and ints they fix the corner and its strides */
  if (!rc && mode->api == KILN_CONV_API_GRAPH)
    rc = graph_pass(h, dev, op, KILN_CONV_BACKWARD_DATA, dt, mode, xs, &cx, w->sizes, gy->sizes, ints,
                    kiln_tensor_data(o), kiln_tensor_data(w), kiln_tensor_data(gy), &done);
  if (!rc && !done) rc = descs_make(&d, op, dt, cx.sub, cx.partial ? cx.strides : NULL, cx.symmetric, w->sizes, gy->sizes, ints);
  struct kiln_conv_key k;
  struct kiln_conv_choice ch;
  void *ws = NULL;
  size_t wsb = 0;
  if (!rc && !done) {
    kiln_conv_key_make(&k, KILN_CONV_BACKWARD_DATA, dt, dev->index, mode->benchmark, xs, w->sizes, gy->sizes, ints);
    struct bufs bf = {NULL, kiln_tensor_data(w), kiln_tensor_data(gy), kiln_tensor_data(o)};
    rc = choose(h, dev, &d, &k, &bf, op, &ch, &ws, &wsb);
  }
  double one64 = 1, zero64 = 0;
  float one32 = 1, zero32 = 0;
  const void *one = dt == KILN_F64 ? (const void *)&one64 : (const void *)&one32;
  const void *zr = dt == KILN_F64 ? (const void *)&zero64 : (const void *)&zero32;
  if (!rc && !done)
    rc = dnn_check(cudnnConvolutionBackwardData(h, one, d.w, kiln_tensor_data(w), d.y, kiln_tensor_data(gy), d.conv,
                                                (cudnnConvolutionBwdDataAlgo_t)ch.algo, ws, wsb, zr, d.x, kiln_tensor_data(o)),
                   op, "cudnnConvolutionBackwardData");
  if (!rc && !done) rc = cuda_launched(op, "cudnnConvolutionBackwardData");
  if (!rc && b) rc = add_bias(h, op, o, b);   /* conv_transpose2d's bias, over the whole of gx */
  if (!rc && b) rc = cuda_launched(op, "cudnnAddTensor (bias)");
  descs_destroy(&d);
  return settle(gx, o, rc);
}

/* gw = conv's weight-gradient from x and gy. */
static int backward_filter(cudnnHandle_t h, struct cuda_device *dev, const struct conv_mode *mode, const struct kiln_call *c,
                           struct kiln_tensor *gw, const struct kiln_tensor *x, const struct kiln_tensor *gy) {
  const char *op = "conv2d_backward";
  int dt = gw->dtype;
  struct kiln_tensor *o = target(gw);
  if (!o) return kiln_error_code();
  struct descs d;
  struct corner cx;
  memset(&d, 0, sizeof d);
  int done = 0, rc = fit_input(op, x->sizes, gw->sizes, gy->sizes, c->ints, &cx);
  if (!rc && mode->api == KILN_CONV_API_GRAPH)
    rc = graph_pass(h, dev, op, KILN_CONV_BACKWARD_FILTER, dt, mode, x->sizes, &cx, gw->sizes, gy->sizes, c->ints,
                    kiln_tensor_data(x), kiln_tensor_data(o), kiln_tensor_data(gy), &done);
  if (!rc && !done) rc = descs_make(&d, op, dt, cx.sub, cx.partial ? cx.strides : NULL, cx.symmetric, gw->sizes, gy->sizes, c->ints);
  struct kiln_conv_key k;
  struct kiln_conv_choice ch;
  void *ws = NULL;
  size_t wsb = 0;
  if (!rc && !done) {
    kiln_conv_key_make(&k, KILN_CONV_BACKWARD_FILTER, dt, dev->index, mode->benchmark, x->sizes, gw->sizes, gy->sizes, c->ints);
    struct bufs bf = {kiln_tensor_data(x), NULL, kiln_tensor_data(gy), kiln_tensor_data(o)};
    rc = choose(h, dev, &d, &k, &bf, op, &ch, &ws, &wsb);
  }
  double one64 = 1, zero64 = 0;
  float one32 = 1, zero32 = 0;
  const void *one = dt == KILN_F64 ? (const void *)&one64 : (const void *)&one32;
  const void *zr = dt == KILN_F64 ? (const void *)&zero64 : (const void *)&zero32;
  if (!rc && !done)
    rc = dnn_check(cudnnConvolutionBackwardFilter(h, one, d.x, kiln_tensor_data(x), d.y, kiln_tensor_data(gy), d.conv,
                                                  (cudnnConvolutionBwdFilterAlgo_t)ch.algo, ws, wsb, zr, d.w, kiln_tensor_data(o)),
                   op, "cudnnConvolutionBackwardFilter");
  if (!rc && !done) rc = cuda_launched(op, "cudnnConvolutionBackwardFilter");
  descs_destroy(&d);
  return settle(gw, o, rc);
}

/* gb = gy summed over all but the channels. */
static int backward_bias(cudnnHandle_t h, struct kiln_tensor *gb, const struct kiln_tensor *gy) {
  const char *op = "conv2d_backward";
  int dt = gb->dtype;
  struct kiln_tensor *o = target(gb);
  if (!o) return kiln_error_code();
  cudnnTensorDescriptor_t dy = NULL, db = NULL;
  cudnnDataType_t type = dnn_type(dt);
  int rc = dnn_check(cudnnCreateTensorDescriptor(&dy), op, "cudnnCreateTensorDescriptor");
  if (!rc) rc = dnn_check(cudnnCreateTensorDescriptor(&db), op, "cudnnCreateTensorDescriptor");
  if (!rc) rc = dnn_check(cudnnSetTensor4dDescriptor(dy, CUDNN_TENSOR_NCHW, type, (int)gy->sizes[0], (int)gy->sizes[1],
                                                     (int)gy->sizes[2], (int)gy->sizes[3]), op, "cudnnSetTensor4dDescriptor (grad output)");
  if (!rc) rc = dnn_check(cudnnSetTensor4dDescriptor(db, CUDNN_TENSOR_NCHW, type, 1, (int)gb->numel, 1, 1), op,
                          "cudnnSetTensor4dDescriptor (grad bias)");
  double one64 = 1, zero64 = 0;
  float one32 = 1, zero32 = 0;
  const void *one = dt == KILN_F64 ? (const void *)&one64 : (const void *)&one32;
  const void *zr = dt == KILN_F64 ? (const void *)&zero64 : (const void *)&zero32;
  if (!rc) rc = dnn_check(cudnnConvolutionBackwardBias(h, one, dy, kiln_tensor_data(gy), zr, db, kiln_tensor_data(o)), op,
                          "cudnnConvolutionBackwardBias");
  if (!rc) rc = cuda_launched(op, "cudnnConvolutionBackwardBias");
  if (dy) cudnnDestroyTensorDescriptor(dy);
  if (db) cudnnDestroyTensorDescriptor(db);
  return settle(gb, o, rc);
}

extern "C" int cuda_conv2d_backward(const struct kiln_call *c) {
  const char *op = "conv2d_backward";
  const struct kiln_conv_grads *g = (const struct kiln_conv_grads *)c->extra;
  const struct kiln_tensor *gy0 = c->in[0];
  struct cuda_device *dev = cuda_device_enter(gy0->device.index, op);
  if (!dev) return kiln_error_code();
  if (float_only(op, gy0)) return kiln_error_code();
  int dt = gy0->dtype;
  cudnnHandle_t h;
  struct conv_mode mode;
  if (dnn_handle(dev, op, &h, &mode)) return kiln_error_code();
  if (gy0->numel == 0) {   /* no images, or no output channels: zero gradients (gx holds only the bias) */
    int rc = KILN_OK;
    if (g->gx && g->gx->numel) {
      struct kiln_tensor *o = target(g->gx), *b = c->in[3] ? cuda_contiguous_as(c->in[3], dt, op) : NULL;
      rc = !o || (c->in[3] && !b) ? kiln_error_code() : KILN_OK;
      if (!rc) rc = cuda_check(cudaMemsetAsync(kiln_tensor_data(o), 0, (size_t)(o->numel * kiln_dtype_size(dt)), dev->stream), op, "cudaMemsetAsync");
      if (!rc && b) rc = add_bias(h, op, o, b);
      kiln_tensor_release(b);
      rc = o ? settle(g->gx, o, rc) : rc;
    }
    if (!rc && g->gw) rc = zero(dev, op, g->gw);
    if (!rc && g->gb) rc = zero(dev, op, g->gb);
    return rc;
  }
  struct kiln_tensor *gy = cuda_contiguous_as(gy0, dt, op), *w = cuda_contiguous_as(c->in[2], dt, op);
  struct kiln_tensor *x = g->gw && c->in[1] ? cuda_contiguous_as(c->in[1], dt, op) : NULL;
  struct kiln_tensor *b = g->gx && c->in[3] ? cuda_contiguous_as(c->in[3], dt, op) : NULL;
  int rc = !gy || !w || (g->gw && c->in[1] && !x) || (g->gx && c->in[3] && !b) ? kiln_error_code() : KILN_OK;
  if (!rc && g->gx && g->gx->numel) rc = backward_data(h, dev, &mode, c, g->gx, gy, w, b);
  if (!rc && g->gw) rc = x && x->numel ? backward_filter(h, dev, &mode, c, g->gw, x, gy) : zero(dev, op, g->gw);
  if (!rc && g->gb) rc = backward_bias(h, g->gb, gy);
  kiln_tensor_release(gy); kiln_tensor_release(w); kiln_tensor_release(x); kiln_tensor_release(b);
  return rc;
}
