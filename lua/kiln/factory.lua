-- kiln.factory: the functions that make tensors (kiln.tensor, zeros, randn, arange, ...), cat,
-- stack and where, and the seed of the random generator. The kiln facade gives them to users; the
-- parts of the library above tensors (nn, optim, autograd, checkpoint, data) require this module.
local core = require "kiln.core"
local Tensor = require "kiln.tensor"
local ffi, C = core.ffi, core.C
local check, raise = core.check, core.raise
local wrap, wrap_retry = core.wrap, core.wrap_retry

local M = {}
M.is_tensor = core.is_tensor

-- ---- creation ----

-- kiln.tensor({{1, 2}, {3, 4}}, {dtype = "f64", device = "cpu"}); a number gives a 0-dim tensor.
function M.tensor(data, opts)
  opts = core.factory_opts(opts, "tensor")
  if core.is_tensor(data) then
    return core.factory_done(data:to{dtype = opts.dtype or data:dtype(), device = opts.device}:clone():detach(), opts)
  end
  return core.factory_done(core.from_table(data, opts.dtype, opts.device), opts)
end

local function creator(name, fill)
  return function(...)
    local sizes, opts = core.sizes_and_options(...)
    opts = core.factory_opts(opts, name)
    local a, n = core.int64_array(sizes)
    return core.factory_done(fill(n, a, opts), opts)
  end
end

M.empty = creator("empty", function(n, a, o) return wrap_retry(C.kiln_tensor_empty, n, a, core.dtype(o.dtype, "empty"), core.device(o.device)) end)
M.zeros = creator("zeros", function(n, a, o) return wrap_retry(C.kiln_tensor_full, n, a, 0, core.dtype(o.dtype, "zeros"), core.device(o.device)) end)
M.ones = creator("ones", function(n, a, o) return wrap_retry(C.kiln_tensor_full, n, a, 1, core.dtype(o.dtype, "ones"), core.device(o.device)) end)

-- kiln.full({2, 3}, 7) or M.full(2, 3, 7, {dtype=...}): the value is the last number.
function M.full(...)
  local args = {...}
  local opts = {}
  if type(args[#args]) == "table" and args[#args][1] == nil then opts = table.remove(args) end
  opts = core.factory_opts(opts, "full")
  local value = table.remove(args)
  if type(value) ~= "number" then raise("full: the last argument (before options) must be the fill value") end
  local a, n = core.int64_array((core.sizes_and_options(unpack(args))))
  return core.factory_done(wrap_retry(C.kiln_tensor_full, n, a, value, core.dtype(opts.dtype, "full"), core.device(opts.device)), opts)
end

-- arange(end), arange(start, end), arange(start, end, step): end is excluded, as in PyTorch.
-- The dtype is i64 when every argument is an integer, else f32.
function M.arange(a, b, c, opts)
  if type(b) == "table" then opts, b = b, nil elseif type(c) == "table" then opts, c = c, nil end
  opts = core.factory_opts(opts, "arange")
  local start, stop, step = 0, a, 1
  if b ~= nil then start, stop, step = a, b, c or 1 end
  core.number_arg(start, "arange", "the start") core.number_arg(stop, "arange", "the end") core.number_arg(step, "arange", "the step")
  local int = start == math.floor(start) and stop == math.floor(stop) and step == math.floor(step)
  local dtype = opts.dtype or (int and "i64" or "f32")
  return core.factory_done(wrap(C.kiln_tensor_arange(start, stop, step, core.dtype(dtype, "arange"), core.device(opts.device))), opts)
end

function M.linspace(a, b, steps, opts)
  opts = core.factory_opts(opts, "linspace")
  core.number_arg(a, "linspace", "the start") core.number_arg(b, "linspace", "the end") core.number_arg(steps, "linspace", "steps")
  return core.factory_done(wrap(C.kiln_tensor_linspace(a, b, steps, core.dtype(opts.dtype, "linspace"), core.device(opts.device))), opts)
end

function M.eye(n, m, opts)
  if type(m) == "table" then opts, m = m, nil end
  opts = core.factory_opts(opts, "eye")
  core.number_arg(n, "eye", "n")
  if m ~= nil then core.number_arg(m, "eye", "m") end
  return core.factory_done(wrap(C.kiln_tensor_eye(n, m or n, core.dtype(opts.dtype, "eye"), core.device(opts.device))), opts)
end

M.rand = creator("rand", function(n, a, o)
  local t = wrap_retry(C.kiln_tensor_empty, n, a, core.dtype(o.dtype, "rand"), core.device(o.device))
  check(C.kiln_uniform_(t.p, 0, 1))
  return t
end)

M.randn = creator("randn", function(n, a, o)
  local t = wrap_retry(C.kiln_tensor_empty, n, a, core.dtype(o.dtype, "randn"), core.device(o.device))
  check(C.kiln_normal_(t.p, 0, 1))
  return t
end)

-- randint(low, high, sizes, opts): integers in [low, high), i64 by default. randint(high, sizes) starts at 0.
function M.randint(low, high, sizes, opts)
  if type(high) == "table" then low, high, sizes, opts = 0, low, high, sizes end
  opts = core.factory_opts(opts, "randint")
  core.number_arg(low, "randint", "low") core.number_arg(high, "randint", "high")
  if sizes ~= nil and type(sizes) ~= "table" then core.raise("randint: the sizes must be a table, got " .. core.describe(sizes)) end
  local a, n = core.int64_array(sizes or {})
  local t = wrap_retry(C.kiln_tensor_empty, n, a, core.dtype(opts.dtype or "i64", "randint"), core.device(opts.device))
  check(C.kiln_randint_(t.p, low, high))
  return core.factory_done(t, opts)
end

local function_of_tensor = core.function_of_tensor

M.zeros_like, M.ones_like = function_of_tensor("zeros_like", Tensor.zeros_like), function_of_tensor("ones_like", Tensor.ones_like)
M.full_like = function_of_tensor("full_like", Tensor.full_like)
M.empty_like = function_of_tensor("empty_like", Tensor._empty_like)
-- uniform in [0, 1) and standard normal values of t's shape ({dtype =, device =, requires_grad =} as full_like)
local function random_like(name, fill)
  return function_of_tensor(name, function(t, opts)
    opts = core.factory_opts(opts, name)
    local r = Tensor.full_like(t, 0, {dtype = opts.dtype, device = opts.device})
    fill(r)
    return core.factory_done(r, opts)
  end)
end
M.rand_like = random_like("rand_like", function(r) Tensor.uniform_(r, 0, 1) end)
M.randn_like = random_like("randn_like", function(r) Tensor.normal_(r, 0, 1) end)


M.cat, M.stack = Tensor.cat, Tensor.stack
M.where = Tensor._where
-- kiln.device("cuda:0") checks and normalises a device name ("cpu", "cuda:N"); kiln.device(t) is t's.
function M.device(x)
  if core.is_tensor(x) then return Tensor.device(x) end
  if type(x) ~= "string" then core.raise("kiln.device: expected a device name or a tensor, got " .. core.describe(x)) end
  return core.device_name(core.device(x, "device"))
end

-- randperm(n[, opts]): the numbers 1..n in a random order (i64 unless opts.dtype says otherwise),
-- drawn from the generator manual_seed sets: n uniform keys, Fisher-Yates over them.
function M.randperm(n, opts)
  opts = core.factory_opts(opts, "randperm")
  core.number_arg(n, "randperm", "n")
  if n < 0 or n ~= math.floor(n) then core.raise("randperm: n must be a non-negative integer, got " .. tostring(n)) end
  local keys = M.rand(math.max(n, 1), {dtype = "f64"})
  local kp = ffi.cast("double *", keys.p.storage.data) + keys.p.offset
  local perm = M.empty(n, {dtype = "i64"})
  local pp = ffi.cast("int64_t *", perm.p.storage.data) + perm.p.offset
  for i = 0, n - 1 do pp[i] = i + 1 end
  for i = n - 1, 1, -1 do
    local j = math.floor(kp[i] * (i + 1))
    pp[i], pp[j] = pp[j], pp[i]
  end
  local r = perm
  if opts.dtype or opts.device then r = perm:to{dtype = opts.dtype or "i64", device = opts.device} end
  return core.factory_done(r, opts)
end

-- ---- the generator ----

function M.manual_seed(seed)
  C.kiln_manual_seed(core.number_arg(seed, "manual_seed", "the seed"))
end
M.seed = M.manual_seed
function M.initial_seed() return tonumber(C.kiln_initial_seed()) end
function M.get_rng_state() return {seed = tonumber(C.kiln_initial_seed()), offset = tonumber(C.kiln_random_offset())} end
function M.set_rng_state(s)
  if type(s) ~= "table" or type(s.seed) ~= "number" or type(s.offset) ~= "number" then
    core.raise("set_rng_state: expected a state as get_rng_state returns it ({seed = n, offset = n}), got " .. core.describe(s))
  end
  C.kiln_random_set_state(s.seed, s.offset)
end


return M
