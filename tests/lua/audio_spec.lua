-- kiln.audio: the WAV reader on files written here (and broken ones), spectrograms against a naive
-- DFT written here, a sine's peak bin, the mel filterbank against the HTK formula, and log_mel
-- against the spectrogram times the filterbank.
local kiln = kiln or require "kiln"
local ffi = require "ffi"
local audio = kiln.audio

local function flat(t) return t:contiguous():reshape(-1):totable() end
local function error_of(fn, ...)
  local ok, e = pcall(fn, ...)
  assert(not ok, "expected an error")
  return tostring(e)
end
local function assert_contains(msg, ...)
  for _, part in ipairs({...}) do
    assert(msg:find(part, 1, true), string.format("message %q lacks %q", msg, part))
  end
end
local function assert_near(got, want, tol, what)
  assert(math.abs(got - want) <= tol * (1 + math.abs(want)), string.format("%s: got %.10g, expected %.10g", what or "value", got, want))
end

-- ---- WAV files, byte by byte ----

local function u16(v) v = v % 65536 return string.char(v % 256, math.floor(v / 256)) end
local function u32(v) v = v % 4294967296 return u16(v % 65536) .. u16(math.floor(v / 65536)) end

-- samples: a flat list (interleaved channels); encode(v) gives one sample's bytes
local function wav(tag, channels, bits, rate, samples, encode)
  local data = {}
  for i, v in ipairs(samples) do data[i] = encode(v) end
  data = table.concat(data)
  local align = channels * bits / 8
  local fmt = u16(tag) .. u16(channels) .. u32(rate) .. u32(rate * align) .. u16(align) .. u16(bits)
  local body = "WAVE" .. "fmt " .. u32(#fmt) .. fmt .. "LIST" .. u32(3) .. "abc\0" .. "data" .. u32(#data) .. data
  return "RIFF" .. u32(#body) .. body
end

local path = os.tmpname()
local function write(bytes)
  local f = assert(io.open(path, "wb"))
  f:write(bytes)
  f:close()
  return path
end

describe("kiln.audio.load_wav", function()
  teardown(function() os.remove(path) end)

  it("reads 16-bit mono PCM, skipping other chunks (an odd-sized one padded)", function()
    local w, rate = audio.load_wav(write(wav(1, 1, 16, 16000, {0, 16384, -32768, 32767}, u16)))
    assert.are.equal(16000, rate)
    assert.are.equal("f32", w:dtype())
    assert.are.same({0, 0.5, -1, 32767 / 32768}, flat(w))
  end)

  it("mixes stereo down to the mean; reads 8-bit, 24-bit and float", function()
    local w = audio.load_wav(write(wav(1, 2, 16, 8000, {16384, 0, -16384, -16384}, u16)))
    assert.are.same({0.25, -0.5}, flat(w))
    w = audio.load_wav(write(wav(1, 1, 8, 8000, {128, 192, 0}, string.char)))
    assert.are.same({0, 0.5, -1}, flat(w))
    local function i24(v) v = v % 16777216 return string.char(v % 256, math.floor(v / 256) % 256, math.floor(v / 65536)) end
    w = audio.load_wav(write(wav(1, 1, 24, 8000, {4194304, -8388608}, i24)))
    assert.are.same({0.5, -1}, flat(w))
    local function f32(v) return ffi.string(ffi.new("float[1]", v), 4) end
    w = audio.load_wav(write(wav(3, 1, 32, 8000, {0.125, -0.75}, f32)))
    assert.are.same({0.125, -0.75}, flat(w))
  end)

  it("names the file and the offset of what is wrong, and the next read works", function()
    local good = wav(1, 1, 16, 8000, {1, 2, 3}, u16)
    assert_contains(error_of(audio.load_wav, write(good:sub(1, #good - 1))), path, "truncated: the RIFF size at offset 4")
    -- the data chunk claims more bytes than there are
    local bad = good:sub(1, #good - 10) .. u32(100) .. good:sub(#good - 5)
    assert_contains(error_of(audio.load_wav, write(bad)), "chunk \"data\" at offset", "has size 100, past the end")
    assert_contains(error_of(audio.load_wav, write("RIFX" .. good:sub(5))), "not a WAV file")
    assert_contains(error_of(audio.load_wav, write(wav(1, 1, 12, 8000, {1}, u16))), "unsupported encoding", "12 bits")
    assert_contains(error_of(audio.load_wav, path .. ".missing"), "cannot open")
    assert.are.equal(3, audio.load_wav(write(good)):size(1))
  end)
end)

describe("kiln.audio spectrograms", function()
  -- The naive DFT power of one frame, with the periodic Hann window of win samples centred in it.
  local function naive_power(x, first, n_fft, win)
    local left = math.floor((n_fft - win) / 2)
    local out = {}
    for k = 0, math.floor(n_fft / 2) do
      local re, im = 0, 0
      for j = 0, n_fft - 1 do
        local i = j - left
        local w = (i >= 0 and i < win) and (0.5 - 0.5 * math.cos(2 * math.pi * i / win)) or 0
        local v = x[first + j] * w
        re = re + v * math.cos(2 * math.pi * j * k / n_fft)
        im = im - v * math.sin(2 * math.pi * j * k / n_fft)
      end
      out[k + 1] = re * re + im * im
    end
    return out
  end

  for _, cs in ipairs({{n_fft = 12, hop = 5, win = 12}, {n_fft = 16, hop = 16, win = 11}, {n_fft = 21, hop = 7, win = 20}}) do
    it(string.format("match a naive DFT (n_fft %d, hop %d, win %d)", cs.n_fft, cs.hop, cs.win), function()
      kiln.manual_seed(4)
      local w = kiln.randn(50, {dtype = "f64"})
      local x = flat(w)
      local s = audio.spectrogram(w, cs)
      local frames = 1 + math.floor((50 - cs.n_fft) / cs.hop)
      local bins = math.floor(cs.n_fft / 2) + 1
      assert.are.same({frames, bins}, {s:size(1), s:size(2)})
      local got = flat(s)
      for f = 0, frames - 1 do
        local want = naive_power(x, f * cs.hop + 1, cs.n_fft, cs.win)
        for k = 1, bins do assert_near(got[f * bins + k], want[k], 1e-5, string.format("frame %d bin %d", f + 1, k)) end
      end
      local l = flat(audio.spectrogram(w, {n_fft = cs.n_fft, hop = cs.hop, win = cs.win, log = true, eps = 1e-3}))
      for i = 1, #got do assert_near(l[i], math.log(got[i] + 1e-3), 1e-5) end
    end)
  end

  it("a sine peaks at its bin", function()
    -- 8 kHz, n_fft 256: bins 31.25 Hz apart; 1000 Hz is bin 32 (33 counting from 1); 1010 Hz too
    for _, hz in ipairs({1000, 1010}) do
      local w = kiln.arange(0, 4000, {dtype = "f64"}):mul(2 * math.pi * hz / 8000):sin()
      local s = audio.spectrogram(w, {n_fft = 256, hop = 128})
      local _, idx = s:max(2)
      for _, v in ipairs(flat(idx)) do assert.are.equal(33, v) end
    end
  end)

  it("the mel filterbank follows the HTK formula", function()
    local function mel(f) return 2595 * math.log10(1 + f / 700) end
    local function hz(m) return 700 * (10 ^ (m / 2595) - 1) end
    assert_near(mel(1000), 1000, 1e-4)
    local n_mels, n_fft, sr, lo, hi = 3, 16, 8000, 100, 3500
    local fb = audio.mel_filterbank({n_mels = n_mels, n_fft = n_fft, sample_rate = sr, f_min = lo, f_max = hi})
    assert.are.same({3, 9}, {fb:size(1), fb:size(2)})
    local pts = {}
    for i = 0, n_mels + 1 do pts[i] = hz(mel(lo) + (mel(hi) - mel(lo)) * i / (n_mels + 1)) end
    local got = flat(fb)
    for m = 0, n_mels - 1 do
      for k = 0, 8 do
        local f = k * sr / n_fft
        local v = math.max(0, math.min((f - pts[m]) / (pts[m + 1] - pts[m]), (pts[m + 2] - f) / (pts[m + 2] - pts[m + 1])))
        assert_near(got[m * 9 + k + 1], v, 1e-6, string.format("filter %d bin %d", m + 1, k + 1))
      end
    end
    -- one filter over 0..8000 Hz at 16 kHz, n_fft 8: its peak at mel 1420.01 (1767.8 Hz)
    local one = flat(audio.mel_filterbank({n_mels = 1, n_fft = 8, sample_rate = 16000}))
    local c = hz(mel(8000) / 2)
    assert_near(c, 1767.8, 1e-4)
    for i, f in ipairs({0, 2000, 4000, 6000, 8000}) do
      assert_near(one[i], f == 0 and 0 or (8000 - f) / (8000 - c), 1e-6)
    end
  end)

  it("log_mel is log(spectrogram @ filterbank^T + eps)", function()
    kiln.manual_seed(5)
    local w = kiln.randn(3000)
    local lm = audio.log_mel(w, {sample_rate = 8000, n_fft = 200, hop = 80, n_mels = 20, f_min = 20, eps = 1e-4})
    local s = audio.spectrogram(w, {n_fft = 200, hop = 80}):double()
    local fb = audio.mel_filterbank({n_mels = 20, n_fft = 200, sample_rate = 8000, f_min = 20}):double()
    local want = flat(((s:matmul(fb:t())) + 1e-4):log())
    local got = flat(lm)
    assert.are.same({1 + math.floor((3000 - 200) / 80), 20}, {lm:size(1), lm:size(2)})
    for i = 1, #got do assert_near(got[i], want[i], 1e-5) end
    assert.are.same({186, 40}, {audio.log_mel(kiln.zeros(30000)):size(1), audio.log_mel(kiln.zeros(30000)):size(2)})
  end)

  it("misuse: errors name the argument", function()
    assert_contains(error_of(audio.spectrogram, kiln.zeros(2, 100)), "spectrogram: wave [2,100]", "1-d")
    assert_contains(error_of(audio.spectrogram, kiln.zeros(100), {hop = 0}), "hop = 0")
    assert_contains(error_of(audio.spectrogram, kiln.zeros(100), {nfft = 4}), "unknown option \"nfft\"")
    assert_contains(error_of(audio.log_mel, kiln.zeros(1000), {sample_rate = 8000, f_max = 5000}), "f_max = 5000")
    assert.are.same({0, 201}, {audio.spectrogram(kiln.zeros(100)):size(1), audio.spectrogram(kiln.zeros(100)):size(2)})
  end)
end)
