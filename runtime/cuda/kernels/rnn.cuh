/* cuda/rnn.cuh: what rnn.cu's kernels compute for one hidden unit j of one sequence b at one step
   s, as __host__ __device__ functions with the semantics of cpu/rnn_impl.h's GEMM path: the
   per-sequence time (t = s, or lengths[b] - 1 - s in reverse), the carry of the state past a
   sequence's end, the gates of each mode with the reserve layout of rnn_calls.h, their backward,
   the grad carried to the state before the step, the rows of the states each step read (for the
   grad of w_hh) and the bias grads as column sums in row order. tests/c/test_cuda_kernels.cu runs
   them on the CPU against libkiln. */
#ifndef KILN_CUDA_RNN_CUH
#define KILN_CUDA_RNN_CUH
#include "elements.cuh"
#include <type_traits>

namespace kiln_rnn {

enum { TANH = 0, RELU = 1, GRU = 2, LSTM = 3 };   /* enum kiln_rnn_mode */

template <class T> KILN_EL T expo(T x) {
  if constexpr (std::is_same<T, float>::value) return expf(x);
  else return exp(x);
}
template <class T> KILN_EL T th(T x) {
  if constexpr (std::is_same<T, float>::value) return tanhf(x);
  else return tanh(x);
}
template <class T> KILN_EL T sigmoid(T x) { return (T)1 / ((T)1 + expo<T>(-x)); }

/* A row-major product C[M,N] = op(A) op(B) (+ beta C), op(A) [M,K], op(B) [K,N], as cuBLAS's
   column-major call takes it: C^T = op(B)^T op(A)^T, so cuBLAS's first operand is B. Host code. */
struct blas_call {
  int trans_first, trans_second;   /* CUBLAS_OP_T for the first (B) and the second (A) operand */
  int64_t m, n, k;
  int64_t ld_first, ld_second, ldc;
};

static inline struct blas_call blas_call_of(int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                                            int64_t ldc) {
  struct blas_call c;
  c.trans_first = tb; c.trans_second = ta;
  c.m = N; c.n = M; c.k = K;
  c.ld_first = ldb; c.ld_second = lda; c.ldc = ldc;
  return c;
}

/* Whether cuBLAS accepts the leading dimensions of c (cublasGemmEx's checks). */
static inline bool blas_call_valid(const struct blas_call &c) {
  int64_t rows_first = c.trans_first ? c.k : c.m, rows_second = c.trans_second ? c.n : c.k;
  return c.ld_first >= (rows_first > 1 ? rows_first : 1) && c.ld_second >= (rows_second > 1 ? rows_second : 1) &&
         c.ldc >= (c.m > 1 ? c.m : 1);
}

/* One layer's buffers, on the device (or the host, in the test). Rows of the time-major buffers
   are (t, b) = t * B + b. */
template <class T> struct layer {
  int mode, reverse;
  int64_t T_, B, H, GH, RS;     /* RS: the reserve's units per row (kiln_rnn_reserve) */
  const int64_t *len;           /* [B], or NULL: every sequence has T_ steps */
  const T *h0, *c0;             /* [B,H] or NULL (zeros) */
  const T *b_hh;                /* [GH] or NULL */
  const T *xp;                  /* [T,B,GH]: x w_ih^T + b_ih */
  const T *hh;                  /* [B,GH]: this step's h w_hh^T */
  T *z, *res;                   /* Z [T+S,B,H]; reserve [T,B,RS*H] or NULL */
  T *h, *hnext, *c;             /* [B,H]: the state before the step, after it; the cell (in place) */
  /* backward */
  const T *gz;                  /* like Z */
  T *dgx, *dgh;                 /* [T,B,GH]: pre-activation grads (dgh: as w_hh sees them; dgx but for GRU) */
  T *dgs;                       /* [B,GH]: this step's dgh rows, zeros for finished sequences */
  T *dh, *dc;                   /* [B,H]: grads of the state after the step (before it, once carried) */
  const T *prod;                /* [B,H]: dgs w_hh */
};

template <class T> KILN_EL int64_t length_of(const layer<T> &L, int64_t b) { return L.len ? L.len[b] : L.T_; }
template <class T> KILN_EL int64_t time_of(const layer<T> &L, int64_t s, int64_t b) {
  return L.reverse ? length_of(L, b) - 1 - s : s;
}
template <class T> KILN_EL int64_t prev_time(const layer<T> &L, int64_t t) { return L.reverse ? t + 1 : t - 1; }

/* Unit j of the state before step s (time t) of sequence b: h0 at s = 0, else the previous output. */
template <class T> KILN_EL T h_before(const layer<T> &L, int64_t s, int64_t b, int64_t t, int64_t j) {
  if (s == 0) return L.h0 ? L.h0[b * L.H + j] : (T)0;
  return L.z[(prev_time(L, t) * L.B + b) * L.H + j];
}
template <class T> KILN_EL T c_before(const layer<T> &L, int64_t s, int64_t b, int64_t t, int64_t j) {
  if (s == 0) return L.c0 ? L.c0[b * L.H + j] : (T)0;
  return L.res[(prev_time(L, t) * L.B + b) * L.RS * L.H + 4 * L.H + j];
}

/* ---- forward: unit j; xp, hh at the unit's first gate (gates H apart), bh the gates' b_hh ---- */

template <class T>
KILN_EL void lstm_forward(int64_t H, const T *xp, const T *hh, const T *bh, T *c, T *res, T *ho, T *y) {
  T i = sigmoid<T>(xp[0] + hh[0] + bh[0]);
  T f = sigmoid<T>(xp[H] + hh[H] + bh[1]);
  T g = th<T>(xp[2 * H] + hh[2 * H] + bh[2]);
  T o = sigmoid<T>(xp[3 * H] + hh[3 * H] + bh[3]);
  T cn = f * c[0] + i * g;
  T hn = o * th<T>(cn);
  res[0] = i; res[H] = f; res[2 * H] = g; res[3 * H] = o; res[4 * H] = cn;
  c[0] = cn; ho[0] = hn; y[0] = hn;
}

template <class T>
KILN_EL void gru_forward(int64_t H, const T *xp, const T *hh, const T *bh, T hp, T *res, T *ho, T *y) {
  T r = sigmoid<T>(xp[0] + hh[0] + bh[0]);
  T zg = sigmoid<T>(xp[H] + hh[H] + bh[1]);
  T hn = hh[2 * H] + bh[2];
  T nn = th<T>(xp[2 * H] + r * hn);
  T h = ((T)1 - zg) * nn + zg * hp;
  res[0] = r; res[H] = zg; res[2 * H] = nn; res[3 * H] = hn;
  ho[0] = h; y[0] = h;
}

template <class T> KILN_EL void plain_forward(int relu, const T *xp, const T *hh, const T *bh, T *ho, T *y) {
  T p = xp[0] + hh[0] + bh[0];
  T h = relu ? (p > 0 ? p : (T)0) : th<T>(p);
  ho[0] = h; y[0] = h;
}

/* Step s, sequence b, unit j (rnn_step_kernel): the gates, or past the sequence's end the
   state carried (its outputs stay the zeros Z was filled with). */
template <class T> KILN_EL void forward_at(const layer<T> &L, int64_t s, int64_t b, int64_t j) {
  int64_t H = L.H, at = b * H + j;
  if (s >= length_of(L, b)) {
    L.hnext[at] = L.h[at];
    return;
  }
  int64_t row = time_of(L, s, b) * L.B + b;
  const T *xp = L.xp + row * L.GH + j, *hh = L.hh + b * L.GH + j;
  T *y = L.z + row * H + j, *res = L.res ? L.res + row * L.RS * H + j : NULL;
  T bh[4] = {0, 0, 0, 0};
  if (L.b_hh)
    for (int64_t g = 0; g * H < L.GH; g++) bh[g] = L.b_hh[g * H + j];
  if (L.mode == LSTM) lstm_forward<T>(H, xp, hh, bh, L.c + at, res, L.hnext + at, y);
  else if (L.mode == GRU) gru_forward<T>(H, xp, hh, bh, L.h[at], res, L.hnext + at, y);
  else plain_forward<T>(L.mode == RELU, xp, hh, bh, L.hnext + at, y);
}

/* ---- backward: unit j; dh, dc at the unit, the grads at its first gate ---- */

template <class T>
KILN_EL void lstm_backward(int64_t H, T gy, const T *res, T cp, T *dh, T *dc, T *dgx, T *dgs) {
  T d = dh[0] += gy;
  T i = res[0], f = res[H], g = res[2 * H], o = res[3 * H], tc = th<T>(res[4 * H]);
  T dct = dc[0] + d * o * ((T)1 - tc * tc);
  T di = dct * g * i * ((T)1 - i), df = dct * cp * f * ((T)1 - f);
  T dg = dct * i * ((T)1 - g * g), dout = d * tc * o * ((T)1 - o);
  dc[0] = dct * f;
  dgx[0] = dgs[0] = di;
  dgx[H] = dgs[H] = df;
  dgx[2 * H] = dgs[2 * H] = dg;
  dgx[3 * H] = dgs[3 * H] = dout;
}

template <class T>
KILN_EL void gru_backward(int64_t H, T gy, const T *res, T hp, T *dh, T *dgx, T *dgh, T *dgs) {
  T d = dh[0] += gy;
  T r = res[0], zg = res[H], nn = res[2 * H], hn = res[3 * H];
  T dn = d * ((T)1 - zg) * ((T)1 - nn * nn);
  T dr = dn * hn * r * ((T)1 - r), dz = d * (hp - nn) * zg * ((T)1 - zg);
  dgx[0] = dgh[0] = dgs[0] = dr;
  dgx[H] = dgh[H] = dgs[H] = dz;
  dgx[2 * H] = dn;
  dgh[2 * H] = dgs[2 * H] = dn * r;
}

template <class T> KILN_EL void plain_backward(int relu, T gy, T y, T *dh, T *dgx, T *dgs) {
  T d = dh[0] += gy;
  T p = relu ? (y > 0 ? d : (T)0) : d * ((T)1 - y * y);
  dgx[0] = dgs[0] = p;
}

/* Step s, sequence b, unit j of the backward (rnn_step_backward_kernel): dh holds the grad of
   the step's output state; the output's own grad is added, the pre-activation grads written to
   dgx, dgh (time rows) and dgs (row b); past the sequence's end dgs is zero. */
template <class T> KILN_EL void backward_at(const layer<T> &L, int64_t s, int64_t b, int64_t j) {
  int64_t H = L.H, GH = L.GH, at = b * H + j;
  T *dgs = L.dgs + b * GH + j;
  if (s >= length_of(L, b)) {
    for (int64_t g = 0; g * H < GH; g++) dgs[g * H] = 0;
    return;
  }
  int64_t t = time_of(L, s, b), row = t * L.B + b;
  T gy = L.gz[row * H + j];
  T *dgx = L.dgx + row * GH + j;
  const T *res = L.res ? L.res + row * L.RS * H + j : NULL;
  if (L.mode == LSTM) lstm_backward<T>(H, gy, res, c_before(L, s, b, t, j), L.dh + at, L.dc + at, dgx, dgs);
  else if (L.mode == GRU) gru_backward<T>(H, gy, res, h_before(L, s, b, t, j), L.dh + at, dgx, L.dgh + row * GH + j, dgs);
  else plain_backward<T>(L.mode == RELU, gy, L.z[row * H + j], L.dh + at, dgx, dgs);
}

/* The grad of the state before step s, unit k of sequence b (rnn_carry_kernel), from prod (its
   dgs row times w_hh); the GRU adds the direct path h = ... + z h_prev. Finished sequences keep
   theirs. */
template <class T> KILN_EL void carry_at(const layer<T> &L, int64_t s, int64_t b, int64_t k) {
  if (s >= length_of(L, b)) return;
  int64_t at = b * L.H + k;
  if (L.mode == GRU) {
    T zg = L.res[(time_of(L, s, b) * L.B + b) * L.RS * L.H + L.H + k];
    L.dh[at] = L.prod[at] + L.dh[at] * zg;
  } else {
    L.dh[at] = L.prod[at];
  }
}

/* Unit k of the state that step (t, b) read, for the grad of w_hh: zero where the sequence has
   no step t. */
template <class T> KILN_EL T hprev_at(const layer<T> &L, int64_t t, int64_t b, int64_t k) {
  int64_t n = length_of(L, b);
  if (t >= n) return (T)0;
  int64_t s = L.reverse ? n - 1 - t : t;
  return h_before(L, s, b, t, k);
}

/* Column q of a [rows, n] matrix summed in row order, in T from 0 (the CPU's bias grads). */
template <class T> KILN_EL T column_sum(const T *m, int64_t rows, int64_t n, int64_t q) {
  T s = 0;
  for (int64_t r = 0; r < rows; r++) s += m[r * n + q];
  return s;
}

}  // namespace kiln_rnn

#endif
