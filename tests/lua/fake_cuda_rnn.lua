-- tests/lua/fake_cuda_rnn.lua: which algorithm a recurrent layer on a CUDA device runs, and why,
-- against the pretend CUDA device of tests/c/fake_cuda_backend.c (host memory, no kernels), which
-- says it was built with cuDNN when FAKE_CUDA_CUDNN=1. ctest runs it as lua/fake-cuda-rnn-cudnn0
-- and lua/fake-cuda-rnn-cudnn1; not a busted spec (the device must be there from the start).
--   KILN_CUDA_LIB=build/lib/libfake_kiln_cuda_device.so FAKE_CUDA_CUDNN=1 build/bin/kiln tests/lua/fake_cuda_rnn.lua
local kiln = kiln or require "kiln"
local F = kiln.functional

assert(os.getenv("KILN_CUDA_LIB"), "KILN_CUDA_LIB must name the fake CUDA device")
assert(kiln.cuda.is_available(), "the fake CUDA device did not load: " .. tostring(kiln.cuda.unavailable_reason()))
local dnn = os.getenv("FAKE_CUDA_CUDNN") == "1"

local checks, failed = 0, 0
local function check(ok, what)
  checks = checks + 1
  if not ok then failed = failed + 1 print("FAILED: " .. what) end
end

check(kiln.cuda.has_cudnn() == dnn, "has_cudnn() follows the backend's table")

-- the choice for a module moved to the device, as algorithm_for reports it
for _, cls in ipairs({"RNN", "GRU", "LSTM"}) do
  for _, dtype in ipairs({"f32", "f64"}) do
    local m = kiln.nn[cls](3, 5, {dtype = dtype}):to("cuda")
    local a, why = m:algorithm_for(4)
    if dnn then
      check(a == "cudnn" and why:match("^cuDNN's RNN %(standard algorithm, exact " .. dtype .. " math%)") ~= nil,
            string.format("%s %s auto on cuda: %s (%s)", cls, dtype, tostring(a), why))
    else
      check(a == "gemm" and why:match("this build of the CUDA backend has no cuDNN") ~= nil,
            string.format("%s %s auto on cuda without cuDNN: %s (%s)", cls, dtype, tostring(a), why))
    end
  end
end

local function choose(algorithm) return F.rnn_algorithm("lstm", 8, 64, {device = "cuda", algorithm = algorithm}) end
local a, why = choose("gemm")
check(a == "gemm" and why:match("own kernels") ~= nil, "gemm when asked: " .. why)
a, why = choose("cudnn")
check(a == (dnn and "cudnn" or "gemm") and why:match(dnn and "as asked" or "no cuDNN") ~= nil, "cudnn when asked: " .. why)
a, why = choose("persistent")
check(a == (dnn and "cudnn" or "gemm") and why:match("the persistent path runs on the CPU") ~= nil,
      "persistent on cuda: " .. why)
-- the CPU is not affected by the device's cuDNN
a, why = F.rnn_algorithm("lstm", 64, 64, {algorithm = "cudnn"})
check(a == "gemm" and why:match("cuDNN runs on CUDA") ~= nil, "cudnn on the cpu: " .. why)

-- the pretend device has no kernels: the layer is refused by name, and the process goes on
local x, w_ih, w_hh = kiln.randn(4, 2, 3):to("cuda"), kiln.randn(20, 3):to("cuda"), kiln.randn(20, 5):to("cuda")
local ok, err = pcall(F.rnn_layer, "lstm", x, nil, nil, w_ih, w_hh, nil, nil, {algorithm = "cudnn"})
check(not ok and tostring(err):match("rnn: not implemented on cuda:0") ~= nil, "no kernel: " .. tostring(err))
check(F.rnn_layer("lstm", x:cpu(), nil, nil, w_ih:cpu(), w_hh:cpu()):size(1) == 6, "usable afterwards")

print(string.format("fake_cuda_rnn (cuDNN %s): %d checks, %d failed", dnn and "on" or "off", checks, failed))
os.exit(failed == 0 and 0 or 1)
