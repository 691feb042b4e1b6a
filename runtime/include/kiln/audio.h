/* kiln/audio.h: audio features for speech models: a WAV reader, a real FFT of any length, the
   power spectrogram and the log-mel spectrogram of a waveform. All on the CPU. */
#ifndef KILN_AUDIO_H
#define KILN_AUDIO_H
#include <stdint.h>

struct kiln_tensor;

/* Reads a RIFF/WAVE file: PCM 8-bit (unsigned), 16, 24 or 32-bit, or IEEE float 32 or 64-bit
   (WAVE_FORMAT_EXTENSIBLE with those subformats too); channels are mixed down to one (their mean).
   Returns a CPU f32 tensor [samples], integer formats scaled to [-1, 1), and writes the sample
   rate to *sample_rate. Every chunk is checked against the file: a truncated or malformed file is
   an error naming the file and the byte offset. */
struct kiln_tensor *kiln_wav_read(const char *path, int32_t *sample_rate);

/* The discrete Fourier transform of n real values (n >= 1, any length: mixed radix, factors 2,
   3, 4, 5 and a plain DFT for larger primes): out[2k], out[2k+1] = the real and imaginary parts of
   X_k = sum_j x_j exp(-2 pi i j k / n), k = 0..n/2. Returns a status. */
int kiln_rfft(int64_t n, const double *x, double *out);

/* wave: a 1-d f32 or f64 CPU tensor. Frame f covers samples [f*hop, f*hop + n_fft); it is
   multiplied by a periodic Hann window of win samples (1 <= win <= n_fft) centred in the frame,
   zero outside it. No padding: frames = 1 + (samples - n_fft) / hop, none when the wave is shorter
   than n_fft. Returns the power |X_k|^2 as f32 [frames, n_fft/2 + 1], or log(power + eps) when
   log is set (eps > 0). */
struct kiln_tensor *kiln_spectrogram(const struct kiln_tensor *wave, int64_t n_fft, int64_t hop, int64_t win, int log,
                                     double eps);

/* The triangular mel filterbank, f32 [n_mels, n_fft/2 + 1], on the HTK mel scale
   mel(f) = 2595 log10(1 + f / 700): n_mels + 2 points equally spaced in mel from f_min to f_max
   (0 <= f_min < f_max <= sample_rate / 2); filter m rises from point m to 1 at point m+1 and falls
   to 0 at point m+2, over the frequencies k * sample_rate / n_fft of the bins (no area
   normalisation: torchaudio's melscale_fbanks with mel_scale="htk", norm=None). */
struct kiln_tensor *kiln_mel_filterbank(int64_t n_mels, int64_t n_fft, double sample_rate, double f_min, double f_max);

/* log(filterbank @ power + eps) of every frame of kiln_spectrogram: f32 [frames, n_mels]. */
struct kiln_tensor *kiln_log_mel(const struct kiln_tensor *wave, double sample_rate, int64_t n_fft, int64_t hop,
                                 int64_t win, int64_t n_mels, double f_min, double f_max, double eps);

#endif
