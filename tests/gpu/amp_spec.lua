-- tests/gpu/amp_spec.lua: mixed precision on cuda:0: bf16 and f16 convolutions (cuDNN, tensor cores,
-- f32 accumulation) forward and backward against f64 arithmetic on the CPU on the same rounded
-- inputs; products under autocast; a small CNN's gradients under autocast against f32 on the CPU;
-- GradScaler's overflow and backoff with f16 on cuda. Exits 1 when a check fails; without a GPU
-- prints "skipped: no CUDA device" and exits 0.
--   build/bin/kiln tests/gpu/amp_spec.lua           (tests/gpu/run.sh runs it)
local kiln = kiln or require "kiln"
local cuda = kiln.cuda
if not cuda.is_available() then
  print("skipped: no CUDA device (" .. tostring(cuda.unavailable_reason()) .. ")")
  os.exit(0)
end
local F, nn, amp = kiln.functional, kiln.nn, kiln.amp
local failed, checks = 0, 0
local function check(ok, what)
  checks = checks + 1
  print((ok and "pass  " or "FAIL  ") .. what)
  if not ok then failed = failed + 1 end
end
local function rel(a, b)
  local d = a:cpu():double() - b:cpu():double()
  return math.sqrt((d * d):sum():item()) / math.max(math.sqrt((b:cpu():double() * b:cpu():double()):sum():item()), 1e-30)
end
local function guarded(what, fn)
  local ok, err = pcall(fn)
  if not ok then check(false, what .. ": " .. tostring(err)) end
end

for _, dt in ipairs{"bf16", "f16"} do
  guarded(dt .. " conv2d", function()
    kiln.manual_seed(1)
    local x = kiln.randn(4, 8, 15, 13):to(dt)
    local w = kiln.randn(16, 4, 3, 3):to(dt)
    local b = kiln.randn(16):to(dt)
    local opts = {padding = 1, stride = {2, 1}, groups = 2}
    local xd, wd, bd = x:double():requires_grad_(), w:double():requires_grad_(), b:double():requires_grad_()
    local want = F.conv2d(xd, wd, bd, opts)
    local xc, wc, bc = x:cuda():requires_grad_(), w:cuda():requires_grad_(), b:cuda():requires_grad_()
    local got = F.conv2d(xc, wc, bc, opts)
    check(got:dtype() == dt, dt .. " conv2d keeps " .. dt)
    local tol = dt == "bf16" and 2 ^ -7 or 2 ^ -10
    check(rel(got, want) < tol, string.format("%s conv2d forward within %g (%.3g)", dt, tol, rel(got, want)))
    local g = kiln.randn(got:size()):to(dt)
    want:backward(g:double())
    got:backward(g:cuda())
    for _, p in ipairs{{xc.grad, xd.grad, "x"}, {wc.grad, wd.grad, "w"}, {bc.grad, bd.grad, "b"}} do
      check(rel(p[1], p[2]) < tol, string.format("%s conv2d grad %s within %g (%.3g)", dt, p[3], tol, rel(p[1], p[2])))
    end
  end)
end

guarded("autocast on cuda", function()
  kiln.manual_seed(2)
  local a, w = kiln.randn(64, 96):cuda(), kiln.randn(96, 32):cuda()
  local y = amp.autocast("bf16", function() return a:matmul(w) end)
  check(y:dtype() == "bf16", "matmul under autocast is bf16 on cuda")
  check(rel(y, a:cpu():matmul(w:cpu())) < 2 ^ -6, "matmul under autocast against f32")
  local model = nn.Sequential{nn.Conv2d(1, 6, 5, {padding = 2}), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(),
                              nn.MaxPool2d(2), nn.Flatten(), nn.Linear(400, 10)}
  local x, t = kiln.randn(8, 1, 28, 28), kiln.randint(1, 11, {8})
  local loss_fn = nn.CrossEntropyLoss()
  model:zero_grad()
  loss_fn(model(x), t):backward()
  local g32 = {}
  for i, p in ipairs(model:parameters()) do g32[i] = p.grad:clone() end
  model:cuda()
  model:zero_grad()
  amp.autocast("bf16", function() return loss_fn(model(x:cuda()), t:cuda()) end):backward()
  for i, p in ipairs(model:parameters()) do
    check(p.grad:dtype() == "f32" and rel(p.grad, g32[i]) < 0.15,
          string.format("CNN grad %d under bf16 on cuda against f32 on the CPU (%.3g)", i, rel(p.grad, g32[i])))
  end
end)

guarded("GradScaler with f16 on cuda", function()
  local p = kiln.tensor({1, 2, 3}):cuda():requires_grad_()
  local opt = kiln.optim.SGD({p}, {lr = 0.1})
  local scaler = amp.GradScaler{init_scale = 2 ^ 16}
  local x = kiln.tensor{{60000, 1, 1}}:cuda()
  local loss = amp.autocast("f16", function() return x:matmul(p:view(3, 1)):float():sum() end)
  scaler:scale(loss):backward()
  local before = p:cpu():totable()
  check(not scaler:step(opt), "an f16 overflow skips the step")
  scaler:update()
  check(scaler:get_scale() == 2 ^ 15, "and halves the scale")
  check(p:cpu():totable()[1] == before[1], "the parameter is unchanged")
end)

print(string.format("%d checks, %d failed", checks, failed))
os.exit(failed == 0 and 0 or 1)
