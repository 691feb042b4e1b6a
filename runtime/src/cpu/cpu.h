/* cpu/cpu.h: the CPU kernels that cpu/backend.c puts in the op table. */
#ifndef KILN_CPU_H
#define KILN_CPU_H
#include "../internal.h"
#include <stdlib.h>
#include <string.h>

/* Every file of cpu/ but backend.c and big_blocks.c is compiled once per instruction-set level
   (docs/cpu.md): KILN_CPU_LEVEL is the level's name (baseline, avx2, avx512, or native in a
   KILN_NATIVE build), and each external name below takes it as a suffix, so that the copies live
   side by side in libkiln and cpu/backend.c picks one set when libkiln is loaded: cpu_gemm is
   cpu_gemm_avx2 in the avx2 copy. Everything else in those files is static. */
#ifdef KILN_CPU_LEVEL
#define KILN_LEVEL_NAME(name) KILN_LEVEL_NAME_(name, KILN_CPU_LEVEL)
#define KILN_LEVEL_NAME_(name, level) KILN_LEVEL_NAME__(name, level)
#define KILN_LEVEL_NAME__(name, level) name##_##level
#define kiln_cpu_kernels KILN_LEVEL_NAME(kiln_cpu_kernels)
#define cpu_elementwise KILN_LEVEL_NAME(cpu_elementwise)
#define cpu_copy KILN_LEVEL_NAME(cpu_copy)
#define cpu_fill KILN_LEVEL_NAME(cpu_fill)
#define cpu_reduce KILN_LEVEL_NAME(cpu_reduce)
#define cpu_gemm KILN_LEVEL_NAME(cpu_gemm)
#define cpu_linear KILN_LEVEL_NAME(cpu_linear)
#define kiln_cpu_linear_finish KILN_LEVEL_NAME(kiln_cpu_linear_finish)
#define cpu_cat KILN_LEVEL_NAME(cpu_cat)
#define cpu_index_select KILN_LEVEL_NAME(cpu_index_select)
#define cpu_gather KILN_LEVEL_NAME(cpu_gather)
#define cpu_scatter_add KILN_LEVEL_NAME(cpu_scatter_add)
#define cpu_masked_fill KILN_LEVEL_NAME(cpu_masked_fill)
#define cpu_masked_select KILN_LEVEL_NAME(cpu_masked_select)
#define cpu_random KILN_LEVEL_NAME(cpu_random)
#define cpu_conv2d KILN_LEVEL_NAME(cpu_conv2d)
#define cpu_conv2d_backward KILN_LEVEL_NAME(cpu_conv2d_backward)
#define cpu_conv2d_relu_pool KILN_LEVEL_NAME(cpu_conv2d_relu_pool)
#define cpu_conv2d_relu_pool_backward KILN_LEVEL_NAME(cpu_conv2d_relu_pool_backward)
#define cpu_max_pool2d KILN_LEVEL_NAME(cpu_max_pool2d)
#define cpu_max_pool2d_backward KILN_LEVEL_NAME(cpu_max_pool2d_backward)
#define cpu_avg_pool2d KILN_LEVEL_NAME(cpu_avg_pool2d)
#define cpu_avg_pool2d_backward KILN_LEVEL_NAME(cpu_avg_pool2d_backward)
#define cpu_batch_norm KILN_LEVEL_NAME(cpu_batch_norm)
#define cpu_batch_norm_backward KILN_LEVEL_NAME(cpu_batch_norm_backward)
#define cpu_row_norm KILN_LEVEL_NAME(cpu_row_norm)
#define cpu_row_norm_backward KILN_LEVEL_NAME(cpu_row_norm_backward)
#define cpu_softmax KILN_LEVEL_NAME(cpu_softmax)
#define cpu_softmax_backward KILN_LEVEL_NAME(cpu_softmax_backward)
#define cpu_nll_loss KILN_LEVEL_NAME(cpu_nll_loss)
#define cpu_nll_loss_backward KILN_LEVEL_NAME(cpu_nll_loss_backward)
#define cpu_dropout KILN_LEVEL_NAME(cpu_dropout)
#define cpu_optim_step KILN_LEVEL_NAME(cpu_optim_step)
#define cpu_rnn KILN_LEVEL_NAME(cpu_rnn)
#define cpu_rnn_backward KILN_LEVEL_NAME(cpu_rnn_backward)
#define cpu_ctc_loss KILN_LEVEL_NAME(cpu_ctc_loss)
#define cpu_ctc_loss_backward KILN_LEVEL_NAME(cpu_ctc_loss_backward)
#define cpu_argsort KILN_LEVEL_NAME(cpu_argsort)
#define cpu_scan KILN_LEVEL_NAME(cpu_scan)
#define cpu_cumprod_backward KILN_LEVEL_NAME(cpu_cumprod_backward)
#define cpu_gemm_bf16 KILN_LEVEL_NAME(cpu_gemm_bf16)
#define cpu_conv2d_bf16 KILN_LEVEL_NAME(cpu_conv2d_bf16)
#define cpu_conv2d_backward_bf16 KILN_LEVEL_NAME(cpu_conv2d_backward_bf16)
#define cpu_conv2d_relu_pool_bf16 KILN_LEVEL_NAME(cpu_conv2d_relu_pool_bf16)
#define cpu_conv2d_relu_pool_backward_bf16 KILN_LEVEL_NAME(cpu_conv2d_relu_pool_backward_bf16)
#define cpu_max_pool2d_bf16 KILN_LEVEL_NAME(cpu_max_pool2d_bf16)
#define cpu_max_pool2d_backward_bf16 KILN_LEVEL_NAME(cpu_max_pool2d_backward_bf16)
#define kiln_cpu_bf16_native KILN_LEVEL_NAME(kiln_cpu_bf16_native)
#define kiln_cpu_bf16_products_native KILN_LEVEL_NAME(kiln_cpu_bf16_products_native)
#define kiln_cpu_gemm_bf16_f32 KILN_LEVEL_NAME(kiln_cpu_gemm_bf16_f32)
#define kiln_cpu_rnn_bf16_panel KILN_LEVEL_NAME(kiln_cpu_rnn_bf16_panel)
#define kiln_cpu_rnn_bf16_round KILN_LEVEL_NAME(kiln_cpu_rnn_bf16_round)
#define kiln_cpu_rnn_bf16_pack_rows KILN_LEVEL_NAME(kiln_cpu_rnn_bf16_pack_rows)
#define kiln_cpu_rnn_bf16_pack_cols KILN_LEVEL_NAME(kiln_cpu_rnn_bf16_pack_cols)
#define kiln_cpu_rnn_bf16_times KILN_LEVEL_NAME(kiln_cpu_rnn_bf16_times)
#define kiln_cpu_rnn_bf16_packed_words KILN_LEVEL_NAME(kiln_cpu_rnn_bf16_packed_words)
#define kiln_cpu_rnn_bf16_times_scratch KILN_LEVEL_NAME(kiln_cpu_rnn_bf16_times_scratch)
#define kiln_cpu_rnn_times_f32_ordered KILN_LEVEL_NAME(kiln_cpu_rnn_times_f32_ordered)
#define kiln_cpu_gemm_raw KILN_LEVEL_NAME(kiln_cpu_gemm_raw)
#define kiln_cpu_sgemm KILN_LEVEL_NAME(kiln_cpu_sgemm)
#define kiln_cpu_sgemm_ep KILN_LEVEL_NAME(kiln_cpu_sgemm_ep)
#define kiln_cpu_sgemm_here KILN_LEVEL_NAME(kiln_cpu_sgemm_here)
#define kiln_cpu_sgemm_panels KILN_LEVEL_NAME(kiln_cpu_sgemm_panels)
#define kiln_cpu_sgemm_bf16 KILN_LEVEL_NAME(kiln_cpu_sgemm_bf16)
#define kiln_cpu_sgemm_bf16_here KILN_LEVEL_NAME(kiln_cpu_sgemm_bf16_here)
#define kiln_cpu_winograd_takes KILN_LEVEL_NAME(kiln_cpu_winograd_takes)
#define kiln_cpu_winograd_run KILN_LEVEL_NAME(kiln_cpu_winograd_run)
#define kiln_cpu_gemm_raw_fixed KILN_LEVEL_NAME(kiln_cpu_gemm_raw_fixed)
#define kiln_cpu_widen_bf16 KILN_LEVEL_NAME(kiln_cpu_widen_bf16)
#define kiln_cpu_gemm_raw_bf16 KILN_LEVEL_NAME(kiln_cpu_gemm_raw_bf16)
#define kiln_cpu_blas_layout KILN_LEVEL_NAME(kiln_cpu_blas_layout)
#define kiln_cpu_copy KILN_LEVEL_NAME(kiln_cpu_copy)
#define kiln_cpu_max2x2_plane_f32 KILN_LEVEL_NAME(kiln_cpu_max2x2_plane_f32)
#define kiln_cpu_fill KILN_LEVEL_NAME(kiln_cpu_fill)
#define kiln_cpu_contiguous KILN_LEVEL_NAME(kiln_cpu_contiguous)
#endif

/* One level's kernels, as cpu/backend.c copies them into kiln_cpu_backend: its elementwise entry
   and its kernel table (cpu/kernels.c). */
extern const struct kiln_backend kiln_cpu_kernels;

int cpu_elementwise(const struct kiln_call *c);
int cpu_copy(const struct kiln_call *c);
int cpu_fill(const struct kiln_call *c);
int cpu_reduce(const struct kiln_call *c);
int cpu_gemm(const struct kiln_call *c);
/* LINEAR (cpu/gemm.c): out [N, O] = x [N, I] w^T + b, relu'd when ints[0] is 1; f32 and f64. */
int cpu_linear(const struct kiln_call *c);
/* C [m, n] (rows ldc apart) of dtype f32 or f64 as LINEAR leaves it: each element + bias[column]
   (bias NULL: nothing), then x < 0 ? 0 : x when relu is 1, as the add and relu ops would. */
void kiln_cpu_linear_finish(int dtype, int64_t m, int64_t n, void *c, int64_t ldc, const void *bias, int relu);
/* cpu/sgemm.c: kiln's own f32 GEMM (the avx512 level; elsewhere it calls the BLAS), with
   kiln_sgemm's arguments; whether a product of [m, k] x [k, n] runs on it (decided once per
   product, before any split). */
void kiln_cpu_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* What is done to each element of C as it is stored the last time: + bias[column] (bias NULL:
   nothing), then x < 0 ? 0 : x when relu is 1 (as the add and relu ops would, the same bits). */
struct kiln_sgemm_ep { const float *bias; int relu; };
void kiln_cpu_sgemm_ep(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                       const float *b, int64_t ldb, float beta, float *c, int64_t ldc, const struct kiln_sgemm_ep *ep);
int kiln_cpu_sgemm_here(int64_t m, int64_t n, int64_t k);
/* The product of bf16 A and B on kiln's own kernel (the avx512 and avx2 levels): each value widened
   as it is packed, the f32 sums as kiln_cpu_sgemm's; C f32, or bf16 (bf16_c) rounded once (nearest
   even) as it is stored: the bits of widening, kiln_cpu_sgemm and rounding. Where
   kiln_cpu_sgemm_bf16_here says so (alpha not 0; a bf16 C: k within the kernel's block of k); 0,
   or -1 when its buffers found no memory. */
int kiln_cpu_sgemm_bf16_here(int64_t m, int64_t n, int64_t k, float alpha, int bf16_c);
int kiln_cpu_sgemm_bf16(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a, int64_t lda,
                        const uint16_t *b, int64_t ldb, float beta, void *c, int64_t ldc, int bf16_c);
/* The avx512 level's product with op(B) given as kiln_cpu_sgemm's panels (cpu/sgemm.c): 64 columns a
   panel, [ceil(n / 64)][k][64], zeros past n, k at most KILN_SGEMM_PANEL_K (its block of k). */
enum { KILN_SGEMM_PANEL_K = 2048 };
void kiln_cpu_sgemm_panels(int ta, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *pb,
                           float beta, float *c, int64_t ldc);
/* cpu/backend.c, compiled once: 1 when this CPU's vdpbf16ps does bf16 products faster than its
   FMAs do f32 ones (measured once, the first time it is asked). */
int kiln_cpu_bf16_fast(void);
/* cpu/bf16_gemm.c: 1 when the CPU runs bf16 products natively (AVX512-BF16; KILN_BF16_EMULATE=1
   says no): the convolution columns' products and the recurrent layers' GEMMs. The matrix products
   of cpu/gemm.c and the recurrent layers' steps (cpu/bf16_rnn.c) take vdpbf16ps only where
   kiln_cpu_bf16_products_native says so: natively and kiln_cpu_bf16_fast, or KILN_BF16_EMULATE=0
   (wherever the CPU has it). Both read the environment once. And the product itself on 3-d bf16
   tensors. */
int kiln_cpu_bf16_native(void);
int kiln_cpu_bf16_products_native(void);
int cpu_gemm_bf16(struct kiln_tensor *out, const struct kiln_tensor *a, const struct kiln_tensor *b, double alpha,
                  double beta);
/* c [n,m] (f32) = alpha * A @ B + beta * c for bf16 A [n,k] and B [k,m], each given by its element
   strides (row, column; c's: one of them 1): the raw form, for cpu/bf16_conv.c. */
int kiln_cpu_gemm_bf16_f32(int64_t n, int64_t m, int64_t k, float alpha, const uint16_t *a, int64_t as1, int64_t as2,
                           const uint16_t *b, int64_t bs1, int64_t bs2, float beta, float *c, int64_t cs1, int64_t cs2);
/* cpu/bf16_rnn.c: the bf16 products of the persistent recurrent path (a bf16 layer, autocast's),
   native (AVX512-BF16) or emulated bit for bit. Weights are packed into panels of
   kiln_cpu_rnn_bf16_panel() columns of bf16 pairs along k: pack_rows from W[k][c] = src[k * ld + c]
   (f32 or bf16, rounded to nearest even), pack_cols from rows of pairs, column c's K elements being
   the bf16 row rows + c * ld (as 32-bit pairs, kp = (K + 1) / 2 of them). times: ys[q] (f32, or bf16
   rounded once) = the bf16 row xs[q] (K elements read as pairs, so one more readable when K is odd) times the packed [K][n], f32 sums;
   span and stride as cpu/rnn.c's times_rows. round: n values of src (f32 or bf16) to bf16.
   packed_words: the 32-bit words a packed [K][n] takes (emulated, its pairs are widened to f32).
   times_scratch: the bytes of scratch times needs for up to na rows (0: none, scratch may be NULL). */
int64_t kiln_cpu_rnn_bf16_panel(void);
int64_t kiln_cpu_rnn_bf16_packed_words(int64_t n, int64_t K);
/* cpu/rnn.c's f32 products of the persistent path on its panels (4 vectors of the level wide, K
   rows each), every sum in k's order: the bf16 emulation's */
void kiln_cpu_rnn_times_f32_ordered(const float *packed, int64_t K, int64_t n, int64_t na, const float *const *xs,
                                    float *const *ys, int64_t span, int64_t stride);
void kiln_cpu_rnn_bf16_round(uint16_t *dst, const void *src, int sdt, int64_t n);
void kiln_cpu_rnn_bf16_pack_rows(uint32_t *packed, int64_t n, int64_t K, const void *src, int sdt, int64_t ld);
void kiln_cpu_rnn_bf16_pack_cols(uint32_t *packed, int64_t n, int64_t kp, const uint32_t *rows, int64_t ld);
size_t kiln_cpu_rnn_bf16_times_scratch(int64_t na, int64_t K, int64_t n, int out_bf16);
void kiln_cpu_rnn_bf16_times(const uint32_t *packed, int64_t K, int64_t n, int64_t na, const uint16_t *const *xs,
                             void *const *ys, int out_bf16, int64_t span, int64_t stride, float *scratch);
int cpu_conv2d_bf16(const struct kiln_call *c);
int cpu_conv2d_backward_bf16(const struct kiln_call *c);
int cpu_conv2d_relu_pool_bf16(const struct kiln_call *c);
int cpu_conv2d_relu_pool_backward_bf16(const struct kiln_call *c);
int cpu_max_pool2d_bf16(const struct kiln_call *c);
int cpu_max_pool2d_backward_bf16(const struct kiln_call *c);
/* 2 x 2 max pooling, stride 2, of one f32 plane of width W = 2 * OW (cpu/pool.c): y [OH, OW] and
   the index of each maximum in the plane; t and tk hold 2 * OH * OW, k OH * OW (scratch). */
void kiln_cpu_max2x2_plane_f32(const float *x, int64_t OH, int64_t OW, int64_t W, float *y, int64_t *idx, float *t,
                               int32_t *tk, int32_t *k);
int cpu_cat(const struct kiln_call *c);
int cpu_index_select(const struct kiln_call *c);
int cpu_gather(const struct kiln_call *c);
int cpu_scatter_add(const struct kiln_call *c);
int cpu_masked_fill(const struct kiln_call *c);
int cpu_masked_select(const struct kiln_call *c);
int cpu_random(const struct kiln_call *c);
/* the fused nn ops (cpu/conv.c, pool.c, norm.c, softmax.c, dropout.c) */
int cpu_conv2d(const struct kiln_call *c);
int cpu_conv2d_backward(const struct kiln_call *c);
int cpu_conv2d_relu_pool(const struct kiln_call *c);
int cpu_conv2d_relu_pool_backward(const struct kiln_call *c);
int cpu_max_pool2d(const struct kiln_call *c);
int cpu_max_pool2d_backward(const struct kiln_call *c);
int cpu_avg_pool2d(const struct kiln_call *c);
int cpu_avg_pool2d_backward(const struct kiln_call *c);
int cpu_batch_norm(const struct kiln_call *c);
int cpu_batch_norm_backward(const struct kiln_call *c);
int cpu_row_norm(const struct kiln_call *c);            /* layer and group norm */
int cpu_row_norm_backward(const struct kiln_call *c);
int cpu_softmax(const struct kiln_call *c);             /* softmax and log_softmax */
int cpu_softmax_backward(const struct kiln_call *c);
int cpu_nll_loss(const struct kiln_call *c);            /* also cross entropy (fused) */
int cpu_nll_loss_backward(const struct kiln_call *c);
int cpu_dropout(const struct kiln_call *c);
int cpu_optim_step(const struct kiln_call *c);          /* SGD, Adam, RMSprop, Adagrad (cpu/optim.c) */
int cpu_rnn(const struct kiln_call *c);                 /* one RNN layer, forward and backward (cpu/rnn.c) */
int cpu_rnn_backward(const struct kiln_call *c);
int cpu_ctc_loss(const struct kiln_call *c);            /* cpu/ctc.c */
int cpu_ctc_loss_backward(const struct kiln_call *c);
int cpu_scan(const struct kiln_call *c);               /* cumsum and cumprod (cpu/scan.c) */
int cpu_cumprod_backward(const struct kiln_call *c);
int cpu_argsort(const struct kiln_call *c);

/* A convolution cut into kiln's fixed batch parts (cpu/conv.c), as the algorithm choice of
   cpu/onednn.c sees it: forward when y is set, else backward (gx and/or the per-part grad-weight
   partials [parts, O, C/G, kh, kw], f32 for bf16 tensors); dense f32, f64 or bf16 buffers.
   kiln_cpu_conv_run runs it by oneDNN or by im2col(ctx) (the caller's own path, which may cut the
   batch its own way and keep its own partials), as KILN_CONV_ALGO and benchmark mode say, sets
   ran_onednn, and returns a KILN_ code. Compiled once, not per level. */
enum { KILN_CONV_PARTS = 16 };
struct kiln_conv_job {
  int dtype;
  int64_t N, C, H, W, O, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, G, parts;
  const void *x, *w, *bias, *gy;
  void *y, *gx, *partials;
  int (*im2col)(void *ctx);
  void *ctx;
  int ran_onednn;
  int partials_summed;   /* set by the run: partials' first slot holds the parts' sum (added in part order) */
  void *gw;              /* f32 only, or NULL: where that sum goes instead of partials' first slot */
  /* A fused layer (cpu/conv.c, cpu/bf16_conv.c: conv2d, relu and 2x2 max pooling) runs on oneDNN
     alone, and its output and output grad never exist in NCHW: forward, each part's output goes in
     oneDNN's nChw16c to epilogue instead of y; backward, prologue writes each part's output grad in
     that layout, which the passes read. Its forward's caller asks kiln_cpu_conv_fused_way first;
     kiln_cpu_conv_run returns 1 (not taken) where oneDNN's passes use another layout. */
  void (*epilogue)(void *ctx, int64_t n0, int64_t nb, const void *blocked);
  void (*prologue)(void *ctx, int64_t n0, int64_t nb, void *blocked);
  /* Set by the caller where its level's Winograd kernels take the shape (cpu/winograd.c): the
     third algorithm, which runs every kind of job above (plain or fused) by itself. */
  int (*winograd)(struct kiln_conv_job *c);
};
int kiln_cpu_conv_run(struct kiln_conv_job *c);
/* cpu/winograd.c: whether F(2x2, 5x5) or F(4x4, 3x3) takes c at this level, and the run: 0, an
   error code, or 1 (not taken: an infinity or a NaN in a forward's input or weights); a weight grad
   goes summed to c->gw, else partials' first slot (partials_summed). */
int kiln_cpu_winograd_takes(const struct kiln_conv_job *c);
int kiln_cpu_winograd_run(struct kiln_conv_job *c);
/* Where the three ops of a fused layer would convolve c (the choice kiln_cpu_conv_run makes): 1 by
   im2col (forced, no oneDNN, or the auto rule's one-channel cases; input_grad: the input's grad
   will be asked for), 0 by oneDNN where it takes the shape, -1 by a timing (benchmark mode). */
int kiln_cpu_conv_fused_way(const struct kiln_conv_job *c, int input_grad);
/* bf16 matrix products by oneDNN's matmul (cpu/onednn.c): whether they go there (AMX, or
   KILN_BF16_MATMUL=onednn; the library loaded), oneDNN's name of its kernel, and the product
   out [B, m, n] = a [B, m, k] b [B, k, n] (bf16): 1 when run (*rc its status), 0 when not taken. */
int kiln_cpu_onednn_matmul_wanted(void);
const char *kiln_cpu_onednn_matmul_impl(void);
int kiln_cpu_onednn_gemm(struct kiln_tensor *out, const struct kiln_tensor *a, const struct kiln_tensor *b, int *rc);

/* What CPU kernels use in place of the public ops, which dispatch and record (cpu/elementwise.c):
   a strided copy with conversion and broadcasting of src to dst's shape, a fill, and t itself when
   contiguous (a new reference), else a contiguous copy. Each level has its own; the layers above
   reach the chosen level's copy through kiln_cpu_copy in internal.h. */
int kiln_cpu_copy(struct kiln_tensor *dst, const struct kiln_tensor *src);
int kiln_cpu_fill(struct kiln_tensor *t, double value);
struct kiln_tensor *kiln_cpu_contiguous(const struct kiln_tensor *t);

/* C[n,m] = alpha * op(A) op(B) + beta * C for row-major f32 or f64 matrices, in kiln's pool (cpu/gemm.c). */
void kiln_cpu_gemm_raw(int dtype, int trans_a, int trans_b, int64_t n, int64_t m, int64_t k, double alpha,
                       const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c, int64_t ldc);
/* The same with the same bits at any thread count (the emulated bf16 products of the convolutions
   and recurrent layers): kiln's own f32 GEMM gives them whatever the split; the BLAS is cut into
   panels as for 16 threads whatever the pool's size. */
void kiln_cpu_gemm_raw_fixed(int dtype, int trans_a, int trans_b, int64_t n, int64_t m, int64_t k, double alpha,
                             const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c, int64_t ldc);
/* The same for bf16 A and B into an f32 C on kiln's own kernel, which widens them as it packs
   (kiln_cpu_sgemm_bf16): the bits of kiln_cpu_gemm_raw_fixed on the widened operands. Where
   kiln_cpu_sgemm_bf16_here(n, m, k, alpha, 0) says so; -1 when its buffers found no memory. */
int kiln_cpu_gemm_raw_bf16(int trans_a, int trans_b, int64_t n, int64_t m, int64_t k, float alpha, const uint16_t *a,
                           int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* How a GEMM reads a rows x cols matrix with strides s0, s1: *tr KILN_BLAS_NO_TRANS or
   KILN_BLAS_TRANS and its leading dim *ld; 0 for a layout no GEMM reads (cpu/gemm.c). */
int kiln_cpu_blas_layout(int64_t rows, int64_t cols, int64_t s0, int64_t s1, int *tr, int64_t *ld);
/* dst[i] = src[i] (bf16) widened to f32, exactly, over the pool (cpu/gemm.c) */
void kiln_cpu_widen_bf16(float *dst, const uint16_t *src, int64_t n);

/* Sums kept in n independent lanes (element i in lane i % n) fold in this fixed tree, in place (n a
   power of two): the order depends on the lane count alone, never on threads or layout. */
static inline double kiln_fold_lanes(double *l, int n) {
  for (int w = n / 2; w >= 1; w /= 2)
    for (int k = 0; k < w; k++) l[k] += l[k + w];
  return l[0];
}
/* 16 floats and 16 int32 masks, for loops gcc does not vectorise by itself (compare-and-select) */
typedef float kiln_vf16 __attribute__((vector_size(16 * sizeof(float))));
typedef float kiln_vf16u __attribute__((vector_size(16 * sizeof(float)), aligned(4)));   /* at any address */
typedef int32_t kiln_vi16 __attribute__((vector_size(16 * sizeof(int32_t))));

/* p[i] += q[i], i < n, sixteen at a time at any level: the grad-weight partials' sums of
   cpu/onednn.c and cpu/winograd.c (element by element, so in part order whatever the level) */
static inline void kiln_add_into(float *restrict p, const float *restrict q, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    kiln_vf16u a, b;
    memcpy(&a, p + i, sizeof a);
    memcpy(&b, q + i, sizeof b);
    a += b;
    memcpy(p + i, &a, sizeof a);
  }
  for (; i < n; i++) p[i] += q[i];
}

/* CPU memory, 64-byte aligned (cpu/big_blocks.c): blocks of KILN_BIG_BLOCK bytes or more are kept
   when freed, within a budget, and reused, instead of being mapped and faulted in again. The
   size given to kiln_cpu_free is the one asked of kiln_cpu_alloc. */
enum { KILN_BIG_BLOCK = 32 << 20 };
void *kiln_cpu_alloc(size_t nbytes);
void kiln_cpu_free(void *p, size_t nbytes);
void kiln_cpu_trim(void);                        /* give every cached block back */
void kiln_cpu_cache_info(size_t *bytes, int *blocks, int64_t *hits);
void kiln_cpu_set_cache_budget(size_t bytes);    /* drops the oldest blocks past it */

/* A kernel's scratch buffer, 64-byte aligned, its size rounded up to whole lines as aligned_alloc
   wants, freed with free() (kiln_cpu_alloc's blocks below the cache's size are these): malloc's
   16-byte alignment would split every zmm load and store of it across two cache lines (the
   persistent RNN's products read their packed weights 5% faster from aligned panels: char-LM step,
   Emerald Rapids). */
static inline void *kiln_cpu_scratch(size_t nbytes) {
  if (nbytes > SIZE_MAX - 63) return NULL;   /* as malloc fails it, not a wrapped small block */
  return aligned_alloc(64, nbytes ? (nbytes + 63) & ~(size_t)63 : 64);
}

#endif
