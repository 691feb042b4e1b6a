/* test_cuda_rnn_cudnn.c: the host-side bookkeeping of the cuDNN recurrent path
   (runtime/cuda/rnn_cudnn.h), checked without a GPU: kiln's modes as cuDNN's cell modes and the
   map from PyTorch's gates to cuDNN's linLayerIDs, each against a table written from cuDNN's
   documentation and cudnn_adv.h; the per-sequence reversal against a naive loop; and the whole
   reverse scheme of rnn_cudnn.cu (reverse each sequence in its length, run forward, reverse the
   outputs back) played with the CPU layer standing in for cuDNN, against the CPU layer run in
   reverse, for every mode with unsorted lengths and initial states. In a build with cuDNN also
   the layer's descriptors (runtime/cuda/rnn_cudnn_desc.c), built without a device and read back
   through cuDNN. */
#include "check.h"
#include "rnn_cudnn.h"
#ifdef KILN_TEST_HAVE_CUDNN
#include "rnn_cudnn_desc.h"
#endif

/* cudnnRNNMode_t in cudnn_adv.h: CUDNN_RNN_RELU = 0, CUDNN_RNN_TANH = 1, CUDNN_LSTM = 2, CUDNN_GRU = 3 */
static void cell_modes(void) {
  static const int want[4][2] = {{KILN_RNN_TANH, 1}, {KILN_RNN_RELU, 0}, {KILN_RNN_GRU, 3}, {KILN_RNN_LSTM, 2}};
  for (int k = 0; k < 4; k++) CHECK(kiln_rnn_cudnn_cell_mode(want[k][0]) == want[k][1]);
  CHECK(kiln_rnn_cudnn_cell_mode(4) == -1);
  CHECK(kiln_rnn_cudnn_cell_mode(-1) == -1);
}

/* cuDNN's linLayerIDs (cudnnGetRNNWeightParams): LSTM 0/4 input gate, 1/5 forget, 2/6 new memory,
   3/7 output; GRU 0/3 reset, 1/4 update, 2/5 new memory; plain RNN 0 input-side, 1 recurrent.
   PyTorch's gates: LSTM i,f,g,o; GRU r,z,n. */
struct gate_row { int mode, recurrent, gate, id; const char *what; };
static const struct gate_row gate_table[] = {
  {KILN_RNN_LSTM, 0, 0, 0, "lstm i (w_ii)"}, {KILN_RNN_LSTM, 0, 1, 1, "lstm f (w_if)"},
  {KILN_RNN_LSTM, 0, 2, 2, "lstm g (w_ig)"}, {KILN_RNN_LSTM, 0, 3, 3, "lstm o (w_io)"},
  {KILN_RNN_LSTM, 1, 0, 4, "lstm i (w_hi)"}, {KILN_RNN_LSTM, 1, 1, 5, "lstm f (w_hf)"},
  {KILN_RNN_LSTM, 1, 2, 6, "lstm g (w_hg)"}, {KILN_RNN_LSTM, 1, 3, 7, "lstm o (w_ho)"},
  {KILN_RNN_GRU, 0, 0, 0, "gru r (w_ir)"}, {KILN_RNN_GRU, 0, 1, 1, "gru z (w_iz)"}, {KILN_RNN_GRU, 0, 2, 2, "gru n (w_in)"},
  {KILN_RNN_GRU, 1, 0, 3, "gru r (w_hr)"}, {KILN_RNN_GRU, 1, 1, 4, "gru z (w_hz)"}, {KILN_RNN_GRU, 1, 2, 5, "gru n (w_hn)"},
  {KILN_RNN_TANH, 0, 0, 0, "tanh w_ih"}, {KILN_RNN_TANH, 1, 0, 1, "tanh w_hh"},
  {KILN_RNN_RELU, 0, 0, 0, "relu w_ih"}, {KILN_RNN_RELU, 1, 0, 1, "relu w_hh"},
};

static void lin_layers(void) {
  for (size_t k = 0; k < sizeof gate_table / sizeof gate_table[0]; k++) {
    const struct gate_row *r = &gate_table[k];
    int got = kiln_rnn_cudnn_lin_layer(r->mode, r->recurrent, r->gate);
    check_report(got == r->id, __FILE__, __LINE__, "%s: linLayerID %d, expected %d", r->what, got, r->id);
  }
  /* gates a mode does not have, and a bad mode */
  CHECK(kiln_rnn_cudnn_lin_layer(KILN_RNN_LSTM, 0, 4) == -1);
  CHECK(kiln_rnn_cudnn_lin_layer(KILN_RNN_GRU, 1, 3) == -1);
  CHECK(kiln_rnn_cudnn_lin_layer(KILN_RNN_TANH, 0, 1) == -1);
  CHECK(kiln_rnn_cudnn_lin_layer(KILN_RNN_RELU, 1, -1) == -1);
  CHECK(kiln_rnn_cudnn_lin_layer(7, 0, 0) == -1);
  /* every mode's map is one-to-one onto 0..2G-1 */
  for (int mode = 0; mode < 4; mode++) {
    int G = mode == KILN_RNN_LSTM ? 4 : mode == KILN_RNN_GRU ? 3 : 1, seen[8] = {0}, ok = 1;
    for (int side = 0; side < 2; side++)
      for (int g = 0; g < G; g++) {
        int id = kiln_rnn_cudnn_lin_layer(mode, side, g);
        if (id < 0 || id >= 2 * G || seen[id]++) ok = 0;
      }
    check_report(ok, __FILE__, __LINE__, "mode %d: the linLayerIDs are not a permutation of 0..%d", mode, 2 * G - 1);
  }
}

/* The reversal of [T,B,N] against a naive loop, and that applying it twice gives the input back. */
static void reversal(void) {
  enum { TT = 5, BB = 4, NN = 3 };
  const int64_t len[BB] = {3, 1, 5, 2};   /* unsorted, one full, one of a single step */
  double src[TT * BB * NN], want[TT * BB * NN], got[TT * BB * NN], back[TT * BB * NN];
  for (int i = 0; i < TT * BB * NN; i++) src[i] = i;
  for (int t = 0; t < TT; t++)
    for (int b = 0; b < BB; b++)
      for (int j = 0; j < NN; j++) {
        int from = t < len[b] ? (int)len[b] - 1 - t : t;   /* padding stays where it is */
        want[(t * BB + b) * NN + j] = src[(from * BB + b) * NN + j];
      }
  for (int64_t i = 0; i < TT * BB * NN; i++) got[i] = src[kiln_rnn_cudnn_reversed_index(i, TT, BB, NN, len)];
  CHECK_ARRAY_NEAR(got, want, TT * BB * NN, 0);
  for (int64_t i = 0; i < TT * BB * NN; i++) back[i] = got[kiln_rnn_cudnn_reversed_index(i, TT, BB, NN, len)];
  CHECK_ARRAY_NEAR(back, src, TT * BB * NN, 0);
  /* no lengths: every sequence has T steps */
  for (int64_t i = 0; i < TT * BB * NN; i++) got[i] = src[kiln_rnn_cudnn_reversed_index(i, TT, BB, NN, NULL)];
  CHECK(got[0] == src[(4 * BB + 0) * NN + 0] && got[(4 * BB + 3) * NN + 2] == src[(0 * BB + 3) * NN + 2]);
  CHECK(kiln_rnn_cudnn_reversed_time(0, 1) == 0 && kiln_rnn_cudnn_reversed_time(3, 2) == 3 &&
        kiln_rnn_cudnn_reversed_time(1, 4) == 2);
  /* the output grads cuDNN reads: zeros (-1) in the padding, else the output's grad, reversed
     within the length for a reverse layer */
  for (int reverse = 0; reverse < 2; reverse++) {
    int bad = 0;
    for (int t = 0; t < TT; t++)
      for (int b = 0; b < BB; b++)
        for (int j = 0; j < NN; j++) {
          int64_t i = (t * BB + b) * NN + j;
          int64_t want_i = t >= len[b] ? -1 : ((reverse ? len[b] - 1 - t : t) * BB + b) * NN + j;
          bad += kiln_rnn_cudnn_grad_index(i, TT, BB, NN, len, reverse) != want_i;
          int64_t want_full = ((reverse ? TT - 1 - t : t) * BB + b) * NN + j;
          bad += kiln_rnn_cudnn_grad_index(i, TT, BB, NN, NULL, reverse) != want_full;
        }
    CHECK(bad == 0);
  }
}

static struct kiln_tensor *rnd(int ndim, const int64_t *sizes, uint64_t seed) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= sizes[d];
  double *v = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) v[i] = hashval(seed * 1000003u + (uint64_t)i) * 0.8;
  struct kiln_tensor *t = T(ndim, sizes, v, KILN_F64);
  free(v);
  return t;
}

/* [T,B,N] values reversed per sequence, as rnn_gather_kernel does on the device for reverse_into. */
static struct kiln_tensor *reversed(const double *v, int64_t steps, int64_t B, int64_t N, const int64_t *len) {
  int64_t n = steps * B * N, sizes[3] = {steps, B, N};
  double *r = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) r[i] = v[kiln_rnn_cudnn_reversed_index(i, steps, B, N, len)];
  struct kiln_tensor *t = T(3, sizes, r, KILN_F64);
  free(r);
  return t;
}

/* rnn_cudnn.cu's reverse scheme with the CPU layer in cuDNN's place, against the CPU in reverse. */
static void reverse_scheme(void) {
  enum { TT = 6, BB = 4, II = 3, HH = 5 };
  const int64_t len[BB] = {4, 6, 1, 3};
  int64_t ls[1] = {BB};
  double lv[BB] = {4, 6, 1, 3};
  struct kiln_tensor *lengths = T(1, ls, lv, KILN_I64);
  for (int mode = 0; mode < 4; mode++) {
    int64_t G = mode == KILN_RNN_LSTM ? 4 : mode == KILN_RNN_GRU ? 3 : 1;
    int64_t xs[3] = {TT, BB, II}, hs[2] = {BB, HH}, wi[2] = {G * HH, II}, wh[2] = {G * HH, HH}, bs[1] = {G * HH};
    struct kiln_tensor *x = rnd(3, xs, 1 + mode), *h0 = rnd(2, hs, 2), *c0 = mode == KILN_RNN_LSTM ? rnd(2, hs, 3) : NULL;
    struct kiln_tensor *w_ih = rnd(2, wi, 4), *w_hh = rnd(2, wh, 5), *b_ih = rnd(1, bs, 6), *b_hh = rnd(1, bs, 7);
    struct kiln_tensor *want = kiln_rnn_layer(mode, x, h0, c0, w_ih, w_hh, b_ih, b_hh, lengths, 1, KILN_RNN_GEMM);
    double *xv = V(x);
    struct kiln_tensor *xr = reversed(xv, TT, BB, II, len);
    struct kiln_tensor *fwd = kiln_rnn_layer(mode, xr, h0, c0, w_ih, w_hh, b_ih, b_hh, lengths, 0, KILN_RNN_GEMM);
    CHECK(want && fwd);
    if (want && fwd) {
      int64_t S = want->sizes[0] - TT, n = want->numel, out = (int64_t)TT * BB * HH;
      double *fv = V(fwd), *wv = V(want), *got = malloc(sizeof(double) * (size_t)n);
      for (int64_t i = 0; i < out; i++) got[i] = fv[kiln_rnn_cudnn_reversed_index(i, TT, BB, HH, len)];
      for (int64_t i = out; i < n; i++) got[i] = fv[i];   /* the final states: no reversal */
      check_report(S == (mode == KILN_RNN_LSTM ? 2 : 1), __FILE__, __LINE__, "mode %d: %lld states", mode, (long long)S);
      check_arrays(got, wv, n, 1e-12, 0, mode == KILN_RNN_LSTM ? "lstm reversed" : mode == KILN_RNN_GRU ? "gru reversed"
                                                                                  : "rnn reversed",
                   __FILE__, __LINE__);
      free(fv); free(wv); free(got);
    }
    free(xv);
    kiln_tensor_release(want); kiln_tensor_release(fwd); kiln_tensor_release(xr);
    kiln_tensor_release(x); kiln_tensor_release(h0); kiln_tensor_release(c0);
    kiln_tensor_release(w_ih); kiln_tensor_release(w_hh); kiln_tensor_release(b_ih); kiln_tensor_release(b_hh);
  }
  kiln_tensor_release(lengths);
}

/* What kiln_rnn_choose_algo says for a CUDA layer (no device needed): cuDNN when the CUDA
   backend next to libkiln was built with it, else kiln's own kernels and why; asking for cuDNN
   on the CPU runs GEMM. */
static void choice(void) {
  char why[256];
  struct kiln_device cuda = {KILN_CUDA, 0};
  if (!kiln_cuda_has_cudnn()) {
    CHECK(kiln_rnn_choose_algo(KILN_RNN_LSTM, 8, 64, KILN_F32, cuda, KILN_RNN_AUTO, why, sizeof why) == KILN_RNN_GEMM);
    check_report(strstr(why, "no cuDNN") != NULL, __FILE__, __LINE__, "why: %s", why);
    CHECK(kiln_rnn_choose_algo(KILN_RNN_LSTM, 8, 64, KILN_F32, cuda, KILN_RNN_CUDNN, why, sizeof why) == KILN_RNN_GEMM);
  } else {
    CHECK(kiln_rnn_choose_algo(KILN_RNN_LSTM, 8, 64, KILN_F32, cuda, KILN_RNN_AUTO, why, sizeof why) == KILN_RNN_CUDNN);
    check_report(strstr(why, "cuDNN") != NULL, __FILE__, __LINE__, "why: %s", why);
  }
  CHECK(kiln_rnn_choose_algo(KILN_RNN_GRU, 8, 64, KILN_F64, cuda, KILN_RNN_GEMM, why, sizeof why) == KILN_RNN_GEMM);
  CHECK(kiln_rnn_choose_algo(KILN_RNN_GRU, 8, 64, KILN_F64, CPU, KILN_RNN_CUDNN, why, sizeof why) == KILN_RNN_GEMM);
  check_report(strstr(why, "cuDNN runs on CUDA") != NULL, __FILE__, __LINE__, "why: %s", why);
  /* the layer itself takes the new value, and refuses one past it */
  int64_t xs[3] = {2, 1, 1}, ws[2] = {1, 1};
  double one[2] = {0.5, 0.25};
  struct kiln_tensor *x = T(3, xs, one, KILN_F32), *w = T(2, ws, one, KILN_F32);
  struct kiln_tensor *z = kiln_rnn_layer(KILN_RNN_TANH, x, NULL, NULL, w, w, NULL, NULL, NULL, 0, KILN_RNN_CUDNN);
  CHECK(z != NULL);
  CHECK_ERR(kiln_rnn_layer(KILN_RNN_TANH, x, NULL, NULL, w, w, NULL, NULL, NULL, 0, KILN_RNN_CUDNN + 1),
            "rnn_tanh: algorithm 4 (expected 0 auto, 1 GEMM, 2 persistent, 3 cuDNN)");
  kiln_tensor_release(z); kiln_tensor_release(x); kiln_tensor_release(w);
}

#ifdef KILN_TEST_HAVE_CUDNN
/* The descriptors of rnn_cudnn_desc.c, read back through cuDNN (no device needed), against what
   the layer must ask for; cuDNN's own enum names are the reference for the cell modes. */
static void descriptors(void) {
  static const cudnnRNNMode_t cells[4] = {[KILN_RNN_TANH] = CUDNN_RNN_TANH, [KILN_RNN_RELU] = CUDNN_RNN_RELU,
                                          [KILN_RNN_GRU] = CUDNN_GRU, [KILN_RNN_LSTM] = CUDNN_LSTM};
  const int32_t len[5] = {9, 3, 1, 7, 9};
  for (int dt = 0; dt < 2; dt++)
    for (int mode = 0; mode < 4; mode++) {
      int dtype = dt ? KILN_F64 : KILN_F32;
      cudnnDataType_t want_type = dt ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
      struct kiln_rnn_cudnn_desc d;
      cudnnStatus_t s = kiln_rnn_cudnn_describe(&d, NULL, mode, dtype, 9, 5, 7, 24, len);
      check_report(s == CUDNN_STATUS_SUCCESS, __FILE__, __LINE__, "mode %d dtype %d: %s failed: %s", mode, dtype,
                   d.call ? d.call : "?", cudnnGetErrorString(s));
      if (s == CUDNN_STATUS_SUCCESS) {
        cudnnRNNAlgo_t algo;
        cudnnRNNMode_t cell;
        cudnnRNNBiasMode_t bias;
        cudnnDirectionMode_t dir;
        cudnnRNNInputMode_t input;
        cudnnDataType_t type, prec;
        cudnnMathType_t math;
        int32_t I, H, P, L;
        cudnnDropoutDescriptor_t drop;
        uint32_t aux;
        CHECK(cudnnGetRNNDescriptor_v8(d.rnn, &algo, &cell, &bias, &dir, &input, &type, &prec, &math, &I, &H, &P, &L, &drop,
                                       &aux) == CUDNN_STATUS_SUCCESS);
        CHECK(algo == CUDNN_RNN_ALGO_STANDARD && cell == cells[mode] && bias == CUDNN_RNN_DOUBLE_BIAS);
        CHECK(dir == CUDNN_UNIDIRECTIONAL && input == CUDNN_LINEAR_INPUT && type == want_type && prec == want_type);
        /* f32 exact: CUDNN_DEFAULT_MATH would allow TF32 tensor cores from Ampere on */
        CHECK(math == (dt ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
        CHECK(I == 7 && H == 24 && P == 24 && L == 1 && drop == d.drop);
        CHECK(aux == CUDNN_RNN_PADDED_IO_ENABLED);
        for (int k = 0; k < 2; k++) {
          cudnnDataType_t t;
          cudnnRNNDataLayout_t layout;
          int T, B, N, got[5] = {0};
          union { double f64; float f32; } fill;   /* room for either dtype, NaN until cuDNN writes it */
          memset(&fill, 0xff, sizeof fill);
          CHECK(cudnnGetRNNDataDescriptor(k ? d.y : d.x, &t, &layout, &T, &B, &N, 5, got, &fill) == CUDNN_STATUS_SUCCESS);
          CHECK(t == want_type && layout == CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED && T == 9 && B == 5 && N == (k ? 24 : 7));
          CHECK(memcmp(got, len, sizeof got) == 0);
          CHECK(dt ? fill.f64 == 0.0 : fill.f32 == 0.0f);
        }
        cudnnDataType_t st;
        int nb = 0, dims[4] = {0}, strides[4] = {0};
        CHECK(cudnnGetTensorNdDescriptor(d.state, 4, &st, &nb, dims, strides) == CUDNN_STATUS_SUCCESS);
        CHECK(st == want_type && nb == 3 && dims[0] == 1 && dims[1] == 5 && dims[2] == 24 && strides[0] == 120 &&
              strides[1] == 24 && strides[2] == 1);
      }
      kiln_rnn_cudnn_desc_release(&d);
    }
  /* a mode cuDNN has no cell for, and a dtype the layer does not run: refused, naming the call */
  struct kiln_rnn_cudnn_desc d;
  CHECK(kiln_rnn_cudnn_describe(&d, NULL, 9, KILN_F32, 2, 1, 1, 1, len) == CUDNN_STATUS_BAD_PARAM && d.call != NULL);
  kiln_rnn_cudnn_desc_release(&d);
  CHECK(kiln_rnn_cudnn_describe(&d, NULL, KILN_RNN_LSTM, KILN_F16, 2, 1, 1, 1, len) == CUDNN_STATUS_BAD_PARAM);
  kiln_rnn_cudnn_desc_release(&d);
  /* a length past the steps: cuDNN refuses the sequences, and the call is named */
  const int32_t bad[2] = {3, 9};
  cudnnStatus_t s = kiln_rnn_cudnn_describe(&d, NULL, KILN_RNN_GRU, KILN_F32, 4, 2, 3, 5, bad);
  check_report(s != CUDNN_STATUS_SUCCESS && d.call && strstr(d.call, "cudnnSetRNNDataDescriptor"), __FILE__, __LINE__,
               "length 9 of 4 steps: %s at %s", cudnnGetErrorString(s), d.call ? d.call : "?");
  kiln_rnn_cudnn_desc_release(&d);
}
#endif

int main(void) {
#ifdef KILN_TEST_HAVE_CUDNN
  descriptors();
#endif
  cell_modes();
  lin_layers();
  reversal();
  reverse_scheme();
  choice();
  return check_done("test_cuda_rnn_cudnn");
}
