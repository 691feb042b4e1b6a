-- kiln.tensor: the tensor metatype: operators, methods, indexing. Every method is a thin
-- call into libkiln; dims and indices count from 1 here (-1 is the last) and from 0 in C.
local core = require "kiln.core"
local cuda = require "kiln.cuda"
local functional = require "kiln.functional"
local format = require "kiln.format"
local ffi, C = core.ffi, core.C
local wrap, check, cdim, fail, is_tensor, raise = core.wrap, core.check, core.cdim, core.fail, core.is_tensor, core.raise
local wrap_retry, tensor_arg, number_arg = core.wrap_retry, core.tensor_arg, core.number_arg

local Tensor = {}     -- the methods
local FLOAT_DTYPES = {[tonumber(C.KILN_F32)] = true, [tonumber(C.KILN_F64)] = true, [tonumber(C.KILN_F16)] = true,
                      [tonumber(C.KILN_BF16)] = true}
local mt = {}

local function scalar_or_tensor(x, what)
  if type(x) == "number" then return x end
  if type(x) == "boolean" then return x and 1 or 0 end
  if is_tensor(x) then return x end
  raise(string.format("%s: expected a tensor or a number, got %s", what, type(x)))
end

-- ---- shape and properties ----

function Tensor.dim(t) return t.p.ndim end
Tensor.ndimension = Tensor.dim
function Tensor.numel(t) return tonumber(t.p.numel) end
Tensor.nelement = Tensor.numel
function Tensor.dtype(t) return core.dtype_names[t.p.dtype] end
function Tensor.device(t) return core.device_name(t.p.device) end
function Tensor.is_contiguous(t) return C.kiln_is_contiguous(t.p) == 1 end
function Tensor.is_freed(t) return C.kiln_tensor_is_freed(t.p) == 1 end
function Tensor.is_floating_point(t) return FLOAT_DTYPES[t.p.dtype] == true end
function Tensor.element_size(t) return C.kiln_dtype_size(t.p.dtype) end

local size_mt = {__tostring = function(s) return "[" .. table.concat(s, ", ") .. "]" end}

function Tensor.size(t, d)
  if d then return tonumber(t.p.sizes[cdim(t, d, "size")]) end
  local s = {}
  for i = 0, t.p.ndim - 1 do s[i + 1] = tonumber(t.p.sizes[i]) end
  return setmetatable(s, size_mt)
end
Tensor.shape = Tensor.size

function Tensor.stride(t, d)
  if d then return tonumber(t.p.strides[cdim(t, d, "stride")]) end
  local s = {}
  for i = 0, t.p.ndim - 1 do s[i + 1] = tonumber(t.p.strides[i]) end
  return s
end

-- ---- views ----

local function size_args(t, what, ...)
  local sizes = core.sizes_and_options(...)
  return sizes
end

function Tensor.view(t, ...)
  local a, n = core.int64_array(size_args(t, "view", ...))
  return wrap(C.kiln_view(t.p, n, a))
end

function Tensor.reshape(t, ...)
  local a, n = core.int64_array(size_args(t, "reshape", ...))
  return wrap(C.kiln_reshape(t.p, n, a))
end

function Tensor.view_as(t, other) tensor_arg(other, "view_as", "other") return t:view(other:size()) end

function Tensor.transpose(t, d0, d1)
  return wrap(C.kiln_transpose(t.p, cdim(t, d0, "transpose"), cdim(t, d1, "transpose")))
end

function Tensor.t(t)
  if t.p.ndim > 2 then raise("t: expects a tensor of at most 2 dims, got " .. ffi.string(C.kiln_shape_string(t.p))) end
  if t.p.ndim < 2 then return wrap(C.kiln_alias(t.p)) end
  return wrap(C.kiln_transpose(t.p, 0, 1))
end

function Tensor.permute(t, ...)
  local dims = type(...) == "table" and ... or {...}
  local a = ffi.new("int[?]", #dims > 0 and #dims or 1)
  for i = 1, #dims do a[i - 1] = cdim(t, dims[i], "permute") end
  return wrap(C.kiln_permute(t.p, #dims, a))
end

-- narrow(dim, start, length): start counts from 1.
function Tensor.narrow(t, d, start, length)
  local cd = cdim(t, d, "narrow")
  number_arg(start, "narrow", "the start") number_arg(length, "narrow", "the length")
  if start < 0 then start = tonumber(t.p.sizes[cd]) + start + 1 end
  if start < 1 then raise(string.format("narrow: start %d out of range (counting from 1)", start)) end
  return wrap(C.kiln_narrow(t.p, cd, start - 1, length))
end

local function c_index(t, cd, i, what)
  local size = tonumber(t.p.sizes[cd])
  if type(i) ~= "number" or i ~= math.floor(i) then
    raise(string.format("%s: index must be an integer, got %s", what, tostring(i)))
  end
  if i == 0 or i > size or i < -size then
    raise(string.format("%s: index %s out of range for dim %d of size %d (tensor %s; counting from 1, -1 is the last)",
                        what, math.abs(i) < 2 ^ 53 and string.format("%d", i) or tostring(i), cd + 1, size,
                        ffi.string(C.kiln_shape_string(t.p))))
  end
  return i > 0 and i - 1 or size + i
end

function Tensor.select(t, d, i)
  local cd = cdim(t, d, "select")
  return wrap(C.kiln_select(t.p, cd, c_index(t, cd, i, "select")))
end

function Tensor.squeeze(t, d)
  if d == nil then return wrap(C.kiln_squeeze_all(t.p)) end
  return wrap(C.kiln_squeeze(t.p, cdim(t, d, "squeeze")))
end

function Tensor.unsqueeze(t, d) return wrap(C.kiln_unsqueeze(t.p, cdim(t, d, "unsqueeze", 1))) end

function Tensor.expand(t, ...)
  local a, n = core.int64_array(size_args(t, "expand", ...))
  return wrap(C.kiln_expand(t.p, n, a))
end
function Tensor.expand_as(t, other) tensor_arg(other, "expand_as", "other") return t:expand(other:size()) end

function Tensor.flatten(t, s, e)
  if t.p.ndim == 0 then return wrap(C.kiln_flatten(t.p, 0, 0)) end
  return wrap(C.kiln_flatten(t.p, cdim(t, s or 1, "flatten"), cdim(t, e or -1, "flatten")))
end

function Tensor.contiguous(t) return wrap(C.kiln_contiguous(t.p)) end
function Tensor.clone(t) return wrap_retry(C.kiln_clone, t.p) end

-- ---- in-place ops under autograd ----

-- A view (p.base set) whose base an in-place op changed takes the base's history before Lua reads
-- its requires_grad or grad_fn (kiln_autograd_refresh; C's ops do it themselves).
local function refresh(p)
  if p.base ~= nil then check(C.kiln_autograd_refresh(p)) end
end

-- Whether an in-place op on t (with b) is one autograd must see: grad mode on, and t or b requires
-- grad, or t is a view of a tensor that does (what it writes changes that tensor's history).
local function recorded(t, b)
  local p = t.p
  refresh(p)
  local bp = type(b) ~= "number" and b ~= nil and b.p or nil
  if bp ~= nil then refresh(bp) end
  if p.requires_grad == 0 and (bp == nil or bp.requires_grad == 0) then return false end
  return C.kiln_grad_enabled() == 1
end

-- t takes the values and the history of r, the in-place op's result computed out of place; a view
-- gives its base the change too (kiln_autograd_assign: PyTorch's CopySlices).
local function assign(t, r, op)
  if r.p.dtype ~= t.p.dtype then r = r:to(core.dtype_names[t.p.dtype]) end
  check(C.kiln_autograd_assign(t.p, r.p, op))
  return t
end

-- ---- copies, dtypes, devices ----

function Tensor.copy_(t, src)
  if type(src) == "number" then return Tensor.fill_(t, src) end
  local sp = tensor_arg(src, "copy_", "the source")
  if recorded(t, src) then return assign(t, src:expand(Tensor.size(t)):clone(), "copy_") end
  check(C.kiln_copy_(t.p, sp))
  return t
end
function Tensor.fill_(t, v)
  number_arg(v, "fill_", "the value")
  if recorded(t) then return assign(t, Tensor.full_like(t, v), "fill_") end
  check(C.kiln_fill_(t.p, v))
  return t
end
function Tensor.zero_(t) return Tensor.fill_(t, 0) end

-- to("f64"), to("cuda"), to{dtype=..., device=..., non_blocking=...}, to(other_tensor), to("cuda", {non_blocking = true}).
-- non_blocking: an upload from a pinned tensor (t:pin_memory()) is queued on the device's stream and
-- to returns at once, as in PyTorch; any other move waits.
function Tensor.to(t, what, opts)
  if is_tensor(what) then return t:to({dtype = what.p.dtype, device = what.p.device}, opts) end
  local dtype, device
  local non_blocking = type(opts) == "table" and opts.non_blocking
  if type(what) == "table" then
    dtype, device = what.dtype, what.device
    if what.non_blocking ~= nil then non_blocking = what.non_blocking end
  elseif type(what) == "string" and C.kiln_dtype_from_name(what) >= 0 then dtype = what
  elseif type(what) == "string" and not (what == "cpu" or what:match("^cuda")) then
    raise(string.format("to: %q is neither a dtype (f32, f64, f16, bf16, i64, i32, u8, bool) nor a device (cpu, cuda, cuda:N)", what))
  else device = what end
  local r = t
  if device ~= nil then
    local d = core.device(device)
    r = wrap_retry(non_blocking and C.kiln_to_device_non_blocking or C.kiln_to_device, r.p, d)
  end
  if dtype ~= nil then r = wrap_retry(C.kiln_to_dtype, r.p, core.dtype(dtype, "to")) end
  return r
end
function Tensor.type(t, dtype) if dtype == nil then return Tensor.dtype(t) end return t:to(dtype) end
function Tensor.float(t) return t:to("f32") end
function Tensor.double(t) return t:to("f64") end
function Tensor.half(t) return t:to("f16") end
function Tensor.bfloat16(t) return t:to("bf16") end
function Tensor.long(t) return t:to("i64") end
function Tensor.int(t) return t:to("i32") end
function Tensor.byte(t) return t:to("u8") end
function Tensor.bool(t) return t:to("bool") end
function Tensor.cpu(t) return t:to("cpu") end
-- t:cuda(), t:cuda(1) (cuda:1), t:cuda{device = 1, non_blocking = true}
function Tensor.cuda(t, i)
  if type(i) == "table" then
    local d = i.device
    if type(d) == "number" then d = "cuda:" .. d end
    return t:to(d or "cuda", {non_blocking = i.non_blocking})
  end
  return t:to(i and ("cuda:" .. i) or "cuda")
end

-- A copy in page-locked host memory (t itself when pinned already), for uploads that do not wait:
-- x:pin_memory():cuda{non_blocking = true}. Needs a CUDA device ("pin_memory: no CUDA device: ...").
function Tensor.pin_memory(t) return wrap(C.kiln_tensor_pin_memory(t.p)) end
-- t's memory is also used by work queued on CUDA stream s (kiln.cuda.Stream): its block is not
-- reused until that work has finished, even after t is freed.
function Tensor.record_stream(t, s) cuda.record_stream(t, s) end
function Tensor.is_pinned(t) return C.kiln_tensor_is_pinned(t.p) ~= 0 end

function Tensor.free(t) C.kiln_tensor_free(t.p) end

-- ---- elements ----

local dbl = ffi.typeof("double[?]")

local item_out = dbl(1)   -- item() runs in training loops: it reads into one buffer, allocating nothing
function Tensor.item(t)
  check(C.kiln_tensor_item(t.p, item_out))
  if t.p.dtype == C.KILN_BOOL then return item_out[0] ~= 0 end
  return item_out[0]
end

-- Nested Lua tables in row-major order (a number for a 0-dim tensor).
function Tensor.totable(t)
  local n = tonumber(t.p.numel)
  local buf = dbl(n > 0 and n or 1)
  check(C.kiln_tensor_to_f64(t.p, buf))
  local is_bool = t.p.dtype == C.KILN_BOOL
  local pos = 0
  local function build(d)
    if d == t.p.ndim then
      local v = buf[pos]
      pos = pos + 1
      if is_bool then return v ~= 0 end
      return v
    end
    local r = {}
    for i = 1, tonumber(t.p.sizes[d]) do r[i] = build(d + 1) end
    return r
  end
  return build(0)
end
Tensor.tolist = Tensor.totable

-- ---- elementwise ----

-- The methods of the unary and binary ops are the op table's: t:<name>() for each row of those
-- families (a new elementwise op needs no line here).
local unary, binary = {}, {}
do
  local d = ffi.new("struct kiln_op_desc")
  for op = 0, tonumber(C.KILN_OP_COUNT) - 1 do
    if C.kiln_op_describe(op, d) == 0 then
      local family = ffi.string(d.family)
      if family == "unary" then unary[#unary + 1] = ffi.string(d.name)
      elseif family == "binary" then binary[#binary + 1] = ffi.string(d.name) end
    end
  end
end
for _, name in ipairs(unary) do
  local op = C["KILN_OP_" .. name:upper()]   -- the enum's name is the op's, in capitals
  Tensor[name] = function(t) return wrap_retry(C.kiln_unary, op, t.p) end
  local out_of_place = Tensor[name]
  Tensor[name .. "_"] = function(t)
    if recorded(t) then return assign(t, out_of_place(t), name .. "_") end
    check(C.kiln_unary_(op, t.p))
    return t
  end
end

for _, name in ipairs(binary) do
  local op = C["KILN_OP_" .. name:upper()]
  Tensor[name] = function(a, b)
    b = scalar_or_tensor(b, name)
    if type(b) == "number" then return wrap_retry(C.kiln_binary_scalar, op, a.p, b, 0) end
    return wrap_retry(C.kiln_binary, op, a.p, b.p)
  end
  Tensor[name .. "_"] = function(a, b)
    b = scalar_or_tensor(b, name .. "_")
    if recorded(a, b) then return assign(a, Tensor[name](a, b), name .. "_") end
    if type(b) == "number" then check(C.kiln_binary_scalar_(op, a.p, b)) else check(C.kiln_binary_(op, a.p, b.p)) end
    return a
  end
end
Tensor.greater, Tensor.less = Tensor.gt, Tensor.lt

-- Operators. A number on the left works too (2 - t, 1 / t).
local OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_POW, OP_REM = C.KILN_OP_ADD, C.KILN_OP_SUB, C.KILN_OP_MUL, C.KILN_OP_DIV, C.KILN_OP_POW, C.KILN_OP_REMAINDER
local function operator(op)
  return function(a, b)
    if type(a) == "number" then return wrap_retry(C.kiln_binary_scalar, op, b.p, a, 1) end
    if type(b) == "number" then return wrap_retry(C.kiln_binary_scalar, op, a.p, b, 0) end
    if not is_tensor(b) or not is_tensor(a) then
      raise(string.format("%s: expected tensors or numbers, got %s and %s", C.kiln_op_name(op) ~= nil and ffi.string(C.kiln_op_name(op)) or "?", type(a), type(b)))
    end
    return wrap_retry(C.kiln_binary, op, a.p, b.p)
  end
end
mt.__add = operator(OP_ADD)
mt.__sub = operator(OP_SUB)
mt.__mul = operator(OP_MUL)
mt.__div = operator(OP_DIV)
mt.__pow = operator(OP_POW)
mt.__mod = operator(OP_REM)
mt.__unm = function(a) return wrap_retry(C.kiln_unary, C.KILN_OP_NEG, a.p) end

function Tensor.where(cond, a, b)
  -- t:where(cond, other) reads like PyTorch's x.where(cond, y); kiln.where(cond, a, b) is below.
  return Tensor._where(a, cond, b)
end
-- A number beside a tensor in where, in the dtype the binary ops give it (a weak scalar).
local function where_scalar(like, v)
  return Tensor.full_like(like, v, {dtype = tonumber(C.kiln_scalar_type(like.p.dtype, v))})
end

function Tensor._where(cond, a, b)
  local like = is_tensor(a) and a or b
  if not is_tensor(like) then raise("where: argument 2 or 3 must be a tensor, got " .. core.describe(a) .. " and " .. core.describe(b)) end
  if type(a) == "number" then a = where_scalar(like, a) end
  if type(b) == "number" then b = where_scalar(like, b) end
  return wrap_retry(C.kiln_where, tensor_arg(cond, "where", "the condition"), tensor_arg(a, "where", "argument 2"),
                    tensor_arg(b, "where", "argument 3"))
end

local function full_like(t, v, opts, what)
  opts = core.factory_opts(opts, what)
  local dtype = opts.dtype and core.dtype(opts.dtype) or t.p.dtype
  local dev = opts.device and core.device(opts.device) or t.p.device
  local a, n = core.int64_array(Tensor.size(t))
  return core.factory_done(wrap_retry(C.kiln_tensor_full, n, a, number_arg(v, what, "the value"), dtype, dev), opts)
end
function Tensor.full_like(t, v, opts) return full_like(t, v, opts, "full_like") end
function Tensor.zeros_like(t, opts) return full_like(t, 0, opts, "zeros_like") end
function Tensor.ones_like(t, opts) return full_like(t, 1, opts, "ones_like") end
function Tensor._empty_like(t, opts) return full_like(t, 0, opts, "empty_like") end

-- The shape the tensors among args broadcast to, as PyTorch (sizes aligned from the right, 1
-- stretching); else an error naming op, each operand (names[i]) and its shape, and the dim (from 1,
-- of the broadcast shape) where they disagree. Numbers and nils among args are skipped.
local function broadcast_check(op, names, ...)
  local args, shapes, used = {...}, {}, {}
  local n = 0
  for i = 1, #names do
    if is_tensor(args[i]) then
      used[#used + 1] = i
      local t = args[i]
      shapes[i] = {}
      for k = 0, t.p.ndim - 1 do shapes[i][k + 1] = tonumber(t.p.sizes[k]) end
      n = math.max(n, #shapes[i])
    end
  end
  local out = {}
  for d = 1, n do
    local size, from
    for _, i in ipairs(used) do
      local s = shapes[i][#shapes[i] - n + d]
      if s and s ~= 1 then
        if size and s ~= size then
          local parts = {}
          for _, j in ipairs(used) do parts[#parts + 1] = names[j] .. " " .. ffi.string(C.kiln_shape_string(args[j].p)) end
          local list = #parts == 2 and (parts[1] .. " and " .. parts[2])
                       or (table.concat(parts, ", ", 1, #parts - 1) .. " and " .. parts[#parts])
          raise(string.format("%s: %s do not broadcast (dim %d: %d in %s vs %d in %s)", op, list, d, size, names[from], s,
                              names[i]))
        end
        size, from = s, i
      end
    end
    out[d] = size or 1
  end
  return out
end

function Tensor.clamp(t, lo, hi)
  if type(lo) == "table" and not is_tensor(lo) then lo, hi = lo.min, lo.max end
  if is_tensor(lo) or is_tensor(hi) then
    -- tensor bounds (broadcast): min(max(t, lo), hi), as PyTorch; either may be a number or nil
    if lo == nil and hi == nil then raise("clamp: give a lower bound, an upper bound or both") end
    broadcast_check("clamp", {"input", "min", "max"}, t, lo, hi)
    local r = t
    if lo ~= nil then r = r:maximum(is_tensor(lo) and lo or number_arg(lo, "clamp", "min")) end
    if hi ~= nil then r = r:minimum(is_tensor(hi) and hi or number_arg(hi, "clamp", "max")) end
    return r
  end
  if lo ~= nil then number_arg(lo, "clamp", "min") end
  if hi ~= nil then number_arg(hi, "clamp", "max") end
  return wrap_retry(C.kiln_clamp, t.p, lo or 0, hi or 0, lo ~= nil and 1 or 0, hi ~= nil and 1 or 0)
end
Tensor.clip = Tensor.clamp

-- ---- reductions ----

local dims_buf = ffi.new("int[8]")
local function dims_arg(t, dim, what)
  if dim == nil then return 0 end
  if type(dim) == "number" then dims_buf[0] = cdim(t, dim, what) return 1 end
  if type(dim) ~= "table" then raise(string.format("%s: dim must be an integer or a table of them, got %s", what, core.describe(dim))) end
  if #dim > 8 then raise(string.format("%s: %d dims given (a tensor has at most 8)", what, #dim)) end
  for i = 1, #dim do dims_buf[i - 1] = cdim(t, dim[i], what) end
  return #dim
end

local function reducer(opname, p_default)
  local op = C["KILN_OP_" .. opname:upper()]
  return function(t, dim, keepdim)
    local n = dims_arg(t, dim, opname)
    return wrap_retry(C.kiln_reduce, op, t.p, n, dims_buf, keepdim and 1 or 0, p_default or 0)
  end
end
Tensor.sum = reducer("sum")
Tensor.mean = reducer("mean")
Tensor.prod = reducer("prod")
Tensor.logsumexp = reducer("logsumexp")

-- var(dim, keepdim, {correction = 1}) or var{dim=, keepdim=, correction=}; unbiased by default.
local function spread(opname)
  local op = C["KILN_OP_" .. opname:upper()]
  return function(t, dim, keepdim, opts)
    if type(dim) == "table" and (dim.dim or dim.correction or dim.keepdim ~= nil or dim.unbiased ~= nil) then
      opts, dim, keepdim = dim, dim.dim, dim.keepdim
    end
    if type(keepdim) == "table" then opts, keepdim = keepdim, nil end
    opts = core.opts_arg(opts, opname)
    local correction = opts.correction or (opts.unbiased == false and 0) or 1
    local n = dims_arg(t, dim, opname)
    return wrap_retry(C.kiln_reduce, op, t.p, n, dims_buf, keepdim and 1 or 0, correction)
  end
end
Tensor.var = spread("var")
Tensor.std = spread("std")

-- norm(p=2, dim, keepdim); p may be math.huge (the largest magnitude) or -math.huge (the smallest).
function Tensor.norm(t, p, dim, keepdim)
  if p ~= nil then number_arg(p, "norm", "p") end
  local n = dims_arg(t, dim, "norm")
  return wrap_retry(C.kiln_reduce, C.KILN_OP_NORM, t.p, n, dims_buf, keepdim and 1 or 0, p or 2)
end

-- Indices that Lua sees count from 1.
local function plus_one(idx) return wrap(C.kiln_binary_scalar(OP_ADD, idx.p, 1, 0)) end

local function arg_reducer(opname)
  local op = C["KILN_OP_" .. opname:upper()]
  return function(t, dim, keepdim)
    local n = dims_arg(t, dim, opname)
    return plus_one(wrap(C.kiln_reduce(op, t.p, n, dims_buf, keepdim and 1 or 0, 0)))
  end
end
Tensor.argmax = arg_reducer("argmax")
Tensor.argmin = arg_reducer("argmin")

-- max() is the largest element; max(dim) gives values and (1-based) indices, like Torch7 and PyTorch;
-- max(other_tensor) is the elementwise maximum.
local function extreme(opname, argname, elementwise)
  local op, argop = C["KILN_OP_" .. opname:upper()], C["KILN_OP_" .. argname:upper()]
  return function(t, dim, keepdim)
    if is_tensor(dim) then return elementwise(t, dim) end
    local n = dims_arg(t, dim, opname)
    local values = wrap(C.kiln_reduce(op, t.p, n, dims_buf, keepdim and 1 or 0, 0))
    if dim == nil then return values end
    return values, plus_one(wrap(C.kiln_reduce(argop, t.p, n, dims_buf, keepdim and 1 or 0, 0)))
  end
end
Tensor.max = extreme("max", "argmax", Tensor.maximum)
Tensor.min = extreme("min", "argmin", Tensor.minimum)

-- ---- softmax (kiln.functional has the other nn ops) ----

function Tensor.softmax(t, dim) return functional.softmax(t, dim) end
function Tensor.log_softmax(t, dim) return functional.log_softmax(t, dim) end

-- ---- linear algebra ----

-- a:matmul(b), or a:matmul(b, {out = c}) to write into c without allocating.
function Tensor.matmul(a, b, opts)
  opts = core.opts_arg(opts, "matmul")
  if opts.out then
    check(C.kiln_matmul_out(tensor_arg(opts.out, "matmul", "out"), a.p, tensor_arg(b, "matmul", "argument 2")))
    return opts.out
  end
  return wrap_retry(C.kiln_matmul, a.p, tensor_arg(b, "matmul", "argument 2"))
end
function Tensor.mm(a, b) return wrap_retry(C.kiln_mm, a.p, tensor_arg(b, "mm", "argument 2")) end
function Tensor.bmm(a, b) return wrap_retry(C.kiln_bmm, a.p, tensor_arg(b, "bmm", "argument 2")) end
function Tensor.dot(a, b) return wrap_retry(C.kiln_matmul, a.p, tensor_arg(b, "dot", "argument 2")) end
-- c:addmm(a, b, {beta=1, alpha=1}) or c:addmm(a, b, beta, alpha) = beta * c + alpha * a @ b
local addmm_options = core.set("beta", "alpha")   -- the options addmm knows
function Tensor.addmm(c, a, b, opts, alpha)
  if type(opts) == "number" or type(alpha) == "number" then
    opts = {beta = number_arg(opts == nil and 1 or opts, "addmm", "beta"), alpha = number_arg(alpha == nil and 1 or alpha, "addmm", "alpha")}
  end
  opts = core.options(opts, addmm_options, "addmm")
  return wrap_retry(C.kiln_addmm, c.p, tensor_arg(a, "addmm", "argument 2"), tensor_arg(b, "addmm", "argument 3"),
                    opts.beta or 1, opts.alpha or 1)
end

-- ---- joining and splitting ----

local function tensor_list(list, what)
  if type(list) ~= "table" or is_tensor(list) then raise(string.format("%s: expected a list of tensors, got %s", what, core.describe(list))) end
  local n = #list
  if n == 0 then raise(what .. ": expected a non-empty list of tensors") end
  local arr = ffi.new("struct kiln_tensor *[?]", n)
  for i = 1, n do
    if not is_tensor(list[i]) then raise(string.format("%s: element %d is a %s, not a tensor", what, i, type(list[i]))) end
    arr[i - 1] = list[i].p
  end
  return arr, n
end

function Tensor.cat(list, dim)
  local arr, n = tensor_list(list, "cat")
  local ref = list[1]
  for i = 1, n do if not (list[i].p.ndim == 1 and list[i].p.numel == 0) then ref = list[i] break end end
  local r = wrap_retry(C.kiln_cat, n, arr, cdim(ref, dim or 1, "cat"))
  return r
end

function Tensor.stack(list, dim)
  local arr, n = tensor_list(list, "stack")
  return wrap_retry(C.kiln_stack, n, arr, cdim(list[1], dim or 1, "stack", 1))
end

-- split(size, dim): views of `size` along dim (the last may be smaller); a table of sizes splits exactly.
function Tensor.split(t, size, dim)
  dim = dim or 1
  local cd = cdim(t, dim, "split")
  local total = tonumber(t.p.sizes[cd])
  local parts, start = {}, 0
  if type(size) == "table" then
    local sum = 0
    for _, s in ipairs(size) do sum = sum + s end
    if sum ~= total then raise(string.format("split: sizes add up to %d, dim %d has size %d", sum, dim, total)) end
    for _, s in ipairs(size) do parts[#parts + 1] = wrap(C.kiln_narrow(t.p, cd, start, s)) start = start + s end
    return parts
  end
  number_arg(size, "split", "the size")
  if size <= 0 then raise("split: size must be positive, got " .. tostring(size)) end
  while start < total do
    local len = math.min(size, total - start)
    parts[#parts + 1] = wrap(C.kiln_narrow(t.p, cd, start, len))
    start = start + len
  end
  return parts
end

function Tensor.chunk(t, n, dim)
  dim = dim or 1
  local total = tonumber(t.p.sizes[cdim(t, dim, "chunk")])
  number_arg(n, "chunk", "the number of chunks")
  if n <= 0 then raise("chunk: number of chunks must be positive, got " .. tostring(n)) end
  return Tensor.split(t, math.max(1, math.ceil(total / n)), dim)
end

-- ---- indexing by tensors (indices count from 1) ----

local function c_indices(idx, what)
  if not is_tensor(idx) then
    if type(idx) == "table" then idx = core.from_table(idx, "i64") else raise(what .. ": index must be a tensor or a table of integers") end
  end
  if idx.p.dtype ~= C.KILN_I64 and idx.p.dtype ~= C.KILN_I32 then
    raise(string.format("%s: index has dtype %s (expected i64 or i32)", what, core.dtype_names[idx.p.dtype]))
  end
  return wrap(C.kiln_binary_scalar(OP_SUB, idx.p, 1, 0))
end

function Tensor.index_select(t, dim, idx)
  return wrap_retry(C.kiln_index_select, t.p, cdim(t, dim, "index_select"), c_indices(idx, "index_select").p)
end
Tensor.index = Tensor.index_select

function Tensor.gather(t, dim, idx)
  return wrap_retry(C.kiln_gather, t.p, cdim(t, dim, "gather"), c_indices(idx, "gather").p)
end

function Tensor.scatter_add(t, dim, idx, src)
  return wrap_retry(C.kiln_scatter_add, t.p, cdim(t, dim, "scatter_add"), c_indices(idx, "scatter_add").p,
                    tensor_arg(src, "scatter_add", "the source"))
end
function Tensor.scatter_add_(t, dim, idx, src)
  if is_tensor(src) and recorded(t, src) then return assign(t, Tensor.scatter_add(t, dim, idx, src), "scatter_add_") end
  check(C.kiln_scatter_add_(t.p, cdim(t, dim, "scatter_add_"), c_indices(idx, "scatter_add_").p,
                               tensor_arg(src, "scatter_add_", "the source")))
  return t
end

function Tensor.masked_fill(t, mask, v)
  return wrap_retry(C.kiln_masked_fill, t.p, tensor_arg(mask, "masked_fill", "the mask"), number_arg(v, "masked_fill", "the value"))
end
function Tensor.masked_fill_(t, mask, v)
  if recorded(t) then return assign(t, Tensor.masked_fill(t, mask, v), "masked_fill_") end
  check(C.kiln_masked_fill_(t.p, tensor_arg(mask, "masked_fill_", "the mask"), number_arg(v, "masked_fill_", "the value")))
  return t
end
function Tensor.masked_select(t, mask) return wrap_retry(C.kiln_masked_select, t.p, tensor_arg(mask, "masked_select", "the mask")) end

-- ---- random fills ----

local function number_or(x, default, what, name)
  if x == nil then return default end
  return number_arg(x, what, name)
end
function Tensor.uniform_(t, lo, hi)
  check(C.kiln_uniform_(t.p, number_or(lo, 0, "uniform_", "the low end"), number_or(hi, 1, "uniform_", "the high end")))
  return t
end
function Tensor.normal_(t, mean, std)
  check(C.kiln_normal_(t.p, number_or(mean, 0, "normal_", "the mean"), number_or(std, 1, "normal_", "the std")))
  return t
end
-- t:random_(lo, hi): integers in [lo, hi), as PyTorch's; t:random_(n): in [1, n], as Torch7's
-- (indices count from 1).
function Tensor.random_(t, lo, hi)
  if hi == nil then
    number_arg(lo, "random_", "the high end")
    lo, hi = 1, lo + 1
  end
  number_arg(lo, "random_", "the low end") number_arg(hi, "random_", "the high end")
  check(C.kiln_randint_(t.p, lo, hi))
  return t
end

-- ---- autograd ----

function Tensor.requires_grad_(t, on)
  check(C.kiln_requires_grad_(t.p, on == nil and 1 or (on and 1 or 0)))
  return t
end

-- backward(), backward(grad), backward{retain_graph = true}, backward(grad, {retain_graph = true})
local backward_options = core.set("retain_graph")   -- the options backward knows
function Tensor.backward(t, grad, opts)
  if type(grad) == "table" and not is_tensor(grad) then opts, grad = grad, nil end
  opts = core.options(opts, backward_options, "backward")
  local gp = grad ~= nil and tensor_arg(grad, "backward", "the gradient") or nil
  -- a graph with custom functions (kiln.autograd.Function) is walked from Lua, which runs their backward
  if core.function_backward and C.kiln_function_nodes_live() > 0 then
    return core.function_backward(t, gp, opts.retain_graph)
  end
  check(C.kiln_backward(t.p, gp, opts.retain_graph and 1 or 0))
end

function Tensor.detach(t) return wrap(C.kiln_detach(t.p)) end

-- ---- composites ----

-- t:flip(d1, d2, ...) or t:flip{d1, ...}: the order of each dim given reversed (a copy).
function Tensor.flip(t, ...)
  local dims = select("#", ...) == 1 and type(...) == "table" and ... or {...}
  if #dims == 0 then raise("flip: give the dims to reverse (dims count from 1)") end
  local r = t
  for _, d in ipairs(dims) do
    local n = r:size(d)
    r = r:index_select(d, wrap(C.kiln_tensor_arange(n, 0, -1, C.KILN_I64, r.p.device)))
  end
  return r
end

-- t:tril(k = 0) and t:triu(k = 0): the lower (upper) triangle of the last two dims, from the k-th
-- diagonal (k > 0 above the main one), the rest 0.
local function triangle(t, k, op, keep)
  k = k or 0
  number_arg(k, op, "the diagonal")
  if t:dim() < 2 then raise(string.format("%s: needs a tensor of at least 2 dims, got %s", op, tostring(t:size()))) end
  local rows, cols = t:size(-2), t:size(-1)
  local r = wrap(C.kiln_tensor_arange(0, rows, 1, C.KILN_I64, t.p.device)):view(rows, 1)
  local c = wrap(C.kiln_tensor_arange(0, cols, 1, C.KILN_I64, t.p.device)):view(1, cols)
  local d = c - r   -- the diagonal of each element
  return t:masked_fill(keep == "lower" and d:gt(k) or d:lt(k), 0)
end
function Tensor.tril(t, k) return triangle(t, k, "tril", "lower") end
function Tensor.triu(t, k) return triangle(t, k, "triu", "upper") end

-- t:any([dim[, keepdim]]) and t:all(...): whether any (all) elements are non-zero, as bool.
function Tensor.any(t, dim, keepdim)
  local n = dim == nil and t:ne(0):sum() or t:ne(0):sum(dim, keepdim)
  return n:gt(0)
end
function Tensor.all(t, dim, keepdim)
  local n = dim == nil and t:eq(0):sum() or t:eq(0):sum(dim, keepdim)
  return n:eq(0)
end

-- ---- sorting and scans (kernels of the op table: argsort, cumsum, cumprod) ----

-- (dim, descending) or {dim =, descending =, stable =}: the dim defaults to the last. Sorting is
-- always stable, so stable = false changes nothing.
local sort_options = core.set("dim", "descending", "stable")
-- The C dim along which an op runs; a 0-d tensor has one element along dim 1 (or -1), as in PyTorch.
local function line_dim(t, dim, what) return cdim(t, dim, what, t.p.ndim == 0 and 1 or 0) end
local function sort_args(t, dim, descending, what)
  if type(dim) == "table" then
    local o = core.options(dim, sort_options, what)
    dim, descending = o.dim, o.descending
  end
  return line_dim(t, dim or -1, what), core.flag(descending, false, what, "descending")
end

-- t:argsort([dim[, descending]]): i64 indices (from 1) that sort t along dim; stable.
function Tensor.argsort(t, dim, descending)
  local d, desc = sort_args(t, dim, descending, "argsort")
  return plus_one(wrap_retry(C.kiln_argsort, t.p, d, desc and 1 or 0))
end

-- t:sort([dim[, descending]]): the sorted values and their indices (from 1), stable as PyTorch's
-- sort(stable=True); NaN sorts above every number. The values are gather(t, idx): they carry grad.
function Tensor.sort(t, dim, descending)
  local d, desc = sort_args(t, dim, descending, "sort")
  local idx = wrap_retry(C.kiln_argsort, t.p, d, desc and 1 or 0)
  if t.p.ndim == 0 then return wrap(C.kiln_alias(t.p)), plus_one(idx) end
  return wrap(C.kiln_gather(t.p, d, idx.p)), plus_one(idx)
end

-- t:topk(k[, dim[, largest[, sorted]]]) or t:topk(k, {dim =, largest =, sorted =}): the k largest
-- (smallest) values along dim and their indices (from 1), in sorted order; ties keep their order.
local topk_options = core.set("dim", "largest", "sorted")
function Tensor.topk(t, k, dim, largest, sorted)
  if type(dim) == "table" then
    local o = core.options(dim, topk_options, "topk")
    dim, largest, sorted = o.dim, o.largest, o.sorted
  end
  core.integer_arg(k, "topk", "k")
  local d = line_dim(t, dim or -1, "topk")
  largest = core.flag(largest, true, "topk", "largest")
  core.flag(sorted, true, "topk", "sorted")
  local n = t.p.ndim == 0 and 1 or tonumber(t.p.sizes[d])
  if k < 0 or k > n then
    raise(string.format("topk: k = %d is out of range for dim %d of size %d (tensor %s)", k, d + 1, n,
                        ffi.string(C.kiln_shape_string(t.p))))
  end
  local idx = wrap_retry(C.kiln_argsort_k, t.p, d, largest and 1 or 0, k)
  if t.p.ndim == 0 then return wrap(C.kiln_alias(t.p)), plus_one(idx) end
  return wrap(C.kiln_gather(t.p, d, idx.p)), plus_one(idx)
end

-- t:cumsum(dim) and t:cumprod(dim): running sums (products) along dim; integers and bool give i64.
function Tensor.cumsum(t, dim)
  if dim == nil then raise("cumsum: give the dim (dims count from 1)") end
  return wrap_retry(C.kiln_cumsum, t.p, line_dim(t, dim, "cumsum"))
end
function Tensor.cumprod(t, dim)
  if dim == nil then raise("cumprod: give the dim (dims count from 1)") end
  return wrap_retry(C.kiln_cumprod, t.p, line_dim(t, dim, "cumprod"))
end

-- ---- composites: ops written with other ops (views, gather, index_select, products), which give
-- them their gradients and their devices ----

local index_tensor = core.index_tensor
local function shape_of(t) return ffi.string(C.kiln_shape_string(t.p)) end
local function sizes_of(t)
  local s = {}
  for i = 0, t.p.ndim - 1 do s[i + 1] = tonumber(t.p.sizes[i]) end
  return s
end
local function count_arg(v, what, name)
  core.integer_arg(v, what, name)
  if v < 0 then raise(string.format("%s: %s must be >= 0, got %d", what, name, v)) end
  return v
end

-- t repeated reps[i] times along dim i (reps at least as long as t has dims; t gains leading dims).
local function tile(t, reps, what)
  for i, r in ipairs(reps) do count_arg(r, what, "repeat " .. i) end
  local lead = #reps - t.p.ndim
  local sizes = sizes_of(t)
  for _ = 1, lead do table.insert(sizes, 1, 1) end
  local x = #sizes == t.p.ndim and t or t:reshape(sizes)
  for i = 1, #reps do
    local r = reps[i]
    if r ~= 1 then
      -- [.., s, ..] -> [.., 1, s, ..] -> [.., r, s, ..] -> [.., r * s, ..]: the whole dim r times
      local v, e = {}, {}
      for k = 1, #sizes do
        if k == i then v[#v + 1], e[#e + 1] = 1, r end
        v[#v + 1], e[#e + 1] = sizes[k], sizes[k]
      end
      sizes[i] = sizes[i] * r
      x = x:reshape(v):expand(e):reshape(sizes)
    end
  end
  if x == t then return t:clone() end
  return x
end

-- t:tile(r1, r2, ...) or t:tile{...}: t repeated along each dim; fewer reps than dims repeat the last
-- dims (the others once), as torch.tile.
function Tensor.tile(t, ...)
  local reps = size_args(t, "tile", ...)
  local full = {}
  for _ = 1, t.p.ndim - #reps do full[#full + 1] = 1 end
  for _, r in ipairs(reps) do full[#full + 1] = r end
  return tile(t, full, "tile")
end

-- t["repeat"](t, r1, r2, ...) (repeat is a Lua keyword): PyTorch's Tensor.repeat, as tile with at
-- least as many reps as t has dims.
Tensor["repeat"] = function(t, ...)
  local reps = size_args(t, "repeat", ...)
  if #reps < t.p.ndim then
    raise(string.format("repeat: %d repeats for a tensor of %d dims %s (give at least one per dim, or use tile)", #reps,
                        t.p.ndim, shape_of(t)))
  end
  return tile(t, reps, "repeat")
end

-- t:repeat_interleave(repeats[, dim]): each element (slice along dim) repeated; repeats is a count,
-- or one count per element (a table or an integer tensor). Without dim, t is flattened first.
function Tensor.repeat_interleave(t, repeats, dim)
  local x = t
  if dim == nil then x, dim = t:reshape(-1), 1 end
  local d = cdim(x, dim, "repeat_interleave")
  local n = tonumber(x.p.sizes[d])
  if is_tensor(repeats) then
    if repeats:dim() > 1 or repeats:is_floating_point() then
      raise(string.format("repeat_interleave: repeats must be a count or a 1-d integer tensor, got %s %s", repeats:dtype(),
                          shape_of(repeats)))
    end
    repeats = repeats:dim() == 0 and repeats:item() or repeats:totable()
  end
  if type(repeats) == "table" and #repeats == 1 then repeats = repeats[1] end
  if type(repeats) == "number" then
    count_arg(repeats, "repeat_interleave", "repeats")
    local sizes = sizes_of(x)
    local v, e = {}, {}
    for k = 1, #sizes do
      v[#v + 1], e[#e + 1] = sizes[k], sizes[k]
      if k == d + 1 then v[#v + 1], e[#e + 1] = 1, repeats end
    end
    sizes[d + 1] = sizes[d + 1] * repeats
    return x:reshape(v):expand(e):reshape(sizes)
  end
  if type(repeats) ~= "table" then
    raise("repeat_interleave: repeats must be a count, a table or a tensor of counts, got " .. core.describe(repeats))
  end
  if #repeats ~= n then
    raise(string.format("repeat_interleave: %d repeats for dim %d of size %d (tensor %s)", #repeats, d + 1, n, shape_of(x)))
  end
  local idx = {}
  for j = 1, n do
    for _ = 1, count_arg(repeats[j], "repeat_interleave", "repeats " .. j) do idx[#idx + 1] = j - 1 end
  end
  return wrap(C.kiln_index_select(x.p, d, index_tensor(idx, x.p.device).p))
end

-- t:roll(shifts[, dims]): elements shifted along each dim, those past the end coming back at the
-- start; shifts and dims are numbers or tables of the same length. Without dims, t is rolled flat.
function Tensor.roll(t, shifts, dims)
  if dims == nil then
    if type(shifts) == "table" then
      if #shifts ~= 1 then raise("roll: without dims, give one shift (the tensor is rolled flat)") end
      shifts = shifts[1]
    end
    return t:reshape(-1):roll(shifts, 1):reshape(sizes_of(t))
  end
  if type(shifts) ~= "table" then shifts = {shifts} end
  if type(dims) ~= "table" then dims = {dims} end
  if #shifts ~= #dims then raise(string.format("roll: %d shifts for %d dims", #shifts, #dims)) end
  local x = t
  for k = 1, #dims do
    core.integer_arg(shifts[k], "roll", "the shift")
    local d = cdim(x, dims[k], "roll")
    local n = tonumber(x.p.sizes[d])
    local s = n > 0 and shifts[k] % n or 0
    if s ~= 0 then
      local idx = {}
      for j = 0, n - 1 do idx[j + 1] = (j - s) % n end
      x = wrap(C.kiln_index_select(x.p, d, index_tensor(idx, x.p.device).p))
    end
  end
  if x == t then return t:clone() end
  return x
end

-- The value of addcmul/addcdiv/baddbmm: a number, or {value =} (and {beta =, alpha =}).
local function scale_arg(v, default, what, name)
  if v == nil then return default end
  return number_arg(v, what, name)
end

-- t:addcmul(a, b[, value = 1]) = t + value * a * b and t:addcdiv(a, b[, value = 1]) = t + value * a / b;
-- the three broadcast, as PyTorch's; value may be given as {value = v}.
function Tensor.addcmul(t, a, b, value)
  if type(value) == "table" then value = core.options(value, core.set("value"), "addcmul").value end
  tensor_arg(a, "addcmul", "tensor1") tensor_arg(b, "addcmul", "tensor2")
  broadcast_check("addcmul", {"input", "tensor1", "tensor2"}, t, a, b)
  return t + a * b * scale_arg(value, 1, "addcmul", "value")
end
function Tensor.addcdiv(t, a, b, value)
  if type(value) == "table" then value = core.options(value, core.set("value"), "addcdiv").value end
  tensor_arg(a, "addcdiv", "tensor1") tensor_arg(b, "addcdiv", "tensor2")
  broadcast_check("addcdiv", {"input", "tensor1", "tensor2"}, t, a, b)
  return t + a / b * scale_arg(value, 1, "addcdiv", "value")
end

-- t:lerp(e, w) = t + w * (e - t): w a number or a tensor; t, e and w broadcast, as PyTorch's.
function Tensor.lerp(t, e, w)
  tensor_arg(e, "lerp", "end")
  if not is_tensor(w) then number_arg(w, "lerp", "weight") end
  broadcast_check("lerp", {"input", "end", "weight"}, t, e, w)
  return t + (e - t) * w
end

-- a:outer(b): the matrix a[i] * b[j] of two 1-d tensors.
function Tensor.outer(a, b)
  tensor_arg(b, "outer", "argument 2")
  if a.p.ndim ~= 1 or b.p.ndim ~= 1 then
    raise(string.format("outer: expects two 1-d tensors, got %s and %s", shape_of(a), shape_of(b)))
  end
  return a:view(-1, 1) * b:view(1, -1)
end
Tensor.ger = Tensor.outer

-- The flat positions (from 0) of diagonal k of a rows x cols matrix.
local function diagonal_positions(rows, cols, k)
  local list = {}
  local r0, c0 = k < 0 and -k or 0, k > 0 and k or 0
  local i = 0
  while r0 + i < rows and c0 + i < cols do
    list[#list + 1] = (r0 + i) * cols + c0 + i
    i = i + 1
  end
  return list
end

-- t:diag([k = 0]): for a 1-d t, the square matrix with t on diagonal k (k > 0 above the main one);
-- for a 2-d t, its diagonal k as a 1-d tensor.
function Tensor.diag(t, k)
  k = k or 0
  core.integer_arg(k, "diag", "the diagonal")
  if t.p.ndim == 1 then
    local n = tonumber(t.p.sizes[0])
    local m = n + math.abs(k)
    local pos = index_tensor(diagonal_positions(m, m, k), t.p.device)
    local zeros = wrap(C.kiln_tensor_full(1, ffi.new("int64_t[1]", m * m), 0, t.p.dtype, t.p.device))
    return wrap(C.kiln_scatter_add(zeros.p, 0, pos.p, t.p)):view(m, m)
  elseif t.p.ndim == 2 then
    local rows, cols = tonumber(t.p.sizes[0]), tonumber(t.p.sizes[1])
    local pos = index_tensor(diagonal_positions(rows, cols, k), t.p.device)
    return wrap(C.kiln_index_select(t:reshape(-1).p, 0, pos.p))
  end
  raise(string.format("diag: expects a 1-d or 2-d tensor, got %s", shape_of(t)))
end

-- t:trace(): the sum of the main diagonal of a 2-d tensor.
function Tensor.trace(t)
  if t.p.ndim ~= 2 then raise(string.format("trace: expects a 2-d tensor, got %s", shape_of(t))) end
  return t:diag():sum()
end

-- c:baddbmm(a, b[, {beta = 1, alpha = 1}]) = beta * c + alpha * (a @ b) for batches a [B,n,k] and
-- b [B,k,m], c broadcast to [B,n,m]; with beta = 0, c is not read (NaN in it does not show).
local baddbmm_options = core.set("beta", "alpha")
function Tensor.baddbmm(c, a, b, opts)
  opts = core.options(opts, baddbmm_options, "baddbmm")
  tensor_arg(a, "baddbmm", "batch1") tensor_arg(b, "baddbmm", "batch2")
  local beta, alpha = scale_arg(opts.beta, 1, "baddbmm", "beta"), scale_arg(opts.alpha, 1, "baddbmm", "alpha")
  local p = a:bmm(b)
  -- c broadcasts to the product's shape [B,n,m] and no further, as PyTorch's (c [4] or [B,1,m], not [2,B,n,m])
  local want = sizes_of(p)
  local fits = c.p.ndim <= 3
  for d = 1, c.p.ndim do
    local s = tonumber(c.p.sizes[c.p.ndim - d])
    if s ~= 1 and s ~= want[4 - d] then fits = false end
  end
  if not fits then
    raise(string.format("baddbmm: input %s does not broadcast to the product's shape %s (batch1 %s @ batch2 %s)",
                        shape_of(c), shape_of(p), shape_of(a), shape_of(b)))
  end
  if alpha ~= 1 then p = p * alpha end
  if beta == 0 then return p end
  return p + (beta == 1 and c or c * beta)
end

-- probs:multinomial(n[, replacement = false]): n category indices (from 1) drawn from each row of
-- non-negative weights (1-d, or 2-d: one draw per row), from kiln's generator (kiln.manual_seed).
-- With replacement: the inverse of the cumulative weights at n uniform draws. Without: the n
-- largest of w / e for exponential draws e (the exponential-clock method PyTorch's CPU uses), so
-- that each category is drawn at most once. Runs where cumsum and argsort run (the CPU).
function Tensor.multinomial(p, n, replacement)
  if type(replacement) == "table" then replacement = core.options(replacement, core.set("replacement"), "multinomial").replacement end
  replacement = core.flag(replacement, false, "multinomial", "replacement")
  count_arg(n, "multinomial", "the number of samples")
  if p.p.ndim < 1 or p.p.ndim > 2 then
    raise(string.format("multinomial: probabilities must be 1-d or 2-d, got %s", shape_of(p)))
  end
  if not p:is_floating_point() then
    raise(string.format("multinomial: probabilities %s are %s (expected a float dtype)", shape_of(p), p:dtype()))
  end
  local k = p:size(-1)
  local rows = p.p.ndim == 2 and p:size(1) or 1
  local w = p:detach():to("f64"):reshape(rows, k)
  local sum = w:sum():item()   -- NaN or inf when a weight is (isfinite has no CUDA kernel)
  if sum ~= sum or sum == math.huge or w:lt(0):any():item() then
    raise(string.format("multinomial: the weights %s must be finite and >= 0", shape_of(p)))
  end
  local positive = w:gt(0):sum(2)
  if positive:eq(0):any():item() then raise(string.format("multinomial: a row of %s has no positive weight", shape_of(p))) end
  if not replacement and n > positive:min():item() then
    raise(string.format("multinomial: cannot draw %d samples without replacement from %d categories with a positive weight (%s)",
                        n, positive:min():item(), shape_of(p)))
  end
  local u = wrap(C.kiln_tensor_empty(2, ffi.new("int64_t[2]", rows, replacement and n or k), C.KILN_F64, p.p.device))
  check(C.kiln_uniform_(u.p, 0, 1))
  local idx
  if replacement then
    local cdf = w:cumsum(2)
    local total = cdf:narrow(2, k, 1)
    -- the category of u * total: how many cumulative weights are <= it (zero weights are skipped);
    -- the draws go in chunks that keep the comparison table near 4M entries
    local chunk = math.max(1, math.floor(4194304 / (rows * k)))
    local parts = {}
    for s = 1, n, chunk do
      local m = math.min(chunk, n - s + 1)
      local at = (u:narrow(2, s, m) * total):view(rows, m, 1)
      parts[#parts + 1] = cdf:view(rows, 1, k):le(at):sum(3)
    end
    idx = (#parts == 1 and parts[1] or Tensor.cat(parts, 2)):clamp(0, k - 1)
  else
    local e = (u * -1 + 1):log() * -1   -- exponential draws, from 1 - u in (0, 1]
    idx = wrap(C.kiln_argsort_k((w / e).p, 1, 1, n))
  end
  idx = idx + 1
  if p.p.ndim == 1 then return idx:reshape(n) end
  return idx
end

-- Fields read like PyTorch's: t.grad, t.requires_grad, t.is_leaf, t.grad_fn.
local properties = {
  grad = function(t)
    local g = t.p.grad
    if g == nil then return nil end
    C.kiln_tensor_retain(g)
    return wrap(g)
  end,
  requires_grad = function(t) refresh(t.p) return t.p.requires_grad ~= 0 end,
  is_leaf = function(t) refresh(t.p) return t.p.grad_fn == nil end,
  grad_fn = function(t)
    local name = C.kiln_grad_fn_name(t.p)
    return name ~= nil and ffi.string(name) or nil
  end,
  data = function(t) return wrap(C.kiln_detach(t.p)) end,
}

-- ---- t[i] and t[i] = v ----

local rawget = rawget

-- What t.<k> gives for a misspelt method k: a function that raises naming the one meant. (Its own
-- function, so that __index captures nothing and stays compiled.)
local function misspelt_method(k, near)
  return function()
    raise(string.format("t:%s: a tensor has no method or field %s; did you mean t:%s?", k, k, near))
  end
end

mt.__index = function(t, k)
  local m = Tensor[k]
  if m ~= nil then return m end
  local prop = properties[k]
  if prop then return prop(t) end
  if type(k) == "number" then
    if t.p.ndim == 0 then raise("index: cannot index a 0-dim tensor (use :item())") end
    local i = c_index(t, 0, k, "index")
    if t.p.ndim == 1 then
      if t.p.device.type ~= 0 then return Tensor.select(t, 1, k):item() end
      if C.kiln_tensor_is_freed(t.p) == 1 then fail() end
      local v = C.kiln_tensor_get(t.p, t.p.offset + i * t.p.strides[0])
      if t.p.dtype == C.KILN_BOOL then return v ~= 0 end
      return v
    end
    return wrap(C.kiln_select(t.p, 0, i))
  end
  if type(k) == "table" then   -- t[{i, j}]: one element, or a view when fewer indices than dims
    if #k > t.p.ndim then
      raise(string.format("index: %d indices for a tensor of %d dims (%s)", #k, t.p.ndim, tostring(Tensor.size(t))))
    end
    local r = t
    for n, i in ipairs(k) do r = r[i] end
    return r
  end
  if is_tensor(k) then
    -- t[mask]: the elements where a bool mask is true (masked_select); t[idx]: the rows idx (index_select)
    if k.p.dtype == C.KILN_BOOL then return Tensor.masked_select(t, k) end
    if k.p.dtype == C.KILN_I64 or k.p.dtype == C.KILN_I32 then return Tensor.index_select(t, 1, k) end
    raise(string.format("index: an index tensor must be bool (a mask) or i64/i32 (rows, from 1), got %s", core.dtype_names[k.p.dtype]))
  end
  -- t:vew(2): no such method, but one close to it: a function that says so when called
  if type(k) == "string" and k:sub(1, 1) ~= "_" then
    local near = core.closest(k, Tensor) or core.closest(k, properties)
    if near then return misspelt_method(k, near) end
  end
  return nil
end

-- the value of t[k] = v: a number, a boolean or a tensor
local function assigned(v)
  if type(v) == "number" or is_tensor(v) then return v end
  if type(v) == "boolean" then return v and 1 or 0 end
  raise("index: the value assigned must be a number, a boolean or a tensor, got " .. core.describe(v))
end

-- t[...] = v writes through the in-place methods, which autograd records (a value with history
-- written into a buffer gives the buffer that history, as in PyTorch).
local function write(t, v)
  if type(v) == "number" then Tensor.fill_(t, v) else Tensor.copy_(t, v) end
end

mt.__newindex = function(t, k, v)
  if type(k) == "table" then
    if #k == 0 then   -- t[{}] = v: all of t
      write(t, assigned(v))
      return
    end
    if #k > t.p.ndim then
      raise(string.format("index: %d indices for a tensor of %d dims (%s)", #k, t.p.ndim, tostring(Tensor.size(t))))
    end
    assigned(v)
    local target = t
    for n = 1, #k - 1 do target = target[k[n]] end
    target[k[#k]] = v
    return
  end
  if k == "grad" then
    if v ~= nil and not is_tensor(v) then raise("grad: must be a tensor or nil, got " .. core.describe(v)) end
    check(C.kiln_set_grad(t.p, v and v.p or nil))
    return
  end
  if k == "requires_grad" then Tensor.requires_grad_(t, v) return end
  if is_tensor(k) and k.p.dtype == C.KILN_BOOL then   -- t[mask] = number
    v = assigned(v)
    if type(v) ~= "number" then raise("index: t[mask] = v takes a number v (masked_fill_), got a tensor") end
    Tensor.masked_fill_(t, k, v)
    return
  end
  if type(k) ~= "number" then
    raise("tensor: cannot set field " .. (is_tensor(k) and ("with an index tensor of " .. core.dtype_names[k.p.dtype] .. " (t[mask] = number takes a bool mask)") or tostring(k)))
  end
  if t.p.ndim == 0 then raise("index: cannot index a 0-dim tensor (use :fill_())") end
  v = assigned(v)
  local i = c_index(t, 0, k, "index")
  if t.p.ndim == 1 and type(v) == "number" and t.p.device.type == 0 and not recorded(t) then
    check(C.kiln_tensor_set(t.p, t.p.offset + i * t.p.strides[0], v))
    return
  end
  write(wrap(C.kiln_select(t.p, 0, i)), v)
end

mt.__len = function(t)
  if t.p.ndim == 0 then return 0 end
  return tonumber(t.p.sizes[0])
end

mt.__tostring = function(t) return format.tensor(t) end
mt.__concat = function(a, b) return tostring(a) .. tostring(b) end

ffi.metatype(core.Ref, mt)

return Tensor
