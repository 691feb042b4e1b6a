-- examples/demo.lua: a short tour of kiln's tensors (the main job until training lands).
-- usage: kiln examples/demo.lua
local kiln = kiln or require "kiln"
kiln.ui.parse_args(arg or {}, {name = "demo", strict = true})   -- no options: --help says so

print(string.format("kiln %s on %d threads", kiln.version, kiln.get_num_threads()))
kiln.manual_seed(7)

local x = kiln.tensor{{1, 2, 3}, {4, 5, 6}}
print("x =\n" .. tostring(x))
print("x:t() @ x =\n" .. tostring(x:t():matmul(x)))
print("x:sum(1) =\n" .. tostring(x:sum(1)))
print("x:mean(2, true) =\n" .. tostring(x:mean(2, true)))

-- Broadcasting, a view, and writing through it.
local bias = kiln.tensor{10, 20, 30}
print("x + bias =\n" .. tostring(x + bias))
local col = x:select(2, 2)
col:fill_(0)
print("x after zeroing column 2 through a view =\n" .. tostring(x))

-- A least-squares fit with the normal equations, solved by gradient steps on the CPU.
local n, d = 256, 4
local A = kiln.randn(n, d, {dtype = "f64"})
local w_true = kiln.tensor({1.5, -2, 0.5, 3}, {dtype = "f64"}):view(d, 1)
local y = A:matmul(w_true) + kiln.randn(n, 1, {dtype = "f64"}) * 0.01
local w = kiln.zeros(d, 1, {dtype = "f64"})
local lr = 0.1
for step = 1, 200 do
  local r = A:matmul(w) - y                  -- residuals [n,1]
  local grad = A:t():matmul(r) / n           -- gradient of mean squared error / 2
  w:sub_(grad * lr)
end
print("fitted w:", table.concat((function() local t = {} for i, v in ipairs(w:view(-1):totable()) do t[i] = string.format("%.3f", v) end return t end)(), " "),
      "(true: 1.5 -2 0.5 3)")
local err = (w - w_true):abs():max():item()
print(string.format("largest error %.4f", err))

-- A big tensor prints summarised; argmax counts from 1, like every index in kiln's Lua API.
local scores = kiln.randn(1000, 10)
local best = scores:argmax(2)
print("scores:argmax(2)[1..5]:", best[1], best[2], best[3], best[4], best[5])
print(kiln.randn(100, 100))
if err > 0.05 then error("demo: the fit did not converge") end
