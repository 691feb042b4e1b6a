-- tests/gpu/bench_conv.lua: 2-d convolution on cuda:0 (cuDNN, f32 exact: no TF32), forward alone
-- and forward + backward (grads of input and weight) through autograd, on ResNet-like shapes. One
-- JSON line per result, also appended to $OUT/bench_conv.jsonl when OUT is set; torch_conv.py
-- times PyTorch on the same shapes. Run with KILN_CUDNN_BENCHMARK=1 to time cuDNN's candidates
-- once per shape (as torch.backends.cudnn.benchmark does); the warm-up runs pay for that search.
-- KILN_CUDNN_API=legacy times cuDNN's legacy convolution calls instead of its graph API (the
-- default); each line says which ("api").
--   build/bin/kiln tests/gpu/bench_conv.lua
local kiln = kiln or require "kiln"
local F = kiln.functional

if not kiln.cuda.is_available() then
  print("skipped: no CUDA device (" .. tostring(kiln.cuda.unavailable_reason()) .. ")")
  os.exit(0)
end

-- {name, x [N,C,H,W], w [O,C,kh,kw], stride, padding}
local shapes = {
  {"resnet conv1", {32, 3, 224, 224}, {64, 3, 7, 7}, 2, 3},
  {"resnet 3x3 @56", {32, 64, 56, 56}, {64, 64, 3, 3}, 1, 1},
  {"resnet 3x3 @14", {32, 256, 14, 14}, {256, 256, 3, 3}, 1, 1},
  {"resnet 1x1 @28", {32, 512, 28, 28}, {128, 512, 1, 1}, 1, 0},
}

local dir = os.getenv("OUT")
local jsonl = dir and dir ~= "" and io.open(dir .. "/bench_conv.jsonl", "a") or nil
local mode = kiln.cuda.cudnn_benchmark() and "benchmark" or "heuristic"
local api = kiln.cuda.conv_api()

local function time(iters, f)
  for _ = 1, 3 do f() end   -- warm-up: the algorithm search, clocks
  kiln.cuda.synchronize()
  local t0 = kiln.ui.clock()
  for _ = 1, iters do f() end
  kiln.cuda.synchronize()
  return (kiln.ui.clock() - t0) / iters
end

for _, s in ipairs(shapes) do
  local x = kiln.randn(s[2], {device = "cuda"}):requires_grad_()
  local w = kiln.randn(s[3], {device = "cuda"}):requires_grad_()
  local opts = {stride = s[4], padding = s[5]}
  local y = F.conv2d(x, w, nil, opts)
  local g = kiln.randn(y:size(), {device = "cuda"})
  local fwd = kiln.no_grad(function() return time(20, function() F.conv2d(x, w, nil, opts):free() end) end)
  local both = time(10, function()
    x.grad, w.grad = nil, nil
    F.conv2d(x, w, nil, opts):backward(g)
  end)
  local line = string.format('{"bench":"conv2d","impl":"kiln","api":"%s","mode":"%s","shape":"%s","fwd_ms":%.3f,"fwd_bwd_ms":%.3f}',
                             api, mode, s[1], fwd * 1e3, both * 1e3)
  print(line)
  if jsonl then jsonl:write(line, "\n") end
  x:free(); w:free(); g:free(); y:free()
  collectgarbage()
end
if jsonl then jsonl:close() end
