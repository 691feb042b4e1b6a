-- kiln.optim: optimizers (SGD, Adam, AdamW, RMSprop, Adagrad), learning-rate schedulers and
-- gradient clipping, with PyTorch's semantics and defaults. Each optimizer file is a small spec
-- (defaults, checks, state tensors, the C call); this file turns a spec into an optimizer whose
-- step() makes one C call per parameter group over pointer arrays built once and reused.
local core = require "kiln.core"
local autograd = require "kiln.autograd"
local Tensor = require "kiln.tensor"
local ffi, C = core.ffi, core.C
local raise, is_tensor = core.raise, core.is_tensor

local M = {}

local TensorArray = ffi.typeof("struct kiln_tensor *[?]")

-- A deep copy of plain tables (hyperparameters such as betas); tensors and numbers pass through.
local function copy(v)
  if type(v) ~= "table" then return v end
  local r = {}
  for k, x in pairs(v) do r[k] = copy(x) end
  return r
end

local function shape_string(t) return tostring(Tensor.size(t)) end

local function same_shape(a, b)
  if a.p.ndim ~= b.p.ndim then return false end
  for d = 0, a.p.ndim - 1 do if a.p.sizes[d] ~= b.p.sizes[d] then return false end end
  return true
end

-- ---- optimizers ----

local Optimizer = {}
Optimizer.__index = Optimizer
M.Optimizer = Optimizer

-- The group's params as a checked list of leaf float tensors.
local function check_params(name, list, where)
  if is_tensor(list) then return {list} end
  if type(list) ~= "table" then raise(string.format("%s: %s must be a list of tensors, got a %s", name, where, type(list))) end
  local out, seen = {}, {}
  for i, p in ipairs(list) do
    if not is_tensor(p) then
      raise(string.format("%s: %s: element %d is a %s, not a tensor", name, where, i, type(p)))
    end
    -- a tensor given twice would be stepped twice each step (by the same C tensor, whatever Lua
    -- value holds it)
    local key = tonumber(ffi.cast("intptr_t", p.p))
    if seen[key] then
      raise(string.format("%s: %s: parameters %d and %d are the same tensor %s; give each parameter once", name, where,
                          seen[key], i, shape_string(p)))
    end
    seen[key] = i
    if p.p.grad_fn ~= nil then
      raise(string.format("%s: %s: parameter %d %s is not a leaf (the result of an op); optimize leaves, or detach() it",
                          name, where, i, shape_string(p)))
    end
    if p.p.dtype ~= C.KILN_F32 and p.p.dtype ~= C.KILN_F64 then
      raise(string.format("%s: %s: parameter %d %s is %s (optimizers update f32 and f64 parameters)", name, where, i,
                          shape_string(p), core.dtype_names[p.p.dtype]))
    end
    out[i] = p
  end
  return out
end

local scheduler_keys = {initial_lr = true, max_lr = true, min_lr = true, max_momentum = true, base_momentum = true}

-- Add a group: {params = {...}, lr = ...}; missing options come from the defaults.
function Optimizer:add_param_group(group)
  local spec = self._spec
  if type(group) ~= "table" or group.params == nil then
    raise(spec.name .. ".add_param_group: expected a table with a params field")
  end
  local g = {}
  for k, v in pairs(group) do
    -- a group's own options (a misspelt one is an error), and what learning-rate schedulers keep there
    if k ~= "params" and self.defaults[k] == nil and not scheduler_keys[k] then
      local names = {}
      for n in pairs(self.defaults) do names[#names + 1] = n end
      table.sort(names)
      raise(string.format("%s: unknown option %q in a parameter group (known: params, %s)%s", spec.name, tostring(k),
                          table.concat(names, ", "), core.did_you_mean(k, self.defaults)))
    end
    if k ~= "params" then g[k] = copy(v) end
  end
  g.params = check_params(spec.name, group.params, "group " .. (#self.param_groups + 1))
  for k, v in pairs(self.defaults) do if g[k] == nil then g[k] = copy(v) end end
  spec.check(g, function(msg) raise(spec.name .. ": " .. msg) end)
  for _, p in ipairs(g.params) do
    if self._owner[p] then raise(spec.name .. ": some parameters appear in more than one parameter group") end
  end
  for _, p in ipairs(g.params) do self._owner[p] = true end
  self.param_groups[#self.param_groups + 1] = g
  if spec.eager_state then
    for _, p in ipairs(g.params) do self.state[p] = spec.eager_state(g, p) end
  end
end

-- optim.X(params, opts): params is a list of tensors, or a list of groups {params = {...}, lr = ...}.
function M.define(spec)
  local allowed = {}
  for k in pairs(spec.defaults) do allowed[k] = true end
  return function(params, opts)
    opts = core.opts_arg(opts, spec.name)
    local defaults = copy(spec.defaults)
    for k, v in pairs(opts) do
      if not allowed[k] then
        local names = {}
        for n in pairs(allowed) do names[#names + 1] = n end
        table.sort(names)
        raise(string.format("%s: unknown option %q (known: %s)%s", spec.name, tostring(k), table.concat(names, ", "),
                            core.did_you_mean(k, allowed)))
      end
      defaults[k] = copy(v)
    end
    if spec.fixed then for k, v in pairs(spec.fixed) do defaults[k] = v end end
    local self = setmetatable({_spec = spec, defaults = defaults, param_groups = {}, state = {}, _owner = {},
                               _caches = {}}, spec.class)
    if is_tensor(params) then params = {params} end
    if type(params) ~= "table" then
      raise(string.format("%s: params must be a list of tensors or of parameter groups, got a %s", spec.name, type(params)))
    end
    if #params == 0 then raise(spec.name .. ": got an empty parameter list") end
    if type(params[1]) == "table" and not is_tensor(params[1]) then
      for _, g in ipairs(params) do self:add_param_group(g) end
    else
      self:add_param_group({params = params})
    end
    return self
  end
end

-- The pointer arrays of group gi, rebuilt only when its params changed.
local function group_cache(self, gi, group)
  local params = group.params
  local n = #params
  local c = self._caches[gi]
  if c and c.group == group and c.n == n then
    local refs = c.refs
    for i = 1, n do
      if not rawequal(refs[i], params[i]) then c = nil break end
    end
    if c then return c end
  end
  local names = self._spec.state_names
  c = {group = group, n = n, refs = {}, params = TensorArray(n > 0 and n or 1), grads = TensorArray(n > 0 and n or 1),
       state = {}}
  for k = 1, #names do c.state[k] = TensorArray(n > 0 and n or 1) end
  for i, p in ipairs(params) do
    c.refs[i] = p
    c.params[i - 1] = p.p
  end
  self._caches[gi] = c
  return c
end

-- C names parameters by their index in the call, from 0; Lua counts from 1 and names the group.
local function step_error(self, gi)
  local msg = ffi.string(C.kiln_error_message())
  local where = #self.param_groups > 1 and string.format(" (group %d)", gi) or ""
  msg = msg:gsub("^[%w_]+: parameter (%d+)", function(i)
    return string.format("%s.step: parameter %d%s", self._spec.name, tonumber(i) + 1, where)
  end, 1)
  raise(msg)
end

-- Drop the state tensors made for a step that failed (only params not yet committed).
local function rollback(self, c, fresh, committed)
  local names = self._spec.state_names
  for j = 1, #fresh, 2 do
    local i, k = fresh[j], fresh[j + 1]
    if not committed[i] then
      local p = c.refs[i]
      local st = self.state[p]
      st[names[k]] = nil
      c.state[k][i - 1] = nil
      if next(st) == nil then self.state[p] = nil end
    end
  end
end

local function step_group(self, gi, group)
  local spec = self._spec
  local c = group_cache(self, gi, group)
  local params, grads, state = group.params, c.grads, self.state
  local names, needs, key_of = spec.state_names, spec.needs, spec.key
  local n = c.n
  local key0, uniform, fresh = nil, true, nil
  for i = 1, n do
    local p = params[i]
    local g = p.p.grad
    grads[i - 1] = g
    if g ~= nil then
      local st = state[p]
      if st == nil then st = {} state[p] = st end
      local created = false
      for k = 1, #names do
        if needs(group, k) then
          local t = st[names[k]]
          if t == nil then
            t = spec.init_state(group, names[k], p)
            st[names[k]] = t
            created = true
            fresh = fresh or {}
            fresh[#fresh + 1] = i
            fresh[#fresh + 1] = k
          end
          c.state[k][i - 1] = t.p      -- every step: the state table may have been changed by hand
        end
      end
      local key = key_of(group, st, created)
      if key0 == nil then key0 = key elseif key ~= key0 then uniform = false end
    end
  end
  if key0 == nil then return end           -- no parameter of the group has a grad
  local commit = spec.commit
  if uniform then
    if spec.call(C, n, c, group, key0) ~= 0 then
      if fresh then rollback(self, c, fresh, {}) end
      step_error(self, gi)
    end
    if commit then
      for i = 1, n do
        if grads[i - 1] ~= nil then commit(state[params[i]], key0) end
      end
    end
    return
  end
  -- Rare: parameters at different points (state made at different steps): one call per point.
  local keys, seen = {}, {}
  local key_at = {}
  for i = 1, n do
    if grads[i - 1] ~= nil then
      local st = state[params[i]]
      local created = false
      if fresh then for j = 1, #fresh, 2 do if fresh[j] == i then created = true end end end
      local key = key_of(group, st, created)
      key_at[i] = key
      if not seen[key] then seen[key] = true keys[#keys + 1] = key end
    end
  end
  table.sort(keys)
  local committed = {}
  local all_grads = {}
  for i = 1, n do all_grads[i] = grads[i - 1] end
  local sub = {params = c.params, grads = TensorArray(n), state = c.state}
  for _, key in ipairs(keys) do
    for i = 1, n do sub.grads[i - 1] = key_at[i] == key and all_grads[i] or nil end
    if spec.call(C, n, sub, group, key) ~= 0 then
      if fresh then rollback(self, c, fresh, committed) end
      step_error(self, gi)
    end
    for i = 1, n do
      if key_at[i] == key then
        committed[i] = true
        if commit then commit(state[params[i]], key) end
      end
    end
  end
end

-- One update of every parameter that has a grad. closure (optional) is called first, under grad
-- mode, and its result returned, as in PyTorch.
function Optimizer:step(closure)
  local loss
  if closure ~= nil and type(closure) ~= "function" then
    raise(string.format("%s.step: the closure must be a function, got %s", self._spec.name, core.describe(closure)))
  end
  if closure then loss = autograd.enable_grad(closure) end
  for gi, group in ipairs(self.param_groups) do step_group(self, gi, group) end
  return loss
end

-- zero_grad() drops the grads (set_to_none, PyTorch's default); zero_grad{set_to_none = false}
-- (or zero_grad(false)) fills them with zeros instead.
function Optimizer:zero_grad(opts)
  local set_to_none = true
  if opts == false or (type(opts) == "table" and opts.set_to_none == false) then set_to_none = false end
  for _, group in ipairs(self.param_groups) do
    for _, p in ipairs(group.params) do
      local g = p.p.grad
      if g ~= nil then
        if set_to_none then
          core.check(C.kiln_set_grad(p.p, nil))
        else
          local prev = C.kiln_set_grad_enabled(0)
          local rc = C.kiln_fill_(g, 0)
          C.kiln_set_grad_enabled(prev)
          core.check(rc)
        end
      end
    end
  end
end

-- {state = {[i] = {step = ..., exp_avg = tensor, ...}}, param_groups = {{lr = ..., params = {i, ...}}}}:
-- parameters are numbered from 0 in the order of the groups, as PyTorch numbers them, so that
-- the keys match a PyTorch optimizer's state dict. Tensors are clones.
function Optimizer:state_dict()
  local index, count = {}, 0
  local groups = {}
  for gi, group in ipairs(self.param_groups) do
    local g = {}
    for k, v in pairs(group) do if k ~= "params" then g[k] = copy(v) end end
    g.params = {}
    for j, p in ipairs(group.params) do
      if index[p] == nil then index[p] = count count = count + 1 end
      g.params[j] = index[p]
    end
    groups[gi] = g
  end
  local state = {}
  for p, st in pairs(self.state) do
    local i = index[p]
    if i ~= nil then
      local s = {}
      for k, v in pairs(st) do s[k] = is_tensor(v) and Tensor.clone(v) or copy(v) end
      state[i] = s
    end
  end
  return {state = state, param_groups = groups}
end

function Optimizer:load_state_dict(sd)
  local name = self._spec.name .. ".load_state_dict"
  if type(sd) ~= "table" or type(sd.state) ~= "table" or type(sd.param_groups) ~= "table" then
    raise(name .. ": expected a table with fields state and param_groups (from state_dict())")
  end
  local saved = sd.param_groups
  if #saved ~= #self.param_groups then
    raise(string.format("%s: the state dict has %d parameter groups, the optimizer %d", name, #saved, #self.param_groups))
  end
  local by_id = {}
  for gi, g in ipairs(saved) do
    local mine = self.param_groups[gi].params
    if type(g.params) ~= "table" or #g.params ~= #mine then
      raise(string.format("%s: group %d has %d parameters in the state dict, %d in the optimizer", name, gi,
                          type(g.params) == "table" and #g.params or 0, #mine))
    end
    for j, id in ipairs(g.params) do by_id[id] = mine[j] end
  end
  -- each group's options as loading would leave them, checked as the constructor checks them,
  -- before anything is taken: a bad state dict leaves the optimizer as it was
  local spec = self._spec
  for gi, g in ipairs(saved) do
    local merged = {}
    for k, v in pairs(self.param_groups[gi]) do merged[k] = v end
    for k, v in pairs(g) do
      if k ~= "params" then
        if self.defaults[k] == nil and not scheduler_keys[k] then
          raise(string.format("%s: group %d: unknown option %q%s", name, gi, tostring(k), core.did_you_mean(k, self.defaults)))
        end
        if spec.fixed and spec.fixed[k] ~= nil and v ~= spec.fixed[k] then
          raise(string.format("%s: group %d: %s is %s in the state dict; %s's is always %s", name, gi, k, tostring(v),
                              spec.name, tostring(spec.fixed[k])))
        end
        merged[k] = v
      end
    end
    spec.check(merged, function(msg) raise(string.format("%s: group %d: %s", name, gi, msg)) end)
  end
  local new_state = {}
  for id, s in pairs(sd.state) do
    local p = by_id[id]
    if p == nil then raise(string.format("%s: the state dict has state for parameter %s, which no group lists", name, tostring(id))) end
    local st = {}
    for k, v in pairs(s) do
      if is_tensor(v) then
        if not same_shape(v, p) then
          raise(string.format("%s: parameter %s: state %s has shape %s, the parameter %s", name, tostring(id), k,
                              shape_string(v), shape_string(p)))
        end
        st[k] = Tensor.clone(v:to{dtype = p.p.dtype, device = p.p.device})
      else
        if k == "step" then core.count_arg(v, name .. ": parameter " .. tostring(id), "step") end
        st[k] = copy(v)
      end
    end
    new_state[p] = st
  end
  for gi, g in ipairs(saved) do
    local group = self.param_groups[gi]
    for k, v in pairs(g) do if k ~= "params" then group[k] = copy(v) end end
  end
  self.state = new_state
  self._caches = {}
end

-- Make an optimizer class: the methods above, and the spec that drives them.
local function class(spec)
  local cls = setmetatable({}, {__index = Optimizer})
  cls.__index = core.class_index(cls)   -- opt:zero_gard() names opt:zero_grad()
  cls.__name = spec.name   -- help(opt) finds optim.<name>'s line by it
  cls.__tostring = function(self)
    local lines = {spec.name .. " ("}
    for gi, g in ipairs(self.param_groups) do
      local keys = {}
      for k in pairs(g) do if k ~= "params" then keys[#keys + 1] = k end end
      table.sort(keys)
      lines[#lines + 1] = string.format("  group %d: %d params", gi, #g.params)
      for _, k in ipairs(keys) do
        local v = g[k]
        if type(v) == "table" then v = "{" .. table.concat(v, ", ") .. "}" end
        lines[#lines + 1] = string.format("    %s: %s", k, tostring(v))
      end
    end
    lines[#lines + 1] = ")"
    return table.concat(lines, "\n")
  end
  spec.class = cls
  return M.define(spec)
end

local sgd = require "kiln.optim.sgd"
local adam = require "kiln.optim.adam"
M.SGD = class(sgd)
M.Adam = class(adam.Adam)
M.AdamW = class(adam.AdamW)
M.RMSprop = class(require "kiln.optim.rmsprop")
M.Adagrad = class(require "kiln.optim.adagrad")

-- ---- gradient clipping ----

local norm_out = ffi.new("double[1]")

local function grad_array(params, what)
  if is_tensor(params) then params = {params} end
  if type(params) ~= "table" then raise(what .. ": expected a list of tensors") end
  local n = #params
  local arr = TensorArray(n > 0 and n or 1)
  for i, p in ipairs(params) do
    if not is_tensor(p) then raise(string.format("%s: element %d is a %s, not a tensor", what, i, type(p))) end
    arr[i - 1] = p.p.grad
  end
  return arr, n
end

local function clip_error()
  raise((ffi.string(C.kiln_error_message()):gsub("grad (%d+)", function(i) return "grad " .. (tonumber(i) + 1) end)))
end

-- The norm of all the params' grads together (norm_type 2 by default; math.huge for the max
-- norm), in double; grads are scaled in place when it exceeds max_norm. Returns the norm (a number).
function M.clip_grad_norm(params, max_norm, norm_type)
  if type(max_norm) ~= "number" then raise("clip_grad_norm: max_norm must be a number") end
  if norm_type == "inf" then norm_type = math.huge end
  local arr, n = grad_array(params, "clip_grad_norm")
  if C.kiln_clip_grad_norm(n, arr, max_norm, norm_type or 2, norm_out) ~= 0 then clip_error() end
  return norm_out[0]
end
M.clip_grad_norm_ = M.clip_grad_norm

-- Clamp every grad to [-clip_value, clip_value] in place.
function M.clip_grad_value(params, clip_value)
  if type(clip_value) ~= "number" then raise("clip_grad_value: clip_value must be a number") end
  local arr, n = grad_array(params, "clip_grad_value")
  if C.kiln_clip_grad_value(n, arr, clip_value) ~= 0 then clip_error() end
end
M.clip_grad_value_ = M.clip_grad_value

-- ---- schedulers ----

M.lr_scheduler = require "kiln.optim.lr_scheduler"
for k, v in pairs(M.lr_scheduler) do
  if M[k] == nil then M[k] = v end
end

return M
