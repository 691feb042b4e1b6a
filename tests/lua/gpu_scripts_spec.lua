-- tests/gpu's training scripts run on the CPU (--device cpu), so that CI keeps them working where
-- no GPU is: train_check.lua passes CPU against CPU, fails (exit 1) when the tolerance cannot hold,
-- and writes its report; bench_train.lua writes one JSON line per model; on a pretend device without
-- kernels both report the error and exit 1; both refuse a bad device.
local kiln = kiln or require "kiln"
local helpers = require "helpers"

local exe = helpers.kiln_exe()

local function tmpdir()
  local out = helpers.capture("mktemp -d")
  return (out:gsub("%s+$", ""))
end

local function read(path)
  local f = io.open(path)
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

describe("tests/gpu scripts on the CPU", function()
  local dir
  before_each(function()
    if not exe then pending("not run by the kiln launcher") end
    dir = tmpdir()
  end)
  after_each(function() if dir and dir:match("^/tmp/") then os.execute("rm -rf '" .. dir .. "'") end end)

  it("train_check.lua --device cpu: every step equal, a report in $OUT", function()
    if not exe then return end
    local out, ok = helpers.capture(string.format("OUT=%s %s tests/gpu/train_check.lua --device cpu --synthetic --steps 4",
                                                  dir, exe))
    assert.is_true(ok, out)
    assert.matches("data: synthetic %(seed 1", out)
    assert.matches("train_check: passed, 4 steps", out)
    local rows = 0
    for err in out:gmatch("\n%s+%d+%s+[%d%.]+%s+[%d%.]+%s+(%S+)") do
      rows = rows + 1
      assert.are.equal("0", err)
    end
    assert.are.equal(4, rows)
    local report = read(dir .. "/train_check.txt")
    assert.is_not_nil(report)
    assert.matches("train_check: passed", report)
  end)

  it("train_check.lua fails with exit 1 when a side differs beyond the tolerance (f64 against f32, tol 1e-12)", function()
    if not exe then return end
    local out, ok = helpers.capture(string.format("OUT=%s %s tests/gpu/train_check.lua --device cpu --dtype f64 --tol 1e-12 "
                                                  .. "--synthetic --steps 3", dir, exe))
    assert.is_false(ok)
    assert.matches("OUT OF TOLERANCE", out)
    assert.matches("train_check: FAILED, %d step%(s%) out of tolerance", out)
    assert.matches("FAILED", read(dir .. "/train_check.txt"))
  end)

  it("train_check.lua says it skipped when there is no CUDA device", function()
    if not exe or kiln.cuda.is_available() then return end
    local out, ok = helpers.capture(exe .. " tests/gpu/train_check.lua")
    assert.is_true(ok, out)
    assert.matches("^skipped: no CUDA device", out)
  end)

  -- The pretend CUDA device of tests/c/fake_cuda_backend.c (memory and copies, no kernels): the
  -- scripts' device side runs until its first kernel, whose error must end in the report.
  local function fake_device()
    local lib = (os.getenv("KILN_LIB_DIR") or exe:gsub("/bin/kiln$", "/lib")) .. "/libfake_kiln_cuda_device.so"
    local f = io.open(lib)
    if not f then return nil end
    f:close()
    return lib
  end

  it("train_check.lua reports an error on the device side with its step, in $OUT too, and exits 1", function()
    if not exe then return end
    local lib = fake_device()
    if not lib then pending("no libfake_kiln_cuda_device.so beside the launcher") return end
    local out, ok = helpers.capture(string.format("KILN_CUDA_LIB=%s OUT=%s %s tests/gpu/train_check.lua --synthetic --steps 2",
                                                  lib, dir, exe))
    assert.is_false(ok)
    assert.matches("train_check: FAILED, an error at step 1: .*conv2d: not implemented on cuda:0", out)
    assert.matches("an error at step 1", read(dir .. "/train_check.txt"))
  end)

  it("bench_train.lua writes a model's error as its line, runs the next model, and exits 1", function()
    if not exe then return end
    local lib = fake_device()
    if not lib then pending("no libfake_kiln_cuda_device.so beside the launcher") return end
    local out, ok = helpers.capture(string.format("KILN_CUDA_LIB=%s OUT=%s %s tests/gpu/bench_train.lua", lib, dir, exe))
    assert.is_false(ok)
    local jsonl = read(dir .. "/bench_train.jsonl")
    assert.matches('"error":"[^"]*not implemented on cuda:0".-"model":"cnn"', jsonl)
    assert.matches('"error":"[^"]*not implemented on cuda:0".-"model":"resnet18"', jsonl)
    assert.matches('"model":"resnet18"', out)
  end)

  it("bench_train.lua --device cpu --quick: one JSON line per model, also in $OUT/bench_train.jsonl", function()
    if not exe then return end
    local out, ok = helpers.capture(string.format("OUT=%s %s tests/gpu/bench_train.lua --device cpu --quick --models cnn",
                                                  dir, exe))
    assert.is_true(ok, out)
    local line = out:match('({"batch":64,"bench":"train_step".-})')
    assert.is_not_nil(line, out)
    assert.matches('"model":"cnn"', line)
    assert.matches('"parameters":1111946', line)
    local ms = tonumber(line:match('"ms_per_step":([%d%.e%-]+)'))
    assert.is_true(ms ~= nil and ms > 0, line)
    assert.are.equal(line .. "\n", read(dir .. "/bench_train.jsonl"))
  end)

  it("both name the choices for a bad --device", function()
    if not exe then return end
    for _, script in ipairs{"train_check", "bench_train"} do
      local out, ok = helpers.capture(exe .. " tests/gpu/" .. script .. ".lua --device tpu")
      assert.is_false(ok)
      assert.matches(script .. ": %-%-device must be cpu or cuda", out)
    end
  end)
end)
