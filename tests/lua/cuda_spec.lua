-- kiln.cuda on the machine the tests run on. Without a GPU (CI): is_available() is false, moving a
-- tensor to "cuda" raises "no CUDA device: ..." and the process carries on. With or without one:
-- the op x backend coverage table (every op has a CPU kernel; which have CUDA kernels), printed.
-- tests/gpu/ checks the CUDA kernels themselves against the CPU.
local kiln = kiln or require "kiln"
local ffi = require "ffi"
local C = kiln.C

local expect_backend = os.getenv("KILN_EXPECT_CUDA_BACKEND")   -- "1"/"0" from ctest; nil when run by hand

describe("kiln.cuda", function()
  it("answers whether a device is there, and why not", function()
    local n = kiln.cuda.device_count()
    assert.is_number(n)
    assert.equal(n > 0, kiln.cuda.is_available())
    if n == 0 then
      assert.matches("^no CUDA device: ", kiln.cuda.unavailable_reason())
    else
      assert.is_nil(kiln.cuda.unavailable_reason())
    end
    if expect_backend == "1" then
      assert.is_true(kiln.cuda.backend_loaded(), "built with CUDA, yet libkiln_cuda.so did not load: " ..
                     tostring(kiln.cuda.unavailable_reason()))
    elseif expect_backend == "0" then
      assert.is_false(kiln.cuda.backend_loaded())
      assert.matches("built without its CUDA backend", kiln.cuda.unavailable_reason())
    end
  end)

  it("memory_stats, empty_cache and manual_seed work on any machine", function()
    local s = kiln.cuda.memory_stats()
    for _, f in ipairs({"allocated", "reserved", "peak_allocated", "peak_reserved", "requests", "cache_hits",
                        "device_allocs", "device_frees", "oom_retries"}) do
      assert.is_number(s[f], f)
    end
    kiln.cuda.empty_cache()
    kiln.cuda.manual_seed(7)
    assert.equal(7, kiln.initial_seed())
  end)

  it("switches cuDNN's convolution API and benchmark mode at run time, through the environment", function()
    local api0, bench0 = os.getenv("KILN_CUDNN_API"), kiln.cuda.cudnn_benchmark()
    kiln.cuda.set_conv_api("legacy")
    assert.equal("legacy", kiln.cuda.conv_api())
    assert.equal("legacy", os.getenv("KILN_CUDNN_API"))   -- what the backend reads at each convolution
    kiln.cuda.set_conv_api("graph")
    assert.equal("graph", kiln.cuda.conv_api())
    assert.equal("graph", os.getenv("KILN_CUDNN_API"))
    for _, bad in ipairs({"Legacy", "", "cudnn", 1}) do
      local ok, err = pcall(function() kiln.cuda.set_conv_api(bad) end)
      assert.is_false(ok)
      assert.matches("kiln.cuda.set_conv_api: expected \"graph\" or \"legacy\", got ", tostring(err))
      assert.matches("cuda_spec", tostring(err))   -- raised at the caller's line
      assert.equal("graph", kiln.cuda.conv_api())     -- and nothing changed
    end
    kiln.cuda.set_cudnn_benchmark(true)
    assert.is_true(kiln.cuda.cudnn_benchmark())
    assert.equal("1", os.getenv("KILN_CUDNN_BENCHMARK"))
    kiln.cuda.set_cudnn_benchmark(false)
    assert.is_false(kiln.cuda.cudnn_benchmark())
    assert.equal("0", os.getenv("KILN_CUDNN_BENCHMARK"))
    assert.has_error(function() kiln.cuda.set_cudnn_benchmark("1") end,
                     "kiln.cuda.set_cudnn_benchmark: expected true or false, got 1")
    kiln.cuda.set_conv_api(api0 == "legacy" and "legacy" or "graph")
    kiln.cuda.set_cudnn_benchmark(bench0)
  end)
end)

describe("without a CUDA device", function()
  if kiln.cuda.is_available() then
    it("(skipped: this machine has a CUDA device)", function() end)
    return
  end

  it("t:cuda(), t:to('cuda') and {device = 'cuda'} raise 'no CUDA device', and the process carries on", function()
    local t = kiln.tensor{{1, 2}, {3, 4}}
    local ok, err = pcall(function() return t:cuda() end)
    assert.is_false(ok)
    assert.matches("no CUDA device", err)
    assert.matches("cuda:0", err)
    ok, err = pcall(function() return t:to("cuda:1") end)
    assert.is_false(ok)
    assert.matches("no CUDA device", err)
    ok, err = pcall(function() return kiln.zeros(3, {device = "cuda"}) end)
    assert.is_false(ok)
    assert.matches("no CUDA device", err)
    ok, err = pcall(function() return kiln.randn(3, 4, {device = "cuda"}) end)
    assert.is_false(ok)
    assert.matches("no CUDA device", err)
    ok, err = pcall(kiln.cuda.synchronize)
    assert.is_false(ok)
    assert.matches("no CUDA device", err)
    ok, err = pcall(kiln.cuda.init)
    assert.is_false(ok)
    assert.matches("no CUDA device", err)
    -- still working
    assert.equal(10, (t + 0):sum():item())
    assert.equal(10, t:cpu():sum():item())
    assert.equal(4, kiln.ones(2, 2):to("cpu"):sum():item())
  end)

  it("t:pin_memory() and non_blocking uploads raise 'pin_memory: no CUDA device' with the loader's reason", function()
    local t = kiln.tensor{{1, 2}, {3, 4}}
    assert.is_false(t:is_pinned())
    local ok, err = pcall(function() return t:pin_memory() end)
    assert.is_false(ok)
    assert.matches("pin_memory: no CUDA device: ", err, 1, true)
    assert.matches(kiln.cuda.unavailable_reason(), err, 1, true)
    ok, err = pcall(function() return t:cuda{non_blocking = true} end)
    assert.is_false(ok)
    assert.matches("no CUDA device", err)
    ok, err = pcall(function() return t:to("cuda", {non_blocking = true}) end)
    assert.is_false(ok)
    assert.matches("no CUDA device", err)
    assert.equal(0, kiln.cuda.memory_stats().pinned_reserved)
    assert.equal(10, t:sum():item())
  end)

  it("model:cuda() raises the same clear error", function()
    local nn = kiln.nn
    local m = nn.Linear(3, 2)
    local ok, err = pcall(function() return m:cuda() end)
    assert.is_false(ok)
    assert.matches("no CUDA device", err)
    assert.equal(2, m(kiln.ones(4, 3)):size(2))
  end)
end)

-- The ops with CUDA kernels (runtime/cuda/backend.c); the rest are NULL in its table.
local cuda_kernels = {
  "copy", "fill", "neg", "abs", "sign", "sqrt", "rsqrt", "exp", "log", "log1p", "expm1", "sin", "cos", "tanh", "sigmoid",
  "relu", "floor", "ceil", "round", "trunc", "reciprocal", "square", "erf", "logical_not", "add", "sub", "mul", "div",
  "pow", "maximum", "minimum", "remainder", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "where",
  "clamp", "erfinv", "atan2", "relu_backward", "gemm", "uniform", "normal", "randint", "argsort", "cumsum", "cumprod", "cumprod_backward",
  "sum", "mean", "prod", "max", "min", "argmax", "argmin", "var", "std", "norm", "logsumexp",
  "cat", "index_select", "gather", "scatter_add", "masked_fill", "masked_select",
  "softmax", "softmax_backward", "log_softmax", "log_softmax_backward", "nll_loss", "nll_loss_backward", "dropout",
  "max_pool2d", "max_pool2d_backward", "avg_pool2d", "avg_pool2d_backward",
  "batch_norm", "batch_norm_backward", "layer_norm", "layer_norm_backward", "group_norm", "group_norm_backward",
  "rnn", "rnn_backward", "ctc_loss", "ctc_loss_backward",
  "sgd_step", "adam_step", "rmsprop_step", "adagrad_step",
}
-- convolution goes through cuDNN: in the table when the build found it (97 of 97), else NULL (95)
local expect_cudnn = os.getenv("KILN_EXPECT_CUDNN")   -- "1"/"0" from ctest; nil when run by hand
if expect_cudnn ~= "0" then
  cuda_kernels[#cuda_kernels + 1] = "conv2d"
  cuda_kernels[#cuda_kernels + 1] = "conv2d_backward"
end
local CUDA_KERNEL_COUNT = #cuda_kernels

describe("the op x backend coverage table", function()
  it("gives every op a CPU kernel, and prints which have CUDA kernels", function()
    local rows, missing_cpu, ncuda = {}, {}, 0
    local loaded = kiln.cuda.backend_loaded()
    for op = 0, C.KILN_OP_COUNT - 1 do
      local name = ffi.string(C.kiln_op_name(op))
      local cpu = C.kiln_op_supported(op, C.KILN_CPU) ~= 0
      local cuda = C.kiln_cuda_op_supported(op) ~= 0
      if not cpu then missing_cpu[#missing_cpu + 1] = name end
      if cuda then ncuda = ncuda + 1 end
      rows[#rows + 1] = string.format("  %3d  %-22s %-4s %s", op, name, cpu and "yes" or "NO",
                                      loaded and (cuda and "yes" or "not implemented") or "-")
    end
    print(string.format("\nop x backend coverage (%d ops; cuda: %s)", C.KILN_OP_COUNT,
                        loaded and string.format("%d kernels, the rest report \"not implemented on cuda:N\"", ncuda)
                        or "libkiln_cuda.so absent: " .. tostring(kiln.cuda.unavailable_reason())))
    print("   op  name                   cpu  cuda")
    print(table.concat(rows, "\n"))
    assert.same({}, missing_cpu)
    if loaded then
      -- the kernels so far must stay in the table, and the count moves only with them
      for _, name in ipairs(cuda_kernels) do assert.is_true(kiln.cuda.has_kernel(name), name) end
      assert.equal(CUDA_KERNEL_COUNT, ncuda)
      assert.equal(expect_cudnn ~= "0" and 97 or 95, ncuda)
      -- the backend says whether it has cuDNN, which the cudnn recurrent algorithm asks
      if expect_cudnn then assert.equal(expect_cudnn ~= "0", kiln.cuda.has_cudnn()) end
      assert.equal(kiln.cuda.has_kernel("conv2d"), kiln.cuda.has_cudnn())
    end
  end)

  it("an op without a CUDA kernel is refused by name on a device", function()
    if not kiln.cuda.is_available() then return end   -- needs a device to reach dispatch
    -- with cuDNN every op has a kernel; without it, convolution is the one left
    if kiln.cuda.has_kernel("conv2d") then return end
    local ok, err = pcall(function()
      return kiln.functional.conv2d(kiln.ones(1, 1, 3, 3, {device = "cuda"}), kiln.ones(1, 1, 2, 2, {device = "cuda"}))
    end)
    assert.is_false(ok)
    assert.matches("conv2d: not implemented on cuda:0", err)
  end)
end)
