-- kiln.amp: mixed precision. autocast runs a function with each op converting its inputs by its
-- op-table class (matrix products, convolutions and recurrent layers in bf16 or f16; exp, log,
-- sums, norms, softmax and losses in f32; the rest in their inputs' dtype), while the parameters
-- stay f32 (the master weights) and their gradients come back in f32. GradScaler scales the loss
-- for f16 so that small gradients do not flush to zero, and skips the steps whose gradients
-- overflowed.
--   local scaler = amp.GradScaler()                      -- f16; bf16 needs none
--   local loss = amp.autocast("f16", function() return loss_fn(model(x), y) end)
--   scaler:scale(loss):backward(); scaler:step(opt); scaler:update()
local core = require "kiln.core"
local autograd = require "kiln.autograd"
local ffi, C = core.ffi, core.C
local raise = core.raise

local M = {}

local LOWER = {bf16 = C.KILN_BF16, bfloat16 = C.KILN_BF16, f16 = C.KILN_F16, float16 = C.KILN_F16, half = C.KILN_F16}

local function lower_dtype(d, what)
  local v = LOWER[d]
  if not v then raise(string.format("%s: dtype must be \"bf16\" or \"f16\", got %s", what, tostring(d))) end
  return v
end

local function dtype_name(v) return v >= 0 and ffi.string(C.kiln_dtype_name(v)) or nil end

-- amp.autocast(dtype, fn, ...): fn(...) with autocast to dtype ("bf16" or "f16") on this thread, then
-- the previous state again (also when fn raises); returns what fn returns. dtype false or nil runs
-- fn as it is, so that a flag can switch it: amp.autocast(args.amp, step).
function M.autocast(dtype, fn, ...)
  local mt = type(fn) == "table" and getmetatable(fn)
  if type(fn) ~= "function" and not (mt and mt.__call) then raise("amp.autocast: expected (dtype, function, ...)") end
  if not dtype then return fn(...) end
  local prev = C.kiln_autocast_set(lower_dtype(dtype, "amp.autocast"))
  local function finish(ok, ...)
    C.kiln_autocast_set(prev)
    if not ok then error((...), 0) end
    return ...
  end
  return finish(pcall(fn, ...))
end

-- amp.set_autocast(dtype or nil): turn autocast on ("bf16", "f16") or off (nil) for what follows;
-- returns the previous dtype's name or nil. For loops that cannot be put in a function.
function M.set_autocast(dtype)
  local v = dtype and lower_dtype(dtype, "amp.set_autocast") or -1
  return dtype_name(C.kiln_autocast_set(v))
end

-- amp.autocast_dtype(): "bf16", "f16" or nil when autocast is off.
function M.autocast_dtype() return dtype_name(C.kiln_autocast_get()) end

-- amp.policy(op_name): the op's class in the op table: "lower", "f32", "keep" or "promote".
local ops_by_name
local function op_index(name)
  if not ops_by_name then
    ops_by_name = {}
    local d = ffi.new("struct kiln_op_desc")
    for op = 0, C.KILN_OP_COUNT - 1 do
      if C.kiln_op_describe(op, d) == 0 then ops_by_name[ffi.string(d.name)] = {op = op, class = ffi.string(d.autocast)} end
    end
  end
  local e = ops_by_name[name]
  if not e then raise(string.format("amp.policy: no op named %q (see docs/ops.md)", tostring(name))) end
  return e
end

function M.policy(name) return op_index(name).class end

-- amp.cast_dtype(op_name, dtype, lower[, device = "cpu"]): the dtype an input of dtype gets in the
-- op under autocast to lower, on that device type: what the op table and the device's kernels say.
function M.cast_dtype(name, dtype, lower, device)
  local d = C.kiln_dtype_from_name(dtype)
  if d < 0 then raise("amp.cast_dtype: unknown dtype " .. tostring(dtype)) end
  local dev = (device == nil or device == "cpu") and 0 or (tostring(device):match("^cuda") and 1)
  if not dev then raise("amp.cast_dtype: device must be \"cpu\" or \"cuda\", got " .. tostring(device)) end
  return dtype_name(C.kiln_autocast_dtype(op_index(name).op, d, dev, lower_dtype(lower, "amp.cast_dtype")))
end

-- ---- GradScaler ----

local GradScaler = {}
GradScaler.__index = GradScaler
M.GradScaler = setmetatable(GradScaler, {__call = function(_, opts) return GradScaler.new(opts) end})

local function positive(v, what)
  if type(v) ~= "number" or not (v > 0) or v == math.huge then
    raise(string.format("amp.GradScaler: %s must be a positive number, got %s", what, tostring(v)))
  end
  return v
end

-- amp.GradScaler([{init_scale = 65536, growth_factor = 2, backoff_factor = 0.5, growth_interval = 2000,
-- enabled = true}]): dynamic loss scaling, as torch.amp.GradScaler.
function GradScaler.new(opts)
  opts = opts or {}
  if type(opts) ~= "table" then raise("amp.GradScaler: options must be a table") end
  local self = setmetatable({}, GradScaler)
  self.enabled = opts.enabled ~= false
  self.scale_value = positive(opts.init_scale or 65536.0, "init_scale")
  self.growth_factor = positive(opts.growth_factor or 2.0, "growth_factor")
  self.backoff_factor = positive(opts.backoff_factor or 0.5, "backoff_factor")
  self.growth_interval = positive(opts.growth_interval or 2000, "growth_interval")
  if self.growth_factor <= 1 then raise("amp.GradScaler: growth_factor must be > 1") end
  if self.backoff_factor >= 1 then raise("amp.GradScaler: backoff_factor must be < 1") end
  self.growth_tracker = 0
  self.per_optimizer = {}   -- this step: opt -> {unscaled = true, found_inf = bool}
  return self
end

-- scaler:scale(loss): loss * scale (loss itself when disabled).
function GradScaler:scale(loss)
  if not self.enabled then return loss end
  return loss * self.scale_value
end

local function grads_of(opt)
  if type(opt) ~= "table" or type(opt.param_groups) ~= "table" then
    raise("amp.GradScaler: expected an optimizer (with param_groups)", 3)
  end
  local list = {}
  for _, g in ipairs(opt.param_groups) do
    for _, p in ipairs(g.params) do
      local gr = p.grad
      if gr ~= nil then list[#list + 1] = gr end
    end
  end
  return list
end

local function finite(x) return x == x and x ~= math.huge and x ~= -math.huge end

-- scaler:unscale_(opt): divide the gradients of opt's parameters by the scale, in place, and note
-- whether any is inf or NaN. Call it before clipping gradients; step calls it when you have not.
function GradScaler:unscale_(opt)
  if not self.enabled then return end
  local st = self.per_optimizer[opt]
  if st and st.unscaled then raise("amp.GradScaler: unscale_ was already called for this optimizer since the last update") end
  local inv, found_inf = 1.0 / self.scale_value, false
  autograd.no_grad(function()
    for _, g in ipairs(grads_of(opt)) do
      g:mul_(inv)
      if not found_inf and not finite(g:sum():item()) then found_inf = true end
    end
  end)
  self.per_optimizer[opt] = {unscaled = true, found_inf = found_inf}
end

-- scaler:step(opt, ...): unscale (unless done), then opt:step(...) unless a gradient was inf or NaN;
-- returns true when the optimizer stepped.
function GradScaler:step(opt, ...)
  if not self.enabled then opt:step(...) return true end
  local st = self.per_optimizer[opt]
  if not (st and st.unscaled) then self:unscale_(opt) st = self.per_optimizer[opt] end
  if st.stepped ~= nil then raise("amp.GradScaler: step was already called for this optimizer since the last update") end
  st.stepped = not st.found_inf
  if st.stepped then opt:step(...) end
  return st.stepped
end

-- scaler:update([new_scale]): after the step(s): halve the scale (backoff_factor) when a gradient
-- overflowed, double it (growth_factor) after growth_interval steps in a row without; or set it.
function GradScaler:update(new_scale)
  if not self.enabled then return end
  if new_scale ~= nil then
    self.scale_value = positive(new_scale, "new_scale")
  else
    local found_inf = false
    for _, st in pairs(self.per_optimizer) do if st.found_inf then found_inf = true end end
    if found_inf then
      self.scale_value = self.scale_value * self.backoff_factor
      self.growth_tracker = 0
    else
      self.growth_tracker = self.growth_tracker + 1
      if self.growth_tracker >= self.growth_interval then
        self.scale_value = self.scale_value * self.growth_factor
        self.growth_tracker = 0
      end
    end
  end
  self.per_optimizer = {}
end

-- scaler:get_scale(): the current scale (1 when disabled).
function GradScaler:get_scale() return self.enabled and self.scale_value or 1.0 end

-- scaler:is_enabled()
function GradScaler:is_enabled() return self.enabled end

-- scaler:state_dict(): {scale, growth_factor, backoff_factor, growth_interval, growth_tracker},
-- PyTorch's names ("_growth_tracker"), for kiln.checkpoint.
function GradScaler:state_dict()
  if not self.enabled then return {} end
  return {scale = self.scale_value, growth_factor = self.growth_factor, backoff_factor = self.backoff_factor,
          growth_interval = self.growth_interval, _growth_tracker = self.growth_tracker}
end

-- scaler:load_state_dict(sd)
function GradScaler:load_state_dict(sd)
  if type(sd) ~= "table" then raise("amp.GradScaler: load_state_dict expects a table from state_dict()") end
  if next(sd) == nil then
    if self.enabled then raise("amp.GradScaler: the state dict is empty (saved from a disabled scaler)") end
    return
  end
  -- every field checked before any is taken: a bad dict leaves the scaler as it was
  local scale, growth = positive(sd.scale, "scale"), positive(sd.growth_factor, "growth_factor")
  local backoff, interval = positive(sd.backoff_factor, "backoff_factor"), positive(sd.growth_interval, "growth_interval")
  if growth <= 1 then raise("amp.GradScaler: growth_factor must be > 1, got " .. tostring(growth)) end
  if backoff >= 1 then raise("amp.GradScaler: backoff_factor must be < 1, got " .. tostring(backoff)) end
  local tracker = sd._growth_tracker
  core.count_arg(tracker, "amp.GradScaler", "_growth_tracker")
  self.scale_value, self.growth_factor, self.backoff_factor = scale, growth, backoff
  self.growth_interval, self.growth_tracker = interval, tracker
  self.per_optimizer = {}
end

return M
