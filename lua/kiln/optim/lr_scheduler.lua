-- kiln.optim.lr_scheduler: learning-rate schedules with PyTorch's semantics: a scheduler sets
-- each group's lr when it is made (step 0) and again at every sched:step(), called after
-- opt:step(). StepLR, MultiStepLR, ExponentialLR and CosineAnnealingLR use PyTorch's recursive
-- (chainable) formulas, so their lrs match PyTorch's to the last bit.
local core = require "kiln.core"
local raise = core.raise

local M = {}

local function list_copy(l)
  local r = {}
  for i, v in ipairs(l) do r[i] = v end
  return r
end

local function deep_copy(v)
  if type(v) ~= "table" then return v end
  local r = {}
  for k, x in pairs(v) do r[k] = deep_copy(x) end
  return r
end

-- A per-group value: a number for all groups, or a list with one per group.
local function per_group(name, v, groups, what)
  if type(v) == "table" then
    if #v ~= #groups then raise(string.format("%s: %s has %d values for %d parameter groups", name, what, #v, #groups)) end
    return list_copy(v)
  end
  local r = {}
  for i = 1, #groups do r[i] = v end
  return r
end

local function check_optimizer(name, opt)
  if type(opt) ~= "table" or type(opt.param_groups) ~= "table" then
    raise(name .. ": the first argument must be an optimizer")
  end
end

-- ---- the base ----

local Scheduler = {}
Scheduler.__index = Scheduler
M.LRScheduler = Scheduler

local function class(name)
  local cls = setmetatable({}, {__index = Scheduler})
  cls.__index = core.class_index(cls)   -- sched:stpe() names sched:step()
  cls.__name = name
  return cls
end

-- Record initial_lr in every group (kept when a scheduler set it before) and take step 0.
local function init(self, optimizer)
  self.optimizer = optimizer
  self.last_epoch = -1
  self._step_count = 0
  self.base_lrs = {}
  for i, g in ipairs(optimizer.param_groups) do
    if g.initial_lr == nil then g.initial_lr = g.lr end
    self.base_lrs[i] = g.initial_lr
  end
  self:step()
  return self
end

function Scheduler:step()
  self._step_count = self._step_count + 1
  self.last_epoch = self.last_epoch + 1
  local lrs = self:get_lr()
  for i, g in ipairs(self.optimizer.param_groups) do g.lr = lrs[i] end
  self._last_lr = lrs
end

-- The lrs the last step set, one per group.
function Scheduler:get_last_lr() return list_copy(self._last_lr) end

-- Everything but the optimizer, for checkpoints.
function Scheduler:state_dict()
  local sd = {}
  for k, v in pairs(self) do
    if k ~= "optimizer" then sd[k] = deep_copy(v) end
  end
  return sd
end

-- Takes the fields of a state dict from a scheduler of the same kind: a field this one does not
-- have, or of another type, is an error (a dict of another kind of scheduler, or of one made with
-- other options), and then nothing is taken.
function Scheduler:load_state_dict(sd)
  local name = (getmetatable(self).__name or "LRScheduler") .. ".load_state_dict"
  if type(sd) ~= "table" then raise(string.format("%s: expected a table from state_dict(), got %s", name, core.describe(sd))) end
  for k, v in pairs(sd) do
    local mine = rawget(self, k)
    if k ~= "optimizer" then
      if mine == nil then
        raise(string.format("%s: the state dict has a field %q that this scheduler does not have (saved from another kind " ..
                            "of scheduler, or one made with other options?)", name, tostring(k)))
      end
      if type(v) ~= type(mine) then
        raise(string.format("%s: field %q is %s in the state dict, a %s here", name, tostring(k), core.describe(v), type(mine)))
      end
    end
  end
  if self._check_loaded then self:_check_loaded(sd, name) end   -- a kind's own checks of its fields
  for k, v in pairs(sd) do
    if k ~= "optimizer" then self[k] = deep_copy(v) end
  end
end

local function group_lrs(self)
  local r = {}
  for i, g in ipairs(self.optimizer.param_groups) do r[i] = g.lr end
  return r
end

-- ---- StepLR: lr * gamma every step_size steps ----

local StepLR = class("StepLR")
M.StepLR = StepLR
setmetatable(StepLR, {__index = Scheduler, __call = function(cls, optimizer, opts)
  opts = core.options(opts, core.set("step_size", "gamma"), "StepLR")
  check_optimizer("StepLR", optimizer)
  if type(opts.step_size) ~= "number" or opts.step_size < 1 then raise("StepLR: step_size must be a positive integer") end
  local self = setmetatable({step_size = opts.step_size, gamma = opts.gamma or 0.1}, cls)
  return init(self, optimizer)
end})

function StepLR:get_lr()
  if self.last_epoch == 0 or self.last_epoch % self.step_size ~= 0 then return group_lrs(self) end
  local r = group_lrs(self)
  for i = 1, #r do r[i] = r[i] * self.gamma end
  return r
end

-- ---- MultiStepLR: lr * gamma at each milestone (a milestone listed twice counts twice) ----

local MultiStepLR = class("MultiStepLR")
M.MultiStepLR = MultiStepLR
setmetatable(MultiStepLR, {__index = Scheduler, __call = function(cls, optimizer, opts)
  opts = core.options(opts, core.set("milestones", "gamma"), "MultiStepLR")
  check_optimizer("MultiStepLR", optimizer)
  if type(opts.milestones) ~= "table" then raise("MultiStepLR: milestones must be a list of step numbers") end
  local counts = {}
  for _, m in ipairs(opts.milestones) do counts[m] = (counts[m] or 0) + 1 end
  local self = setmetatable({milestones = counts, gamma = opts.gamma or 0.1}, cls)
  return init(self, optimizer)
end})

function MultiStepLR:get_lr()
  local r = group_lrs(self)
  local k = self.milestones[self.last_epoch]
  if not k then return r end
  for i = 1, #r do r[i] = r[i] * self.gamma ^ k end
  return r
end

-- ---- ExponentialLR: lr * gamma every step ----

local ExponentialLR = class("ExponentialLR")
M.ExponentialLR = ExponentialLR
setmetatable(ExponentialLR, {__index = Scheduler, __call = function(cls, optimizer, opts)
  opts = core.options(opts, core.set("gamma"), "ExponentialLR")
  check_optimizer("ExponentialLR", optimizer)
  if type(opts.gamma) ~= "number" then raise("ExponentialLR: gamma must be a number") end
  return init(setmetatable({gamma = opts.gamma}, cls), optimizer)
end})

function ExponentialLR:get_lr()
  local r = group_lrs(self)
  if self.last_epoch == 0 then return r end
  for i = 1, #r do r[i] = r[i] * self.gamma end
  return r
end

-- ---- CosineAnnealingLR, with an optional linear warm-up ----
-- Without warm-up: PyTorch's CosineAnnealingLR (from base_lr down to eta_min over T_max steps,
-- then back up: a period of 2 T_max). With warmup_steps = W > 0 (not in PyTorch): for t < W the lr
-- rises linearly, base_lr * (t + 1) / (W + 1); from t = W it follows the cosine from base_lr,
-- eta_min + (base_lr - eta_min) * (1 + cos(pi * (t - W) / T_max)) / 2, so T_max counts the steps
-- after the warm-up and the whole schedule reaches eta_min at t = W + T_max.

local CosineAnnealingLR = class("CosineAnnealingLR")
M.CosineAnnealingLR = CosineAnnealingLR
setmetatable(CosineAnnealingLR, {__index = Scheduler, __call = function(cls, optimizer, opts)
  opts = core.options(opts, core.set("T_max", "eta_min", "warmup_steps"), "CosineAnnealingLR")
  check_optimizer("CosineAnnealingLR", optimizer)
  if type(opts.T_max) ~= "number" or opts.T_max <= 0 then raise("CosineAnnealingLR: T_max must be a positive number of steps") end
  local w = opts.warmup_steps or 0
  if type(w) ~= "number" or w < 0 then raise("CosineAnnealingLR: warmup_steps must be a number >= 0") end
  return init(setmetatable({T_max = opts.T_max, eta_min = opts.eta_min or 0, warmup_steps = w}, cls), optimizer)
end})

function CosineAnnealingLR:get_lr()
  local t, T, eta = self.last_epoch, self.T_max, self.eta_min
  local r = group_lrs(self)
  local W = self.warmup_steps
  if W > 0 then
    for i, base in ipairs(self.base_lrs) do
      if t < W then r[i] = base * (t + 1) / (W + 1)
      else r[i] = eta + (base - eta) * (1 + math.cos(math.pi * (t - W) / T)) / 2 end
    end
    return r
  end
  if t == 0 then return r end
  if (t - 1 - T) % (2 * T) == 0 then
    for i, base in ipairs(self.base_lrs) do r[i] = r[i] + (base - eta) * (1 - math.cos(math.pi / T)) / 2 end
    return r
  end
  for i = 1, #r do
    r[i] = (1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T)) * (r[i] - eta) + eta
  end
  return r
end

-- ---- OneCycleLR (Smith & Topin): warm up to max_lr, then anneal far below the start ----
-- PyTorch's defaults: pct_start 0.3, cosine annealing, div_factor 25, final_div_factor 1e4, and
-- momentum (or Adam's beta1) cycled between 0.95 and 0.85 inversely to the lr.

local OneCycleLR = class("OneCycleLR")
M.OneCycleLR = OneCycleLR

local function anneal_cos(start, stop, pct) return stop + (start - stop) / 2 * (math.cos(math.pi * pct) + 1) end
local function anneal_linear(start, stop, pct) return (stop - start) * pct + start end
local anneal_by_name = {cos = anneal_cos, linear = anneal_linear}

setmetatable(OneCycleLR, {__index = Scheduler, __call = function(cls, optimizer, opts)
  opts = core.options(opts, core.set("max_lr", "total_steps", "epochs", "steps_per_epoch", "pct_start", "anneal_strategy", "cycle_momentum", "base_momentum", "max_momentum", "div_factor", "final_div_factor", "three_phase"), "OneCycleLR")
  local name = "OneCycleLR"
  check_optimizer(name, optimizer)
  local groups = optimizer.param_groups
  local total = opts.total_steps
  if total == nil then
    if not (opts.epochs and opts.steps_per_epoch) then raise(name .. ": give total_steps, or epochs and steps_per_epoch") end
    if opts.epochs <= 0 or opts.steps_per_epoch <= 0 then raise(name .. ": epochs and steps_per_epoch must be positive") end
    total = opts.epochs * opts.steps_per_epoch
  elseif type(total) ~= "number" or total <= 0 then
    raise(name .. ": total_steps must be a positive integer, got " .. tostring(total))
  end
  local pct_start = opts.pct_start or 0.3
  if type(pct_start) ~= "number" or pct_start < 0 or pct_start > 1 then
    raise(name .. ": pct_start must be between 0 and 1, got " .. tostring(pct_start))
  end
  local strategy = opts.anneal_strategy or "cos"
  if not anneal_by_name[strategy] then
    raise(name .. ": anneal_strategy must be \"cos\" or \"linear\", got " .. tostring(strategy))
  end
  if opts.max_lr == nil then raise(name .. ": max_lr is required") end
  -- the strategy by name (PyTorch's _anneal_func_type), so that a state dict and a checkpoint carry it
  local self = setmetatable({total_steps = total, _anneal_func_type = strategy,
                             cycle_momentum = opts.cycle_momentum ~= false}, cls)
  if opts.three_phase then
    self._schedule_phases = {
      {end_step = pct_start * total - 1, start_lr = "initial_lr", end_lr = "max_lr", start_momentum = "max_momentum", end_momentum = "base_momentum"},
      {end_step = 2 * pct_start * total - 2, start_lr = "max_lr", end_lr = "initial_lr", start_momentum = "base_momentum", end_momentum = "max_momentum"},
      {end_step = total - 1, start_lr = "initial_lr", end_lr = "min_lr", start_momentum = "max_momentum", end_momentum = "max_momentum"},
    }
  else
    self._schedule_phases = {
      {end_step = pct_start * total - 1, start_lr = "initial_lr", end_lr = "max_lr", start_momentum = "max_momentum", end_momentum = "base_momentum"},
      {end_step = total - 1, start_lr = "max_lr", end_lr = "min_lr", start_momentum = "base_momentum", end_momentum = "max_momentum"},
    }
  end
  local max_lrs = per_group(name, opts.max_lr, groups, "max_lr")
  local div, final_div = opts.div_factor or 25, opts.final_div_factor or 1e4
  for i, g in ipairs(groups) do
    local initial = max_lrs[i] / div
    g.initial_lr, g.max_lr, g.min_lr = initial, max_lrs[i], initial / final_div
  end
  if self.cycle_momentum then
    local d = optimizer.defaults or {}
    if d.momentum == nil and d.betas == nil then
      raise(name .. ": the optimizer has no momentum nor beta1 to cycle; pass cycle_momentum = false")
    end
    self.use_beta1 = d.betas ~= nil
    local maxm = per_group(name, opts.max_momentum or 0.95, groups, "max_momentum")
    local basem = per_group(name, opts.base_momentum or 0.85, groups, "base_momentum")
    for i, g in ipairs(groups) do
      if self.use_beta1 then g.betas = {maxm[i], g.betas[2]} else g.momentum = maxm[i] end
      g.max_momentum, g.base_momentum = maxm[i], basem[i]
    end
  end
  return init(self, optimizer)
end})

function OneCycleLR:_check_loaded(sd, name)
  if sd._anneal_func_type ~= nil and not anneal_by_name[sd._anneal_func_type] then
    raise(string.format("%s: _anneal_func_type %q is unknown (cos or linear)", name, tostring(sd._anneal_func_type)))
  end
end

function OneCycleLR:get_lr()
  local step = self.last_epoch
  if step > self.total_steps then
    raise(string.format("OneCycleLR: tried to step %d times; total_steps is %d", step, self.total_steps))
  end
  local r = {}
  local phases = self._schedule_phases
  local anneal = anneal_by_name[self._anneal_func_type]   -- checked when made and when loaded
  for i, g in ipairs(self.optimizer.param_groups) do
    local start_step = 0
    local lr, momentum
    for k, ph in ipairs(phases) do
      if step <= ph.end_step or k == #phases then
        local pct = (step - start_step) / (ph.end_step - start_step)
        lr = anneal(g[ph.start_lr], g[ph.end_lr], pct)
        if self.cycle_momentum then momentum = anneal(g[ph.start_momentum], g[ph.end_momentum], pct) end
        break
      end
      start_step = ph.end_step
    end
    r[i] = lr
    if self.cycle_momentum then
      if self.use_beta1 then g.betas = {momentum, g.betas[2]} else g.momentum = momentum end
    end
  end
  return r
end

-- ---- ReduceLROnPlateau: lr * factor when a metric stops improving ----
-- sched:step(metric) after each evaluation; mode "min" (a loss) or "max" (an accuracy).

local ReduceLROnPlateau = class("ReduceLROnPlateau")
M.ReduceLROnPlateau = ReduceLROnPlateau
setmetatable(ReduceLROnPlateau, {__index = Scheduler, __call = function(cls, optimizer, opts)
  opts = core.options(opts, core.set("mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "min_lr", "eps"), "ReduceLROnPlateau")
  local name = "ReduceLROnPlateau"
  check_optimizer(name, optimizer)
  local self = setmetatable({
    optimizer = optimizer,
    mode = opts.mode or "min", factor = opts.factor or 0.1, patience = opts.patience or 10,
    threshold = opts.threshold or 1e-4, threshold_mode = opts.threshold_mode or "rel",
    cooldown = opts.cooldown or 0, eps = opts.eps or 1e-8,
    min_lrs = per_group(name, opts.min_lr or 0, optimizer.param_groups, "min_lr"),
    cooldown_counter = 0, num_bad_epochs = 0, last_epoch = 0,
  }, cls)
  if self.factor >= 1 then raise(name .. ": factor should be < 1.0") end
  if self.mode ~= "min" and self.mode ~= "max" then raise(name .. ": mode " .. tostring(self.mode) .. " is unknown (min or max)") end
  if self.threshold_mode ~= "rel" and self.threshold_mode ~= "abs" then
    raise(name .. ": threshold_mode " .. tostring(self.threshold_mode) .. " is unknown (rel or abs)")
  end
  self.best = self.mode == "min" and math.huge or -math.huge
  self._last_lr = group_lrs(self)
  return self
end})

function ReduceLROnPlateau:is_better(a, best)
  local rel = self.threshold_mode == "rel"
  if self.mode == "min" then
    if rel then return a < best * (1 - self.threshold) end
    return a < best - self.threshold
  end
  if rel then return a > best * (self.threshold + 1) end
  return a > best + self.threshold
end

function ReduceLROnPlateau:step(metric)
  if core.is_tensor(metric) then metric = metric:item() end
  if type(metric) ~= "number" then raise("ReduceLROnPlateau.step: expected the metric (a number), got " .. type(metric)) end
  self.last_epoch = self.last_epoch + 1
  if self:is_better(metric, self.best) then
    self.best = metric
    self.num_bad_epochs = 0
  else
    self.num_bad_epochs = self.num_bad_epochs + 1
  end
  if self.cooldown_counter > 0 then
    self.cooldown_counter = self.cooldown_counter - 1
    self.num_bad_epochs = 0
  end
  if self.num_bad_epochs > self.patience then
    for i, g in ipairs(self.optimizer.param_groups) do
      local old = g.lr
      local new = math.max(old * self.factor, self.min_lrs[i])
      if old - new > self.eps then g.lr = new end
    end
    self.cooldown_counter = self.cooldown
    self.num_bad_epochs = 0
  end
  self._last_lr = group_lrs(self)
end

return M
