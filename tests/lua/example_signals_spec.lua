-- SIGTERM in the examples that train (fashion_mnist's is in io_spec.lua): the step in progress
-- ends, the weights are written, and the process exits with status 143 and a message; the file
-- loads, at the step the example paused after.
local kiln = require "kiln"
local kiln_exe = require("helpers").kiln_exe
local function read(path)
  local f = io.open(path, "rb")
  if not f then return "" end
  local s = f:read("*a")
  f:close()
  return s
end
local function sh(cmd) local ok = os.execute(cmd) return ok == true or ok == 0 end

local dir = os.tmpname()
os.remove(dir)
sh("mkdir -p " .. dir)

-- Start cmd in the background (its log, its pid), wait for `pattern` in the log, SIGTERM it, and
-- return its exit status and log.
local function term_after(cmd, name, pattern)
  local base = dir .. "/" .. name
  sh(string.format("(%s > %s.log 2>&1 & echo $! > %s.pid; wait $!; echo $? > %s.status) &", cmd, base, base, base))
  local waited = 0
  while not read(base .. ".log"):find(pattern, 1, true) and waited < 1200 do sh("sleep 0.1") waited = waited + 1 end
  assert.truthy(read(base .. ".log"):find(pattern, 1, true), read(base .. ".log"))
  assert.is_true(sh("kill -TERM " .. read(base .. ".pid"):match("%d+")))
  waited = 0
  while read(base .. ".status") == "" and waited < 600 do sh("sleep 0.1") waited = waited + 1 end
  return read(base .. ".status"):match("%d+"), read(base .. ".log")
end

describe("SIGTERM in the examples", function()
  it("char_lm: ends the step, writes the model and exits with 143", function()
    local exe = kiln_exe()
    if not exe then pending("not running under the kiln launcher") return end
    if not io.open("/usr/share/games/fortunes/fortunes") then pending("fortunes is not installed") return end
    local save = dir .. "/clm.safetensors"
    local status, log = term_after(string.format("%s examples/char_lm.lua --steps 500 --eval-every 1000 --threads 1 --pause-after 3 "
                                                 .. "--save %s --hidden 32 --embedding 16", exe, save), "clm", "paused after step 3")
    assert.are.equal("143", status, log)
    assert.truthy(log:find("terminated after step 3: the model written to " .. save, 1, true), log)
    local tensors, meta = kiln.load(save)
    assert.are.equal("3", meta.step)
    assert.are.same({128, 32}, tensors["2.weight_hh_l0"]:size())   -- the LSTM, 4 x hidden rows
  end)

  it("speech_digits: ends the step, writes the weights and exits with 143", function()
    local exe = kiln_exe()
    if not exe then pending("not running under the kiln launcher") return end
    if not sh("command -v espeak-ng > /dev/null") then pending("espeak-ng is not installed") return end
    local save = dir .. "/sd.safetensors"
    local status, log = term_after(string.format("%s examples/speech_digits.lua --train-utterances 64 --test-utterances 16 "
                                                 .. "--batch-size 16 --hidden 16 --channels 16 --layers 1 --threads 1 "
                                                 .. "--pause-after 2 --save %s --data %s/data", exe, save, dir),
                                   "sd", "paused after step 2")
    assert.are.equal("143", status, log)
    assert.truthy(log:find("terminated after step 2: the weights written to " .. save, 1, true), log)
    local _, meta = kiln.load(save)
    assert.are.equal("2", meta.step)
  end)
end)
