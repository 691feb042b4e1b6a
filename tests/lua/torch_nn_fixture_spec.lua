-- kiln's nn ops, losses, optimizers, schedulers and clipping against PyTorch itself:
-- tests/fixtures/torch_nn.safetensors holds what PyTorch 1.13 computed in f64 (values, and the
-- gradients of sum(y * r) for a stored r) on the same inputs (tools/torch_fixtures.py wrote it).
-- PyTorch counts dims and class labels from 0, kiln from 1: the calls below say each in kiln's terms.
-- KILN_FIXTURE_DEVICE=cuda runs the same on a GPU (tests/gpu/run.sh).
local kiln = kiln or require "kiln"
local F = require "kiln.functional"
local nn, optim = kiln.nn, kiln.optim
local DIR = debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/"
package.path = DIR .. "?.lua;" .. package.path
local H = require "helpers"

local fx, DEV = H.torch_fixture("torch_nn.safetensors")
if not fx then   -- no such device here
  describe("nn ops against PyTorch", function() it("needs the device", function() pending(DEV) end) end)
  return
end
local TOL = 1e-10

-- A tensor of the fixture, on DEV.
local function get(case, name)
  return assert(fx[case .. "." .. name], "the fixture lacks " .. case .. "." .. name):to(DEV)
end
local function leaf(case, name) return get(case, name):clone():requires_grad_() end
local function near(got, want, what, tol)
  local ok, msg = H.compare(got:to("cpu"), want:to("cpu"):totable(), tol or TOL)
  assert(ok, what .. ": " .. tostring(msg))
end

-- y = fn(inputs...) against the case's y, then the grads of sum(y * r) against grad_<name>.
local function check(case, names, fn)
  local inputs = {}
  for i, name in ipairs(names) do inputs[i] = leaf(case, name) end
  local y = fn(unpack(inputs))
  near(y, get(case, "y"), case .. ": value")
  ;(y * get(case, "r")):sum():backward()
  for i, name in ipairs(names) do near(inputs[i].grad, get(case, "grad_" .. name), case .. ": grad of " .. name) end
end

describe("nn ops against PyTorch", function()
  it("conv2d with per-dim stride, padding and dilation, and groups", function()
    check("conv2d", {"x", "w", "b"}, function(x, w, b)
      return F.conv2d(x, w, b, {stride = {2, 1}, padding = {1, 2}, dilation = {1, 2}, groups = 2})
    end)
  end)

  it("conv1d with stride, padding and dilation", function()
    check("conv1d", {"x", "w", "b"}, function(x, w, b) return F.conv1d(x, w, b, {stride = 2, padding = 1, dilation = 2}) end)
  end)

  it("conv_transpose2d with output_padding and groups", function()
    check("conv_transpose2d", {"x", "w", "b"}, function(x, w, b)
      return F.conv_transpose2d(x, w, b, {stride = 2, padding = 1, output_padding = 1, groups = 2})
    end)
  end)

  it("max_pool2d with ceil_mode and padding, and with dilation", function()
    check("max_pool2d_ceil", {"x"}, function(x) return F.max_pool2d(x, 3, 2, {padding = 1, ceil_mode = true}) end)
    check("max_pool2d_dilated", {"x"}, function(x) return F.max_pool2d(x, 2, 1, {padding = 1, dilation = 2}) end)
  end)

  it("avg_pool2d with and without the padding counted, and ceil_mode", function()
    check("avg_pool2d_ceil_nopad", {"x"}, function(x)
      return F.avg_pool2d(x, 3, 2, {padding = 1, ceil_mode = true, count_include_pad = false})
    end)
    check("avg_pool2d_pad", {"x"}, function(x) return F.avg_pool2d(x, 3, 2, {padding = 1}) end)
  end)

  it("adaptive_avg_pool2d to a size that does not divide the input", function()
    check("adaptive_avg_pool2d", {"x"}, function(x) return F.adaptive_avg_pool2d(x, {3, 4}) end)
  end)

  it("batch_norm in training: the output, the grads and the running stats it moves", function()
    local rm, rv = get("batch_norm", "running_mean0"):clone(), get("batch_norm", "running_var0"):clone()
    check("batch_norm", {"x", "w", "b"}, function(x, w, b)
      return F.batch_norm(x, rm, rv, w, b, {training = true, momentum = 0.2, eps = 1e-4})
    end)
    near(rm, get("batch_norm", "running_mean"), "running_mean")
    near(rv, get("batch_norm", "running_var"), "running_var")
  end)

  it("layer_norm over the last two dims and group_norm", function()
    check("layer_norm", {"x", "w", "b"}, function(x, w, b) return F.layer_norm(x, {4, 5}, w, b, {eps = 1e-4}) end)
    check("group_norm", {"x", "w", "b"}, function(x, w, b) return F.group_norm(x, 3, w, b, {eps = 1e-4}) end)
  end)
end)

describe("losses against PyTorch", function()
  local target = get("cross_entropy", "target") + 1   -- kiln's labels count from 1; 3 is PyTorch's ignored 2
  local weight = get("cross_entropy", "weight")

  for _, reduction in ipairs{"none", "sum", "mean"} do
    it("cross_entropy with class weights, an ignored label and label smoothing, reduction " .. reduction, function()
      local z = get("cross_entropy", "z_" .. reduction):clone():requires_grad_()
      local case = "cross_entropy_" .. reduction
      local y = F.cross_entropy(z, target, weight, {ignore_index = 3, label_smoothing = 0.2, reduction = reduction})
      near(y, get(case, "y"), case)
      ;(y * get(case, "r")):sum():backward()
      near(z.grad, get(case, "grad_z"), case .. ": grad")
    end)
  end

  it("cross_entropy over [N,C,H,W] with label smoothing, and nll_loss with weights and an ignored label", function()
    local t4 = get("cross_entropy_4d", "target") + 1
    check("cross_entropy_4d", {"z"}, function(z) return F.cross_entropy(z, t4, {label_smoothing = 0.1}) end)
    check("nll_loss", {"z"}, function(z) return F.nll_loss(F.log_softmax(z, 2), target, weight, {ignore_index = 3}) end)
  end)

  it("MSE, L1 (sum), smooth L1 (beta 0.5), BCE and BCE with logits (none)", function()
    local t = get("elementwise_losses", "target")
    local t01 = get("bce_target", "t")
    check("mse", {"a"}, function(a) return nn.MSELoss()(a, t) end)
    check("l1", {"a"}, function(a) return nn.L1Loss{reduction = "sum"}(a, t) end)
    check("smooth_l1", {"a"}, function(a) return nn.SmoothL1Loss{beta = 0.5}(a, t) end)
    check("bce", {"p"}, function(p) return nn.BCELoss()(p, t01) end)
    check("bce_with_logits", {"z"}, function(z) return nn.BCEWithLogitsLoss{reduction = "none"}(z * 4, t01) end)
  end)
end)

describe("optimizers, schedulers and clipping against PyTorch", function()
  local configs = {
    sgd_momentum = function(q) return optim.SGD({q}, {lr = 0.1, momentum = 0.9, dampening = 0.1, weight_decay = 0.01}) end,
    sgd_nesterov = function(q) return optim.SGD({q}, {lr = 0.1, momentum = 0.9, nesterov = true, weight_decay = 0.01}) end,
    adam = function(q) return optim.Adam({q}, {lr = 0.01, betas = {0.8, 0.99}, eps = 1e-6, weight_decay = 0.1}) end,
    adam_amsgrad = function(q) return optim.Adam({q}, {lr = 0.01, amsgrad = true}) end,
    adamw = function(q) return optim.AdamW({q}, {lr = 0.01, weight_decay = 0.1}) end,
    rmsprop = function(q)
      return optim.RMSprop({q}, {lr = 0.01, alpha = 0.9, eps = 1e-6, weight_decay = 0.01, momentum = 0.5, centered = true})
    end,
    adagrad = function(q)
      return optim.Adagrad({q}, {lr = 0.1, lr_decay = 0.01, weight_decay = 0.01, initial_accumulator_value = 0.1, eps = 1e-8})
    end,
  }
  for _, name in ipairs{"sgd_momentum", "sgd_nesterov", "adam", "adam_amsgrad", "adamw", "rmsprop", "adagrad"} do
    it(name .. ": six steps with the same grads give the same parameters", function()
      local q = get("optim", "p0"):clone():requires_grad_()
      local opt = configs[name](q)
      local grads, want = get("optim", "grads"), get("optim", name)
      for s = 1, grads:size(1) do
        q.grad = grads[s]:clone()
        opt:step()
        near(q:detach(), want[s], name .. " after step " .. s, 1e-12)
      end
    end)
  end

  -- The lr (and momentum) at steps 0..15 of SGD(lr 0.1, momentum 0.9) under a scheduler.
  local function lrs(make, metrics)
    local q = kiln.zeros(1, {dtype = "f64", device = DEV}):requires_grad_()
    local opt = optim.SGD({q}, {lr = 0.1, momentum = 0.9})
    local sched = make(opt)
    local lr, mom = {}, {}
    for i = 1, 16 do
      lr[i], mom[i] = opt.param_groups[1].lr, opt.param_groups[1].momentum
      q.grad = kiln.zeros(1, {dtype = "f64", device = DEV})
      opt:step()
      if metrics then sched:step(metrics[i]) else sched:step() end
    end
    return kiln.tensor(lr, {dtype = "f64"}), kiln.tensor(mom, {dtype = "f64"})
  end

  it("StepLR, MultiStepLR, ExponentialLR and CosineAnnealingLR (past T_max)", function()
    near(lrs(function(o) return optim.StepLR(o, {step_size = 3, gamma = 0.5}) end), get("sched", "step"), "StepLR", 1e-12)
    near(lrs(function(o) return optim.MultiStepLR(o, {milestones = {2, 5, 9}, gamma = 0.3}) end), get("sched", "multistep"),
         "MultiStepLR", 1e-12)
    near(lrs(function(o) return optim.ExponentialLR(o, {gamma = 0.9}) end), get("sched", "exponential"), "ExponentialLR", 1e-12)
    near(lrs(function(o) return optim.CosineAnnealingLR(o, {T_max = 5, eta_min = 0.01}) end), get("sched", "cosine"),
         "CosineAnnealingLR", 1e-12)
  end)

  it("OneCycleLR: lr and momentum, cosine; and three phases, linear", function()
    local lr, mom = lrs(function(o) return optim.OneCycleLR(o, {max_lr = 1.0, total_steps = 17}) end)
    near(lr, get("sched", "onecycle_lr"), "OneCycleLR lr", 1e-12)
    near(mom, get("sched", "onecycle_momentum"), "OneCycleLR momentum", 1e-12)
    lr = lrs(function(o)
      return optim.OneCycleLR(o, {max_lr = 1.0, total_steps = 17, anneal_strategy = "linear", three_phase = true, pct_start = 0.25})
    end)
    near(lr, get("sched", "onecycle3_lr"), "OneCycleLR three phases", 1e-12)
  end)

  it("ReduceLROnPlateau with patience, cooldown, the relative threshold and min_lr", function()
    local metrics = get("sched", "plateau_metrics"):to("cpu"):totable()
    near(lrs(function(o) return optim.ReduceLROnPlateau(o, {factor = 0.5, patience = 1, cooldown = 1, min_lr = 0.02}) end, metrics),
         get("sched", "plateau"), "ReduceLROnPlateau", 1e-12)
  end)

  it("clip_grad_norm: the total 2-norm and inf-norm and the clipped grads", function()
    for _, spec in ipairs{{"l2", 2}, {"inf", math.huge}} do
      local a = kiln.zeros(3, 4, {dtype = "f64", device = DEV}):requires_grad_()
      local b = kiln.zeros(5, {dtype = "f64", device = DEV}):requires_grad_()
      a.grad, b.grad = get("clip", "ga"):clone(), get("clip", "gb"):clone()
      local total = optim.clip_grad_norm({a, b}, 1.5, spec[2])
      near(kiln.tensor({total}, {dtype = "f64"}), get("clip", spec[1] .. "_total"), spec[1] .. " total", 1e-12)
      near(a.grad, get("clip", spec[1] .. "_ga"), spec[1] .. " clipped grad a", 1e-12)
      near(b.grad, get("clip", spec[1] .. "_gb"), spec[1] .. " clipped grad b", 1e-12)
    end
  end)
end)
