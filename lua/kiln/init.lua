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

-- ---- creation (kiln.factory) ----

local factory = require "kiln.factory"
for name, fn in pairs(factory) do kiln[name] = fn end
local function_of_tensor = core.function_of_tensor

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
          frees = tonumber(s.frees), threshold = tonumber(s.threshold), collections = core.collections,
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
  C.kiln_memory_set_threshold(on, bytes or (on == C.KILN_CPU and 64 or 16) * 2 ^ 20)
end

kiln.help = require("kiln.help").help

-- The CPU convolutions' algorithm (docs/cpu.md): "auto" (kiln's Winograd where it takes the shape,
-- else oneDNN where it does, else im2col + GEMM), "im2col", "onednn" or "winograd"; benchmark mode
-- times each on a shape's first call and keeps the fastest. Both settings live in the environment (KILN_CONV_ALGO, KILN_CONV_BENCHMARK),
-- so that the C side reads them on every convolution, and a child process inherits them.
pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
local conv_algorithms = {auto = true, im2col = true, onednn = true, winograd = true}
function kiln.set_conv_algorithm(name)
  if not conv_algorithms[name] then
    error(string.format('kiln.set_conv_algorithm: %s is not an algorithm: "auto", "im2col", "onednn" or "winograd"',
                        type(name) == "string" and string.format("%q", name) or tostring(name)), 2)
  end
  ffi.C.setenv("KILN_CONV_ALGO", name, 1)
end
function kiln.conv_algorithm()
  local v = os.getenv("KILN_CONV_ALGO")
  return conv_algorithms[v] and v or "auto"
end
function kiln.set_conv_benchmark(on)
  if type(on) ~= "boolean" then error("kiln.set_conv_benchmark: expected true or false, got " .. tostring(on), 2) end
  ffi.C.setenv("KILN_CONV_BENCHMARK", on and "1" or "0", 1)
end
function kiln.conv_benchmark()
  local v = os.getenv("KILN_CONV_BENCHMARK")
  return v ~= nil and v ~= "" and v ~= "0"
end
-- The shapes convolved so far on the CPU and what ran each: a list of lines, oldest first.
-- kiln.conv_choices(true) also forgets them, so that the next calls choose again.
function kiln.conv_choices(clear)
  local list = {}
  for i = 0, tonumber(C.kiln_conv_choice_count()) - 1 do
    local line = C.kiln_conv_choice(i)
    if line ~= nil then list[#list + 1] = ffi.string(line) end
  end
  if clear then C.kiln_conv_choices_clear() end
  return list
end

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
           family = C.kiln_cpu_family(), model = C.kiln_cpu_model(), features = features,
           level = ffi.string(C.kiln_cpu_level())},
    blas = {name = ffi.string(C.kiln_blas_name()), core = ffi.string(C.kiln_blas_core()),
            state = blas_states[C.kiln_blas_state()], note = ffi.string(C.kiln_blas_note()),
            f32_gemm = ffi.string(C.kiln_cpu_f32_gemm()), bf16_products = ffi.string(C.kiln_cpu_bf16_products())},
    cuda = kiln.cuda.is_available(),
    onednn = {name = C.kiln_onednn_name() ~= nil and ffi.string(C.kiln_onednn_name()) or nil,
              note = ffi.string(C.kiln_onednn_note())},
  }
end

-- A SIGTERM that a training loop handles: after kiln.catch_terminate(), SIGTERM only makes
-- kiln.terminate_requested() true, so the loop can finish its step, save a checkpoint and exit.
function kiln.catch_terminate() check(C.kiln_terminate_catch()) end
function kiln.terminate_requested() return C.kiln_terminate_requested() ~= 0 end

-- KILN_CPU_LEVEL named a level of the CPU kernels that this CPU lacks (docs/cpu.md): kiln stops here.
check(C.kiln_cpu_level_check())

-- Said once, when kiln loads: the CPU's GEMM runs on generic kernels and kiln could not fix it.
if C.kiln_blas_state() >= C.KILN_BLAS_GENERIC and not core.blas_warned then
  core.blas_warned = true
  io.stderr:write("kiln: warning: ", ffi.string(C.kiln_blas_note()), "\n")
end

kiln.functional = require "kiln.functional"
kiln.F = kiln.functional
kiln.einsum = kiln.functional.einsum
kiln.nn = require "kiln.nn"
kiln.data = require "kiln.data"
kiln.ui = require "kiln.ui"
kiln.display = require "kiln.display"
kiln.plot = require "kiln.plot"
kiln.optim = require "kiln.optim"
kiln.amp = require "kiln.amp"

kiln.io = require "kiln.io"
kiln.save, kiln.load = kiln.io.save, kiln.io.load
kiln.checkpoint = require "kiln.checkpoint"

kiln.cuda = require "kiln.cuda"
kiln.audio = require "kiln.audio"
kiln.dist = require "kiln.dist"

return kiln
