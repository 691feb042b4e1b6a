/* cpu/onednn.h: the table between libkiln and libkiln_onednn.so (runtime/onednn/conv.c), the
   convolutions of oneDNN and its bf16 matmul, which libkiln opens at run time (cpu/onednn.c). A plan is one pass of one
   convolution shape for one part of the batch; it runs single-threaded in the calling thread, so
   that kiln's pool runs the parts and no second thread pool exists. The tensors it reads and
   writes are kiln's dense NCHW / OIHW buffers; what oneDNN wants in its own blocked layouts lives
   in the workspace the caller gives. Nothing here includes oneDNN's headers. */
#ifndef KILN_CPU_ONEDNN_H
#define KILN_CPU_ONEDNN_H
#include <stddef.h>
#include <stdint.h>

#define KILN_ONEDNN_VERSION 3

enum kiln_onednn_pass {
  KILN_ONEDNN_FORWARD,        /* run(x, -, w', bias, y) */
  KILN_ONEDNN_BACKWARD_DATA,  /* run(gy, -, w', -, gx) */
  KILN_ONEDNN_BACKWARD_WEIGHTS /* run(x, gy, -, -, gw): gw in OIHW (f32) */
};

/* run's flags */
enum {
  KILN_ONEDNN_OUT_BLOCKED = 1,   /* forward: the output is left in the primitive's layout (block) at out */
  KILN_ONEDNN_GRAD_BLOCKED = 2,  /* backward: the output's grad is given in the primitive's layout */
  KILN_ONEDNN_GW_BLOCKED = 4     /* weight grad: left in the primitive's layout (grad_weights_bytes) at out */
};

struct kiln_onednn_shape {
  int32_t pass, dtype;        /* enum kiln_onednn_pass; a kiln dtype (f32, or bf16: the grad of the weights then f32) */
  int64_t N, C, H, W;         /* the part's input */
  int64_t O, OH, OW;          /* its output */
  int64_t kh, kw, sh, sw, ph, pw, dh, dw, groups;
  int32_t bias;               /* forward: a bias is added */
};

/* A bf16 matrix product (a part of one): C [m, n] = A [m, k] B [k, n], f32 sums rounded once;
   A's element (i, p) at a[i * ars + p * acs], B's (p, j) at b[p * brs + j * bcs] (any strides:
   transposed operands are read as they lie), C's (i, j) at c[i * ldc + j]. */
struct kiln_onednn_matmul {
  int64_t m, n, k, ars, acs, brs, bcs, ldc;
};

struct kiln_onednn {
  int version;
  char name[64];              /* "oneDNN 2.6.3" */
  /* A plan, or NULL with the reason in err (a shape oneDNN has no kernel for, out of memory). */
  void *(*plan)(const struct kiln_onednn_shape *s, char *err, size_t n);
  void (*plan_free)(void *plan);
  const char *(*impl)(void *plan);            /* oneDNN's name of its kernel: "jit:avx512_core" */
  size_t (*weights_bytes)(void *plan);        /* the weights in the layout the pass reads; 0: as given */
  size_t (*workspace_bytes)(void *plan);      /* what run needs besides (64-byte aligned) */
  /* The channel block of the pass's output (forward) or output grad (backward) in the layout the
     primitive reads or writes: 16 or 8 (nChw16c, nChw8c: [N][C/b][H][W][b], channels past C
     zero), 0 for NCHW itself, -1 for another layout. */
  int (*block)(void *plan);
  /* A weight-grad plan: the bytes of its grad in the primitive's own layout (0: OIHW itself), and a
     grad in that layout (the parts' sum, say) into OIHW. */
  size_t (*grad_weights_bytes)(void *plan);
  int (*grad_weights_out)(void *plan, const void *blocked, void *gw, char *err, size_t n);
  /* The weights w (OIHW) into wbuf (weights_bytes) for forward and backward data, once a call. */
  int (*prepare_weights)(void *plan, const void *w, void *wbuf, char *err, size_t n);
  int (*run)(void *plan, const void *a, const void *b, const void *w, const void *bias, void *out, void *workspace,
             int flags, char *err, size_t n);
  /* Version 3: a matmul plan (plan_free, impl and workspace_bytes serve it too), and its run. */
  void *(*matmul_plan)(const struct kiln_onednn_matmul *s, char *err, size_t n);
  int (*matmul_run)(void *plan, const void *a, const void *b, void *c, void *workspace, char *err, size_t n);
};

typedef const struct kiln_onednn *(*kiln_onednn_open_fn)(int version);

#endif
