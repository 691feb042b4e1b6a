/* cpu/rnn_impl.h: one recurrent layer for one element type, included by cpu/rnn.c with
   R (float or double), FN(name) (a suffixed name) and DT (the kiln dtype) defined.

   Layout: rows of the time-major buffers are (t, b) = t * B + b. A step s of sequence b works on
   time t = s (forward) or lengths[b] - 1 - s (reverse), and only while s < lengths[b]; the state
   of a sequence past its length is carried unchanged and its outputs there stay zero. */

static inline R FN(sigmoid)(R x) { return (R)1 / ((R)1 + EXP(-x)); }

/* The persistent path's products: y[b][0:n] = sum_k x[b][k] a[k][c] for a matrix a [K][n] that
   stays in the thread's cache, packed once per call in panels of PW columns (panel p holds
   columns p*PW.. for every k, contiguous, zeros past n), so that a step streams it in order;
   NB sequences at a time against one panel (NB x 4 vector accumulators). */
typedef R FN(vec) __attribute__((vector_size(32)));
#define LANES ((int64_t)(32 / sizeof(R)))
#define PW (4 * LANES)

static inline FN(vec) FN(load)(const R *p) { FN(vec) v; memcpy(&v, p, sizeof v); return v; }

static inline int64_t FN(panels)(int64_t n) { return (n + PW - 1) / PW; }

/* Pack a [K][n] matrix whose column c is cols[c][k] (forward: rows of w_hh, read along) as rows
   koff.. of panels KP rows tall, or whose row k is rows + k * ld (backward: a column slice of
   w_hh, read row by row). */
static void FN(pack_cols)(R *packed, int64_t KP, int64_t koff, int64_t K, int64_t n, const R *const *cols) {
  for (int64_t p = 0; p < FN(panels)(n); p++) {
    int64_t c0 = p * PW, m = n - c0 < PW ? n - c0 : PW, k0 = 0;
    R *panel = packed + (p * KP + koff) * PW;
#if defined(__AVX__)
    /* f32 in 8 x 8 blocks transposed in registers: 8 source rows read along, 8 packed rows
       written whole (a scalar loop over this transpose costs several steps of the layer) */
    if (sizeof(R) == 4 && m == PW)
      for (; k0 + 8 <= K; k0 += 8)
        for (int64_t v0 = 0; v0 < PW; v0 += 8)
          transpose8_f32((float *)panel + k0 * PW + v0, PW, (const float *const *)cols + c0 + v0, k0);
#endif
    for (int64_t v = 0; v < PW; v++)
      for (int64_t k = k0; k < K; k++) panel[k * PW + v] = v < m ? cols[c0 + v][k] : 0;
  }
}

static void FN(pack_rows)(R *packed, int64_t K, int64_t n, const R *rows, int64_t ld) {
  for (int64_t k = 0; k < K; k++)
    for (int64_t p = 0; p < FN(panels)(n); p++) {
      R *dst = packed + (p * K + k) * PW;
      int64_t c0 = p * PW, m = n - c0 < PW ? n - c0 : PW;
      memcpy(dst, rows + k * ld + c0, sizeof(R) * (size_t)m);
      for (int64_t v = m; v < PW; v++) dst[v] = 0;
    }
}

/* Panel p of the products for NB sequences, written at y[q] + out (for columns p * PW on). */
static inline __attribute__((always_inline)) void FN(times_block)(const int NB, const R *packed, int64_t K, int64_t n,
                                                                  int64_t p, const R *const *x, R *const *y, int64_t out) {
  const R *ap = packed + p * K * PW;
  FN(vec) acc[4][4] = {{{0}}};
  int64_t k = 0;
  if (NB == 1) {   /* one sequence: a second set of accumulators for odd k hides the FMA latency */
    FN(vec) odd[4] = {{0}};
    for (; k + 2 <= K; k += 2) {
      const R *ak = ap + k * PW;
      R x0 = x[0][k], x1 = x[0][k + 1];
      for (int v = 0; v < 4; v++) {
        acc[0][v] += x0 * FN(load)(ak + v * LANES);
        odd[v] += x1 * FN(load)(ak + PW + v * LANES);
      }
    }
    for (int v = 0; v < 4; v++) acc[0][v] += odd[v];
  }
  for (; k < K; k++) {
    const R *ak = ap + k * PW;
    FN(vec) w0 = FN(load)(ak), w1 = FN(load)(ak + LANES), w2 = FN(load)(ak + 2 * LANES), w3 = FN(load)(ak + 3 * LANES);
    /* the four weight vectors are loaded once for the NB sequences: without this the compiler
       folds a load into every FMA, and the loop waits on the load ports instead of the FMAs */
#if defined(__AVX__)
    __asm__("" : "+x"(w0), "+x"(w1), "+x"(w2), "+x"(w3));
#endif
    for (int q = 0; q < NB; q++) {
      R xv = x[q][k];
      acc[q][0] += xv * w0; acc[q][1] += xv * w1; acc[q][2] += xv * w2; acc[q][3] += xv * w3;
    }
  }
  int64_t c0 = p * PW, m = n - c0 < PW ? n - c0 : PW;
  for (int q = 0; q < NB; q++) {
    R vals[4 * 32 / sizeof(R)];
    memcpy(vals, acc[q], sizeof vals);
    memcpy(y[q] + out, vals, sizeof(R) * (size_t)m);
  }
}

/* ys[q] = xs[q] a for na rows. Panel by panel, each panel against all of them in blocks of 4,
   so that the weights are read once a step whatever the batch (from L2 or further out when they
   do not fit), and a panel is reused from L1 or L2 by the blocks after the first. With span > 0
   (a multiple of PW), column c goes to (c / span) * stride + c % span of ys[q]: the forward's
   gates straight into their places in a row of w_hh h. */
static void FN(times_rows)(const R *packed, int64_t K, int64_t n, int64_t na, const R **xs, R **ys, int64_t span,
                           int64_t stride) {
  for (int64_t p = 0; p < FN(panels)(n); p++) {
    int64_t c0 = p * PW, out = span ? (c0 / span) * stride + c0 % span : c0, q = 0;
    for (; q + 4 <= na; q += 4) FN(times_block)(4, packed, K, n, p, xs + q, ys + q, out);
    if (na - q == 3) FN(times_block)(3, packed, K, n, p, xs + q, ys + q, out);
    else if (na - q == 2) FN(times_block)(2, packed, K, n, p, xs + q, ys + q, out);
    else if (na - q == 1) FN(times_block)(1, packed, K, n, p, xs + q, ys + q, out);
  }
}

struct FN(layer) {
  int mode, reverse, G, RS;
  int padded;                    /* some sequence is shorter than T: rows past its end stay 0 */
  int64_t T, B, I, H, GH;
  const int64_t *len;            /* [B] */
  const R *x, *h0, *c0;          /* h0, c0: [B,H], zeros when the layer has none */
  const R *w_ih, *w_hh, *b_hh;   /* b_hh: zeros when the layer has none */
  R *z, *res;                    /* Z [T+S,B,H]; reserve [T,B,RS*H] */
  R *xp;                         /* forward: [T,B,GH] input projection (b_ih is added in the gates);
                                    NULL when the persistent team folds it into its products */
  const R *b_ih;                 /* zeros when the layer has none */
  const R *zero;                 /* GH zeros */
  R *hh;                         /* [B,GH]: the recurrent products of the current step */
  R *h, *hnext, *c;              /* [B,H] state; hnext: the persistent path's second buffer */
  /* backward */
  const R *gz;
  R *dgx, *dgh;                  /* [T,B,GH] pre-activation grads (dgh: as seen by w_hh; = dgx but for GRU) */
  R *dgs;                        /* [B,GH]: the GEMM path's rows of this step, when dgh has them apart */
  R *dh, *dc, *tmp;              /* [B,H] */
  struct barrier bar;
};

static inline int64_t FN(time)(const struct FN(layer) *L, int64_t s, int64_t b) {
  return L->reverse ? L->len[b] - 1 - s : s;
}
/* The time of the step before s (s > 0). */
static inline int64_t FN(prev_time)(const struct FN(layer) *L, int64_t t) { return L->reverse ? t + 1 : t - 1; }

/* The state before step s of sequence b: h0/c0 at s = 0, else the previous step's output/cell. */
static inline const R *FN(h_before)(const struct FN(layer) *L, int64_t s, int64_t b, int64_t t) {
  return s == 0 ? L->h0 + b * L->H : L->z + (FN(prev_time)(L, t) * L->B + b) * L->H;
}

/* The gate loops over n units, one function each with restrict pointers (at the first unit;
   gates are H apart) so that they vectorise. */
static void FN(lstm_forward)(int64_t H, int64_t n, const R *restrict xp, const R *restrict bi, const R *restrict hh,
                             const R *restrict bh,
                             R *restrict c, R *restrict res, R *restrict ho, R *restrict y) {
#pragma GCC ivdep   /* gate rows are H >= n apart: no overlap */
  for (int64_t j = 0; j < n; j++) {
    R i = FN(sigmoid)(xp[j] + bi[j] + hh[j] + bh[j]);
    R f = FN(sigmoid)(xp[H + j] + bi[H + j] + hh[H + j] + bh[H + j]);
    R g = TANH(xp[2 * H + j] + bi[2 * H + j] + hh[2 * H + j] + bh[2 * H + j]);
    R o = FN(sigmoid)(xp[3 * H + j] + bi[3 * H + j] + hh[3 * H + j] + bh[3 * H + j]);
    R cn = f * c[j] + i * g;
    R hn = o * TANH(cn);
    res[j] = i; res[H + j] = f; res[2 * H + j] = g; res[3 * H + j] = o; res[4 * H + j] = cn;
    c[j] = cn; ho[j] = hn; y[j] = hn;
  }
}

static void FN(gru_forward)(int64_t H, int64_t n, const R *restrict xp, const R *restrict bi, const R *restrict hh,
                            const R *restrict bh,
                            const R *restrict hp, R *restrict res, R *restrict ho, R *restrict y) {
#pragma GCC ivdep   /* gate rows are H >= n apart: no overlap */
  for (int64_t j = 0; j < n; j++) {
    R r = FN(sigmoid)(xp[j] + bi[j] + hh[j] + bh[j]);
    R zg = FN(sigmoid)(xp[H + j] + bi[H + j] + hh[H + j] + bh[H + j]);
    R hn = hh[2 * H + j] + bh[2 * H + j];
    R nn = TANH(xp[2 * H + j] + bi[2 * H + j] + r * hn);
    R h = ((R)1 - zg) * nn + zg * hp[j];
    res[j] = r; res[H + j] = zg; res[2 * H + j] = nn; res[3 * H + j] = hn;
    ho[j] = h; y[j] = h;
  }
}

static void FN(plain_forward)(int relu, int64_t n, const R *restrict xp, const R *restrict bi, const R *restrict hh,
                              const R *restrict bh,
                              R *restrict ho, R *restrict y) {
#pragma GCC ivdep   /* gate rows are H >= n apart: no overlap */
  for (int64_t j = 0; j < n; j++) {
    R p = xp[j] + bi[j] + hh[j] + bh[j];
    R h = relu ? (p > 0 ? p : 0) : TANH(p);
    ho[j] = h; y[j] = h;
  }
}

static void FN(lstm_backward)(int64_t H, int64_t n, const R *restrict gy, const R *restrict res, const R *restrict cp,
                              R *restrict dh, R *restrict dc, R *restrict dgx) {
#pragma GCC ivdep   /* gate rows are H >= n apart: no overlap */
  for (int64_t j = 0; j < n; j++) {
    R d = dh[j] += gy[j];
    R i = res[j], f = res[H + j], g = res[2 * H + j], o = res[3 * H + j], tc = TANH(res[4 * H + j]);
    R dct = dc[j] + d * o * ((R)1 - tc * tc);
    R di = dct * g * i * ((R)1 - i), df = dct * cp[j] * f * ((R)1 - f);
    R dg = dct * i * ((R)1 - g * g), dout = d * tc * o * ((R)1 - o);
    dc[j] = dct * f;
    dgx[j] = di;
    dgx[H + j] = df;
    dgx[2 * H + j] = dg;
    dgx[3 * H + j] = dout;
  }
}

static void FN(gru_backward)(int64_t H, int64_t n, const R *restrict gy, const R *restrict res, const R *restrict hp,
                             R *restrict dh, R *restrict dgx, R *restrict dgh) {
#pragma GCC ivdep   /* gate rows are H >= n apart: no overlap */
  for (int64_t j = 0; j < n; j++) {
    R d = dh[j] += gy[j];
    R r = res[j], zg = res[H + j], nn = res[2 * H + j], hn = res[3 * H + j];
    R dn = d * ((R)1 - zg) * ((R)1 - nn * nn);
    R dr = dn * hn * r * ((R)1 - r), dz = d * (hp[j] - nn) * zg * ((R)1 - zg);
    dgx[j] = dgh[j] = dr;
    dgx[H + j] = dgh[H + j] = dz;
    dgx[2 * H + j] = dn;
    dgh[2 * H + j] = dn * r;
  }
}

static void FN(plain_backward)(int relu, int64_t n, const R *restrict gy, const R *restrict y, R *restrict dh,
                               R *restrict dgx) {
#pragma GCC ivdep   /* gate rows are H >= n apart: no overlap */
  for (int64_t j = 0; j < n; j++) {
    R d = dh[j] += gy[j];
    R p = relu ? (y[j] > 0 ? d : 0) : d * ((R)1 - y[j] * y[j]);
    dgx[j] = p;
  }
}

/* Gates of units [j0, j1) of sequence b at step s: reads hh[b] (w_hh h) and the state in hin[b]
   (and c[b]), writes the new state to hout[b] (another buffer) and c[b], the output to Z and the
   reserve. */
static void FN(cell_forward)(struct FN(layer) *L, int64_t s, int64_t b, int64_t j0, int64_t j1, const R *hin, R *hout) {
  int64_t H = L->H, t = FN(time)(L, s, b), row = t * L->B + b, n = j1 - j0;
  const R *xp = (L->xp ? L->xp + row * L->GH : L->zero) + j0, *bi = L->b_ih + j0, *hh = L->hh + b * L->GH + j0;
  const R *bh = L->b_hh + j0;
  R *y = L->z + row * H + j0, *ho = hout + b * H + j0, *res = L->res ? L->res + row * L->RS * H + j0 : NULL;
  if (L->mode == KILN_RNN_LSTM) FN(lstm_forward)(H, n, xp, bi, hh, bh, L->c + b * H + j0, res, ho, y);
  else if (L->mode == KILN_RNN_GRU) FN(gru_forward)(H, n, xp, bi, hh, bh, hin + b * H + j0, res, ho, y);
  else FN(plain_forward)(L->mode == KILN_RNN_RELU, n, xp, bi, hh, bh, ho, y);
}

/* The grads of units [j0, j1) of sequence b at step s: dh[b] holds the grad of the step's output
   state (the output's grad added here), dc[b] that of its cell. Writes the pre-activation grads
   to dgx and dgh (time rows; dgh is dgx but for the GRU), and dc[b] for
   the step before. */
static void FN(cell_backward)(struct FN(layer) *L, int64_t s, int64_t b, int64_t j0, int64_t j1) {
  int64_t H = L->H, t = FN(time)(L, s, b), row = t * L->B + b, GH = L->GH, n = j1 - j0;
  const R *gy = L->gz + row * H + j0, *res = L->res ? L->res + row * L->RS * H + j0 : NULL;
  R *dh = L->dh + b * H + j0, *dgx = L->dgx + row * GH + j0;
  if (L->mode == KILN_RNN_LSTM) {
    const R *cp = s == 0 ? L->c0 + b * H : L->res + (FN(prev_time)(L, t) * L->B + b) * L->RS * H + 4 * H;
    FN(lstm_backward)(H, n, gy, res, cp + j0, dh, L->dc + b * H + j0, dgx);
  } else if (L->mode == KILN_RNN_GRU) {
    FN(gru_backward)(H, n, gy, res, FN(h_before)(L, s, b, t) + j0, dh, dgx, L->dgh + row * GH + j0);
  } else {
    FN(plain_backward)(L->mode == KILN_RNN_RELU, n, gy, L->z + row * H + j0, dh, dgx);
  }
}

/* The grad of the state before step s for units [k0, k1) of sequence b, from prod[k - k0] (its
   dgh row times w_hh); GRU adds the direct path h = ... + z h_prev. */
static void FN(carry_back)(struct FN(layer) *L, int64_t s, int64_t b, int64_t k0, int64_t k1, const R *prod) {
  R *dh = L->dh + b * L->H;
  if (L->mode == KILN_RNN_GRU) {
    const R *zg = L->res + (FN(time)(L, s, b) * L->B + b) * L->RS * L->H + L->H;
    for (int64_t k = k0; k < k1; k++) dh[k] = prod[k - k0] + dh[k] * zg[k];
  } else {
    for (int64_t k = k0; k < k1; k++) dh[k] = prod[k - k0];
  }
}

/* ---- the GEMM path: one product per step over the batch, then the fused gates ---- */

struct FN(rows) { struct FN(layer) *L; int64_t s; };

static void FN(forward_rows)(void *ctx, int64_t b0, int64_t b1) {
  const struct FN(rows) *r = ctx;
  struct FN(layer) *L = r->L;
  for (int64_t b = b0; b < b1; b++)
    if (r->s < L->len[b]) FN(cell_forward)(L, r->s, b, 0, L->H, L->h, L->hnext);
    else memcpy(L->hnext + b * L->H, L->h + b * L->H, sizeof(R) * (size_t)L->H);   /* past its end: carry */
}

static void FN(backward_rows)(void *ctx, int64_t b0, int64_t b1) {
  const struct FN(rows) *r = ctx;
  struct FN(layer) *L = r->L;
  for (int64_t b = b0; b < b1; b++)
    if (r->s < L->len[b]) FN(cell_backward)(L, r->s, b, 0, L->H);
}

static int64_t FN(row_grain)(const struct FN(layer) *L) {
  int64_t per_row = L->GH * 8;   /* rough work of a row of gates */
  return per_row >= 16384 ? 1 : 16384 / per_row + 1;
}

static void FN(forward_gemm)(struct FN(layer) *L) {
  for (int64_t s = 0; s < L->T; s++) {
    kiln_cpu_gemm_raw(DT, 0, 1, L->B, L->GH, L->H, 1.0, L->h, L->H, L->w_hh, L->H, 0.0, L->hh, L->GH);
    struct FN(rows) r = {L, s};
    kiln_parallel_for(L->B, FN(row_grain)(L), FN(forward_rows), &r);
    R *swap = L->h; L->h = L->hnext; L->hnext = swap;
  }
}

static void FN(backward_gemm)(struct FN(layer) *L) {
  for (int64_t s = L->T - 1; s >= 0; s--) {
    struct FN(rows) r = {L, s};
    kiln_parallel_for(L->B, FN(row_grain)(L), FN(backward_rows), &r);
    /* this step's dgh rows: the B rows of one time, in place (rows past a sequence's end are 0),
       unless reversed sequences of several lengths put them at different times */
    const R *rows = L->dgh + (L->B ? FN(time)(L, s, 0) : 0) * L->B * L->GH;
    if (L->reverse && L->padded) {
      for (int64_t b = 0; b < L->B; b++) {
        R *dst = L->dgs + b * L->GH;
        if (s < L->len[b]) memcpy(dst, L->dgh + (FN(time)(L, s, b) * L->B + b) * L->GH, sizeof(R) * (size_t)L->GH);
        else memset(dst, 0, sizeof(R) * (size_t)L->GH);
      }
      rows = L->dgs;
    }
    kiln_cpu_gemm_raw(DT, 0, 0, L->B, L->H, L->GH, 1.0, rows, L->GH, L->w_hh, L->H, 0.0, L->tmp, L->H);
    for (int64_t b = 0; b < L->B; b++)
      if (s < L->len[b]) FN(carry_back)(L, s, b, 0, L->H, L->tmp + b * L->H);
  }
}

/* ---- the persistent path: each thread of a team owns hidden units [j0, j1) for the whole
   sequence, with its rows of w_hh (forward) or its columns (backward) packed in its own memory ---- */

static void FN(slice)(int64_t H, int id, int nteam, int64_t *j0, int64_t *j1) {
  *j0 = H * id / nteam;
  *j1 = H * (id + 1) / nteam;
}

static void FN(forward_team)(void *ctx, int id, int nteam) {
  struct FN(layer) *L = ctx;
  int64_t j0, j1, H = L->H, G = L->G, B = L->B;
  FN(slice)(H, id, nteam, &j0, &j1);
  int64_t nj = j1 - j0;
  int sense = 0;
  /* rows g*H + j of w_hh for the own units as the columns of a packed [H][G*nj] (and below them
     the same rows of w_ih when the input projection is folded in: [H+I][G*nj] against [h | x]);
     their products [B][G*nj] */
  int64_t nq = G * nj, I = L->xp ? 0 : L->I, K = H + I;
  R *w = malloc(sizeof(R) * (size_t)(FN(panels)(nq) * PW * K + 1));
  const R **cols = malloc(sizeof(R *) * (size_t)(nq + 1));
  R *prod = malloc(sizeof(R) * (size_t)(B * nq + 1));
  R *hx = I ? malloc(sizeof(R) * (size_t)(B * K + 1)) : NULL;
  unsigned char *active = malloc((size_t)B);
  const R **xs = malloc(sizeof(R *) * (size_t)(B + 1));
  R **ys = malloc(sizeof(R *) * (size_t)(B + 1));
  if (!w || !cols || !prod || (I && !hx) || !active || !xs || !ys) __atomic_store_n(&L->bar.failed, 1, __ATOMIC_RELAXED);
  barrier_wait(&L->bar, &sense);
  if (__atomic_load_n(&L->bar.failed, __ATOMIC_RELAXED)) {
    free(w); free(cols); free(prod); free(hx); free(active); free(xs); free(ys);
    return;
  }
  for (int64_t q = 0; q < nq; q++) cols[q] = L->w_hh + ((q / nj) * H + j0 + q % nj) * H;
  FN(pack_cols)(w, K, 0, H, nq, cols);
  if (I) {
    for (int64_t q = 0; q < nq; q++) cols[q] = L->w_ih + ((q / nj) * H + j0 + q % nj) * I;
    FN(pack_cols)(w, K, H, I, nq, cols);
  }
  free(cols);
  R *hcur = L->h, *hnext = L->hnext;
  /* when whole panels fall within one gate, the products go straight to their places in hh
     (gate g of unit j at g * H + j); else through prod */
  int direct = nj % PW == 0;
  for (int64_t s = 0; s < L->T; s++) {
    int64_t na = 0;
    for (int64_t b = 0; b < B; b++) {
      active[b] = s < L->len[b];
      if (!active[b]) continue;
      if (I) {   /* [h | x] of the step */
        memcpy(hx + na * K, hcur + b * H, sizeof(R) * (size_t)H);
        memcpy(hx + na * K + H, L->x + (FN(time)(L, s, b) * B + b) * I, sizeof(R) * (size_t)I);
      }
      xs[na] = I ? hx + na * K : hcur + b * H;
      ys[na] = direct ? L->hh + b * L->GH + j0 : prod + b * nq;
      na++;
    }
    FN(times_rows)(w, K, nq, na, xs, ys, direct ? nj : 0, H);
    for (int64_t b = 0; b < B; b++) {
      if (!active[b]) {   /* past its end: carry the state */
        memcpy(hnext + b * H + j0, hcur + b * H + j0, sizeof(R) * (size_t)nj);
        continue;
      }
      R *hh = L->hh + b * L->GH;
      if (!direct)
        for (int64_t g = 0; g < G; g++) memcpy(hh + g * H + j0, prod + b * nq + g * nj, sizeof(R) * (size_t)nj);
      FN(cell_forward)(L, s, b, j0, j1, hcur, hnext);
    }
    R *swap = hcur; hcur = hnext; hnext = swap;
    barrier_wait(&L->bar, &sense);
  }
  free(w); free(prod); free(hx); free(active); free(xs); free(ys);
}

static void FN(backward_team)(void *ctx, int id, int nteam) {
  struct FN(layer) *L = ctx;
  int64_t j0, j1, H = L->H, GH = L->GH, B = L->B;
  FN(slice)(H, id, nteam, &j0, &j1);
  int64_t nj = j1 - j0;
  int sense = 0;
  /* columns j0..j1 of w_hh, packed [GH][nj]; the products [B][nj] */
  R *wc = malloc(sizeof(R) * (size_t)(FN(panels)(nj) * PW * GH + 1));
  R *prod = malloc(sizeof(R) * (size_t)(B * nj + 1));
  unsigned char *active = malloc((size_t)B);
  const R **xs = malloc(sizeof(R *) * (size_t)(B + 1));
  R **ys = malloc(sizeof(R *) * (size_t)(B + 1));
  if (!wc || !prod || !active || !xs || !ys) __atomic_store_n(&L->bar.failed, 1, __ATOMIC_RELAXED);
  barrier_wait(&L->bar, &sense);
  if (__atomic_load_n(&L->bar.failed, __ATOMIC_RELAXED)) {
    free(wc); free(prod); free(active); free(xs); free(ys);
    return;
  }
  FN(pack_rows)(wc, GH, nj, L->w_hh + j0, H);
  for (int64_t s = L->T - 1; s >= 0; s--) {
    for (int64_t b = 0; b < B; b++) {
      active[b] = s < L->len[b];
      if (active[b]) FN(cell_backward)(L, s, b, j0, j1);
    }
    barrier_wait(&L->bar, &sense);
    /* this step's rows are read where they are in dgh, by time, so that the next step may write
       its own rows while other threads still read these: one barrier per step */
    int64_t na = 0;
    for (int64_t b = 0; b < B; b++)
      if (active[b]) { xs[na] = L->dgh + (FN(time)(L, s, b) * B + b) * GH; ys[na] = prod + b * nj; na++; }
    FN(times_rows)(wc, GH, nj, na, xs, ys, 0, 0);
    for (int64_t b = 0; b < B; b++)
      if (active[b]) FN(carry_back)(L, s, b, j0, j1, prod + b * nj);
  }
  free(wc); free(prod); free(active); free(xs); free(ys);
}

/* ---- the layer ---- */

static int FN(setup)(struct FN(layer) *L, int mode, int reverse, const struct kiln_rnn_tensors *t, R **zeros) {
  L->mode = mode; L->reverse = reverse;
  L->G = kiln_rnn_gates(mode); L->RS = kiln_rnn_reserve(mode);
  L->T = t->x->sizes[0]; L->B = t->x->sizes[1]; L->I = t->x->sizes[2];
  L->H = t->w_hh->sizes[1]; L->GH = L->G * L->H;
  L->x = kiln_tensor_data(t->x);
  L->w_ih = kiln_tensor_data(t->w_ih); L->w_hh = kiln_tensor_data(t->w_hh);
  int64_t nz = L->GH > L->B * L->H ? L->GH : L->B * L->H;
  *zeros = calloc((size_t)nz, sizeof(R));
  int64_t *len = malloc(sizeof(int64_t) * (size_t)(L->B > 0 ? L->B : 1));
  if (!*zeros || !len) { free(len); return kiln_fail(KILN_ERR_MEMORY, "rnn: out of memory"); }
  for (int64_t b = 0; b < L->B; b++) {
    len[b] = t->lengths ? ((const int64_t *)kiln_tensor_data(t->lengths))[b] : L->T;
    if (len[b] < L->T) L->padded = 1;
  }
  L->len = len;
  L->h0 = t->h0 ? kiln_tensor_data(t->h0) : *zeros;
  L->c0 = t->c0 ? kiln_tensor_data(t->c0) : *zeros;
  L->b_hh = t->b_hh ? kiln_tensor_data(t->b_hh) : *zeros;
  L->b_ih = t->b_ih ? kiln_tensor_data(t->b_ih) : *zeros;
  return KILN_OK;
}

static int FN(forward)(const struct kiln_call *c) {
  const struct kiln_rnn_forward *f = c->extra;
  struct FN(layer) L = {0};
  R *zeros = NULL;
  if (FN(setup)(&L, (int)c->ints[0], (int)c->ints[1], &f->t, &zeros)) return kiln_error_code();
  int64_t T = L.T, B = L.B, H = L.H, GH = L.GH;
  L.z = kiln_tensor_data(c->out);
  L.res = f->reserve ? kiln_tensor_data(f->reserve) : NULL;
  /* The persistent team folds the input projection into its products when each weight serves
     enough sequences a step and a panel of [w_hh | w_ih] is small (LSTM and plain
     RNN: a GRU's n gate keeps the two apart) */
  int fold = c->ints[2] == KILN_RNN_PERSISTENT && L.mode != KILN_RNN_GRU && B >= KILN_RNN_FOLD_MIN_BATCH &&
             (H + L.I) * PW * (int64_t)sizeof(R) <= KILN_RNN_FOLD_MAX_PANEL;
  size_t nxp = sizeof(R) * (size_t)(T * B * GH > 0 ? T * B * GH : 1);   /* large: from the block cache */
  L.xp = fold ? NULL : kiln_cpu_alloc(nxp);
  L.zero = zeros;
  L.hh = calloc((size_t)(B * GH > 0 ? B * GH : 1), sizeof(R));
  L.h = malloc(sizeof(R) * (size_t)(B * H > 0 ? B * H : 1));
  L.hnext = malloc(sizeof(R) * (size_t)(B * H > 0 ? B * H : 1));
  L.c = malloc(sizeof(R) * (size_t)(B * H > 0 ? B * H : 1));
  int rc = KILN_OK;
  if ((!fold && !L.xp) || !L.hh || !L.h || !L.hnext || !L.c) {
    rc = kiln_fail(KILN_ERR_MEMORY, "rnn: out of memory for the layer's buffers");
    goto done;
  }
  if (L.padded) memset(L.z, 0, sizeof(R) * (size_t)c->out->numel);   /* else every row is written */
  /* the input projection of every step: one GEMM */
  if (!fold) kiln_cpu_gemm_raw(DT, 0, 1, T * B, GH, L.I, 1.0, L.x, L.I, L.w_ih, L.I, 0.0, L.xp, GH);
  memcpy(L.h, L.h0, sizeof(R) * (size_t)(B * H));
  memcpy(L.c, L.c0, sizeof(R) * (size_t)(B * H));
  if (c->ints[2] == KILN_RNN_PERSISTENT) {
    barrier_init(&L.bar, kiln_parallel_team_size());
    kiln_parallel_team(FN(forward_team), &L);
    if (L.bar.failed) { rc = kiln_fail(KILN_ERR_MEMORY, "rnn: out of memory for the persistent threads' weights"); goto done; }
    /* the team swapped the buffers T times: after an odd count the final state is in hnext */
    if (T % 2) { R *swap = L.h; L.h = L.hnext; L.hnext = swap; }
  } else {
    FN(forward_gemm)(&L);
  }
  memcpy(L.z + T * B * H, L.h, sizeof(R) * (size_t)(B * H));
  if (L.mode == KILN_RNN_LSTM) memcpy(L.z + (T + 1) * B * H, L.c, sizeof(R) * (size_t)(B * H));
done:
  kiln_cpu_free(L.xp, nxp); free(L.hh);
  free(L.h); free(L.hnext); free(L.c);
  free((void *)L.len); free(zeros);
  return rc;
}

/* A large buffer from the block cache, zeroed when some rows will not be written. */
static R *FN(scratch)(size_t nbytes, int zero) {
  R *p = kiln_cpu_alloc(nbytes);
  if (p && zero) memset(p, 0, nbytes);
  return p;
}

static int FN(backward)(const struct kiln_call *c) {
  const struct kiln_rnn_backward *bw = c->extra;
  struct FN(layer) L = {0};
  R *zeros = NULL;
  if (FN(setup)(&L, (int)c->ints[0], (int)c->ints[1], &bw->t, &zeros)) return kiln_error_code();
  int64_t T = L.T, B = L.B, H = L.H, GH = L.GH, I = L.I;
  L.z = kiln_tensor_data(bw->z);
  L.res = bw->reserve ? kiln_tensor_data(bw->reserve) : NULL;
  L.gz = kiln_tensor_data(bw->gz);
  /* the large buffers come from the block cache, zeroed when rows past a sequence's end must stay 0 */
  size_t nbig = sizeof(R) * (size_t)(T * B * GH > 0 ? T * B * GH : 1), nbh = (size_t)(B * H > 0 ? B * H : 1);
  size_t nprev = sizeof(R) * (size_t)(T * B * H > 0 ? T * B * H : 1);
  L.dgx = FN(scratch)(nbig, L.padded);
  L.dgh = L.mode == KILN_RNN_GRU ? FN(scratch)(nbig, L.padded) : L.dgx;
  /* the GEMM path's rows of a step, gathered when reversed sequences of several lengths put them
     at different times (backward_gemm) */
  int gather_rows = c->ints[2] != KILN_RNN_PERSISTENT && L.reverse && L.padded;
  L.dgs = gather_rows ? malloc(sizeof(R) * (size_t)(B * GH)) : NULL;
  L.dh = malloc(sizeof(R) * nbh);
  L.dc = malloc(sizeof(R) * nbh);
  L.tmp = malloc(sizeof(R) * nbh);
  /* the states before each step, for w_hh's grad: gathered only when sequences of several lengths
     scatter them (else they are h0 and the output rows, read in place) */
  int gather = L.padded || T * B == 0;
  R *hprev = bw->gw_hh && gather ? FN(scratch)(nprev, L.padded) : NULL;
  int rc = KILN_OK;
  if (!L.dgx || !L.dgh || (gather_rows && !L.dgs) || !L.dh || !L.dc || !L.tmp || (bw->gw_hh && gather && !hprev)) {
    rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory for the layer's buffers");
    goto done;
  }
  memcpy(L.dh, L.gz + T * B * H, sizeof(R) * (size_t)(B * H));
  if (L.mode == KILN_RNN_LSTM) memcpy(L.dc, L.gz + (T + 1) * B * H, sizeof(R) * (size_t)(B * H));
  else memset(L.dc, 0, sizeof(R) * (size_t)(B * H));
  if (c->ints[2] == KILN_RNN_PERSISTENT) {
    barrier_init(&L.bar, kiln_parallel_team_size());
    kiln_parallel_team(FN(backward_team), &L);
    if (L.bar.failed) { rc = kiln_fail(KILN_ERR_MEMORY, "rnn_backward: out of memory for the persistent threads' weights"); goto done; }
  } else {
    FN(backward_gemm)(&L);
  }
  if (bw->gh0) memcpy(kiln_tensor_data(bw->gh0), L.dh, sizeof(R) * (size_t)(B * H));
  if (bw->gc0) memcpy(kiln_tensor_data(bw->gc0), L.dc, sizeof(R) * (size_t)(B * H));
  if (bw->gx) kiln_cpu_gemm_raw(DT, 0, 0, T * B, I, GH, 1.0, L.dgx, GH, L.w_ih, I, 0.0, kiln_tensor_data(bw->gx), I);
  if (bw->gw_ih) kiln_cpu_gemm_raw(DT, 1, 0, GH, I, T * B, 1.0, L.dgx, GH, L.x, I, 0.0, kiln_tensor_data(bw->gw_ih), I);
  if (bw->gw_hh && !gather) {
    /* rows of the step whose state before is h0 (the first, or the last when reversed), then the
       rest against the outputs of the steps before them */
    R *gw = kiln_tensor_data(bw->gw_hh);
    const R *first = L.reverse ? L.dgh + (T - 1) * B * GH : L.dgh, *rest = L.reverse ? L.dgh : L.dgh + B * GH;
    kiln_cpu_gemm_raw(DT, 1, 0, GH, H, B, 1.0, first, GH, L.h0, H, 0.0, gw, H);
    if (T > 1) kiln_cpu_gemm_raw(DT, 1, 0, GH, H, (T - 1) * B, 1.0, rest, GH, L.reverse ? L.z + B * H : L.z, H, 1.0, gw, H);
  } else if (bw->gw_hh) {
    for (int64_t b = 0; b < B; b++)
      for (int64_t s = 0; s < L.len[b]; s++) {
        int64_t t = FN(time)(&L, s, b);
        memcpy(hprev + (t * B + b) * H, FN(h_before)(&L, s, b, t), sizeof(R) * (size_t)H);
      }
    kiln_cpu_gemm_raw(DT, 1, 0, GH, H, T * B, 1.0, L.dgh, GH, hprev, H, 0.0, kiln_tensor_data(bw->gw_hh), H);
  }
  for (int k = 0; k < 2; k++) {
    struct kiln_tensor *gb = k ? bw->gb_hh : bw->gb_ih;
    if (!gb) continue;
    const R *src = k ? L.dgh : L.dgx;
    R *dst = kiln_tensor_data(gb);
    if (k == 1 && bw->gb_ih && L.dgh == L.dgx) {   /* the same sums as b_ih's */
      memcpy(dst, kiln_tensor_data(bw->gb_ih), sizeof(R) * (size_t)GH);
      continue;
    }
    memset(dst, 0, sizeof(R) * (size_t)GH);
    for (int64_t r = 0; r < T * B; r++)
      for (int64_t q = 0; q < GH; q++) dst[q] += src[r * GH + q];
  }
done:
  if (L.dgh != L.dgx) kiln_cpu_free(L.dgh, nbig);
  kiln_cpu_free(L.dgx, nbig); kiln_cpu_free(hprev, nprev);
  free(L.dgs); free(L.dh); free(L.dc); free(L.tmp);
  free((void *)L.len); free(zeros);
  return rc;
}
