/* audio.c: audio features (kiln/audio.h): the WAV reader, a mixed-radix FFT, power and log-mel
   spectrograms. Frames are transformed in parallel by kiln's thread pool; the arithmetic is double. */
#include "internal.h"
#include <unistd.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- WAV ---- */

static uint32_t le32(const unsigned char *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint16_t le16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* The four characters of a chunk id, printable. */
static const char *chunk_name(const unsigned char *p) {
  static _Thread_local char buf[8];
  for (int i = 0; i < 4; i++) buf[i] = p[i] >= 32 && p[i] < 127 ? (char)p[i] : '?';
  buf[4] = 0;
  return buf;
}

enum { WAV_PCM = 1, WAV_FLOAT = 3, WAV_EXTENSIBLE = 0xFFFE };

static struct kiln_tensor *wav_decode(const char *path, const unsigned char *b, int64_t size, int32_t *rate) {
  const char *op = "wav_read";
  if (size < 12 || memcmp(b, "RIFF", 4) != 0 || memcmp(b + 8, "WAVE", 4) != 0) {
    kiln_fail(KILN_ERR_FORMAT, "%s: %s: not a WAV file: offset 0 should hold \"RIFF\" and offset 8 \"WAVE\" (%lld bytes)", op,
              path, (long long)size);
    return NULL;
  }
  int64_t end = (int64_t)le32(b + 4) + 8;
  if (end > size) {
    kiln_fail(KILN_ERR_FORMAT, "%s: %s: truncated: the RIFF size at offset 4 says %lld bytes, the file has %lld", op, path,
              (long long)end, (long long)size);
    return NULL;
  }
  const unsigned char *fmt = NULL, *data = NULL;
  int64_t fmt_size = 0, data_size = 0, fmt_at = 0, data_at = 0;
  for (int64_t at = 12; at < end;) {
    if (end - at < 8) {
      kiln_fail(KILN_ERR_FORMAT, "%s: %s: truncated chunk header at offset %lld (%lld bytes left of the RIFF chunk)", op, path,
                (long long)at, (long long)(end - at));
      return NULL;
    }
    int64_t n = le32(b + at + 4);
    if (n > end - at - 8) {
      kiln_fail(KILN_ERR_FORMAT, "%s: %s: chunk \"%s\" at offset %lld has size %lld, past the end of the RIFF chunk at %lld",
                op, path, chunk_name(b + at), (long long)at, (long long)n, (long long)end);
      return NULL;
    }
    if (memcmp(b + at, "fmt ", 4) == 0 && !fmt) { fmt = b + at + 8; fmt_size = n; fmt_at = at; }
    else if (memcmp(b + at, "data", 4) == 0 && !data) { data = b + at + 8; data_size = n; data_at = at; }
    at += 8 + n + (n & 1);   /* chunks are padded to an even size */
  }
  if (!fmt || !data) {
    kiln_fail(KILN_ERR_FORMAT, "%s: %s: no \"%s\" chunk", op, path, fmt ? "data" : "fmt ");
    return NULL;
  }
  if (fmt_size < 16) {
    kiln_fail(KILN_ERR_FORMAT, "%s: %s: the \"fmt \" chunk at offset %lld has %lld bytes (expected at least 16)", op, path,
              (long long)fmt_at, (long long)fmt_size);
    return NULL;
  }
  int tag = le16(fmt), channels = le16(fmt + 2), bits = le16(fmt + 14), align = le16(fmt + 12);
  int64_t sample_rate = le32(fmt + 4);
  if (tag == WAV_EXTENSIBLE) {
    if (fmt_size < 40) {
      kiln_fail(KILN_ERR_FORMAT, "%s: %s: the extensible \"fmt \" chunk at offset %lld has %lld bytes (expected 40)", op, path,
                (long long)fmt_at, (long long)fmt_size);
      return NULL;
    }
    tag = le16(fmt + 24);   /* the first two bytes of the subformat GUID */
  }
  int ok = (tag == WAV_PCM && (bits == 8 || bits == 16 || bits == 24 || bits == 32)) || (tag == WAV_FLOAT && (bits == 32 || bits == 64));
  if (!ok) {
    kiln_fail(KILN_ERR_FORMAT, "%s: %s: unsupported encoding at offset %lld: format %d with %d bits (expected PCM 8, 16, 24 or "
              "32 bits, or float 32 or 64 bits)", op, path, (long long)fmt_at + 8, tag, bits);
    return NULL;
  }
  if (channels < 1 || sample_rate < 1 || sample_rate > INT32_MAX || align != channels * bits / 8) {
    kiln_fail(KILN_ERR_FORMAT, "%s: %s: bad \"fmt \" chunk at offset %lld: %d channels, rate %lld, block align %d (expected "
              "channels * %d bits / 8 = %d)", op, path, (long long)fmt_at, channels, (long long)sample_rate, align, bits,
              channels * bits / 8);
    return NULL;
  }
  if (data_size % align) {
    kiln_fail(KILN_ERR_FORMAT, "%s: %s: the \"data\" chunk at offset %lld has %lld bytes, not a whole number of %d-byte frames",
              op, path, (long long)data_at, (long long)data_size, align);
    return NULL;
  }
  int64_t frames = data_size / align;
  struct kiln_tensor *out = kiln_tensor_empty(1, &frames, KILN_F32, (struct kiln_device){KILN_CPU, 0});
  if (!out) return NULL;
  float *y = kiln_tensor_data(out);
  int bytes = bits / 8;
  for (int64_t f = 0; f < frames; f++) {
    double s = 0;
    for (int c = 0; c < channels; c++) {
      const unsigned char *p = data + f * align + c * bytes;
      double v;
      if (tag == WAV_FLOAT) {
        if (bits == 32) { float x; memcpy(&x, p, 4); v = x; }
        else { double x; memcpy(&x, p, 8); v = x; }
      } else if (bits == 8) v = (p[0] - 128) / 128.0;
      else if (bits == 16) v = (int16_t)le16(p) / 32768.0;
      else if (bits == 24) v = (double)((int32_t)((uint32_t)p[0] << 8 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 24) >> 8) / 8388608.0;
      else v = (int32_t)le32(p) / 2147483648.0;
      s += v;
    }
    y[f] = (float)(s / channels);
  }
  *rate = (int32_t)sample_rate;
  return out;
}

KILN_API struct kiln_tensor *kiln_wav_read(const char *path, int32_t *sample_rate) {
  if (!path || !sample_rate) { kiln_fail(KILN_ERR_ARGUMENT, "wav_read: no path or no sample_rate given"); return NULL; }
  int fd = kiln_open_regular("wav_read", path, NULL);
  if (fd < 0) return NULL;
  FILE *f = fdopen(fd, "rb");
  if (!f) { kiln_fail(KILN_ERR_IO, "wav_read: %s: cannot open: %s", path, strerror(errno)); close(fd); return NULL; }
  unsigned char *buf = NULL;
  long size = -1;
  if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
  if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
    kiln_fail(KILN_ERR_IO, "wav_read: %s: cannot find the file's size: %s", path, strerror(errno));
    fclose(f);
    return NULL;
  }
  struct kiln_tensor *out = NULL;
  if (!(buf = malloc((size_t)size + 1))) kiln_fail(KILN_ERR_MEMORY, "wav_read: %s: out of memory for %ld bytes", path, size);
  else if (fread(buf, 1, (size_t)size, f) != (size_t)size) kiln_fail(KILN_ERR_IO, "wav_read: %s: read error", path);
  else out = wav_decode(path, buf, size, sample_rate);
  free(buf);
  fclose(f);
  return out;
}

/* ---- FFT ---- */

/* A complex FFT of one size: its factors and the twiddles exp(-2 pi i j / n). */
struct fft_plan {
  int64_t n, nf, factors[64];
  double *tw;   /* 2n: re, im */
};

static int fft_plan_init(struct fft_plan *p, int64_t n) {
  p->n = n; p->nf = 0;
  for (int64_t m = n; m > 1;) {
    int64_t f = m % 4 == 0 ? 4 : m % 2 == 0 ? 2 : m % 3 == 0 ? 3 : m % 5 == 0 ? 5 : 0;
    if (!f) for (f = 7; f * f <= m && m % f; f += 2) {}
    if (f * f > m) f = m;
    p->factors[p->nf++] = f;
    m /= f;
  }
  p->tw = malloc(sizeof(double) * 2 * (size_t)n);
  if (!p->tw) return kiln_fail(KILN_ERR_MEMORY, "fft: out of memory for the twiddles of size %lld", (long long)n);
  for (int64_t j = 0; j < n; j++) {
    double a = -2 * M_PI * (double)j / (double)n;
    p->tw[2 * j] = cos(a); p->tw[2 * j + 1] = sin(a);
  }
  return KILN_OK;
}

/* out[k] (k < n, n the product of the factors from level on) = the DFT of in[0], in[stride], ...:
   decimation in time, r sub-transforms of size m = n / r, then radix-r butterflies. t: 2r doubles
   of scratch (a level uses it after its sub-transforms are done). */
static void fft_rec(const struct fft_plan *p, const double *in, double *out, int64_t stride, int level, double *t) {
  int64_t n = 1;
  for (int k = level; k < p->nf; k++) n *= p->factors[k];
  if (n == 1) { out[0] = in[0]; out[1] = in[1]; return; }
  int64_t r = p->factors[level], m = n / r, tstep = p->n / n;
  for (int64_t q = 0; q < r; q++) fft_rec(p, in + 2 * q * stride, out + 2 * q * m, stride * r, level + 1, t);
  for (int64_t k = 0; k < m; k++) {
    /* t[q] = input q of this butterfly, twiddled: out[q m + k] w_n^(q k) */
    for (int64_t q = 0; q < r; q++) {
      const double *a = out + 2 * (q * m + k), *w = p->tw + 2 * ((q * k * tstep) % p->n);
      t[2 * q] = a[0] * w[0] - a[1] * w[1];
      t[2 * q + 1] = a[0] * w[1] + a[1] * w[0];
    }
    for (int64_t u = 0; u < r; u++) {
      double re = 0, im = 0;
      for (int64_t q = 0; q < r; q++) {
        const double *w = p->tw + 2 * (((q * u) % r) * m * tstep);   /* w_r^(q u) */
        re += t[2 * q] * w[0] - t[2 * q + 1] * w[1];
        im += t[2 * q] * w[1] + t[2 * q + 1] * w[0];
      }
      out[2 * (u * m + k)] = re; out[2 * (u * m + k) + 1] = im;
    }
  }
}

enum { RFFT_WORK = 6 };   /* doubles of work per point: the complex input, the result, the butterflies' scratch */

/* x (n reals) -> out (n/2 + 1 complex), with RFFT_WORK * n doubles of work. */
static void rfft_with(const struct fft_plan *p, const double *x, double *out, double *work) {
  int64_t n = p->n;
  double *in = work, *res = work + 2 * n, *t = work + 4 * n;
  for (int64_t j = 0; j < n; j++) { in[2 * j] = x[j]; in[2 * j + 1] = 0; }
  fft_rec(p, in, res, 1, 0, t);
  memcpy(out, res, sizeof(double) * 2 * (size_t)(n / 2 + 1));
}

KILN_API int kiln_rfft(int64_t n, const double *x, double *out) {
  if (n < 1 || n > (1 << 30) || !x || !out)
    return kiln_fail(KILN_ERR_ARGUMENT, "rfft: n = %lld (expected 1 to 2^30, with x and out given)", (long long)n);
  struct fft_plan p;
  if (fft_plan_init(&p, n)) return kiln_error_code();
  double *work = malloc(sizeof(double) * RFFT_WORK * (size_t)n);
  int rc = KILN_OK;
  if (work) rfft_with(&p, x, out, work);
  else rc = kiln_fail(KILN_ERR_MEMORY, "rfft: out of memory for size %lld", (long long)n);
  free(work); free(p.tw);
  return rc;
}

/* ---- spectrograms ---- */

struct spec_job {
  const struct fft_plan *plan;
  const double *wave;     /* the samples, as double */
  const double *window;   /* n_fft: the Hann window, centred, zero around */
  const float *fb;        /* [n_mels, bins] or NULL */
  int64_t hop, bins, n_mels;
  int log;
  double eps;
  float *out;             /* [frames, bins] or [frames, n_mels] */
  int failed;
};

static void spec_frames(void *ctx, int64_t begin, int64_t end) {
  struct spec_job *j = ctx;
  int64_t n = j->plan->n, bins = j->bins;
  double *buf = malloc(sizeof(double) * (size_t)((1 + RFFT_WORK) * n + 3 * bins + 2));
  if (!buf) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); return; }
  double *frame = buf, *work = buf + n, *spec = work + RFFT_WORK * n, *power = spec + 2 * (bins + 1);
  for (int64_t f = begin; f < end; f++) {
    const double *x = j->wave + f * j->hop;
    for (int64_t i = 0; i < n; i++) frame[i] = x[i] * j->window[i];
    rfft_with(j->plan, frame, spec, work);
    for (int64_t k = 0; k < bins; k++) power[k] = spec[2 * k] * spec[2 * k] + spec[2 * k + 1] * spec[2 * k + 1];
    if (!j->fb) {
      float *o = j->out + f * bins;
      for (int64_t k = 0; k < bins; k++) o[k] = (float)(j->log ? log(power[k] + j->eps) : power[k]);
    } else {
      float *o = j->out + f * j->n_mels;
      for (int64_t m = 0; m < j->n_mels; m++) {
        const float *w = j->fb + m * bins;
        double s = 0;
        for (int64_t k = 0; k < bins; k++) s += w[k] * power[k];
        o[m] = (float)log(s + j->eps);
      }
    }
  }
  free(buf);
}

static int spec_args(const char *op, const struct kiln_tensor *wave, int64_t n_fft, int64_t hop, int64_t win, double eps) {
  if (kiln_check_live(op, wave)) return kiln_error_code();
  if (wave->ndim != 1 || (wave->dtype != KILN_F32 && wave->dtype != KILN_F64) || wave->device.type != KILN_CPU)
    return kiln_fail(KILN_ERR_SHAPE, "%s: wave %s %s on %s (expected a 1-d f32 or f64 tensor on the cpu)", op,
                     kiln_shape_string(wave), kiln_dtype_name(wave->dtype), kiln_device_name(wave->device));
  if (n_fft < 1 || hop < 1 || win < 1 || win > n_fft || n_fft > (1 << 24))
    return kiln_fail(KILN_ERR_ARGUMENT, "%s: n_fft = %lld, hop = %lld, win = %lld (expected n_fft >= 1, hop >= 1, 1 <= win <= n_fft)",
                     op, (long long)n_fft, (long long)hop, (long long)win);
  if (!(eps > 0)) return kiln_fail(KILN_ERR_ARGUMENT, "%s: eps = %g must be > 0", op, eps);
  return KILN_OK;
}

/* The frames of wave transformed into a new f32 [frames, bins or n_mels] tensor; fb as in spec_job. */
static struct kiln_tensor *spectrum(const char *op, const struct kiln_tensor *wave, int64_t n_fft, int64_t hop, int64_t win,
                                    int log, double eps, const struct kiln_tensor *fb) {
  int64_t len = wave->numel, frames = len < n_fft ? 0 : 1 + (len - n_fft) / hop, bins = n_fft / 2 + 1;
  int64_t sizes[2] = {frames, fb ? fb->sizes[0] : bins};
  struct kiln_tensor *out = kiln_tensor_empty(2, sizes, KILN_F32, (struct kiln_device){KILN_CPU, 0});
  struct kiln_tensor *w64 = kiln_to_dtype(wave, KILN_F64), *wc = w64 ? kiln_contiguous(w64) : NULL;
  struct fft_plan plan = {0};
  double *window = malloc(sizeof(double) * (size_t)n_fft);
  if (!out || !wc || !window || fft_plan_init(&plan, n_fft)) {
    if (!window) kiln_fail(KILN_ERR_MEMORY, "%s: out of memory for a window of %lld", op, (long long)n_fft);
    kiln_tensor_release(out); out = NULL;
    goto done;
  }
  /* periodic Hann of win samples, centred in the frame as torch.stft places a shorter window */
  int64_t left = (n_fft - win) / 2;
  for (int64_t i = 0; i < n_fft; i++) {
    int64_t k = i - left;
    window[i] = k >= 0 && k < win ? 0.5 - 0.5 * cos(2 * M_PI * (double)k / (double)win) : 0;
  }
  struct spec_job j = {.plan = &plan, .wave = kiln_tensor_data(wc), .window = window, .fb = fb ? kiln_tensor_data(fb) : NULL,
                       .hop = hop, .bins = bins, .n_mels = fb ? fb->sizes[0] : 0, .log = log, .eps = eps,
                       .out = kiln_tensor_data(out)};
  if (frames) kiln_parallel_for(frames, 8, spec_frames, &j);
  if (j.failed) {
    kiln_fail(KILN_ERR_MEMORY, "%s: out of memory for the frames of wave %s", op, kiln_shape_string(wave));
    kiln_tensor_release(out); out = NULL;
  }
done:
  free(window); free(plan.tw);
  kiln_tensor_release(w64); kiln_tensor_release(wc);
  return out;
}

KILN_API struct kiln_tensor *kiln_spectrogram(const struct kiln_tensor *wave, int64_t n_fft, int64_t hop, int64_t win, int log,
                                              double eps) {
  if (spec_args("spectrogram", wave, n_fft, hop, win, log ? eps : 1)) return NULL;
  return spectrum("spectrogram", wave, n_fft, hop, win, log, eps, NULL);
}

static double hz_to_mel(double f) { return 2595.0 * log10(1.0 + f / 700.0); }
static double mel_to_hz(double m) { return 700.0 * (pow(10.0, m / 2595.0) - 1.0); }

KILN_API struct kiln_tensor *kiln_mel_filterbank(int64_t n_mels, int64_t n_fft, double sample_rate, double f_min, double f_max) {
  const char *op = "mel_filterbank";
  if (n_mels < 1 || n_fft < 1 || !(sample_rate > 0) || !(f_min >= 0) || !(f_max > f_min) || f_max > sample_rate / 2) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: n_mels = %lld, n_fft = %lld, sample_rate = %g, f_min = %g, f_max = %g (expected n_mels, "
              "n_fft >= 1 and 0 <= f_min < f_max <= sample_rate / 2)", op, (long long)n_mels, (long long)n_fft, sample_rate,
              f_min, f_max);
    return NULL;
  }
  int64_t bins = n_fft / 2 + 1, sizes[2] = {n_mels, bins};
  struct kiln_tensor *fb = kiln_tensor_empty(2, sizes, KILN_F32, (struct kiln_device){KILN_CPU, 0});
  double *pts = malloc(sizeof(double) * (size_t)(n_mels + 2));
  if (!fb || !pts) {
    if (!pts) kiln_fail(KILN_ERR_MEMORY, "%s: out of memory for %lld mel points", op, (long long)n_mels);
    kiln_tensor_release(fb); free(pts);
    return NULL;
  }
  double m0 = hz_to_mel(f_min), m1 = hz_to_mel(f_max);
  for (int64_t i = 0; i < n_mels + 2; i++) pts[i] = mel_to_hz(m0 + (m1 - m0) * (double)i / (double)(n_mels + 1));
  float *w = kiln_tensor_data(fb);
  for (int64_t m = 0; m < n_mels; m++)
    for (int64_t k = 0; k < bins; k++) {
      double f = (double)k * sample_rate / (double)n_fft;
      double up = (f - pts[m]) / (pts[m + 1] - pts[m]), down = (pts[m + 2] - f) / (pts[m + 2] - pts[m + 1]);
      double v = up < down ? up : down;
      w[m * bins + k] = (float)(v > 0 ? v : 0);
    }
  free(pts);
  return fb;
}

KILN_API struct kiln_tensor *kiln_log_mel(const struct kiln_tensor *wave, double sample_rate, int64_t n_fft, int64_t hop,
                                          int64_t win, int64_t n_mels, double f_min, double f_max, double eps) {
  if (spec_args("log_mel", wave, n_fft, hop, win, eps)) return NULL;
  struct kiln_tensor *fb = kiln_mel_filterbank(n_mels, n_fft, sample_rate, f_min, f_max);
  if (!fb) return NULL;
  struct kiln_tensor *out = spectrum("log_mel", wave, n_fft, hop, win, 1, eps, fb);
  kiln_tensor_release(fb);
  return out;
}
