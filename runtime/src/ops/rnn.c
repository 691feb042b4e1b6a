/* rnn.c: the front end of one recurrent layer (kiln/rnn.h): checks, the choice of algorithm, the
   forward kernel and its node, and the derivative that runs the backward kernel. */
#include "internal.h"
#include "rnn_calls.h"
#include <stdio.h>
#include <string.h>

static const char *const mode_names[] = {"rnn_tanh", "rnn_relu", "gru", "lstm"};

/* The inputs of a layer node, in order; lengths is saved but takes no grad. */
enum { IN_X, IN_H0, IN_C0, IN_W_IH, IN_W_HH, IN_B_IH, IN_B_HH, NIN };
/* What a node keeps: the contiguous x, h0, c0, w_ih, w_hh (b_ih, b_hh only shape the grads), the
   output, the reserve and the lengths. */
enum { S_X, S_H0, S_C0, S_W_IH, S_W_HH, S_Z, S_RESERVE, S_LENGTHS, NSAVED };
_Static_assert((int)NSAVED <= (int)MAX_SAVED, "an rnn node keeps more tensors than a node holds");

/* The multiply-adds per thread per step below which AUTO keeps the GEMM path: batches of 1 to 3
   are bound by streaming w_hh, where the team must have a large slice to beat one product per
   step; from 4 up the team wins sooner, except for the plain RNN (one gate), whose product per
   step OpenBLAS runs well. Measured with bench-like LSTM/GRU/RNN layers (input 256, sequence 64,
   forward + backward) at hidden 32 to 2048, batch 1 to 128, 1 and 2 threads: docs/rnn.md. */
static double persistent_min_work(int mode, int64_t batch) {
  if (batch <= 3) return 350e3;
  return mode == KILN_RNN_TANH || mode == KILN_RNN_RELU ? 600e3 : 150e3;
}

KILN_API int kiln_rnn_choose_algo(int mode, int64_t batch, int64_t hidden, int dtype, struct kiln_device device, int algo,
                                  char *why, size_t whylen) {
  char buf[256];
  int chosen;
  if (device.type == KILN_CUDA) {
    int dnn = kiln_cuda_has_cudnn();
    if (algo == KILN_RNN_GEMM) {
      chosen = KILN_RNN_GEMM;
      snprintf(buf, sizeof buf, "kiln's own kernels (a cuBLAS product per step), as asked");
    } else if (!dnn) {
      chosen = KILN_RNN_GEMM;
      snprintf(buf, sizeof buf, "kiln's own kernels (a cuBLAS product per step): %s%s",
               algo == KILN_RNN_PERSISTENT ? "the persistent path runs on the CPU, and " : "",
               "this build of the CUDA backend has no cuDNN");
    } else if (dtype != KILN_F32 && dtype != KILN_F64) {
      chosen = KILN_RNN_GEMM;
      snprintf(buf, sizeof buf, "kiln's own kernels: the cuDNN path runs f32 and f64; this layer is %s", kiln_dtype_name(dtype));
    } else if (algo == KILN_RNN_PERSISTENT) {
      chosen = KILN_RNN_CUDNN;
      snprintf(buf, sizeof buf, "cuDNN's RNN: the persistent path runs on the CPU; this layer is on %s", kiln_device_name(device));
    } else {
      chosen = KILN_RNN_CUDNN;
      snprintf(buf, sizeof buf, "cuDNN's RNN (standard algorithm, exact %s math)%s", kiln_dtype_name(dtype),
               algo == KILN_RNN_CUDNN ? ", as asked" : "");
    }
  } else if (device.type != KILN_CPU) {
    chosen = KILN_RNN_GEMM;
    snprintf(buf, sizeof buf, "the persistent path runs on the CPU; this layer is on %s", kiln_device_name(device));
  } else if (algo == KILN_RNN_CUDNN) {
    chosen = KILN_RNN_GEMM;
    snprintf(buf, sizeof buf, "GEMM per step: cuDNN runs on CUDA; this layer is on %s", kiln_device_name(device));
  } else if (dtype != KILN_F32 && dtype != KILN_F64 && dtype != KILN_BF16) {
    chosen = KILN_RNN_GEMM;
    snprintf(buf, sizeof buf, "the persistent path runs f32, f64 and bf16; this layer is %s", kiln_dtype_name(dtype));
  } else {
    int G = mode == KILN_RNN_LSTM ? 4 : mode == KILN_RNN_GRU ? 3 : 1;
    int threads = kiln_parallel_team_size();
    if (threads < 1) threads = 1;
    double work = (double)G * ((double)hidden / threads) * (double)hidden * (double)(batch > 0 ? batch : 1);
    double need = persistent_min_work(mode, batch);
    if (algo == KILN_RNN_GEMM) {
      chosen = KILN_RNN_GEMM;
      snprintf(buf, sizeof buf, "GEMM per step, as asked");
    } else if (algo == KILN_RNN_PERSISTENT) {
      chosen = KILN_RNN_PERSISTENT;
      snprintf(buf, sizeof buf, "persistent, as asked: %d threads, %.0fk multiply-adds per thread per step", threads, work / 1e3);
    } else if (batch > KILN_RNN_PERSISTENT_MAX_BATCH) {
      chosen = KILN_RNN_GEMM;
      snprintf(buf, sizeof buf, "GEMM per step: batch %lld is above %d, where one product per step is as fast",
               (long long)batch, KILN_RNN_PERSISTENT_MAX_BATCH);
    } else if (threads == 1) {
      /* a team of one has no barrier to wait at: its products (packed once, 64-byte vectors at
         the avx512 level) beat a GEMM per step at every size measured (docs/rnn.md) */
      chosen = KILN_RNN_PERSISTENT;
      snprintf(buf, sizeof buf, "persistent: batch %lld, 1 thread (no barrier to wait at), %.0fk multiply-adds a step",
               (long long)batch, work / 1e3);
    } else if (batch > 16 && hidden < KILN_RNN_PERSISTENT_MIN_HIDDEN_ABOVE_16) {
      chosen = KILN_RNN_GEMM;
      snprintf(buf, sizeof buf, "GEMM per step: at batch %lld and hidden size %lld (below %d) one product per step is as fast",
               (long long)batch, (long long)hidden, KILN_RNN_PERSISTENT_MIN_HIDDEN_ABOVE_16);
    } else if (work < need) {
      chosen = KILN_RNN_GEMM;
      snprintf(buf, sizeof buf,
               "GEMM per step: %d thread%s would each do %.0fk multiply-adds a step (below %.0fk), too few to pay for a "
               "barrier per step", threads, threads == 1 ? "" : "s", work / 1e3, need / 1e3);
    } else {
      chosen = KILN_RNN_PERSISTENT;
      snprintf(buf, sizeof buf, "persistent: batch %lld, %d thread%s, %.0fk multiply-adds per thread per step",
               (long long)batch, threads, threads == 1 ? "" : "s", work / 1e3);
    }
  }
  if (why && whylen) snprintf(why, whylen, "%s", buf);
  return chosen;
}

static int check_tensor(const char *op, const char *what, const struct kiln_tensor *t, const struct kiln_tensor *x,
                        int ndim, const int64_t *sizes) {
  if (!t) return KILN_OK;
  if (kiln_check_live(op, t) || kiln_check_same_device(op, x, t)) return kiln_error_code();
  /* a bf16 input (autocast's) takes f32 weights, biases and states too: the master weights, and
     states carried on in f32 */
  if (t->dtype != x->dtype && !(x->dtype == KILN_BF16 && t->dtype == KILN_F32))
    return kiln_fail(KILN_ERR_DTYPE, "%s: %s %s is %s but the input %s is %s", op, what, kiln_shape_string(t),
                     kiln_dtype_name(t->dtype), kiln_shape_string(x), kiln_dtype_name(x->dtype));
  int ok = t->ndim == ndim;
  for (int d = 0; ok && d < ndim; d++) ok = t->sizes[d] == sizes[d];
  if (!ok)
    return kiln_fail(KILN_ERR_SHAPE, "%s: %s is %s, expected %s", op, what, kiln_shape_string(t), kiln_sizes_string(ndim, sizes));
  return KILN_OK;
}

static int check_lengths(const char *op, const struct kiln_tensor *lengths, int64_t T, int64_t B) {
  if (kiln_check_live(op, lengths)) return kiln_error_code();
  if (lengths->dtype != KILN_I64 || lengths->ndim != 1 || lengths->sizes[0] != B || lengths->device.type != KILN_CPU)
    return kiln_fail(KILN_ERR_SHAPE, "%s: lengths %s %s on %s: expected i64 [%lld] on the CPU, one length per sequence", op,
                     kiln_shape_string(lengths), kiln_dtype_name(lengths->dtype), kiln_device_name(lengths->device),
                     (long long)B);
  for (int64_t b = 0; b < B; b++) {
    int64_t n = (int64_t)kiln_tensor_get(lengths, lengths->offset + b * lengths->strides[0]);
    if (n < 1 || n > T)
      return kiln_fail(KILN_ERR_ARGUMENT, "%s: sequence %lld has length %lld, outside 1..%lld (the input has %lld steps)", op,
                       (long long)b + 1, (long long)n, (long long)T, (long long)T);
  }
  return KILN_OK;
}

/* Autocast for a layer: the op table's rule for each input, but an f32 weight, bias or initial
   state stays f32 where the input is lowered to bf16 (the CPU's bf16 layer packs its own bf16
   operands once per sequence, keeps the state f32 and gives the master weights f32 grads). 1 when
   some input was converted (out[] holds the converted ones, NULL for the others), 0 when none,
   -1 on an error. */
static int autocast_layer(const struct kiln_tensor *const *in, struct kiln_tensor **out) {
  int lower = kiln_autocast_get(), change = 0;
  for (int i = 0; i < 7; i++) out[i] = NULL;
  if (lower < 0) return 0;
  for (int i = 0; i < 7; i++) {
    const struct kiln_tensor *t = in[i];
    if (!t || (t->storage && (t->storage->flags & KILN_STORAGE_FREED))) continue;   /* the checks below refuse it */
    if (i == 0 && !in[3]) continue;   /* a looked-up table stays as it is (layer_dtype) */
    int want = kiln_autocast_dtype(KILN_OP_RNN, t->dtype, t->device.type, lower);
    if (i > 0 && want == KILN_BF16 && t->dtype == KILN_F32) want = KILN_F32;
    if (want == t->dtype) continue;
    if (!(out[i] = kiln_to_dtype(t, want))) { kiln_autocast_release(7, out); return -1; }
    change = 1;
  }
  return change;
}

/* The dtype a layer runs in: its input's, but for a looked-up f32 table (no w_ih) on the CPU
   under bf16 autocast: a bf16 layer that reads the projection in f32, as it reads the one it makes
   from bf16 operands. */
static int layer_dtype(const struct kiln_tensor *x, const struct kiln_tensor *w_ih) {
  int lower = kiln_autocast_get();
  if (!w_ih && x->dtype == KILN_F32 && x->device.type == KILN_CPU && lower >= 0 &&
      kiln_autocast_dtype(KILN_OP_RNN, KILN_F32, KILN_CPU, lower) == KILN_BF16)
    return KILN_BF16;
  return x->dtype;
}

/* A layer; index: x is a table [V, G*H] of projected rows that index [T,B] picks (w_ih NULL) */
static struct kiln_tensor *layer(int mode, const struct kiln_tensor *x, const struct kiln_tensor *index,
                                 const struct kiln_tensor *h0, const struct kiln_tensor *c0, const struct kiln_tensor *w_ih,
                                 const struct kiln_tensor *w_hh, const struct kiln_tensor *b_ih, const struct kiln_tensor *b_hh,
                                 const struct kiln_tensor *lengths, int reverse, int algo) {
  const struct kiln_tensor *given[7] = {x, h0, c0, w_ih, w_hh, b_ih, b_hh};
  struct kiln_tensor *ac[7];
  switch (autocast_layer(given, ac)) {
  case 0: break;
  case 1: {
    const struct kiln_tensor *u[7];
    for (int i = 0; i < 7; i++) u[i] = ac[i] ? ac[i] : given[i];
    struct kiln_tensor *r = layer(mode, u[0], index, u[1], u[2], u[3], u[4], u[5], u[6], lengths, reverse, algo);
    kiln_autocast_release(7, ac);
    return r;
  }
  default: return NULL;
  }
  if (mode < KILN_RNN_TANH || mode > KILN_RNN_LSTM) {
    kiln_fail(KILN_ERR_ARGUMENT, "rnn: mode %d (expected 0 tanh, 1 relu, 2 GRU, 3 LSTM)", mode);
    return NULL;
  }
  const char *op = mode_names[mode];
  if (algo < KILN_RNN_AUTO || algo > KILN_RNN_CUDNN) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: algorithm %d (expected 0 auto, 1 GEMM, 2 persistent, 3 cuDNN)", op, algo);
    return NULL;
  }
  if (kiln_check_live(op, x) || (!index && kiln_check_live(op, w_ih)) || kiln_check_live(op, w_hh) ||
      (index && kiln_check_live(op, index)))
    return NULL;
  if (index && (index->ndim != 2 || index->dtype != KILN_I64 || index->device.type != KILN_CPU || x->ndim != 2)) {
    kiln_fail(KILN_ERR_SHAPE, "%s: a looked-up input is a table [rows, gates*hidden] and an i64 index [T,B] on the CPU; got %s and %s %s",
              op, kiln_shape_string(x), kiln_shape_string(index), kiln_dtype_name(index->dtype));
    return NULL;
  }
  if (!index && x->ndim != 3) {
    kiln_fail(KILN_ERR_SHAPE, "%s: input %s has %d dims (expected 3: [T,B,input_size])", op, kiln_shape_string(x), x->ndim);
    return NULL;
  }
  if (x->dtype != KILN_F32 && x->dtype != KILN_F64 && !(x->dtype == KILN_BF16 && x->device.type == KILN_CPU)) {
    kiln_fail(KILN_ERR_DTYPE, "%s: input %s is %s on %s (expected f32 or f64, or bf16 on the CPU)", op, kiln_shape_string(x),
              kiln_dtype_name(x->dtype), kiln_device_name(x->device));
    return NULL;
  }
  int64_t T = index ? index->sizes[0] : x->sizes[0], B = index ? index->sizes[1] : x->sizes[1];
  int64_t I = index ? x->sizes[1] : x->sizes[2], G = kiln_rnn_gates(mode);
  if (T < 1 || B < 1) {
    kiln_fail(KILN_ERR_SHAPE, "%s: input %s has no steps or no sequences", op, kiln_shape_string(x));
    return NULL;
  }
  if (w_hh->ndim != 2 || w_hh->sizes[1] < 1 || w_hh->sizes[0] != G * w_hh->sizes[1]) {
    kiln_fail(KILN_ERR_SHAPE, "%s: weight_hh %s is not [%lld*hidden, hidden]", op, kiln_shape_string(w_hh), (long long)G);
    return NULL;
  }
  int64_t H = w_hh->sizes[1], GH = G * H;
  int64_t s_ih[2] = {GH, I}, s_hh[2] = {GH, H}, s_b[1] = {GH}, s_h[2] = {B, H};
  /* a looked-up input: x is a table of rows already multiplied by weight_ih, which index picks
     (nn's Embedding feeding a layer, its table projected once), on the CPU in f32 or f64 (under
     bf16 autocast the layer runs in bf16 and reads it in f32: layer_dtype) */
  if (index && I != GH) {
    kiln_fail(KILN_ERR_SHAPE, "%s: the looked-up table %s has %lld columns, expected gates*hidden = %lld", op, kiln_shape_string(x),
              (long long)I, (long long)GH);
    return NULL;
  }
  if (index && (x->device.type != KILN_CPU || x->dtype == KILN_BF16)) {
    kiln_fail(KILN_ERR_UNSUPPORTED, "%s: a looked-up table runs on the CPU in f32 or f64; table %s is %s on %s", op,
              kiln_shape_string(x), kiln_dtype_name(x->dtype), kiln_device_name(x->device));
    return NULL;
  }
  if (w_ih && w_ih->ndim == 2 && w_ih->sizes[0] == GH && w_ih->sizes[1] != I) {
    kiln_fail(KILN_ERR_SHAPE, "%s: input %s has %lld features but weight_ih %s expects %lld", op, kiln_shape_string(x),
              (long long)I, kiln_shape_string(w_ih), (long long)w_ih->sizes[1]);
    return NULL;
  }
  if (check_tensor(op, "weight_ih", w_ih, x, 2, s_ih) || check_tensor(op, "weight_hh", w_hh, x, 2, s_hh) ||
      check_tensor(op, "bias_ih", b_ih, x, 1, s_b) || check_tensor(op, "bias_hh", b_hh, x, 1, s_b) ||
      check_tensor(op, "initial hidden state", h0, x, 2, s_h) || check_tensor(op, "initial cell state", c0, x, 2, s_h))
    return NULL;
  if (c0 && mode != KILN_RNN_LSTM) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: an initial cell state is given, but only an LSTM has one", op);
    return NULL;
  }
  if (lengths && check_lengths(op, lengths, T, B)) return NULL;
  if (index) {   /* every row the index names is in the table */
    struct kiln_tensor *ic = kiln_contiguous(index);
    if (!ic) return NULL;
    const int64_t *iv = kiln_tensor_data(ic);
    for (int64_t r = 0; r < T * B; r++)
      if (iv[r] < 0 || iv[r] >= x->sizes[0]) {
        kiln_fail(KILN_ERR_INDEX, "%s: index %lld at step %lld, sequence %lld is outside the table %s (rows 0..%lld)", op,
                  (long long)iv[r], (long long)(r / B), (long long)(r % B), kiln_shape_string(x), (long long)x->sizes[0] - 1);
        kiln_tensor_release(ic);
        return NULL;
      }
    kiln_tensor_release(ic);
  }

  const struct kiln_tensor *orig[NIN] = {x, h0, c0, w_ih, w_hh, b_ih, b_hh};
  struct kiln_tensor *in[NIN] = {0}, *len = NULL, *z = NULL, *reserve = NULL, *idx = NULL;
  for (int k = 0; k < NIN; k++)
    if (orig[k] && !(in[k] = kiln_contiguous(orig[k]))) goto fail;
  if (lengths && !(len = kiln_contiguous(lengths))) goto fail;
  if (index && !(idx = kiln_contiguous(index))) goto fail;
  int64_t zs[3] = {T + kiln_rnn_states(mode), B, H};
  int ldt = layer_dtype(x, w_ih);
  if (!(z = kiln_tensor_empty(3, zs, ldt, x->device))) goto fail;
  int chosen = kiln_rnn_choose_algo(mode, B, H, ldt, x->device, algo, NULL, 0);
  if (chosen == KILN_RNN_CUDNN && I == 0) chosen = KILN_RNN_GEMM;   /* cuDNN needs an input feature */
  /* one step (the cells): the team would pack the weights for a single product, which a GEMM
     runs as fast (persistent / GEMM time 0.75 to 0.97 at one step, 1.0 to 1.15 at four) */
  if (chosen == KILN_RNN_PERSISTENT && algo == KILN_RNN_AUTO && T == 1) chosen = KILN_RNN_GEMM;
  /* cuDNN's reserve is made by its kernel (rnn_calls.h) */
  if (kiln_rnn_reserve(mode) && chosen != KILN_RNN_CUDNN) {   /* a bf16 layer's gates and cells: f32 */
    int64_t rs[3] = {T, B, kiln_rnn_reserve(mode) * H};
    if (!(reserve = kiln_tensor_empty(3, rs, ldt == KILN_BF16 ? KILN_F32 : ldt, x->device))) goto fail;
  }
  struct kiln_rnn_forward f = {{in[IN_X], in[IN_H0], in[IN_C0], in[IN_W_IH], in[IN_W_HH], in[IN_B_IH], in[IN_B_HH], len, idx},
                               reserve, NULL, !kiln_autograd_wanted(NIN, orig)};
  struct kiln_call call = {.op = KILN_OP_RNN, .out = z, .nints = 4, .ints = {mode, reverse ? 1 : 0, chosen, idx != NULL}, .extra = &f};
  int rc = kiln_dispatch(x->device, &call);
  if (f.cudnn_reserve) reserve = f.cudnn_reserve;
  if (rc) goto fail;
  /* a looked-up input has no w_ih: its slot keeps the index (ints[3] says which) */
  const struct kiln_tensor *saved[NSAVED] = {[S_X] = in[IN_X], [S_H0] = in[IN_H0], [S_C0] = in[IN_C0],
                                             [S_W_IH] = idx ? idx : in[IN_W_IH], [S_W_HH] = in[IN_W_HH], [S_Z] = z,
                                             [S_RESERVE] = reserve, [S_LENGTHS] = len};
  if (kiln_autograd_record_saved(KILN_OP_RNN, z, NIN, orig, NULL, call.ints, 4, saved, NSAVED)) goto fail;
  for (int k = 0; k < NIN; k++) kiln_tensor_release(in[k]);
  kiln_tensor_release(len);
  kiln_tensor_release(idx);
  kiln_tensor_release(reserve);
  return z;
fail:
  for (int k = 0; k < NIN; k++) kiln_tensor_release(in[k]);
  kiln_tensor_release(len); kiln_tensor_release(z); kiln_tensor_release(reserve); kiln_tensor_release(idx);
  return NULL;
}

KILN_API struct kiln_tensor *kiln_rnn_layer(int mode, const struct kiln_tensor *x, const struct kiln_tensor *h0,
                                            const struct kiln_tensor *c0, const struct kiln_tensor *w_ih,
                                            const struct kiln_tensor *w_hh, const struct kiln_tensor *b_ih,
                                            const struct kiln_tensor *b_hh, const struct kiln_tensor *lengths, int reverse,
                                            int algo) {
  return layer(mode, x, NULL, h0, c0, w_ih, w_hh, b_ih, b_hh, lengths, reverse, algo);
}

KILN_API struct kiln_tensor *kiln_rnn_layer_lookup(int mode, const struct kiln_tensor *table, const struct kiln_tensor *index,
                                                   const struct kiln_tensor *h0, const struct kiln_tensor *c0,
                                                   const struct kiln_tensor *w_hh, const struct kiln_tensor *b_ih,
                                                   const struct kiln_tensor *b_hh, const struct kiln_tensor *lengths, int reverse,
                                                   int algo) {
  if (!index) {
    kiln_fail(KILN_ERR_ARGUMENT, "rnn_layer_lookup: the index is missing (NULL)");
    return NULL;
  }
  return layer(mode, table, index, h0, c0, NULL, w_hh, b_ih, b_hh, lengths, reverse, algo);
}

int kiln_rnn_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  struct kiln_tensor *gz = kiln_contiguous(g);
  if (!gz) return kiln_error_code();
  for (int k = 0; k < NIN; k++) {
    const struct edge *e = &n->in[k];
    if (e->needs && !(gin[k] = kiln_tensor_empty(e->ndim, e->sizes, e->dtype, e->device))) {
      kiln_tensor_release(gz);
      return kiln_error_code();
    }
  }
  int lookup = n->nints > 3 && n->ints[3];   /* S_W_IH holds the index */
  struct kiln_rnn_backward bw = {
    .t = {n->saved[S_X], n->saved[S_H0], n->saved[S_C0], lookup ? NULL : n->saved[S_W_IH], n->saved[S_W_HH], NULL, NULL,
          n->saved[S_LENGTHS], lookup ? n->saved[S_W_IH] : NULL},
    .z = n->saved[S_Z], .reserve = n->saved[S_RESERVE], .gz = gz,
    .gx = gin[IN_X], .gh0 = gin[IN_H0], .gc0 = gin[IN_C0], .gw_ih = gin[IN_W_IH], .gw_hh = gin[IN_W_HH],
    .gb_ih = gin[IN_B_IH], .gb_hh = gin[IN_B_HH]};
  struct kiln_call call = {.op = KILN_OP_RNN_BACKWARD, .nints = 3, .ints = {n->ints[0], n->ints[1], n->ints[2]}, .extra = &bw};
  int rc = kiln_dispatch(gz->device, &call);
  kiln_tensor_release(gz);
  return rc;
}
