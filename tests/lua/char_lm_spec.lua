-- examples/char_lm.lua end to end on a small corpus written here: training lowers the validation
-- bits per character well below the uniform code, the saved model samples text of the asked
-- length from its vocabulary, the same seed samples the same text, and a missing corpus is a
-- clear error.
local H = require "helpers"
local kiln_exe, capture = H.kiln_exe, H.capture

describe("examples/char_lm.lua", function()
  local dir, exe
  setup(function()
    exe = kiln_exe()
    dir = capture("mktemp -d /tmp/kiln-char-lm-spec-XXXXXX"):gsub("%s+$", "")
    os.execute("mkdir -p '" .. dir .. "/corpus'")
    local f = assert(io.open(dir .. "/corpus/tales", "w"))
    local words = {"the cat sat on the mat. ", "a dog ran in the fog. ", "the end. "}
    for i = 1, 1500 do f:write(words[i % 3 + 1]) end
    f:close()
  end)
  teardown(function()
    if dir and dir:match("^/tmp/kiln%-char%-lm%-spec%-") then os.execute("rm -rf '" .. dir .. "'") end
  end)

  it("trains, saves, and samples from the saved model", function()
    if not exe then pending("not running under the kiln launcher") return end
    local model = dir .. "/m.safetensors"
    local out, ok = capture(string.format("%s examples/char_lm.lua --corpus %s/corpus --steps 150 --eval-every 75 --seq 16 "
                                          .. "--batch-size 8 --hidden 32 --embedding 8 --lr 0.01 --threads 1 --save %s",
                                          exe, dir, model))
    assert(ok, out)
    local bpc = tonumber(out:match('"valid_bpc":([%d%.e%-]+)'))
    assert(bpc, out)
    -- 16 distinct characters: the uniform code costs 4 bits; the text is nearly periodic
    assert(bpc < 1.5, "validation bits per character " .. bpc .. "\n" .. out)
    assert.equal(150, tonumber(out:match('"steps":(%d+)')))
    local cmd = string.format("%s examples/char_lm.lua --sample %s --length 60 --prime 'the ' --seed 3", exe, model)
    local a, ok_a = capture(cmd)
    local b = capture(cmd)
    assert(ok_a, a)
    assert.equal(a, b)
    local text = a:gsub("\n$", "")
    assert.equal(64, #text)
    assert.equal("the ", text:sub(1, 4))
    assert.is_nil(text:find("[^a-z%. ]"), "a character outside the corpus: " .. text)
  end)

  it("reads the King James Bible of Debian's bible-kjv with --corpus kjv", function()
    if not exe then pending("not running under the kiln launcher") return end
    local out, ok = capture(string.format("%s examples/char_lm.lua --corpus kjv --steps 1 --eval-every 1000 --seq 16 "
                                          .. "--batch-size 64 --hidden 8 --embedding 4 --threads 1 --save %s/kjv.safetensors",
                                          exe, dir))
    assert(ok, out)
    -- bible-kjv 4.38 (Debian 12): 4,298,239 characters in 263 blocks of 16 KiB, every 20th held out
    assert.matches("char%-LM on the King James Bible: 4085247 training and 212992 validation characters, vocabulary 73",
                   out)
  end)

  it("names the missing corpus and the package that has it", function()
    if not exe then pending("not running under the kiln launcher") return end
    local out, ok = capture(exe .. " examples/char_lm.lua --corpus /nonexistent/fortunes --steps 1")
    assert.is_falsy(ok)
    assert.matches("no corpus at /nonexistent/fortunes %(install Debian's fortunes package", out)
  end)
end)
