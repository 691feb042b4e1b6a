-- kiln.autograd: grad mode, gradcheck (f64 central differences against backward), and custom
-- functions (autograd.Function) whose forward and backward are Lua.
local core = require "kiln.core"
local factory = require "kiln.factory"
local ffi, C = core.ffi, core.C

local M = {}

-- Run fn(...) with grad mode set to `enabled`, restoring the previous mode even on error.
local function with_grad_mode(enabled, fn, ...)
  if type(fn) ~= "function" then
    core.raise(string.format("%s: expected a function to run, got %s", enabled and "enable_grad" or "no_grad", core.describe(fn)))
  end
  local prev = C.kiln_set_grad_enabled(enabled and 1 or 0)
  local res = {pcall(fn, ...)}
  C.kiln_set_grad_enabled(prev)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

function M.no_grad(fn, ...) return with_grad_mode(false, fn, ...) end
function M.enable_grad(fn, ...) return with_grad_mode(true, fn, ...) end
function M.set_grad_enabled(on) return C.kiln_set_grad_enabled(on and 1 or 0) == 1 end
function M.is_grad_enabled() return C.kiln_grad_enabled() == 1 end

-- Storage offsets of every element of t, in row-major order.
local function offsets(t)
  local p = t.p
  local list, idx = {}, {}
  for d = 0, p.ndim - 1 do idx[d] = 0 end
  for _ = 1, tonumber(p.numel) do
    local off = tonumber(p.offset)
    for d = 0, p.ndim - 1 do off = off + idx[d] * tonumber(p.strides[d]) end
    list[#list + 1] = off
    for d = p.ndim - 1, 0, -1 do
      idx[d] = idx[d] + 1
      if idx[d] < tonumber(p.sizes[d]) then break end
      idx[d] = 0
    end
  end
  return list
end

-- Compare backward with central differences of L = sum(fn(inputs...) * v) for random v.
-- inputs: f64 tensors (those that require grad are checked). Returns ok, report.
function M.gradcheck(fn, inputs, opts)
  opts = core.opts_arg(opts, "gradcheck")
  if type(fn) ~= "function" then core.raise("gradcheck: argument 1 must be a function, got " .. core.describe(fn)) end
  if type(inputs) ~= "table" or core.is_tensor(inputs) then
    core.raise("gradcheck: argument 2 must be a list of input tensors, got " .. core.describe(inputs))
  end
  local eps, atol, rtol = opts.eps or 1e-6, opts.atol or 1e-5, opts.rtol or 1e-3
  local checked = {}
  for i, x in ipairs(inputs) do
    if core.is_tensor(x) and x.p.requires_grad == 1 then
      if x.p.dtype ~= C.KILN_F64 then
        return false, string.format("gradcheck: input %d is %s; gradcheck needs f64", i, core.dtype_names[x.p.dtype])
      end
      checked[#checked + 1] = i
    end
  end
  if #checked == 0 then return false, "gradcheck: no input requires grad" end
  local function outputs()
    local r = {fn(unpack(inputs, 1, table.maxn(inputs)))}
    local list = {}
    for _, o in ipairs(r) do if core.is_tensor(o) and o:dtype() ~= "bool" and o:dtype() ~= "i64" then list[#list + 1] = o end end
    return list
  end
  -- Fixed random projections, one per output.
  local outs = outputs()
  local vs = {}
  for k, o in ipairs(outs) do vs[k] = factory.randn(o:size(), {dtype = "f64"}) end
  local function loss(list)
    local total
    for k, o in ipairs(list) do
      local term = (o:to("f64") * vs[k]):sum()
      total = total and total + term or term
    end
    return total
  end
  -- Analytic.
  for _, i in ipairs(checked) do inputs[i].grad = nil end
  local L = loss(outs)
  if L.p.requires_grad == 0 then return false, "gradcheck: the output does not depend on any input that requires grad" end
  L:backward()
  local worst = {err = 0}
  for _, i in ipairs(checked) do
    local x = inputs[i]
    local analytic = x.grad and x.grad:to("f64"):contiguous():view(-1):totable() or {}
    local offs = offsets(x)
    for j, off in ipairs(offs) do
      local orig = C.kiln_tensor_get(x.p, off)
      local function at(v)
        local prev = C.kiln_set_grad_enabled(0)
        C.kiln_tensor_set(x.p, off, v)
        C.kiln_set_grad_enabled(prev)
        return M.no_grad(function() return loss(outputs()):item() end)
      end
      local numeric = (at(orig + eps) - at(orig - eps)) / (2 * eps)
      at(orig)
      local a = analytic[j] or 0
      local err = math.abs(a - numeric)
      if err > atol + rtol * math.abs(numeric) or a ~= a then
        return false, string.format("gradcheck: input %d, element %d: backward gives %.10g, finite differences %.10g",
                                    i, j, a, numeric)
      end
      if err > worst.err then worst = {err = err, input = i, element = j} end
    end
  end
  return true, string.format("gradcheck: largest difference %.3g (input %s, element %s)", worst.err,
                             tostring(worst.input), tostring(worst.element))
end

-- ---- custom functions ----

-- local Exp = autograd.Function("Exp")
-- function Exp.forward(ctx, x) local y = x:exp() ctx:save_for_backward(y) return y end
-- function Exp.backward(ctx, gy) local y = unpack(ctx.saved_tensors) return gy * y end
-- local y = Exp.apply(x)      -- or Exp(x)
--
-- C records one node per call of apply (kiln_function_record) and never calls Lua: a backward that
-- meets such a node stops there and returns (kiln_backward_step), this file runs the Lua backward
-- with the grads of the outputs, gives C the grads of the inputs, and steps on. What a node's
-- backward needs (its ctx) is kept here under the node's id until C says the node was freed.
local registry = {}          -- id -> {class, ctx, nin, tensor_input, outputs = {k -> sizes, dtype, device}}
local next_id = 0
local function_id = ffi.new("int64_t[1]")
local released = ffi.new("int64_t[256]")

local function drain_released()
  while true do
    local n = C.kiln_function_released(released, 256)
    for i = 0, n - 1 do registry[tonumber(released[i])] = nil end
    if n < 256 then return end
  end
end

local Ctx = {}
Ctx.__index = Ctx

-- ctx:save_for_backward(t1, t2, ...): the tensors backward reads, as ctx.saved_tensors (a list);
-- changing one in place before backward is an error there that names it.
function Ctx:save_for_backward(...)
  local list, versions = {}, {}
  for i = 1, select("#", ...) do
    local t = select(i, ...)
    if t ~= nil and not core.is_tensor(t) then
      core.raise(string.format("save_for_backward: argument %d is %s; save tensors (keep other values in ctx fields)",
                               i, core.describe(t)))
    end
    list[i] = t
    versions[i] = t and t.p.storage.version
  end
  rawset(self, "saved_tensors", list)
  rawset(self, "_versions", versions)
end

-- ctx:mark_non_differentiable(t1, ...): outputs of forward that get no grad (indices, masks).
function Ctx:mark_non_differentiable(...)
  for i = 1, select("#", ...) do
    local t = select(i, ...)
    if not core.is_tensor(t) then core.raise("mark_non_differentiable: argument " .. i .. " is not a tensor") end
    self._non_differentiable[#self._non_differentiable + 1] = t
  end
end

local function pack(...) return {n = select("#", ...), ...} end

local function same_tensor(a, b) return a.p == b.p end

local function apply(class, ...)
  local args = pack(...)
  local ctx = setmetatable({needs_input_grad = {}, _non_differentiable = {}, saved_tensors = {}}, Ctx)
  local grad_on = C.kiln_grad_enabled() == 1
  local any = false
  for i = 1, args.n do
    local x = args[i]
    if grad_on and core.is_tensor(x) and x.p.base ~= nil then core.check(C.kiln_autograd_refresh(x.p)) end
    local needs = grad_on and core.is_tensor(x) and x.p.requires_grad == 1
    ctx.needs_input_grad[i] = needs or false
    any = any or needs
  end
  if type(class.forward) ~= "function" then core.raise(class.name .. ": define " .. class.name .. ".forward(ctx, ...)") end
  local outs = pack(M.no_grad(class.forward, ctx, ...))
  if not any then return unpack(outs, 1, outs.n) end
  if type(class.backward) ~= "function" then core.raise(class.name .. ": define " .. class.name .. ".backward(ctx, grad_outputs...)") end
  if outs.n == 0 then core.raise(class.name .. ".forward returned nothing; it must return its outputs") end
  drain_released()
  next_id = next_id + 1
  local entry = {class = class, ctx = ctx, nin = args.n, tensor_input = {}, outputs = {}, nout = outs.n}
  local ins = ffi.new("struct kiln_tensor *[?]", args.n > 0 and args.n or 1)
  for i = 1, args.n do
    if core.is_tensor(args[i]) then ins[i - 1] = args[i].p entry.tensor_input[i] = true end
  end
  local out_ptrs = ffi.new("struct kiln_tensor *[?]", outs.n)
  for k = 1, outs.n do
    local o = outs[k]
    if core.is_tensor(o) then
      local differentiable = true
      for _, t in ipairs(ctx._non_differentiable) do if same_tensor(t, o) then differentiable = false end end
      -- an output that already has a history (an input returned as it is) is given as a fresh view
      if o.p.requires_grad == 1 or o.p.grad_fn ~= nil then o = o:detach() outs[k] = o end
      if differentiable then
        out_ptrs[k - 1] = o.p
        entry.outputs[k] = {sizes = o:size(), dtype = o:dtype(), device = o:device()}
      end
    end
  end
  registry[next_id] = entry
  local rc = C.kiln_function_record(next_id, class.name, args.n, ins, outs.n, out_ptrs)
  if rc ~= 0 then registry[next_id] = nil core.fail() end
  return unpack(outs, 1, outs.n)
end

-- The Lua backward of function node id, in the middle of walk w.
local function run_function(w, id, retain_graph)
  local entry = registry[id]
  if not entry then core.raise("backward: the context of a custom function was lost (id " .. id .. ")") end
  local ctx, class = entry.ctx, entry.class
  local versions = rawget(ctx, "_versions") or {}
  for i, t in pairs(ctx.saved_tensors or {}) do
    if t.p.storage.version ~= versions[i] then
      core.raise(string.format("backward: tensor %s, saved by %s (ctx:save_for_backward argument %d), was changed in "
                               .. "place after it was saved; change a clone() instead, or save what backward needs after "
                               .. "the change", tostring(t:size()), class.name, i))
    end
  end
  local grads = {}
  for k = 1, entry.nout do
    local g = C.kiln_backward_output_grad(w, k - 1)
    if g ~= nil then
      grads[k] = core.wrap(g)
    elseif entry.outputs[k] then   -- no grad reached this output: zeros, as PyTorch gives
      local o = entry.outputs[k]
      grads[k] = factory.zeros(o.sizes, {dtype = o.dtype, device = o.device})
    end
  end
  local res = pack(M.no_grad(class.backward, ctx, unpack(grads, 1, entry.nout)))
  if res.n > entry.nin then
    core.raise(string.format("backward of %s: returned %d grads for %d inputs", class.name, res.n, entry.nin))
  end
  for i = 1, res.n do
    local g = res[i]
    if g ~= nil and entry.tensor_input[i] then
      if not core.is_tensor(g) then
        core.raise(string.format("backward of %s: the grad of input %d is %s; return a tensor or nil", class.name, i,
                                 core.describe(g)))
      end
      core.check(C.kiln_backward_input_grad(w, i - 1, g.p))
    end
  end
  if not retain_graph then
    rawset(ctx, "saved_tensors", nil)
  end
end

-- loss:backward() through a graph that holds custom functions (Tensor.backward comes here while
-- one is alive): the walk, stepped from Lua.
local function walk_backward(t, grad, retain_graph)
  drain_released()
  local w = C.kiln_backward_start(t.p, grad, retain_graph and 1 or 0)   -- grad: a struct kiln_tensor * or nil
  if w == nil then core.fail() end
  local ok, err = pcall(function()
    while true do
      core.check(C.kiln_backward_step(w, function_id))
      local id = tonumber(function_id[0])
      if id == 0 then return end
      run_function(w, id, retain_graph)
    end
  end)
  C.kiln_backward_end(w)
  drain_released()
  if not ok then error(err, 0) end
end
core.function_backward = walk_backward

-- autograd.Function(name): a new custom function class; define class.forward(ctx, ...) and
-- class.backward(ctx, grad_outputs...), then call class.apply(...) or class(...).
local Function = setmetatable({}, {__call = function(_, name)
  if type(name) ~= "string" or name == "" then
    core.raise("autograd.Function: give the function a name, autograd.Function(\"Exp\"), got " .. core.describe(name))
  end
  local class = {name = name}
  class.apply = function(...) return apply(class, ...) end
  return setmetatable(class, {__call = function(_, ...) return apply(class, ...) end,
                              __tostring = function() return "autograd.Function " .. name end})
end})
M.Function = Function
M.FunctionContext = Ctx

return M
