-- tests/gpu/bench_rnn.lua: one recurrent layer on cuda:0, f32, through cuDNN (algorithm "cudnn")
-- and through kiln's own kernels (algorithm "gemm"), forward alone (no grad: cuDNN's inference
-- mode) and forward + backward (grads of x and the weights) through autograd; sequence 64, input
-- 256, LSTM and GRU at hidden 256 and 1024, batch 1, 16 and 64. One JSON line per result, also
-- appended to $OUT/bench_rnn.jsonl when OUT is set; torch_rnn.py times PyTorch (cuDNN) on the same
-- shapes, for the ratio.
--   build/bin/kiln tests/gpu/bench_rnn.lua
local kiln = kiln or require "kiln"
local F = kiln.functional

if not kiln.cuda.is_available() then
  print("skipped: no CUDA device (" .. tostring(kiln.cuda.unavailable_reason()) .. ")")
  os.exit(0)
end

local T, I = 64, 256
local algorithms = kiln.cuda.has_cudnn() and {"cudnn", "gemm"} or {"gemm"}
local dir = os.getenv("OUT")
local jsonl = dir and dir ~= "" and io.open(dir .. "/bench_rnn.jsonl", "a") or nil

local function time(iters, f)
  for _ = 1, 3 do f() end
  kiln.cuda.synchronize()
  local t0 = kiln.ui.clock()
  for _ = 1, iters do f() end
  kiln.cuda.synchronize()
  return (kiln.ui.clock() - t0) / iters
end

for _, mode in ipairs({"lstm", "gru"}) do
  local G = mode == "lstm" and 4 or 3
  for _, H in ipairs({256, 1024}) do
    for _, B in ipairs({1, 16, 64}) do
      local x = (kiln.randn(T, B, I) * 0.5):to("cuda"):requires_grad_()
      local w_ih = (kiln.randn(G * H, I) / math.sqrt(I)):to("cuda"):requires_grad_()
      local w_hh = (kiln.randn(G * H, H) / math.sqrt(H)):to("cuda"):requires_grad_()
      local b_ih, b_hh = kiln.zeros(G * H, {device = "cuda"}):requires_grad_(), kiln.zeros(G * H, {device = "cuda"}):requires_grad_()
      local g = kiln.randn(T + (mode == "lstm" and 2 or 1), B, H, {device = "cuda"})
      for _, algo in ipairs(algorithms) do
        local o = {algorithm = algo}
        local function layer() return F.rnn_layer(mode, x, nil, nil, w_ih, w_hh, b_ih, b_hh, o) end
        local fwd = kiln.no_grad(function() return time(10, function() layer():free() end) end)
        local both = time(5, function()
          x.grad, w_ih.grad, w_hh.grad, b_ih.grad, b_hh.grad = nil, nil, nil, nil, nil
          layer():backward(g)
        end)
        local line = string.format('{"bench":"rnn","impl":"kiln","algorithm":"%s","mode":"%s","T":%d,"B":%d,"I":%d,"H":%d,' ..
                                   '"fwd_ms":%.3f,"fwd_bwd_ms":%.3f}', algo, mode, T, B, I, H, fwd * 1e3, both * 1e3)
        print(line)
        if jsonl then jsonl:write(line, "\n") end
      end
      x:free(); w_ih:free(); w_hh:free(); b_ih:free(); b_hh:free(); g:free()
      collectgarbage()
    end
  end
end
if jsonl then jsonl:close() end
