-- JIT-friendliness: the training step's Lua hot path compiles (LuaJIT's trace events), and the
-- calls a training loop makes every step allocate nothing they need not.
local kiln = require "kiln"
local H = require "helpers"

-- Aborts that are how LuaJIT forms traces around nested loops and returns, or that come and go
-- with the garbage collector (a tensor's finalizer running while a trace records, a C symbol
-- collected from the FFI's cache): not code it cannot compile.
local BENIGN = {"inner loop in root trace", "leaving loop in root trace", "NYI: return to lower frame",
                "loop unroll limit reached", "error thrown or hook called during recording", "symbol not in cache"}

local function benign(line)
  for _, s in ipairs(BENIGN) do if line:find(s, 1, true) then return true end end
  return false
end

describe("the JIT", function()
  it("compiles a training step's hot path: no trace aborts but LuaJIT's structural ones", function()
    local exe = H.kiln_exe()
    if not exe then pending("not running under the kiln launcher") return end
    local script = (debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "jit/train_step.lua"
    local out, ok = H.capture(exe .. " " .. script .. " 1000")
    assert.is_true(ok, out)
    assert.matches("steps done, %d+ samples", out)
    -- an abort LuaJIT keeps meeting at one place is code on the hot path that it cannot compile
    local seen, bad = {}, {}
    for line in out:gmatch("abort ([^\n]+)") do
      if not benign(line) then
        seen[line] = (seen[line] or 0) + 1
        if seen[line] == 2 then bad[#bad + 1] = line end
      end
    end
    assert.are.equal("", table.concat(bad, "\n"))
    -- and the steps run compiled: with the JIT off, no sample is in compiled code (N)
    local compiled = tonumber(out:match("share N ([%d.]+)"))
    assert.truthy(compiled, out)
    assert.is_true(compiled >= 0.3, string.format("%.0f%% of the samples in compiled code:\n%s", compiled * 100, out))
  end)

  it("t:item() allocates nothing", function()
    local t = kiln.tensor(2.5)
    local s = 0
    for _ = 1, 200 do s = s + t:item() end   -- compiled by now
    collectgarbage("collect")
    collectgarbage("stop")
    local before = collectgarbage("count")
    for _ = 1, 20000 do s = s + t:item() end
    local grown = collectgarbage("count") - before
    collectgarbage("restart")
    assert.are.equal(2.5 * 20200, s)
    -- a buffer made per call is 16 bytes or more (320 KB here); what the interpreter boxes while a
    -- trace is being recorded or has exited (t.p) stays far below that
    assert.is_true(grown < 100, string.format("%.1f KB allocated by 20000 calls", grown))
  end)
end)
