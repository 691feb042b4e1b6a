-- A training step's Lua hot path from a cold start, under LuaJIT's trace events (tests/lua/jit_spec.lua
-- runs it in a fresh process): an MLP forward through nn.Sequential, cross entropy, backward, an SGD
-- step with momentum, zero_grad and loss:item(). Prints one line per trace abort ("abort file:line
-- reason") over the first steps, then the share of the profiler's samples in each VM state over
-- half a second of steps ("share N 0.65": N compiled code, with the C it calls; I the interpreter;
-- C C functions called from the interpreter; G the garbage collector; J the JIT compiler).
local vmdef = require "jit.vmdef"
local jutil = require "jit.util"
local nn, optim = kiln.nn, kiln.optim
kiln.manual_seed(0)
local model = nn.Sequential{nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4)}
local opt = optim.SGD(model:parameters(), {lr = 0.01, momentum = 0.9})
local loss_fn = nn.CrossEntropyLoss()
local x = kiln.randn(8, 20)
local y = kiln.randint(1, 5, {8})
local aborts = {}
jit.attach(function(what, tr, func, pc, otr, oex)
  if what ~= "abort" then return end
  local fi = jutil.funcinfo(func, pc)
  local reason = otr
  if type(otr) == "number" then
    if type(oex) == "function" then
      local f = jutil.funcinfo(oex)
      oex = f.ffid and vmdef.ffnames[f.ffid] or f.loc or "?"
    end
    reason = string.format(vmdef.traceerr[otr], oex)
  end
  aborts[#aborts + 1] = "abort " .. (fi.loc or "?") .. " " .. tostring(reason)
end, "trace")
local total = 0
local function step()
  opt:zero_grad()
  local loss = loss_fn(model(x), y)
  loss:backward()
  opt:step()
  total = total + loss:item()
end
for _ = 1, tonumber(arg and arg[1]) or 1000 do step() end
jit.attach(function() end)
for _, a in ipairs(aborts) do print(a) end

local counts, n = {}, 0
local profile = require "jit.profile"
profile.start("i1", function(_, samples, vmstate) counts[vmstate] = (counts[vmstate] or 0) + samples n = n + samples end)
local t0 = os.clock()
while os.clock() - t0 < 0.5 or n < 100 do step() end
profile.stop()
for _, state in ipairs{"N", "I", "C", "G", "J"} do print(string.format("share %s %.3f", state, (counts[state] or 0) / n)) end
print(string.format("steps done, %d samples, loss %.4f", n, total))
