/* cuda/conv_graph.h: one convolution pass (forward, backward-data, backward-filter) as cuDNN 9's
   graph (backend) API sees it: its tensor, convolution and operation descriptors, the operation
   graph, the engines cuDNN's heuristics rank for it, the execution plans made from them and their
   execution. Plain C over libcudnn (no CUDA runtime), so that CI builds and checks the descriptors
   on a machine without a GPU; every function returns cuDNN's status and, through *call, the name of
   the cuDNN call that failed, for the caller to turn into a kiln error. */
#ifndef KILN_CUDA_CONV_GRAPH_H
#define KILN_CUDA_CONV_GRAPH_H
#include "conv_cache.h"
#include <cudnn.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The unique ids of the three tensors of a pass, by role: x (or gx), w (or gw), y (or gy). */
enum { KILN_CONV_UID_X = 1, KILN_CONV_UID_W = 2, KILN_CONV_UID_Y = 3 };

/* One pass: the sizes and strides of x, w and y (all NCHW; w is [O, C/groups, kh, kw], so groups
   is C over w's channels), the conv's ints (stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups,
   as KILN_OP_CONV2D carries them), the padding after the last row and column (post: ints' pads,
   less for the corner of a taller input, see kiln_conv_graph_corner), and each buffer's byte
   alignment (kiln_conv_graph_alignment). */
struct kiln_conv_graph_shape {
  int pass;    /* enum kiln_conv_pass */
  int dtype;   /* enum kiln_dtype: f32, f64, f16, bf16 */
  int64_t x[4], xs[4], w[4], ws[4], y[4], ys[4];
  int64_t ints[7];
  int64_t post[2];
  int64_t align_x, align_w, align_y;
};

/* The part of an input x [N,C,H,W] that a conv of ints with output y's extent reads, for an input
   that may be taller or wider than that conv needs (conv_transpose2d's output padding beyond its
   stride hands the conv's passes such pairs). 0: all of it (sub = x, post = the pads). 1: the
   [H', W'] corner sub, the rows and columns up to the last one the kernel reaches,
   (y - 1) * stride - pad + span (those after it never meet the kernel), with post the padding after
   the corner that gives y's extent: 0 when the corner ends at that reach, less than the pad
   always. -1: sizes no conv of these ints joins (x too short for y). */
int kiln_conv_graph_corner(const int64_t x[4], const int64_t w[4], const int64_t y[4], const int64_t ints[7], int64_t sub[4],
                           int64_t post[2]);

/* s for a pass over x (strides xs, or contiguous when NULL: the corner of a taller input, whose
   post padding the caller then sets), w and y (contiguous), with the alignments of the three
   buffers x, w and y; post is the pads. */
void kiln_conv_graph_shape_make(struct kiln_conv_graph_shape *s, int pass, int dtype, const int64_t x[4], const int64_t *xs,
                                const int64_t w[4], const int64_t y[4], const int64_t ints[7], const void *px,
                                const void *pw, const void *py);
/* cuDNN's data type for dtype and the compute type of its convolution (f32 for f16 and bf16); 0, or
   -1 for a dtype cuDNN does not convolve. */
int kiln_conv_graph_types(int dtype, cudnnDataType_t *data, cudnnDataType_t *compute);
/* The largest power of two, at most 16, that divides the address (16 for NULL): what a tensor
   descriptor may promise about a buffer. */
int64_t kiln_conv_graph_alignment(const void *p);
/* Whether an engine with these numerical notes keeps dtype's precision: for f32 and f64, none that
   rounds the inputs or the sums to fewer bits (DOWN_CONVERT_INPUTS, REDUCED_PRECISION_REDUCTION,
   and for f32 TENSOR_CORE, i.e. TF32; f64 tensor cores do IEEE double FMAs); for f16 and bf16
   every engine. */
int kiln_conv_graph_exact(int dtype, const cudnnBackendNumericalNote_t *notes, int64_t count);

/* The kiln error code for a failed cuDNN status: KILN_ERR_MEMORY for a failed host or device
   allocation, KILN_ERR_UNSUPPORTED for any status of cuDNN 9's NOT_SUPPORTED category (which
   comes with specific codes: CUDNN_STATUS_NOT_SUPPORTED_SHAPE, ..._LAYOUT, ...), else
   KILN_ERR_DEVICE. */
int kiln_conv_graph_error_code(cudnnStatus_t s);

/* A finalized 4-d tensor descriptor. */
cudnnStatus_t kiln_conv_graph_tensor(cudnnBackendDescriptor_t *out, int64_t uid, cudnnDataType_t type, const int64_t dims[4],
                                     const int64_t strides[4], int64_t alignment, const char **call);
/* A finalized 2-d cross-correlation descriptor of ints: ints' pads before, post after (the pads
   again when NULL). */
cudnnStatus_t kiln_conv_graph_convolution(cudnnBackendDescriptor_t *out, cudnnDataType_t compute, const int64_t ints[7],
                                          const int64_t *post, const char **call);

/* The descriptors of one pass, then of its graph; everything NULL until made. */
struct kiln_conv_graph {
  cudnnBackendDescriptor_t x, w, y, conv, op, graph;
};
/* x, w, y, conv and the finalized operation of s->pass (alpha 1, beta 0). */
cudnnStatus_t kiln_conv_graph_operation(struct kiln_conv_graph *g, const struct kiln_conv_graph_shape *s, const char **call);
/* The finalized operation graph of g's one operation, on handle. */
cudnnStatus_t kiln_conv_graph_finalize(struct kiln_conv_graph *g, cudnnHandle_t handle, const char **call);
void kiln_conv_graph_destroy(struct kiln_conv_graph *g);

/* A plan: the engine configuration, the finalized execution plan made of it, and its workspace. */
struct kiln_conv_plan {
  cudnnBackendDescriptor_t config, plan;
  int64_t workspace;
  int64_t engine;   /* cuDNN's global engine index, for messages */
};
/* Up to max plans of g (finalized), best first as cuDNN's heuristics of mode rank them, skipping
   engines kiln_conv_graph_exact refuses for dtype and configurations that do not finalize. *count
   gets how many; a status only when the heuristics themselves fail. */
cudnnStatus_t kiln_conv_graph_plans(const struct kiln_conv_graph *g, cudnnHandle_t handle, cudnnBackendHeurMode_t mode,
                                    int dtype, struct kiln_conv_plan *plans, int max, int *count, const char **call);
void kiln_conv_plan_destroy(struct kiln_conv_plan *p);

/* Run p on handle's stream over x, w and y (the pass's inputs and output by role) with workspace. */
cudnnStatus_t kiln_conv_plan_execute(const struct kiln_conv_plan *p, cudnnHandle_t handle, void *x, void *w, void *y,
                                     void *workspace, const char **call);

#ifdef __cplusplus
}
#endif
#endif
