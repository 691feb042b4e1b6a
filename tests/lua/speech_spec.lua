-- datasets/speech_digits.lua and examples/speech_digits.lua: the character error rate against edit
-- distances worked out by hand, the utterance lists, the features of a few utterances synthesised
-- with espeak-ng (skipped when it is not installed; scripts/install-deps.sh installs it), the errors
-- for a missing espeak-ng and a damaged WAV, and a short run of the example.
local ffi = require "ffi"
local digits = require "datasets.speech_digits"

pcall(ffi.cdef, [[
int kiln_spec_setenv(const char *name, const char *value, int overwrite) __asm__("setenv");
]])

local H = require "helpers"
local kiln_exe, capture = H.kiln_exe, H.capture

describe("speech_digits: labels and the character error rate", function()
  it("computes edit distances worked out by hand", function()
    assert.equal(3, digits.edit_distance("kitten", "sitting"))   -- k->s, e->i, +g
    assert.equal(2, digits.edit_distance("flaw", "lawn"))        -- -f, +n
    assert.equal(3, digits.edit_distance("", "one"))
    assert.equal(3, digits.edit_distance("two", ""))
    assert.equal(0, digits.edit_distance("", ""))
    assert.equal(1, digits.edit_distance("one two", "one too"))
    assert.equal(2, digits.edit_distance("one", "nine"))         -- +n, o->i
    assert.equal(5, digits.edit_distance("three", "eight"))      -- five substitutions; no shift does better
    assert.equal(2, digits.edit_distance("seven", "eleven"))     -- s->e, +l
    assert.equal(1, digits.edit_distance({2, 3, 4}, {2, 4}))
  end)

  it("sums the edits over the summed reference lengths", function()
    -- "one tw" misses 1 of "one two" (7 characters); "nine" is right; "sx" vs "six": 1 of 3
    assert.near(2 / 14, digits.cer({"one tw", "nine", "sx"}, {"one two", "nine", "six"}), 1e-12)
    assert.equal(0, digits.cer({"zero"}, {"zero"}))
    assert.equal(1, digits.cer({""}, {"five"}))
    assert.has_error(function() digits.cer({"a"}, {"a", "b"}) end)
  end)

  it("encodes the transcript as classes 2..17 and decodes them back", function()
    local text = "zero one two three four five six seven eight nine"
    local classes = digits.encode(text)
    assert.equal(#text, #classes)
    for _, c in ipairs(classes) do assert.is_true(c >= 2 and c <= digits.num_classes) end
    assert.equal(text, digits.decode(classes))
    assert.equal(17, digits.num_classes)
    assert.equal(2, digits.encode(" ")[1])
    local ok, err = pcall(digits.encode, "one 2")
    assert.is_false(ok)
    assert.matches('"2" is not in the alphabet " efghinorstuvwxz"', err, 1, true)
  end)

  it("lists the same utterances for the same seed, with held-out voices apart from the training ones", function()
    local a = digits.utterances{split = "train", count = 20, seed = 3}
    local b = digits.utterances{split = "train", count = 5, seed = 3}
    local c = digits.utterances{split = "train", count = 20, seed = 4}
    for i = 1, 5 do assert.same(a[i], b[i]) end
    local differ = false
    for i = 1, 20 do differ = differ or a[i].name ~= c[i].name end
    assert.is_true(differ)
    for _, u in ipairs(a) do
      local n = #u.digits
      assert.is_true(n >= digits.digit_range[1] and n <= digits.digit_range[2])
      assert.equal(n, select(2, u.text:gsub("%a+", "")))
    end
    local train = {}
    for _, v in ipairs(digits.voices.train) do train[v] = true end
    for _, v in ipairs(digits.voices.test) do assert.is_nil(train[v], v) end
    for _, u in ipairs(digits.utterances{split = "test", count = 50}) do assert.is_nil(train[u.voice], u.voice) end
  end)
end)

describe("speech_digits: synthesis and features", function()
  local dir
  setup(function()
    dir = capture("mktemp -d /tmp/kiln-speech-spec-XXXXXX"):gsub("%s+$", "")
  end)
  teardown(function()
    if dir and dir:match("^/tmp/kiln%-speech%-spec%-") then os.execute("rm -rf '" .. dir .. "'") end
  end)

  it("synthesises 3 utterances once and gives normalised log-mel features", function()
    if not digits.have_espeak() then pending("espeak-ng is not installed: " .. digits.INSTALL) return end
    local set = digits.load{split = "test", count = 3, seed = 1, dir = dir .. "/data"}
    assert.equal(3, set.synthesised)
    for i = 1, 3 do
      local f = set.features[i]
      assert.equal(2, f:dim())
      assert.equal(digits.n_mels, f:size(2))
      -- 3 to 7 digits at 130 to 210 words a minute: about 1 to 4 s, 100 frames a second
      assert.is_true(f:size(1) > 60 and f:size(1) < 600, "frames " .. f:size(1))
      for _, row in ipairs(f:totable()) do
        for _, v in ipairs(row) do assert.is_true(v == v and math.abs(v) < 100, "a feature is " .. v) end
      end
      -- each band has mean 0 and variance 1 over the utterance
      assert.is_true(f:mean(1):abs():max():item() < 1e-3)
      assert.is_true((f:pow(2):mean(1) - 1):abs():max():item() < 1e-2)
      assert.same(digits.encode(set.texts[i]), set.labels[i])
    end
    local again = digits.load{split = "test", count = 3, seed = 1, dir = dir .. "/data"}
    assert.equal(0, again.synthesised)
    for i = 1, 3 do assert.equal(0, (again.features[i] - set.features[i]):abs():max():item()) end

    local x, lengths, targets = digits.batch(set, {3, 1})
    assert.same({math.max(lengths[1], lengths[2]), 2, digits.n_mels}, x:size())
    assert.same({set.features[3]:size(1), set.features[1]:size(1)}, lengths)
    assert.same({set.labels[3], set.labels[1]}, targets)
    local short = lengths[1] < lengths[2] and 1 or 2
    if lengths[short] < x:size(1) then
      assert.equal(0, x:select(2, short):narrow(1, lengths[short] + 1, x:size(1) - lengths[short]):abs():max():item())
    end
  end)

  it("names the Debian package when espeak-ng is missing", function()
    local path = os.getenv("PATH")
    ffi.C.kiln_spec_setenv("PATH", "/nonexistent", 1)
    local ok, err = pcall(digits.load, {split = "train", count = 2, dir = dir .. "/none"})
    ffi.C.kiln_spec_setenv("PATH", path, 1)
    assert.is_false(ok)
    assert.matches("espeak-ng is not installed", err, 1, true)
    assert.matches("apt-get install espeak-ng", err, 1, true)
  end)

  it("names the file and the offset of a damaged WAV in the cache", function()
    local u = digits.utterances{split = "train", count = 1, seed = 1}[1]
    local path = dir .. "/damaged/" .. u.name
    os.execute("mkdir -p '" .. path:match("^(.*)/") .. "'")
    local f = assert(io.open(path, "wb"))
    f:write("RIFF", "\100\0\0\0", "WAVEfmt ")   -- a RIFF size past the end of the file
    f:close()
    local ok, err = pcall(digits.load, {split = "train", count = 1, seed = 1, dir = dir .. "/damaged"})
    assert.is_false(ok)
    assert.matches("cannot read " .. path, err, 1, true)
    assert.matches("offset 4", err, 1, true)
  end)

  it("runs the example end to end on a few utterances", function()
    if not digits.have_espeak() then pending("espeak-ng is not installed: " .. digits.INSTALL) return end
    local exe = kiln_exe()
    if not exe then pending("not running under the kiln launcher") return end
    local out, ok = capture(string.format("%s examples/speech_digits.lua --data %s/run --train-utterances 96 "
                                          .. "--test-utterances 16 --epochs 3 --batch-size 16 --hidden 32 --channels 32 "
                                          .. "--layers 1 --lr 0.003 --threads 1 --beam 2", exe, dir))
    assert(ok, out)
    local cer = tonumber(out:match('"test_cer":([%d%.e%-]+)'))
    assert(cer and cer >= 0 and cer <= 1, out)
    local first = tonumber(out:match("epoch 1: train loss ([%d%.]+)"))
    local last = tonumber(out:match("epoch 3: train loss ([%d%.]+)"))
    assert(first and last and last < first, out)
    assert.matches("96 training utterances", out, 1, true)
    assert.matches("held-out: CER", out, 1, true)
  end)
end)
