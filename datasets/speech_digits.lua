-- datasets.speech_digits: spoken digit strings ("three one four one five") synthesised with espeak-ng
-- (the Debian package espeak-ng) in several voices, speeds and pitches, as log-mel features and
-- character labels for a CTC model. The test split speaks with voices the training split never uses.
--   local digits = require "datasets.speech_digits"
--   local train = digits.load{split = "train", count = 2000, dir = "build/data/speech_digits"}
--   train.features[i]  -- f32 [frames, 40], normalised per utterance
--   train.labels[i]    -- the transcript's characters as classes 2..17 (class 1 is the CTC blank)
--   train.texts[i]     -- "three one four"
-- The WAVs are cached under dir (dir/<voice>/s<speed>-p<pitch>-<digits>.wav); only missing ones are
-- synthesised, so a second run reads them at once. The list of utterances depends only on
-- (split, count, seed), and espeak-ng renders a text the same way every time.
local kiln = require "kiln"

local M = {}

M.words = {"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"}
-- The output alphabet: the space and the 15 letters of the ten words. Class 1 is the CTC blank,
-- class k + 1 the k-th character here.
M.alphabet = " efghinorstuvwxz"
M.blank = 1
M.num_classes = #M.alphabet + 1

-- Voices are espeak-ng "language+variant" pairs. The test voices use variants (m4, m7, f3, f4) that
-- no training voice uses, and en-us-nyc is an accent the training split never hears.
M.voices = {
  train = {"en+m1", "en+m3", "en+f1", "en+f2", "en-us+m2", "en-us+m5", "en-us+f5", "en-us+m6",
           "en-gb-scotland+m1", "en-gb-scotland+f2", "en-029+m3", "en-029+f1", "en-gb-x-rp+m2",
           "en-gb-x-rp+f5", "en-gb-x-gbclan+m5", "en-gb-x-gbcwmd+m6"},
  test = {"en+m4", "en+f4", "en-us+m7", "en-us+f3", "en-us-nyc+m4", "en-us-nyc+f3", "en-gb-x-rp+m7",
          "en-gb-scotland+f4"},
}
M.speeds = {130, 210}   -- words per minute, uniform
M.pitches = {30, 70}    -- espeak-ng's 0..99 scale, uniform
M.digit_range = {3, 7}  -- digits per utterance, uniform

M.INSTALL = "install the Debian package espeak-ng (sudo apt-get install espeak-ng)"

-- ---- a deterministic random stream (Park and Miller's minimal standard; exact in doubles) ----

local function rng(seed)
  local s = (math.floor(seed) % 2147483646) + 1
  return function(lo, hi)   -- an integer in [lo, hi]
    s = (s * 16807) % 2147483647
    return lo + math.floor((s - 1) / 2147483646 * (hi - lo + 1))
  end
end

local split_id = {train = 1, test = 2}

-- utterances{split = "train" | "test", count = N, seed = 1} -> a list of {text, digits, voice, speed, pitch, name}:
-- what to synthesise, the same for the same arguments (and the first k of count N are those of count k).
function M.utterances(opts)
  local split, count, seed = opts.split or "train", opts.count, opts.seed or 1
  if not split_id[split] then error("speech_digits: unknown split " .. tostring(split) .. " (train, test)", 2) end
  if type(count) ~= "number" or count < 0 or count ~= math.floor(count) then
    error("speech_digits: count must be a non-negative integer, got " .. tostring(count), 2)
  end
  local voices = opts.voices or M.voices[split]
  local random = rng(seed * 7919 + split_id[split])
  local list = {}
  for i = 1, count do
    local n = random(M.digit_range[1], M.digit_range[2])
    local digits, words = {}, {}
    for k = 1, n do
      local d = random(0, 9)
      digits[k], words[k] = tostring(d), M.words[d + 1]
    end
    local u = {text = table.concat(words, " "), digits = table.concat(digits), voice = voices[random(1, #voices)],
               speed = random(M.speeds[1], M.speeds[2]), pitch = random(M.pitches[1], M.pitches[2])}
    u.name = string.format("%s/s%d-p%d-%s.wav", u.voice, u.speed, u.pitch, u.digits)
    list[i] = u
  end
  return list
end

-- ---- synthesis ----

local function shell_ok(cmd)
  local r = os.execute(cmd)
  return r == 0 or r == true
end

local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

function M.have_espeak() return shell_ok("command -v espeak-ng >/dev/null 2>&1") end

-- synthesise(list, dir) -> how many WAVs were written: those of the list missing under dir. Each is
-- written to a temporary name and renamed, so an interrupted run leaves no half-written file.
function M.synthesise(list, dir)
  local missing = {}
  for _, u in ipairs(list) do
    if not exists(dir .. "/" .. u.name) then missing[#missing + 1] = u end
  end
  if #missing == 0 then return 0 end
  if not M.have_espeak() then
    error(string.format("speech_digits: %d utterances are not in %s yet and espeak-ng is not installed: %s",
                        #missing, dir, M.INSTALL), 2)
  end
  local folders = {}
  for _, u in ipairs(missing) do folders[dir .. "/" .. u.voice] = true end
  for f in pairs(folders) do
    if not shell_ok("mkdir -p " .. quote(f)) then error("speech_digits: cannot create the folder " .. f, 2) end
  end
  -- one shell per chunk of utterances: espeak-ng itself takes ~10 ms each
  local chunk = 64
  for first = 1, #missing, chunk do
    local cmds = {}
    for i = first, math.min(first + chunk - 1, #missing) do
      local u = missing[i]
      local path = dir .. "/" .. u.name
      cmds[#cmds + 1] = string.format("espeak-ng -v %s -s %d -p %d -w %s %s && mv %s %s", quote(u.voice), u.speed, u.pitch,
                                      quote(path .. ".tmp"), quote(u.text), quote(path .. ".tmp"), quote(path))
    end
    os.execute("{ " .. table.concat(cmds, "; ") .. "; } >/dev/null 2>&1")
  end
  -- say which utterance failed, with espeak-ng's own message
  for _, u in ipairs(missing) do
    local path = dir .. "/" .. u.name
    if not exists(path) then
      local p = io.popen(string.format("espeak-ng -v %s -s %d -p %d -w %s %s 2>&1", quote(u.voice), u.speed, u.pitch,
                                       quote(path .. ".tmp"), quote(u.text)))
      local out = p:read("*a")
      p:close()
      os.remove(path .. ".tmp")
      error(string.format("speech_digits: espeak-ng could not write %s (voice %s): %s", path, u.voice,
                          out ~= "" and out:gsub("%s+$", "") or "no message"), 2)
    end
  end
  return #missing
end

-- ---- features and labels ----

-- features(wave, rate) -> f32 [frames, n_mels]: log-mel energies over 512-sample frames (23 ms at
-- espeak-ng's 22050 Hz) every 10 ms, each band normalised to mean 0 and variance 1 over the utterance.
M.n_mels = 40
function M.features(wave, rate)
  local hop = math.floor(rate / 100 + 0.5)
  local n_fft = 2 ^ math.floor(math.log(rate * 0.025) / math.log(2) + 0.5)
  local f = kiln.audio.log_mel(wave, {sample_rate = rate, n_fft = n_fft, hop = hop, n_mels = M.n_mels, eps = 1e-4})
  local mean = f:mean(1, true)
  local std = (f - mean):pow(2):mean(1, true):sqrt() + 1e-5
  return ((f - mean) / std):contiguous()
end

local index = {}
for k = 1, #M.alphabet do index[M.alphabet:sub(k, k)] = k + 1 end

-- encode("one two") -> classes (2..17); decode(classes) -> the string (the blank and unknown classes dropped).
function M.encode(text)
  local out = {}
  for k = 1, #text do
    local c = index[text:sub(k, k)]
    if not c then error(string.format("speech_digits: %q is not in the alphabet %q", text:sub(k, k), M.alphabet), 2) end
    out[k] = c
  end
  return out
end

function M.decode(classes)
  local out = {}
  for _, c in ipairs(classes) do
    if c >= 2 and c <= M.num_classes then out[#out + 1] = M.alphabet:sub(c - 1, c - 1) end
  end
  return table.concat(out)
end

-- edit_distance(a, b): Levenshtein distance (insertions, deletions, substitutions, each 1) between two
-- strings or two lists.
function M.edit_distance(a, b)
  local function items(s)
    if type(s) == "table" then return s end
    local t = {}
    for k = 1, #s do t[k] = s:sub(k, k) end
    return t
  end
  a, b = items(a), items(b)
  local prev, cur = {}, {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    cur[0] = i
    for j = 1, #b do
      local cost = a[i] == b[j] and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev, cur = cur, prev
  end
  return prev[#b]
end

-- cer(hypotheses, references): the character error rate, the summed edit distances over the summed
-- reference lengths.
function M.cer(hyps, refs)
  if #hyps ~= #refs then error(string.format("speech_digits.cer: %d hypotheses for %d references", #hyps, #refs), 2) end
  local errors, total = 0, 0
  for i = 1, #refs do
    errors = errors + M.edit_distance(hyps[i], refs[i])
    total = total + #refs[i]
  end
  return total > 0 and errors / total or 0
end

-- load{split = "train", count = N, seed = 1, dir = "build/data/speech_digits"} -> {features = {...},
-- labels = {...}, texts = {...}, utterances = {...}, synthesised = n}: synthesises what is missing,
-- then reads every WAV and computes its features.
function M.load(opts)
  local dir = opts.dir or "build/data/speech_digits"
  local list = M.utterances{split = opts.split, count = opts.count, seed = opts.seed, voices = opts.voices}
  local made = M.synthesise(list, dir)
  local set = {features = {}, labels = {}, texts = {}, utterances = list, synthesised = made}
  for i, u in ipairs(list) do
    local path = dir .. "/" .. u.name
    local ok, wave, rate = pcall(kiln.audio.load_wav, path)
    if not ok then
      error(string.format("speech_digits: cannot read %s (delete it to have it synthesised again): %s", path,
                          (tostring(wave):gsub("^[^:]*:%d+: ", ""))), 2)
    end
    set.features[i] = M.features(wave, rate)
    set.labels[i] = M.encode(u.text)
    set.texts[i] = u.text
  end
  return set
end

-- batch(set, indices) -> x [T,B,n_mels] (zero past each utterance's end), lengths {B}, targets {B lists}:
-- the utterances set.features[indices[b]], padded to the longest.
function M.batch(set, indices)
  local T, lengths, targets = 0, {}, {}
  for b, i in ipairs(indices) do
    lengths[b] = set.features[i]:size(1)
    targets[b] = set.labels[i]
    if lengths[b] > T then T = lengths[b] end
  end
  local x = kiln.zeros(T, #indices, M.n_mels)
  for b, i in ipairs(indices) do x:select(2, b):narrow(1, 1, lengths[b]):copy_(set.features[i]) end
  return x, lengths, targets
end

return M
