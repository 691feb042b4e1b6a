/* test_audio.c: kiln/audio.h: the FFT against a naive DFT for many lengths (powers of two, mixed
   radix, primes), the spectrogram of a sine against the expected bin, the mel filterbank against
   the HTK formula, and the WAV reader on files written here, good and broken (run under ASan too). */
#include "check.h"
#include <unistd.h>

static void test_fft(void) {
  static const int64_t sizes[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16, 25, 49, 60, 64, 97, 100, 210, 256, 400, 401, 512, 802, 1000};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    int64_t n = sizes[i];
    double *x = malloc(sizeof(double) * (size_t)n), *got = malloc(sizeof(double) * (size_t)(n + 2));
    double *want = malloc(sizeof(double) * (size_t)(n + 2));
    for (int64_t j = 0; j < n; j++) x[j] = sin(0.37 * (double)(j * j % 17)) + 0.1 * (double)(j % 5);
    for (int64_t k = 0; k <= n / 2; k++) {
      long double re = 0, im = 0;
      for (int64_t j = 0; j < n; j++) {
        long double a = -2.0L * 3.14159265358979323846264338327950288L * (long double)((j * k) % n) / (long double)n;
        re += x[j] * cosl(a); im += x[j] * sinl(a);
      }
      want[2 * k] = (double)re; want[2 * k + 1] = (double)im;
    }
    CHECK(kiln_rfft(n, x, got) == 0);
    check_arrays(got, want, 2 * (n / 2 + 1), 1e-10 * (double)n, 0, "rfft against the naive DFT", __FILE__, __LINE__);
    free(x); free(got); free(want);
  }
  double x = 1, out[2];
  CHECK_ERR(kiln_rfft(0, &x, out), "rfft: n = 0");
}

static void test_spectrogram_sine(void) {
  /* 16 kHz, 1 kHz sine: with n_fft = 400 the bins are 40 Hz apart, the peak is bin 25 */
  int64_t n = 16000;
  double *w = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) w[i] = 0.5 * sin(2 * M_PI * 1000 * (double)i / 16000);
  struct kiln_tensor *wave = T(1, &n, w, KILN_F32);
  struct kiln_tensor *s = kiln_spectrogram(wave, 400, 160, 400, 0, 1);
  CHECK(same_sizes(s, 2, (int64_t[]){1 + (16000 - 400) / 160, 201}));
  double *v = V(s);
  int bad = 0;
  for (int64_t f = 0; f < s->sizes[0]; f++) {
    int64_t best = 0;
    for (int64_t k = 1; k < 201; k++) if (v[f * 201 + k] > v[f * 201 + best]) best = k;
    bad += best != 25;
  }
  CHECK(bad == 0);
  /* Parseval for a Hann-windowed sine at an exact bin: |X_25|^2 = (A n / 4)^2 for the window's 0.5 gain */
  CHECK_NEAR(v[25], pow(0.5 * 400 / 4, 2), 1e-2 * pow(0.5 * 400 / 4, 2));
  free(v);
  struct kiln_tensor *lm = kiln_log_mel(wave, 16000, 400, 160, 400, 40, 0, 8000, 1e-6);
  CHECK(same_sizes(lm, 2, (int64_t[]){s->sizes[0], 40}));
  kiln_tensor_release(lm);
  kiln_tensor_release(s);
  CHECK_ERR(kiln_spectrogram(wave, 400, 0, 400, 0, 1), "spectrogram: n_fft = 400, hop = 0");
  CHECK_ERR(kiln_spectrogram(wave, 400, 160, 500, 0, 1), "1 <= win <= n_fft");
  CHECK_ERR(kiln_log_mel(wave, 16000, 400, 160, 400, 40, 0, 9000, 1e-6), "f_max = 9000");
  kiln_tensor_release(wave);
  free(w);
  /* shorter than one frame: no frames */
  int64_t m = 100;
  struct kiln_tensor *tiny = kiln_tensor_full(1, &m, 0.5, KILN_F64, CPU);
  struct kiln_tensor *e = kiln_spectrogram(tiny, 400, 160, 400, 1, 1e-10);
  CHECK(same_sizes(e, 2, (int64_t[]){0, 201}));
  kiln_tensor_release(e); kiln_tensor_release(tiny);
}

static void test_mel(void) {
  struct kiln_tensor *fb = kiln_mel_filterbank(1, 8, 16000, 0, 8000);
  CHECK(same_sizes(fb, 2, (int64_t[]){1, 5}));
  double *v = V(fb);
  double mid = 700 * (pow(10, 2595 * log10(1 + 8000.0 / 700) / 2 / 2595) - 1);   /* the centre, in Hz */
  double want[5] = {0, (8000 - 2000) / (8000 - mid), (8000 - 4000) / (8000 - mid), (8000 - 6000) / (8000 - mid), 0};
  CHECK_ARRAY_NEAR(v, want, 5, 1e-6);
  free(v);
  kiln_tensor_release(fb);
  CHECK_ERR(kiln_mel_filterbank(0, 400, 16000, 0, 8000), "mel_filterbank: n_mels = 0");
}

/* ---- WAV ---- */

static void put16(unsigned char *p, unsigned v) { p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); }
static void put32(unsigned char *p, uint32_t v) { put16(p, v & 0xFFFF); put16(p + 2, v >> 16); }

/* A WAV of n frames in buf (returns its size): tag, channels, bits; samples from vals (as ints or floats). */
static size_t wav_bytes(unsigned char *buf, int tag, int channels, int bits, int n, const double *vals) {
  int bytes = bits / 8, align = channels * bytes;
  uint32_t data = (uint32_t)(n * align);
  memcpy(buf, "RIFF", 4); put32(buf + 4, 36 + data); memcpy(buf + 8, "WAVE", 4);
  memcpy(buf + 12, "fmt ", 4); put32(buf + 16, 16); put16(buf + 20, (unsigned)tag); put16(buf + 22, (unsigned)channels);
  put32(buf + 24, 8000); put32(buf + 28, 8000u * (uint32_t)align); put16(buf + 32, (unsigned)align); put16(buf + 34, (unsigned)bits);
  memcpy(buf + 36, "data", 4); put32(buf + 40, data);
  unsigned char *p = buf + 44;
  for (int i = 0; i < n * channels; i++, p += bytes) {
    if (tag == 3) { float f = (float)vals[i]; memcpy(p, &f, 4); }
    else if (bits == 8) p[0] = (unsigned char)(vals[i] + 128);
    else if (bits == 16) put16(p, (unsigned)(int)vals[i] & 0xFFFF);
    else put32(p, (uint32_t)(int32_t)vals[i]);
  }
  return 44 + data;
}

static const char *write_file(const unsigned char *buf, size_t n) {
  static char path[64];
  snprintf(path, sizeof path, "/tmp/kiln_test_audio_%d.wav", (int)getpid());
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(buf, 1, n, f) != n) abort();
  fclose(f);
  return path;
}

static void test_wav(void) {
  unsigned char buf[256];
  int32_t rate = 0;
  /* 16-bit stereo: mixed down to the mean */
  double v16[6] = {16384, -16384, 32767, 32767, -32768, 0};
  const char *path = write_file(buf, wav_bytes(buf, 1, 2, 16, 3, v16));
  struct kiln_tensor *t = kiln_wav_read(path, &rate);
  CHECK(same_sizes(t, 1, (int64_t[]){3}) && rate == 8000);
  double *v = V(t);
  CHECK_ARRAY_NEAR(v, ((double[]){0, 32767 / 32768.0, -0.5}), 3, 1e-7);
  free(v); kiln_tensor_release(t);
  /* 8-bit unsigned mono, and 32-bit float */
  double v8[3] = {0, 64, -128};
  path = write_file(buf, wav_bytes(buf, 1, 1, 8, 3, v8));
  t = kiln_wav_read(path, &rate);
  v = V(t);
  CHECK_ARRAY_NEAR(v, ((double[]){0, 0.5, -1}), 3, 1e-7);
  free(v); kiln_tensor_release(t);
  double vf[2] = {0.25, -0.75};
  path = write_file(buf, wav_bytes(buf, 3, 1, 32, 2, vf));
  t = kiln_wav_read(path, &rate);
  v = V(t);
  CHECK_ARRAY_NEAR(v, vf, 2, 0);
  free(v); kiln_tensor_release(t);
  /* broken files */
  size_t n = wav_bytes(buf, 1, 1, 16, 3, v16);
  path = write_file(buf, n - 2);
  CHECK_ERR(kiln_wav_read(path, &rate), "truncated: the RIFF size at offset 4 says 50 bytes, the file has 48");
  unsigned char bad[256];
  memcpy(bad, buf, n); put32(bad + 4, (uint32_t)n - 8 - 2); put32(bad + 40, 6);
  path = write_file(bad, n - 2);
  CHECK_ERR(kiln_wav_read(path, &rate), "chunk \"data\" at offset 36 has size 6, past the end of the RIFF chunk at 48");
  memcpy(bad, buf, n); put32(bad + 40, 5); put32(bad + 4, (uint32_t)n - 8 - 1);
  path = write_file(bad, n - 1);
  CHECK_ERR(kiln_wav_read(path, &rate), "the \"data\" chunk at offset 36 has 5 bytes, not a whole number of 2-byte frames");
  memcpy(bad, buf, n); put32(bad + 16, 400);
  path = write_file(bad, n);
  CHECK_ERR(kiln_wav_read(path, &rate), "chunk \"fmt \" at offset 12 has size 400");
  memcpy(bad, buf, n); put16(bad + 34, 12); put16(bad + 32, 2);
  path = write_file(bad, n);
  CHECK_ERR(kiln_wav_read(path, &rate), "unsupported encoding at offset 20: format 1 with 12 bits");
  memcpy(bad, buf, n); memcpy(bad + 8, "AVI ", 4);
  path = write_file(bad, n);
  CHECK_ERR(kiln_wav_read(path, &rate), "not a WAV file");
  memcpy(bad, buf, n); memcpy(bad + 36, "LIST", 4);
  path = write_file(bad, n);
  CHECK_ERR(kiln_wav_read(path, &rate), "no \"data\" chunk");
  /* every truncation of a good file is an error, never a crash */
  int errors = 0;
  for (size_t k = 0; k < n; k++) {
    path = write_file(buf, k);
    struct kiln_tensor *r = kiln_wav_read(path, &rate);
    errors += r == NULL;
    kiln_tensor_release(r);
  }
  CHECK(errors == (int)n);
  unlink(path);
  CHECK_ERR(kiln_wav_read("/nonexistent/x.wav", &rate), "wav_read: /nonexistent/x.wav: cannot open");
}

int main(void) {
  test_fft();
  test_spectrogram_sine();
  test_mel();
  test_wav();
  return check_done("test_audio");
}
