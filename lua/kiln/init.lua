-- kiln: tensors and deep learning in LuaJIT over a C runtime.
-- `local kiln = require "kiln"` loads libkiln, its declarations and the tensor metatype.
local core = require "kiln.core"
local Tensor = require "kiln.tensor"
local ffi, C = core.ffi, core.C
local wrap, check, raise = core.wrap, core.check, core.raise
local wrap_retry = core.wrap_retry

local kiln = {}
kiln.version = ffi.string(C.kiln_version())
kiln.Tensor = Tensor
kiln.C = C
kiln.ffi = ffi

for name, d in pairs({f32 = "f32", f64 = "f64", f16 = "f16", bf16 = "bf16", i64 = "i64", i32 = "i32", u8 = "u8", bool = "bool"}) do
  kiln[name] = d
end
kiln.float32, kiln.float64, kiln.float16, kiln.bfloat16 = "f32", "f64", "f16", "bf16"
kiln.int64, kiln.int32, kiln.uint8 = "i64", "i32", "u8"

kiln.is_tensor = core.is_tensor

-- ---- creation ----

-- kiln.tensor({{1, 2}, {3, 4}}, {dtype = "f64", device = "cpu"}); a number gives a 0-dim tensor.
function kiln.tensor(data, opts)
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

kiln.empty = creator("empty", function(n, a, o) return wrap_retry(C.kiln_tensor_empty, n, a, core.dtype(o.dtype, "empty"), core.device(o.device)) end)
kiln.zeros = creator("zeros", function(n, a, o) return wrap_retry(C.kiln_tensor_full, n, a, 0, core.dtype(o.dtype, "zeros"), core.device(o.device)) end)
kiln.ones = creator("ones", function(n, a, o) return wrap_retry(C.kiln_tensor_full, n, a, 1, core.dtype(o.dtype, "ones"), core.device(o.device)) end)

-- kiln.full({2, 3}, 7) or kiln.full(2, 3, 7, {dtype=...}): the value is the last number.
function kiln.full(...)
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
function kiln.arange(a, b, c, opts)
  if type(b) == "table" then opts, b = b, nil elseif type(c) == "table" then opts, c = c, nil end
  opts = core.factory_opts(opts, "arange")
  local start, stop, step = 0, a, 1
  if b ~= nil then start, stop, step = a, b, c or 1 end
  core.number_arg(start, "arange", "the start") core.number_arg(stop, "arange", "the end") core.number_arg(step, "arange", "the step")
  local int = start == math.floor(start) and stop == math.floor(stop) and step == math.floor(step)
  local dtype = opts.dtype or (int and "i64" or "f32")
  return core.factory_done(wrap(C.kiln_tensor_arange(start, stop, step, core.dtype(dtype, "arange"), core.device(opts.device))), opts)
end

function kiln.linspace(a, b, steps, opts)
  opts = core.factory_opts(opts, "linspace")
  core.number_arg(a, "linspace", "the start") core.number_arg(b, "linspace", "the end") core.number_arg(steps, "linspace", "steps")
  return core.factory_done(wrap(C.kiln_tensor_linspace(a, b, steps, core.dtype(opts.dtype, "linspace"), core.device(opts.device))), opts)
end

function kiln.eye(n, m, opts)
  if type(m) == "table" then opts, m = m, nil end
  opts = core.factory_opts(opts, "eye")
  core.number_arg(n, "eye", "n")
  if m ~= nil then core.number_arg(m, "eye", "m") end
  return core.factory_done(wrap(C.kiln_tensor_eye(n, m or n, core.dtype(opts.dtype, "eye"), core.device(opts.device))), opts)
end

kiln.rand = creator("rand", function(n, a, o)
  local t = wrap_retry(C.kiln_tensor_empty, n, a, core.dtype(o.dtype, "rand"), core.device(o.device))
  check(C.kiln_uniform_(t.p, 0, 1))
  return t
end)

kiln.randn = creator("randn", function(n, a, o)
  local t = wrap_retry(C.kiln_tensor_empty, n, a, core.dtype(o.dtype, "randn"), core.device(o.device))
  check(C.kiln_normal_(t.p, 0, 1))
  return t
end)

-- randint(low, high, sizes, opts): integers in [low, high), i64 by default. randint(high, sizes) starts at 0.
function kiln.randint(low, high, sizes, opts)
  if type(high) == "table" then low, high, sizes, opts = 0, low, high, sizes end
  opts = core.factory_opts(opts, "randint")
  core.number_arg(low, "randint", "low") core.number_arg(high, "randint", "high")
  if sizes ~= nil and type(sizes) ~= "table" then core.raise("randint: the sizes must be a table, got " .. core.describe(sizes)) end
  local a, n = core.int64_array(sizes or {})
  local t = wrap_retry(C.kiln_tensor_empty, n, a, core.dtype(opts.dtype or "i64", "randint"), core.device(opts.device))
  check(C.kiln_randint_(t.p, low, high))
  return core.factory_done(t, opts)
end

-- kiln.f(t, ...) for a method t:f(...): the same, after checking that t is a tensor.
local function function_of_tensor(name, fn)
  return function(t, ...)
    if not core.is_tensor(t) then
      core.raise(string.format("kiln.%s: argument 1 must be a tensor, got %s", name, core.describe(t)))
    end
    return fn(t, ...)
  end
end

kiln.zeros_like, kiln.ones_like = function_of_tensor("zeros_like", Tensor.zeros_like), function_of_tensor("ones_like", Tensor.ones_like)
kiln.full_like = function_of_tensor("full_like", Tensor.full_like)
kiln.empty_like = function_of_tensor("empty_like", Tensor._empty_like)
-- uniform in [0, 1) and standard normal values of t's shape ({dtype =, device =, requires_grad =} as full_like)
local function random_like(name, fill)
  return function_of_tensor(name, function(t, opts)
    opts = core.factory_opts(opts, name)
    local r = Tensor.full_like(t, 0, {dtype = opts.dtype, device = opts.device})
    fill(r)
    return core.factory_done(r, opts)
  end)
end
kiln.rand_like = random_like("rand_like", function(r) Tensor.uniform_(r, 0, 1) end)
kiln.randn_like = random_like("randn_like", function(r) Tensor.normal_(r, 0, 1) end)

-- ---- functions ----

-- Under the kiln launcher a Ctrl-C's "interrupted" error is raised again after every pcall that
-- catches it, until it reaches the top. Code that handles it itself (saves a checkpoint, say)
-- says so from an xpcall message handler, where it is not raised:
--   xpcall(train, function(e) kiln.interrupt_caught() return e end)
-- No-op outside the launcher.
do
  local ok, readline = pcall(require, "kiln.readline")   -- the launcher's module
  kiln.interrupt_caught = ok and type(readline) == "table" and readline.interrupt_caught or function() end
end

kiln.cat, kiln.stack = Tensor.cat, Tensor.stack
kiln.where = Tensor._where
-- kiln.device("cuda:0") checks and normalises a device name ("cpu", "cuda:N"); kiln.device(t) is t's.
function kiln.device(x)
  if core.is_tensor(x) then return Tensor.device(x) end
  if type(x) ~= "string" then core.raise("kiln.device: expected a device name or a tensor, got " .. core.describe(x)) end
  return core.device_name(core.device(x, "device"))
end

-- randperm(n[, opts]): the numbers 1..n in a random order (i64 unless opts.dtype says otherwise),
-- drawn from the generator manual_seed sets: n uniform keys, Fisher-Yates over them.
function kiln.randperm(n, opts)
  opts = core.factory_opts(opts, "randperm")
  core.number_arg(n, "randperm", "n")
  if n < 0 or n ~= math.floor(n) then core.raise("randperm: n must be a non-negative integer, got " .. tostring(n)) end
  local keys = kiln.rand(math.max(n, 1), {dtype = "f64"})
  local kp = ffi.cast("double *", keys.p.storage.data) + keys.p.offset
  local perm = kiln.empty(n, {dtype = "i64"})
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

-- Every method is also a function of the tensor: kiln.exp(t), kiln.sum(t, 2).
for name, fn in pairs(Tensor) do
  if kiln[name] == nil and name:sub(1, 1) ~= "_" then kiln[name] = function_of_tensor(name, fn) end
end

-- ---- autograd ----

kiln.autograd = require "kiln.autograd"
kiln.no_grad, kiln.enable_grad = kiln.autograd.no_grad, kiln.autograd.enable_grad
kiln.set_grad_enabled, kiln.is_grad_enabled = kiln.autograd.set_grad_enabled, kiln.autograd.is_grad_enabled
kiln.gradcheck = kiln.autograd.gradcheck

-- ---- the runtime ----

function kiln.manual_seed(seed)
  C.kiln_manual_seed(core.number_arg(seed, "manual_seed", "the seed"))
end
kiln.seed = kiln.manual_seed
function kiln.initial_seed() return tonumber(C.kiln_initial_seed()) end
function kiln.get_rng_state() return {seed = tonumber(C.kiln_initial_seed()), offset = tonumber(C.kiln_random_offset())} end
function kiln.set_rng_state(s)
  if type(s) ~= "table" or type(s.seed) ~= "number" or type(s.offset) ~= "number" then
    core.raise("set_rng_state: expected a state as get_rng_state returns it ({seed = n, offset = n}), got " .. core.describe(s))
  end
  C.kiln_random_set_state(s.seed, s.offset)
end

function kiln.set_num_threads(n) check(C.kiln_set_num_threads(core.number_arg(n, "set_num_threads", "the thread count"))) end
function kiln.get_num_threads() return C.kiln_get_num_threads() end

-- How f32 matrix products may compute on a GPU, as torch.set_float32_matmul_precision:
-- "highest" (the default: exact f32), "high" (TF32 tensor cores) or "medium" (BF16). No effect on
-- the CPU, nor on f64, f16 and bf16 products.
local precisions = {highest = C.KILN_MATMUL_HIGHEST, high = C.KILN_MATMUL_HIGH, medium = C.KILN_MATMUL_MEDIUM}
local precision_names = {[C.KILN_MATMUL_HIGHEST] = "highest", [C.KILN_MATMUL_HIGH] = "high",
                         [C.KILN_MATMUL_MEDIUM] = "medium"}
function kiln.set_float32_matmul_precision(p)
  local v = precisions[p]
  if v == nil then
    error(string.format('kiln.set_float32_matmul_precision: %s is not a precision: "highest" (exact f32), '
                        .. '"high" (TF32) or "medium" (BF16)', type(p) == "string" and string.format("%q", p) or tostring(p)), 2)
  end
  check(C.kiln_set_float32_matmul_precision(v))
end
function kiln.get_float32_matmul_precision() return precision_names[C.kiln_get_float32_matmul_precision()] end

-- Bytes held by tensors on a device type ("cpu" or "cuda"); on the CPU also the bytes of freed
-- large blocks kept for reuse (cached_bytes).
-- the device type of memory_stats' and set_gc_threshold's device argument (nil: the cpu)
local function device_type(device, what)
  return device == nil and C.KILN_CPU or core.device(device, what).type
end

function kiln.memory_stats(device)
  local on = device_type(device, "memory_stats")
  local s = C.kiln_memory_stats(on)
  return {live_bytes = tonumber(s.live_bytes), peak_bytes = tonumber(s.peak_bytes), allocs = tonumber(s.allocs),
          frees = tonumber(s.frees), threshold = tonumber(s.threshold),
          cached_bytes = on == C.KILN_CPU and tonumber(C.kiln_cpu_cached_bytes()) or nil}
end
-- Give the CPU's cached blocks back to the system (kiln.cuda.empty_cache does the device's).
function kiln.empty_cache() C.kiln_cpu_empty_cache() end
-- Collect garbage after this many tensor bytes were allocated since the last collection
-- (nil: back to the automatic CPU threshold).
function kiln.set_gc_threshold(bytes, device)
  if bytes ~= nil then core.number_arg(bytes, "set_gc_threshold", "the byte count") end
  local on = device_type(device, "set_gc_threshold")
  if on == C.KILN_CPU then core.gc_threshold_fixed = bytes ~= nil end
  C.kiln_memory_set_threshold(on, bytes or 16 * 2 ^ 20)
end

function kiln.help(x) return require("kiln.help").help(x) end

-- What kiln runs on: kiln.info().cpu.features, kiln.info().blas.core, ...
local blas_states = {[0] = "detected", "corrected", "from_env", "generic", "missing"}
function kiln.info()
  local features = {}
  for f in ffi.string(C.kiln_cpu_features()):gmatch("%S+") do features[#features + 1] = f end
  return {
    version = kiln.version,
    luajit = jit.version,
    threads = C.kiln_get_num_threads(),
    cpu = {name = ffi.string(C.kiln_cpu_name()), vendor = ffi.string(C.kiln_cpu_vendor()),
           family = C.kiln_cpu_family(), model = C.kiln_cpu_model(), features = features},
    blas = {name = ffi.string(C.kiln_blas_name()), core = ffi.string(C.kiln_blas_core()),
            state = blas_states[C.kiln_blas_state()], note = ffi.string(C.kiln_blas_note())},
    cuda = kiln.cuda.is_available(),
  }
end

-- Said once, when kiln loads: the CPU's GEMM runs on generic kernels and kiln could not fix it.
if C.kiln_blas_state() >= C.KILN_BLAS_GENERIC and not core.blas_warned then
  core.blas_warned = true
  io.stderr:write("kiln: warning: ", ffi.string(C.kiln_blas_note()), "\n")
end

-- nn and optim need kiln itself, so they load on first use: kiln.nn, kiln.optim.
setmetatable(kiln, {__index = function(t, k)
  if k == "nn" or k == "F" or k == "functional" then
    local m = require(k == "nn" and "kiln.nn" or "kiln.functional")
    rawset(t, k, m)
    return m
  end
end})

kiln.data = require "kiln.data"
kiln.ui = require "kiln.ui"
kiln.optim = require "kiln.optim"

kiln.io = require "kiln.io"
kiln.save, kiln.load = kiln.io.save, kiln.io.load
kiln.checkpoint = require "kiln.checkpoint"

kiln.cuda = require "kiln.cuda"
kiln.audio = require "kiln.audio"

return kiln
