-- kiln.autograd: grad mode, and gradcheck (f64 central differences against backward).
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

return M
