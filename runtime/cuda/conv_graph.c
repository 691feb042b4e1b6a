/* cuda/conv_graph.c: one convolution pass through cuDNN 9's backend descriptors (see
   conv_graph.h). Tensors, the convolution and the operation need no handle; the operation graph,
   the heuristics and the plans are made on the device's handle. */
#include "conv_graph.h"
#include <kiln/dtype.h>
#include <kiln/error.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define TRY(expr, name)                 \
  do {                                  \
    cudnnStatus_t s_ = (expr);          \
    if (s_ != CUDNN_STATUS_SUCCESS) {   \
      *call = (name);                   \
      return s_;                        \
    }                                   \
  } while (0)

static void contiguous(const int64_t d[4], int64_t s[4]) {
  s[3] = 1;
  for (int i = 2; i >= 0; i--) s[i] = s[i + 1] * d[i + 1];
}

void kiln_conv_graph_shape_make(struct kiln_conv_graph_shape *s, int pass, int dtype, const int64_t x[4], const int64_t *xs,
                                const int64_t w[4], const int64_t y[4], const int64_t ints[7], const void *px,
                                const void *pw, const void *py) {
  memset(s, 0, sizeof *s);
  s->pass = pass;
  s->dtype = dtype;
  memcpy(s->x, x, sizeof s->x);
  memcpy(s->w, w, sizeof s->w);
  memcpy(s->y, y, sizeof s->y);
  memcpy(s->ints, ints, sizeof s->ints);
  s->post[0] = ints[2];
  s->post[1] = ints[3];
  if (xs) memcpy(s->xs, xs, sizeof s->xs);
  else contiguous(x, s->xs);
  contiguous(w, s->ws);
  contiguous(y, s->ys);
  s->align_x = kiln_conv_graph_alignment(px);
  s->align_w = kiln_conv_graph_alignment(pw);
  s->align_y = kiln_conv_graph_alignment(py);
}

int kiln_conv_graph_corner(const int64_t x[4], const int64_t w[4], const int64_t y[4], const int64_t ints[7], int64_t sub[4],
                           int64_t post[2]) {
  int partial = 0;
  sub[0] = x[0];
  sub[1] = x[1];
  for (int i = 0; i < 2; i++) {
    int64_t stride = ints[i], pad = ints[2 + i], span = ints[4 + i] * (w[2 + i] - 1) + 1, in = x[2 + i] + 2 * pad;
    int64_t out = in >= span ? (in - span) / stride + 1 : 0;
    int64_t reach = (y[2 + i] - 1) * stride - pad + span;   /* rows [0, reach) of x meet the kernel */
    sub[2 + i] = x[2 + i];
    post[i] = pad;
    if (out == y[2 + i]) continue;
    if (out < y[2 + i] || reach < 1) return -1;
    partial = 1;
    sub[2 + i] = reach < x[2 + i] ? reach : x[2 + i];
    post[i] = reach - sub[2 + i];   /* conv of sub padded by pad before and post after: y's extent */
  }
  return partial;
}

int kiln_conv_graph_types(int dtype, cudnnDataType_t *data, cudnnDataType_t *compute) {
  switch (dtype) {
  case KILN_F32: *data = CUDNN_DATA_FLOAT; *compute = CUDNN_DATA_FLOAT; return 0;
  case KILN_F64: *data = CUDNN_DATA_DOUBLE; *compute = CUDNN_DATA_DOUBLE; return 0;
  case KILN_F16: *data = CUDNN_DATA_HALF; *compute = CUDNN_DATA_FLOAT; return 0;
  case KILN_BF16: *data = CUDNN_DATA_BFLOAT16; *compute = CUDNN_DATA_FLOAT; return 0;
  default: return -1;
  }
}

int64_t kiln_conv_graph_alignment(const void *p) {
  uintptr_t a = (uintptr_t)p;
  int64_t align = 1;
  if (!a) return 16;
  while (align < 16 && !(a & (uintptr_t)align)) align *= 2;
  return align;
}

int kiln_conv_graph_exact(int dtype, const cudnnBackendNumericalNote_t *notes, int64_t count) {
  if (dtype != KILN_F32 && dtype != KILN_F64) return 1;
  for (int64_t i = 0; i < count; i++)
    /* f32 on tensor cores is TF32; f64 tensor cores (Ampere and later) do IEEE double FMAs */
    if ((notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE && dtype == KILN_F32) ||
        notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS || notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)
      return 0;
  return 1;
}

int kiln_conv_graph_error_code(cudnnStatus_t s) {
  if (s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED || s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
    return KILN_ERR_MEMORY;
  return CUDNN_STATUS_CATEGORY(s) == CUDNN_STATUS_NOT_SUPPORTED ? KILN_ERR_UNSUPPORTED : KILN_ERR_DEVICE;
}

cudnnStatus_t kiln_conv_graph_tensor(cudnnBackendDescriptor_t *out, int64_t uid, cudnnDataType_t type, const int64_t dims[4],
                                     const int64_t strides[4], int64_t alignment, const char **call) {
  cudnnBackendDescriptor_t t = NULL;
  *out = NULL;
  TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t), "cudnnBackendCreateDescriptor (tensor)");
  *out = t;
  TRY(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type),
      "cudnnBackendSetAttribute (CUDNN_ATTR_TENSOR_DATA_TYPE)");
  TRY(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims),
      "cudnnBackendSetAttribute (CUDNN_ATTR_TENSOR_DIMENSIONS)");
  TRY(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides),
      "cudnnBackendSetAttribute (CUDNN_ATTR_TENSOR_STRIDES)");
  TRY(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid),
      "cudnnBackendSetAttribute (CUDNN_ATTR_TENSOR_UNIQUE_ID)");
  TRY(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment),
      "cudnnBackendSetAttribute (CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT)");
  TRY(cudnnBackendFinalize(t), "cudnnBackendFinalize (tensor)");
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t kiln_conv_graph_convolution(cudnnBackendDescriptor_t *out, cudnnDataType_t compute, const int64_t ints[7],
                                          const int64_t *post, const char **call) {
  cudnnBackendDescriptor_t c = NULL;
  int64_t dims = 2, strides[2] = {ints[0], ints[1]}, pads[2] = {ints[2], ints[3]}, dilations[2] = {ints[4], ints[5]};
  int64_t after[2] = {post ? post[0] : ints[2], post ? post[1] : ints[3]};
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  *out = NULL;
  TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &c), "cudnnBackendCreateDescriptor (convolution)");
  *out = c;
  TRY(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute),
      "cudnnBackendSetAttribute (CUDNN_ATTR_CONVOLUTION_COMP_TYPE)");
  TRY(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode),
      "cudnnBackendSetAttribute (CUDNN_ATTR_CONVOLUTION_CONV_MODE)");
  TRY(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims),
      "cudnnBackendSetAttribute (CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS)");
  TRY(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pads),
      "cudnnBackendSetAttribute (CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS)");
  TRY(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, after),
      "cudnnBackendSetAttribute (CUDNN_ATTR_CONVOLUTION_POST_PADDINGS)");
  TRY(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, strides),
      "cudnnBackendSetAttribute (CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES)");
  TRY(cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilations),
      "cudnnBackendSetAttribute (CUDNN_ATTR_CONVOLUTION_DILATIONS)");
  TRY(cudnnBackendFinalize(c), "cudnnBackendFinalize (convolution)");
  return CUDNN_STATUS_SUCCESS;
}

/* The operation's descriptor type and attribute names, by pass. */
struct op_attrs {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t alpha, beta, conv, x, w, y;
  const char *name;
};
static const struct op_attrs OPS[3] = {
  [KILN_CONV_FORWARD] = {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, "convolution forward"},
  [KILN_CONV_BACKWARD_DATA] = {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                               "convolution backward-data"},
  [KILN_CONV_BACKWARD_FILTER] = {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                                 CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                                 CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                                 CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                                 CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                                 CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, "convolution backward-filter"},
};

cudnnStatus_t kiln_conv_graph_operation(struct kiln_conv_graph *g, const struct kiln_conv_graph_shape *s, const char **call) {
  memset(g, 0, sizeof *g);
  cudnnDataType_t data, compute;
  if (s->pass < 0 || s->pass > KILN_CONV_BACKWARD_FILTER || kiln_conv_graph_types(s->dtype, &data, &compute)) {
    *call = "kiln_conv_graph_operation (pass or dtype)";
    return CUDNN_STATUS_BAD_PARAM;
  }
  cudnnStatus_t st = kiln_conv_graph_tensor(&g->x, KILN_CONV_UID_X, data, s->x, s->xs, s->align_x, call);
  if (!st) st = kiln_conv_graph_tensor(&g->w, KILN_CONV_UID_W, data, s->w, s->ws, s->align_w, call);
  if (!st) st = kiln_conv_graph_tensor(&g->y, KILN_CONV_UID_Y, data, s->y, s->ys, s->align_y, call);
  if (!st) st = kiln_conv_graph_convolution(&g->conv, compute, s->ints, s->post, call);
  if (st) return st;
  const struct op_attrs *a = &OPS[s->pass];
  /* alpha and beta in the compute type's precision: double for f64, float otherwise */
  double one64 = 1, zero64 = 0;
  float one32 = 1, zero32 = 0;
  int f64 = data == CUDNN_DATA_DOUBLE;
  cudnnBackendAttributeType_t st_type = f64 ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
  TRY(cudnnBackendCreateDescriptor(a->type, &g->op), "cudnnBackendCreateDescriptor (convolution operation)");
  TRY(cudnnBackendSetAttribute(g->op, a->alpha, st_type, 1, f64 ? (const void *)&one64 : (const void *)&one32),
      "cudnnBackendSetAttribute (operation alpha)");
  TRY(cudnnBackendSetAttribute(g->op, a->beta, st_type, 1, f64 ? (const void *)&zero64 : (const void *)&zero32),
      "cudnnBackendSetAttribute (operation beta)");
  TRY(cudnnBackendSetAttribute(g->op, a->conv, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->conv),
      "cudnnBackendSetAttribute (operation convolution)");
  TRY(cudnnBackendSetAttribute(g->op, a->x, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->x), "cudnnBackendSetAttribute (operation x)");
  TRY(cudnnBackendSetAttribute(g->op, a->w, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->w), "cudnnBackendSetAttribute (operation w)");
  TRY(cudnnBackendSetAttribute(g->op, a->y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->y), "cudnnBackendSetAttribute (operation y)");
  TRY(cudnnBackendFinalize(g->op), "cudnnBackendFinalize (convolution operation)");
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t kiln_conv_graph_finalize(struct kiln_conv_graph *g, cudnnHandle_t handle, const char **call) {
  TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &g->graph),
      "cudnnBackendCreateDescriptor (operation graph)");
  TRY(cudnnBackendSetAttribute(g->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->op),
      "cudnnBackendSetAttribute (CUDNN_ATTR_OPERATIONGRAPH_OPS)");
  TRY(cudnnBackendSetAttribute(g->graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle),
      "cudnnBackendSetAttribute (CUDNN_ATTR_OPERATIONGRAPH_HANDLE)");
  TRY(cudnnBackendFinalize(g->graph), "cudnnBackendFinalize (operation graph)");
  return CUDNN_STATUS_SUCCESS;
}

void kiln_conv_graph_destroy(struct kiln_conv_graph *g) {
  cudnnBackendDescriptor_t *all[6] = {&g->graph, &g->op, &g->conv, &g->x, &g->w, &g->y};
  for (int i = 0; i < 6; i++) {
    if (*all[i]) cudnnBackendDestroyDescriptor(*all[i]);
    *all[i] = NULL;
  }
}

void kiln_conv_plan_destroy(struct kiln_conv_plan *p) {
  if (p->plan) cudnnBackendDestroyDescriptor(p->plan);
  if (p->config) cudnnBackendDestroyDescriptor(p->config);
  p->plan = p->config = NULL;
  p->workspace = 0;
}

enum { MAX_CONFIGS = 256 };   /* the most engine configurations looked at per heuristics query */

/* Whether config's engine keeps dtype's precision (kiln_conv_graph_exact); its global index in *engine. */
static cudnnStatus_t config_exact(cudnnBackendDescriptor_t config, int dtype, int *exact, int64_t *engine) {
  cudnnBackendDescriptor_t e = NULL;
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t n = 0, got = 0;
  cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &e);
  if (!s) s = cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &e);
  if (!s) s = cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                       CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes);
  if (!s && cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got, engine))
    *engine = -1;
  if (!s) *exact = kiln_conv_graph_exact(dtype, notes, n);
  if (e) cudnnBackendDestroyDescriptor(e);
  return s;
}

/* The finalized plan of config on handle, or a status when this engine cannot run the graph. */
static cudnnStatus_t make_plan(cudnnBackendDescriptor_t config, cudnnHandle_t handle, struct kiln_conv_plan *p) {
  int64_t got = 0;
  cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p->plan);
  if (!s) s = cudnnBackendSetAttribute(p->plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  if (!s) s = cudnnBackendSetAttribute(p->plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config);
  if (!s) s = cudnnBackendFinalize(p->plan);
  if (!s) s = cudnnBackendGetAttribute(p->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, &p->workspace);
  if (!s && p->workspace < 0) s = CUDNN_STATUS_INTERNAL_ERROR;
  if (s && p->plan) {
    cudnnBackendDestroyDescriptor(p->plan);
    p->plan = NULL;
  }
  return s;
}

cudnnStatus_t kiln_conv_graph_plans(const struct kiln_conv_graph *g, cudnnHandle_t handle, cudnnBackendHeurMode_t mode,
                                    int dtype, struct kiln_conv_plan *plans, int max, int *count, const char **call) {
  cudnnBackendDescriptor_t heur = NULL, *configs = NULL;
  int64_t total = 0, n = 0;
  cudnnStatus_t s;
  *count = 0;
  s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur);
  if (s) *call = "cudnnBackendCreateDescriptor (engine heuristics)";
  if (!s) {
    s = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->graph);
    if (s) *call = "cudnnBackendSetAttribute (CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH)";
  }
  if (!s) {
    s = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (s) *call = "cudnnBackendSetAttribute (CUDNN_ATTR_ENGINEHEUR_MODE)";
  }
  if (!s) {
    s = cudnnBackendFinalize(heur);
    if (s) *call = "cudnnBackendFinalize (engine heuristics)";
  }
  if (!s) {   /* how many configurations the heuristics rank */
    s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &total, NULL);
    if (s) *call = "cudnnBackendGetAttribute (CUDNN_ATTR_ENGINEHEUR_RESULTS, count)";
  }
  if (total > MAX_CONFIGS) total = MAX_CONFIGS;
  if (!s && total > 0) {
    configs = (cudnnBackendDescriptor_t *)calloc((size_t)total, sizeof *configs);
    if (!configs) {
      s = CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
      *call = "kiln_conv_graph_plans (engine configurations)";
    }
  }
  for (int64_t i = 0; !s && i < total; i++) {
    s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &configs[i]);
    if (s) *call = "cudnnBackendCreateDescriptor (engine configuration)";
  }
  if (!s && total > 0) {
    s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, total, &n, configs);
    if (s) *call = "cudnnBackendGetAttribute (CUDNN_ATTR_ENGINEHEUR_RESULTS)";
  }
  if (n > total) n = total;
  for (int64_t i = 0; !s && i < n && *count < max; i++) {
    int exact = 0;
    struct kiln_conv_plan p = {configs[i], NULL, 0, -1};
    if (config_exact(configs[i], dtype, &exact, &p.engine) || !exact) continue;
    if (make_plan(configs[i], handle, &p)) continue;   /* an engine that cannot run this shape: skipped */
    configs[i] = NULL;                                  /* the plan keeps its configuration */
    plans[(*count)++] = p;
  }
  for (int64_t i = 0; configs && i < total; i++)
    if (configs[i]) cudnnBackendDestroyDescriptor(configs[i]);
  free(configs);
  if (heur) cudnnBackendDestroyDescriptor(heur);
  if (s) {
    for (int i = 0; i < *count; i++) kiln_conv_plan_destroy(&plans[i]);
    *count = 0;
  }
  return s;
}

cudnnStatus_t kiln_conv_plan_execute(const struct kiln_conv_plan *p, cudnnHandle_t handle, void *x, void *w, void *y,
                                     void *workspace, const char **call) {
  cudnnBackendDescriptor_t pack = NULL;
  int64_t uids[3] = {KILN_CONV_UID_X, KILN_CONV_UID_W, KILN_CONV_UID_Y};
  void *ptrs[3] = {x, w, y};
  cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  if (s) *call = "cudnnBackendCreateDescriptor (variant pack)";
  if (!s) {
    s = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
    if (s) *call = "cudnnBackendSetAttribute (CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS)";
  }
  if (!s) {
    s = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs);
    if (s) *call = "cudnnBackendSetAttribute (CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)";
  }
  if (!s) {
    s = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    if (s) *call = "cudnnBackendSetAttribute (CUDNN_ATTR_VARIANT_PACK_WORKSPACE)";
  }
  if (!s) {
    s = cudnnBackendFinalize(pack);
    if (s) *call = "cudnnBackendFinalize (variant pack)";
  }
  if (!s) {
    s = cudnnBackendExecute(handle, p->plan, pack);
    if (s) *call = "cudnnBackendExecute";
  }
  if (pack) cudnnBackendDestroyDescriptor(pack);
  return s;
}
