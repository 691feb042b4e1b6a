-- bench/conv.lua: the CPU convolution's two algorithms (docs/cpu.md), shape by shape: forward and
-- forward + backward (grads of input, weight and bias) by im2col + GEMM and by oneDNN, in f32 and
-- bf16, at 1 and 2 threads, medians (bench/common.lua's measure); then what benchmark mode
-- chooses for each shape. One JSON line per result. Shapes: the benchmark CNN's two convolutions
-- (batch 64), a ResNet-18 3x3 block conv at 28x28 (batch 16), a 1x1 and a strided 3x3.
-- usage: kiln bench/conv.lua [--quick]
local kiln = kiln or require "kiln"
local common = require "bench.common"
local F = kiln.functional

local shapes = {
  {name = "cnn_conv1", x = {64, 1, 28, 28}, w = {32, 1, 5, 5}, o = {}},
  {name = "cnn_conv2", x = {64, 32, 12, 12}, w = {64, 32, 5, 5}, o = {}},
  {name = "resnet_3x3", x = {16, 128, 28, 28}, w = {128, 128, 3, 3}, o = {padding = 1}},
  {name = "resnet_1x1", x = {16, 256, 14, 14}, w = {128, 256, 1, 1}, o = {}},
  {name = "strided_3x3", x = {16, 64, 56, 56}, w = {128, 64, 3, 3}, o = {stride = 2, padding = 1}},
}

local function flop(s)   -- 2 * N * O * OH * OW * C/G * kh * kw of the forward
  local y = F.conv2d(kiln.zeros(1, s.x[2], s.x[3], s.x[4]), kiln.zeros(unpack(s.w)), nil, s.o)
  return 2 * s.x[1] * s.w[1] * y:size(3) * y:size(4) * s.w[2] * s.w[3] * s.w[4]
end

if kiln.info().onednn.name == nil then
  kiln.ui.json{bench = "conv", note = kiln.info().onednn.note}
end

for _, threads in ipairs{1, 2} do
  kiln.set_num_threads(threads)
  for _, s in ipairs(shapes) do
    local fl = flop(s)
    for _, dtype in ipairs{"f32", "bf16"} do
      kiln.manual_seed(0)
      local x = kiln.randn(unpack(s.x)):to(dtype):requires_grad_()
      local w = kiln.randn(unpack(s.w)):to(dtype):requires_grad_()
      local b = kiln.randn(s.w[1]):to(dtype):requires_grad_()
      local g
      for _, algo in ipairs{"im2col", "onednn", "winograd"} do
        kiln.set_conv_algorithm(algo)
        local fwd = common.measure(function() return F.conv2d(x:detach(), w:detach(), b:detach(), s.o) end) * 1000
        local both = common.measure(function()
          x.grad, w.grad, b.grad = nil, nil, nil
          local y = F.conv2d(x, w, b, s.o)
          g = g or kiln.randn(y:size()):to(dtype)
          y:backward(g)
        end) * 1000
        kiln.ui.json{bench = "conv", shape = s.name, dtype = dtype, threads = threads, algorithm = algo,
                     forward_ms = fwd, forward_backward_ms = both, forward_gflops = fl / fwd / 1e6,
                     forward_backward_gflops = 3 * fl / both / 1e6}
      end
    end
  end
end

-- benchmark mode: what the measurement chooses for each shape, at 1 thread
kiln.set_num_threads(1)
kiln.set_conv_algorithm("auto")
kiln.set_conv_benchmark(true)
kiln.conv_choices(true)
for _, s in ipairs(shapes) do
  for _, dtype in ipairs{"f32", "bf16"} do
    local x = kiln.randn(unpack(s.x)):to(dtype):requires_grad_()
    local w = kiln.randn(unpack(s.w)):to(dtype):requires_grad_()
    F.conv2d(x, w, nil, s.o):sum():backward()
  end
end
for _, line in ipairs(kiln.conv_choices()) do kiln.ui.json{bench = "conv_choice", threads = 1, choice = line} end
kiln.set_conv_benchmark(false)
