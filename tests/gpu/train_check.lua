-- tests/gpu/train_check.lua: the main job's CNN (models/lenet.lua, the model examples/fashion_mnist.lua
-- trains by default, at its batch size 64 with its optimizer: SGD, momentum 0.9, Nesterov) trained for
-- 20 steps on the CPU and on cuda:0 from the same initial weights on the same batches, the losses of
-- every step compared. The batches are the first ones of Fashion-MNIST's training set when its files
-- are found (--root, default the Debian package's folder), else a synthetic stream made from the seed
-- (ten random class templates plus noise, unit variance, so that the loss falls as on real data); the
-- output says which.
--
-- The learning rate is a constant 0.01, not the example's 0.05 under a cosine schedule: at 0.05 the
-- first 20 steps are chaotic enough that f32 rounding alone (CPU f32 against CPU f64) grows from 5e-8
-- at step 1 to 8e-3 (Fashion-MNIST) and 1.0 (synthetic) within 20 steps (12 seeds), so no bound would
-- both hold and catch anything; at 0.01 the same difference stays at most 5e-5 over 20 steps (10
-- seeds, both data).
--
-- Tolerance: |loss_dev - loss_cpu| / max(1, |loss_cpu|) <= tol * step (tol = 1e-4): the two sides
-- differ by f32 rounding in other orders of addition (cuDNN's convolution algorithms, cuBLAS against
-- OpenBLAS), which training amplifies step by step. The bound leaves 30x the CPU f32-against-f64
-- difference; a learning rate 1% off on one side exceeds it from step 12. The "f64" column shows that
-- difference for this run (CPU f64 from the same weights, for comparison only, not checked).
--
-- Writes $OUT/train_check.txt (the settings, the loss table, the result line); exits 1 when a step is
-- out of tolerance, a loss is not finite or the loss did not fall. Without CUDA: "skipped: no CUDA
-- device", exit 0.
--   build/bin/kiln tests/gpu/train_check.lua [--device cuda|cpu] [--dtype f32|f64] [--steps 20]
--                  [--batch-size 64] [--lr 0.01] [--seed 1] [--tol 1e-4] [--root DIR] [--synthetic]
--   --device cpu: the CPU in the device's place (the losses must then be equal): checks this script;
--   --dtype f64: the device side in f64.
local kiln = kiln or require "kiln"
package.path = "./?.lua;" .. package.path
local nn, optim, ui = kiln.nn, kiln.optim, kiln.ui

local opt = ui.parse_args(arg or {}, {name = "train_check", flags = {synthetic = true}, strict = {"root"},
                                      defaults = {device = "cuda", dtype = "f32", steps = 20, batch_size = 64,
                                                  seed = 1, tol = 1e-4, lr = 0.01}})
local device = opt.device
if device ~= "cpu" and not device:match("^cuda") then
  error("train_check: --device must be cpu or cuda[:N], got " .. tostring(device), 0)
end
if opt.dtype ~= "f32" and opt.dtype ~= "f64" then error("train_check: --dtype must be f32 or f64", 0) end
if device ~= "cpu" and not kiln.cuda.is_available() then
  print("skipped: no CUDA device (" .. tostring(kiln.cuda.unavailable_reason()) .. ")")
  os.exit(0)
end

local steps, batch = opt.steps, opt.batch_size

-- ---- the batches: Fashion-MNIST's first steps * batch training images in order, or synthetic ----
local batches, source = {}, nil
local ok, train = false, nil
if not opt.synthetic then
  ok, train = pcall(function() return require("datasets.fashion_mnist").load{split = "train", root = opt.root} end)
end
if ok then
  source = string.format("Fashion-MNIST (%s), the first %d training images in order",
                         opt.root or require("datasets.fashion_mnist").root, steps * batch)
  for i = 1, steps do
    local first = (i - 1) * batch + 1
    batches[i] = {train.images:narrow(1, first, batch):contiguous(), train.labels:narrow(1, first, batch):contiguous()}
  end
else
  source = string.format("synthetic (seed %d: ten random 28x28 templates, label = template, plus N(0,1) noise, scaled to unit variance)%s",
                         opt.seed, opt.synthetic and "" or "; no Fashion-MNIST files found")
  kiln.manual_seed(opt.seed + 1000)
  local templates = kiln.randn(10, 1, 28, 28)
  for i = 1, steps do
    local y = kiln.randint(1, 11, {batch})
    local x = (templates:index_select(1, y) + kiln.randn(batch, 1, 28, 28) * 0.5) / math.sqrt(1.25)   -- variance 1
    batches[i] = {x, y}
  end
end

-- ---- the same initial weights on both sides ----
kiln.manual_seed(opt.seed)
local lenet = require "models.lenet"
local ref = lenet()
local dev, r64 = lenet(), lenet()
dev:load_state_dict(ref:state_dict())
r64:load_state_dict(ref:state_dict())
dev:to(device)
if opt.dtype ~= "f32" then dev:to(opt.dtype) end
r64:to("f64")
local sgd_opts = {lr = opt.lr, momentum = 0.9, nesterov = true}
local ref_opt, dev_opt = optim.SGD(ref:parameters(), sgd_opts), optim.SGD(dev:parameters(), sgd_opts)
local r64_opt = optim.SGD(r64:parameters(), sgd_opts)
local criterion = nn.CrossEntropyLoss()

local function step(model, o, x, y)
  local loss = criterion(model(x), y)
  o:zero_grad()
  loss:backward()
  o:step()
  return loss:item()
end

local other = device .. (opt.dtype ~= "f32" and (" " .. opt.dtype) or "")
local lines = {
  string.format("kiln train_check: models/lenet.lua (%d parameters), batch %d, %d steps, SGD lr %g momentum 0.9 nesterov",
                ref:num_parameters(), batch, steps, opt.lr),
  "data: " .. source,
  string.format("cpu f32 against %s; error |%s - cpu| / max(1, |cpu|) <= bound = %g * step; f64: the same for cpu f64 (not checked)",
                other, other, opt.tol),
  string.format("%4s  %12s  %12s  %10s  %10s  %10s", "step", "cpu", other, "error", "bound", "f64"),
}
for _, l in ipairs(lines) do print(l) end

-- The report: lines so far and the result line, on standard output and in $OUT/train_check.txt.
local function finish(result, passed)
  print(result)
  lines[#lines + 1] = result
  local dir = os.getenv("OUT")
  if dir and dir ~= "" then
    local f = assert(io.open(dir .. "/train_check.txt", "w"))
    f:write(table.concat(lines, "\n"), "\n")
    f:close()
  end
  os.exit(passed and 0 or 1)
end

local failures, worst, first_loss, last_loss = {}, 0, nil, nil
local t0 = ui.clock()
local at = 0
-- An error on either side (a kernel, out of memory) still ends in the report, naming the step.
local ok, err = pcall(function()
  for i, b in ipairs(batches) do
    at = i
    local x, y = b[1], b[2]
    local a = step(ref, ref_opt, x, y)
    local xd = x:to(device)
    if opt.dtype ~= "f32" then xd = xd:to(opt.dtype) end
    local d = step(dev, dev_opt, xd, y:to(device))
    local e64 = math.abs(step(r64, r64_opt, x:to("f64"), y) - a) / math.max(1, math.abs(a))
    local e = math.abs(d - a) / math.max(1, math.abs(a))
    local bound = opt.tol * i
    local bad = not (e <= bound) or a ~= a or d ~= d or math.abs(a) == math.huge
    if bad then failures[#failures + 1] = i end
    if e == e then worst = math.max(worst, e / bound) end
    first_loss, last_loss = first_loss or a, a
    local l = string.format("%4d  %12.7f  %12.7f  %10.3g  %10.3g  %10.3g%s", i, a, d, e, bound, e64,
                            bad and "  OUT OF TOLERANCE" or "")
    print(l)
    lines[#lines + 1] = l
  end
end)
if not ok then finish(string.format("train_check: FAILED, an error at step %d: %s", at, tostring(err)), false) end
local seconds = ui.clock() - t0

-- The final weights, for the record (not checked: the losses are).
local wdiff = 0
kiln.no_grad(function()
  local rp, dp = ref:parameters(), dev:parameters()
  for i = 1, #rp do
    local r = rp[i]:to("f64")
    local e = ((dp[i]:to("cpu"):to("f64") - r):abs() / r:abs():clamp(1, nil)):max():item()
    wdiff = math.max(wdiff, e)
  end
end)
lines[#lines + 1] = string.format("loss %.4f -> %.4f over %d steps; final weights differ by at most %.3g (normalised); %.1f s",
                                  first_loss, last_loss, steps, wdiff, seconds)
local learned = last_loss < first_loss
if not learned then lines[#lines + 1] = "the loss did not fall: the check trained nothing" end
for i = #lines - (learned and 0 or 1), #lines do print(lines[i]) end
if #failures == 0 and learned then
  finish(string.format("train_check: passed, %d steps of the CNN on cpu and %s agree within %g * step (worst %.0f%% of the bound)",
                       steps, other, opt.tol, worst * 100), true)
end
finish(string.format("train_check: FAILED, %s", #failures > 0 and
                     (#failures .. " step(s) out of tolerance, first step " .. failures[1]) or "the loss did not fall"), false)
