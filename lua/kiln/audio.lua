-- kiln.audio: audio features for speech models (runtime/include/kiln/audio.h).
--   local wave, rate = kiln.audio.load_wav("clip.wav")          -- f32 [samples] in [-1, 1), mono
--   local feats = kiln.audio.log_mel(wave, {sample_rate = rate}) -- [frames, 40]
local core = require "kiln.core"
local ffi, C = core.ffi, core.C
local wrap, raise, is_tensor = core.wrap, core.raise, core.is_tensor

local M = {}

local options, set = core.options, core.set

local function integer(v, what)
  if type(v) ~= "number" or v ~= math.floor(v) then raise(string.format("%s must be an integer, got %s", what, tostring(v))) end
  return v
end

local function wave_arg(w, op)
  if not is_tensor(w) then raise(string.format("%s: wave must be a tensor, got %s", op, type(w))) end
  return w
end

-- load_wav(path) -> wave (f32 [samples], channels mixed down to mono, in [-1, 1)), sample_rate.
-- PCM 8, 16, 24 and 32-bit and float 32 and 64-bit; a malformed file is an error naming the offset.
function M.load_wav(path)
  if type(path) ~= "string" then raise("load_wav: the path must be a string, got " .. type(path)) end
  local rate = ffi.new("int32_t[1]")
  local t = wrap(C.kiln_wav_read(path, rate))
  return t, tonumber(rate[0])
end

-- spectrogram(wave, {n_fft = 400, hop = 160, win = n_fft, log = false, eps = 1e-6}) -> [frames, n_fft/2 + 1]:
-- the power |X_k|^2 of each Hann-windowed frame (log(power + eps) with log = true). No padding:
-- frames = 1 + (samples - n_fft) // hop.
function M.spectrogram(wave, opts)
  opts = options(opts, set("n_fft", "hop", "win", "log", "eps"), "spectrogram")
  wave_arg(wave, "spectrogram")
  local n_fft = integer(opts.n_fft or 400, "spectrogram: n_fft")
  return wrap(C.kiln_spectrogram(wave.p, n_fft, integer(opts.hop or 160, "spectrogram: hop"),
                                 integer(opts.win or n_fft, "spectrogram: win"), opts.log and 1 or 0, opts.eps or 1e-6))
end

-- mel_filterbank({n_mels = 40, n_fft = 400, sample_rate = 16000, f_min = 0, f_max = sample_rate / 2})
-- -> [n_mels, n_fft/2 + 1]: triangular filters on the HTK mel scale, peak 1.
function M.mel_filterbank(opts)
  opts = options(opts, set("n_mels", "n_fft", "sample_rate", "f_min", "f_max"), "mel_filterbank")
  local sr = opts.sample_rate or 16000
  return wrap(C.kiln_mel_filterbank(integer(opts.n_mels or 40, "mel_filterbank: n_mels"),
                                    integer(opts.n_fft or 400, "mel_filterbank: n_fft"), sr, opts.f_min or 0,
                                    opts.f_max or sr / 2))
end

-- log_mel(wave, {sample_rate = 16000, n_fft = 400, hop = 160, win = n_fft, n_mels = 40, f_min = 0,
--                f_max = sample_rate / 2, eps = 1e-6}) -> [frames, n_mels]: log(filterbank @ power + eps).
function M.log_mel(wave, opts)
  opts = options(opts, set("sample_rate", "n_fft", "hop", "win", "n_mels", "f_min", "f_max", "eps"), "log_mel")
  wave_arg(wave, "log_mel")
  local sr = opts.sample_rate or 16000
  local n_fft = integer(opts.n_fft or 400, "log_mel: n_fft")
  return wrap(C.kiln_log_mel(wave.p, sr, n_fft, integer(opts.hop or 160, "log_mel: hop"), integer(opts.win or n_fft, "log_mel: win"),
                             integer(opts.n_mels or 40, "log_mel: n_mels"), opts.f_min or 0, opts.f_max or sr / 2,
                             opts.eps or 1e-6))
end

return M
