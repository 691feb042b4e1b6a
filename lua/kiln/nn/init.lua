-- kiln.nn: modules. A module is a Lua table with parameters, buffers and child modules by name,
-- and a forward function; calling it runs forward and names the module path in any error.
--   local Linear = nn.define("Linear")
--   function Linear:init(n_in, n_out) self.weight = self:parameter(kiln.empty(n_out, n_in)) end
--   function Linear:forward(x) return x:matmul(self.weight:t()) end
local factory = require "kiln.factory"
local autograd = require "kiln.autograd"
local core = require "kiln.core"

local nn = {}

local Module = {}
Module.__index = Module
nn.Module = Module

-- ---- defining modules ----

-- nn.define(name [, parent]) makes a module class; nn[name](...) constructs one (calling init).
function nn.define(name, parent)
  local class = setmetatable({}, {__index = parent or Module})
  class.__index = core.class_index(class)   -- m:paramters() names m:parameters()
  class.__name = name
  class.__call = Module.__call
  class.__tostring = Module.__tostring
  class.__newindex = Module.__newindex
  nn[name] = function(...)
    local self = setmetatable({_params = {}, _param_names = {}, _buffers = {}, _buffer_names = {},
                               _children = {}, _child_names = {}, training = true}, class)
    if class.init then class.init(self, ...) end
    return self
  end
  return class
end

local function is_module(v)
  return type(v) == "table" and getmetatable(v) ~= nil and getmetatable(v).__call == Module.__call
end
nn.is_module = is_module

-- Assigning to a new field registers what it holds: a module becomes a child (its key names it in
-- errors and state dicts); a tensor made by self:parameter(), or any leaf tensor that requires
-- grad (PyTorch's nn.Parameter), becomes a parameter.
function Module.__newindex(self, k, v)
  if type(k) == "string" and k:sub(1, 1) ~= "_" then
    if is_module(v) then
      if not self._children[k] then self._child_names[#self._child_names + 1] = k end
      self._children[k] = v
      rawset(v, "_key", k)
    elseif factory.is_tensor(v) and (rawget(self, "_pending_param") == v or (v.requires_grad and v.is_leaf)) then
      if rawget(self, "_pending_param") == v then rawset(self, "_pending_param", nil) end
      if self._params[k] == nil then self._param_names[#self._param_names + 1] = k end
      self._params[k] = v
    end
  end
  rawset(self, k, v)
end

-- A registered parameter's tensor as the field holds it now (false when the field holds none):
-- m.weight = other.weight after registration ties the two, and every listing follows the field.
local function param_of(m, k)
  local v = rawget(m, k)
  if factory.is_tensor(v) then
    m._params[k] = v
    return v
  end
  return false
end

-- self.weight = self:parameter(t): t (detached) becomes a leaf that requires grad, registered
-- under the field it is assigned to.
function Module:parameter(t)
  if not factory.is_tensor(t) then error("parameter: expected a tensor, got " .. type(t), 2) end
  t = t:detach():requires_grad_()
  rawset(self, "_pending_param", t)
  return t
end

-- Explicit forms; a nil parameter or buffer (a Linear without bias) keeps its name in order.
-- the name and value a module registers: a string and a tensor (or nil)
local function check_entry(what, name, t)
  if type(name) ~= "string" then core.raise(string.format("%s: the name must be a string, got %s", what, core.describe(name))) end
  if t ~= nil and not factory.is_tensor(t) then
    core.raise(string.format("%s: %s must be a tensor or nil, got %s", what, name, core.describe(t)))
  end
end

function Module:register_parameter(name, t)
  check_entry("register_parameter", name, t)
  if t ~= nil and not t.requires_grad then t:requires_grad_() end
  if self._params[name] == nil then self._param_names[#self._param_names + 1] = name end
  self._params[name] = t or false
  rawset(self, name, t)
end

function Module:register_buffer(name, t)
  check_entry("register_buffer", name, t)
  if self._buffers[name] == nil then self._buffer_names[#self._buffer_names + 1] = name end
  self._buffers[name] = t or false
  rawset(self, name, t)
end

function Module:add_module(name, m)
  if not is_module(m) then
    core.raise(string.format("add_module: child %q must be a module, got %s", tostring(name),
                             type(m) == "table" and "a table that is not one" or core.describe(m)))
  end
  name = tostring(name)
  if not self._children[name] then self._child_names[#self._child_names + 1] = name end
  self._children[name] = m
  rawset(self, name, m)
  rawset(m, "_key", name)
  return m
end

-- ---- introspection ----

function Module:named_children()
  local list = {}
  for _, k in ipairs(self._child_names) do list[#list + 1] = {k, self._children[k]} end
  return list
end

function Module:children()
  local list = {}
  for _, k in ipairs(self._child_names) do list[#list + 1] = self._children[k] end
  return list
end

-- Parameters with PyTorch's names: "weight", "0.bias", "features.3.weight". A tensor shared
-- by two modules (tied weights) comes once, under its first name, unless with_duplicates.
function Module:named_parameters(prefix, seen, list, with_duplicates)
  prefix, seen, list = prefix or "", seen or {}, list or {}
  for _, k in ipairs(self._param_names) do
    local p = param_of(self, k)
    if p and (with_duplicates or not seen[p]) then
      seen[p] = true
      list[#list + 1] = {prefix .. k, p}
    end
  end
  for _, k in ipairs(self._child_names) do
    self._children[k]:named_parameters(prefix .. k .. ".", seen, list, with_duplicates)
  end
  return list
end

function Module:parameters()
  local list = {}
  for _, np in ipairs(self:named_parameters()) do list[#list + 1] = np[2] end
  return list
end

function Module:named_buffers(prefix, list)
  prefix, list = prefix or "", list or {}
  for _, k in ipairs(self._buffer_names) do
    if self._buffers[k] then list[#list + 1] = {prefix .. k, self._buffers[k]} end
  end
  for _, k in ipairs(self._child_names) do self._children[k]:named_buffers(prefix .. k .. ".", list) end
  return list
end

function Module:modules(list)
  list = list or {}
  list[#list + 1] = self
  for _, c in ipairs(self:children()) do c:modules(list) end
  return list
end

function Module:num_parameters()
  local n = 0
  for _, p in ipairs(self:parameters()) do n = n + p:numel() end
  return n
end

function Module:apply(fn)
  if type(fn) ~= "function" then core.raise("apply: expected a function of a module, got " .. core.describe(fn)) end
  for _, c in ipairs(self:children()) do c:apply(fn) end
  fn(self)
  return self
end

function Module:train(mode)
  if mode == nil then mode = true end
  for _, m in ipairs(self:modules()) do rawset(m, "training", mode) end
  return self
end

function Module:eval() return self:train(false) end

function Module:zero_grad()
  for _, p in ipairs(self:parameters()) do p.grad = nil end
end

-- ---- state ----

-- Parameters and buffers by name (persistent buffers only), as tensors sharing their storage.
function Module:state_dict()
  local sd, order = {}, {}
  -- every name, tied ones too (their entries share storage), as PyTorch's state_dict has them
  for _, np in ipairs(self:named_parameters(nil, nil, nil, true)) do sd[np[1]] = np[2]:detach() order[#order + 1] = np[1] end
  for _, nb in ipairs(self:named_buffers()) do sd[nb[1]] = nb[2] order[#order + 1] = nb[1] end
  return setmetatable(sd, {__index = {keys = function() return order end}})
end

-- Copy values into the existing tensors (so optimizers keep their references). strict (default):
-- missing, unexpected and mis-shaped keys are an error listing all of them.
local load_options = core.set("strict")   -- the options load_state_dict knows
function Module:load_state_dict(sd, strict)
  if type(sd) ~= "table" then core.raise("load_state_dict: expected a table of named tensors, got " .. core.describe(sd)) end
  for name, v in pairs(sd) do
    if not factory.is_tensor(v) then core.raise(string.format("load_state_dict: %s is %s, not a tensor", tostring(name), core.describe(v))) end
  end
  -- strict: true (the default) or false, or PyTorch's keyword as an option, {strict = false}
  if type(strict) == "table" then strict = core.options(strict, load_options, "load_state_dict").strict end
  if strict == nil then strict = true end
  if type(strict) ~= "boolean" then core.raise("load_state_dict: strict must be true or false, got " .. core.describe(strict)) end
  local targets = {}
  for _, np in ipairs(self:named_parameters(nil, nil, nil, true)) do targets[np[1]] = np[2] end
  for _, nb in ipairs(self:named_buffers()) do targets[nb[1]] = nb[2] end
  local missing, unexpected, mismatched = {}, {}, {}
  for name, t in pairs(targets) do
    local v = sd[name]
    if v == nil then missing[#missing + 1] = name
    elseif tostring(v:size()) ~= tostring(t:size()) then
      mismatched[#mismatched + 1] = string.format("%s: checkpoint %s, model %s", name, tostring(v:size()), tostring(t:size()))
    end
  end
  for name in pairs(sd) do if targets[name] == nil then unexpected[#unexpected + 1] = name end end
  table.sort(missing) table.sort(unexpected) table.sort(mismatched)
  if #mismatched > 0 or (strict and (#missing > 0 or #unexpected > 0)) then
    local parts = {}
    if #missing > 0 then parts[#parts + 1] = "missing keys: " .. table.concat(missing, ", ") end
    if #unexpected > 0 then parts[#parts + 1] = "unexpected keys: " .. table.concat(unexpected, ", ") end
    if #mismatched > 0 then parts[#parts + 1] = "shape mismatch: " .. table.concat(mismatched, "; ") end
    error("load_state_dict: " .. table.concat(parts, "; "), 2)
  end
  autograd.no_grad(function()
    for name, t in pairs(targets) do
      if sd[name] ~= nil then t:copy_(sd[name]) end
    end
  end)
  return {missing = missing, unexpected = unexpected}
end

-- Move or convert every parameter and buffer (new tensors; make optimizers afterwards).
function Module:to(what)
  local moved = {}   -- a tensor tied between modules is moved once, and stays tied
  for _, m in ipairs(self:modules()) do
    for _, k in ipairs(m._param_names) do
      local p = param_of(m, k)
      if p then
        local q = moved[p]
        if not q then
          q = autograd.no_grad(function() return p:to(what) end)
          if q ~= p then q = q:detach():requires_grad_() end
          moved[p] = q
        end
        m._params[k] = q
        rawset(m, k, q)
      end
    end
    for _, k in ipairs(m._buffer_names) do
      local b = m._buffers[k]
      if b then
        local is_float = b:dtype() == "f32" or b:dtype() == "f64" or b:dtype() == "f16" or b:dtype() == "bf16"
        local q = (is_float or type(what) ~= "string" or what:match("^cuda") or what == "cpu") and b:to(what) or b
        m._buffers[k] = q
        rawset(m, k, q)
      end
    end
  end
  return self
end
function Module:float() return self:to("f32") end
function Module:double() return self:to("f64") end
function Module:cuda() return self:to("cuda") end
function Module:cpu() return self:to("cpu") end

-- ---- calling, with the module path in errors ----

local depth = 0

local function describe_inputs(...)
  local parts = {}
  for i = 1, select("#", ...) do
    local x = select(i, ...)
    parts[#parts + 1] = factory.is_tensor(x) and tostring(x:size()):gsub(" ", "") or type(x)
  end
  return table.concat(parts, ", ")
end

local function module_error(e)
  local names = {e.path[1].__name}
  for i = 2, #e.path do names[#names + 1] = e.path[i]._key or "?" end
  local leaf = e.path[#e.path]
  local ok, desc = pcall(function() return leaf.extra_repr and leaf:extra_repr() or "" end)
  if not ok then desc = "" end
  return string.format("%s (%s%s): input %s: %s", table.concat(names, "."), leaf.__name, desc ~= "" and (" " .. desc) or "",
                       e.input, e.msg)
end

-- An error inside forward comes out once, at the outermost module, as
-- "Sequential.3 (Linear 512→256): input [64,500]: <what went wrong>" at the caller's line.
function Module.__call(self, ...)
  local n = select("#", ...)
  local args = {...}
  depth = depth + 1
  local ok, a, b, c = pcall(self.forward, self, ...)
  depth = depth - 1
  if ok then return a, b, c end
  local e = a
  if type(e) ~= "table" or not e.kiln_module_error then
    e = {kiln_module_error = true, path = {}, msg = (tostring(e):gsub("^[^\n]-:%d+: ", "")),
         input = describe_inputs(unpack(args, 1, n))}
  end
  table.insert(e.path, 1, self)
  if depth > 0 then error(e, 0) end
  core.raise(module_error(e))
end

-- ---- printing ----

function Module:extra_repr() return "" end

local function count_str(n)
  if n >= 1e6 then return string.format("%.2fM", n / 1e6) end
  if n >= 1e3 then return string.format("%.1fk", n / 1e3) end
  return tostring(n)
end

function Module:tree(indent, key)
  indent = indent or ""
  local ok, extra = pcall(self.extra_repr, self)
  if not ok then extra = "?" end
  local head = string.format("%s%s%s%s", indent, key and (key .. ": ") or "", self.__name, extra ~= "" and ("(" .. extra .. ")") or "")
  local n = self:num_parameters()
  if n > 0 then head = head .. string.format("  [%s params]", count_str(n)) end
  local lines = {head}
  for _, kc in ipairs(self:named_children()) do lines[#lines + 1] = kc[2]:tree(indent .. "  ", kc[1]) end
  return table.concat(lines, "\n")
end

function Module.__tostring(self) return self:tree() end

-- ---- containers ----

local Sequential = nn.define("Sequential")
-- nn.Sequential{ layer1, layer2, ... } or nn.Sequential(layer1, layer2, ...)
function Sequential:init(...)
  local layers = select("#", ...) == 1 and type(...) == "table" and getmetatable(...) == nil and ... or {...}
  for i, m in ipairs(layers) do
    if type(m) ~= "table" or getmetatable(m) == nil or getmetatable(m).__call ~= Module.__call then
      error(string.format("Sequential: element %d is not a module (%s)", i, type(m)), 3)
    end
    self:add_module(i - 1, m)
  end
end
function Sequential:add(m)
  self:add_module(#self._child_names, m)
  return self
end
function Sequential:forward(x)
  local names, children, i = self._child_names, self._children, 1
  while i <= #names do
    local m = children[names[i]]
    if i + 2 <= #names and nn._fuses_relu_max_pool2d(m, children[names[i + 1]], children[names[i + 2]]) then
      x, i = m(x, "relu_max_pool2d"), i + 3   -- Conv2d, ReLU, MaxPool2d(2) as one call (nn/layers.lua)
    elseif i + 1 <= #names and nn._fuses_linear_relu(m, children[names[i + 1]]) then
      x, i = m(x, "relu"), i + 2              -- Linear, ReLU as one call
    else
      x, i = m(x), i + 1
    end
  end
  return x
end
function Sequential:__len() return #self._child_names end
local function child_index(what, i)
  if type(i) ~= "number" or i ~= math.floor(i) then core.raise(string.format("%s: the index must be an integer, got %s", what, core.describe(i))) end
  return tostring(i - 1)
end
function Sequential:get(i) return self._children[child_index("Sequential:get", i)] end
-- seq[i] (i a number, from 1; -1 the last) is the i-th child, as seq:get(i); seq["0"] is the child
-- named "0" (PyTorch's name, the same module as seq[1]).
local function indexed_class(class)
  local by_name = class.__index
  class.__index = function(self, k)
    if type(k) == "number" then
      local n = #rawget(self, "_child_names")
      if k < 0 and k == math.floor(k) then k = n + 1 + k end
      return rawget(self, "_children")[child_index(class.__name, k)]
    end
    return by_name(self, k)
  end
  core.indexed_classes[class.__index] = class
end
indexed_class(Sequential)

local ModuleList = nn.define("ModuleList")
function ModuleList:init(list)
  if list ~= nil and (type(list) ~= "table" or is_module(list)) then
    core.raise("ModuleList: expected a list of modules, got " .. (is_module(list) and "a module" or core.describe(list)))
  end
  for i, m in ipairs(list or {}) do self:add_module(i - 1, m) end
end
function ModuleList:append(m)
  self:add_module(#self._child_names, m)
  return self
end
function ModuleList:get(i) return self._children[child_index("ModuleList:get", i)] end
indexed_class(ModuleList)
function ModuleList:forward() error("ModuleList: has no forward; call its modules", 2) end

nn.init = require "kiln.nn.initializers"
nn.functional = require "kiln.functional"   -- also kiln.functional, kiln.F
require "kiln.nn.layers"(nn)
require "kiln.nn.rnn"(nn)

return nn
