-- bench/kernels.lua: single ops on the CPU (elementwise, reductions, softmax and losses, copies of
-- views, indexing, conv2d, pooling, norms) at sizes where memory or arithmetic dominates, at 1 and
-- 2 threads, beside PyTorch's same ops in the same run when python3 has torch (bench/kernels.py,
-- with OMP_WAIT_POLICY=passive). Results are out-of-place, as a training step computes them, so
-- they include allocating the output. Medians; one JSON line per result, then the ratios.
-- usage: kiln bench/kernels.lua [--quick] [--no-peer]
local kiln = kiln or require "kiln"
local F = require "kiln.functional"
local common = require "bench.common"
local quick = common.quick
local function measure(fn) return common.measure(fn, {warmup = 2, target = {0.03, 0.15}}) * 1e6 end   -- microseconds

kiln.manual_seed(0)
local a, b, row, acc = kiln.randn(1024, 1024), kiln.randn(1024, 1024), kiln.randn(1024), kiln.zeros(1024, 1024)
local logits, target = kiln.randn(256, 1000), kiln.randint(1, 1001, {256})
local x, w = kiln.randn(32, 32, 28, 28), kiln.randn(64, 32, 3, 3)
local bn_w, bn_b, rm, rv = kiln.ones(32), kiln.zeros(32), kiln.zeros(32), kiln.ones(32)
local emb, idx = kiln.randn(1024, 256), kiln.randint(1, 1025, {4096})
local ops = {
  {"add", function() return a + b end},
  {"mul_broadcast_row", function() return a * row end},
  {"add_inplace", function() return acc:add_(b) end},
  {"exp", function() return a:exp() end},
  {"relu", function() return a:relu() end},
  {"sum_all", function() return a:sum() end},
  {"sum_last_dim", function() return a:sum(2) end},
  {"sum_first_dim", function() return a:sum(1) end},
  {"max_last_dim", function() return a:max(2) end},
  {"var_last_dim", function() return a:var(2) end},
  {"softmax", function() return F.softmax(logits, 2) end},
  {"log_softmax", function() return F.log_softmax(logits, 2) end},
  {"cross_entropy", function() return F.cross_entropy(logits, target) end},
  {"transpose_contiguous", function() return a:t():contiguous() end},
  {"cat", function() return kiln.cat({a, b}, 1) end},
  {"index_select_rows", function() return emb:index_select(1, idx) end},
  {"conv2d_3x3", function() return F.conv2d(x, w, nil, {padding = 1}) end},
  {"max_pool2d", function() return F.max_pool2d(x, 2) end},
  {"batch_norm_train", function() return F.batch_norm(x, rm, rv, {weight = bn_w, bias = bn_b, training = true}) end},
  {"layer_norm", function() return F.layer_norm(logits, {1000}) end},
}
if quick then ops = {ops[1], ops[6], ops[11], ops[14]} end

local ours, names = {}, {}
for _, threads in ipairs{1, 2} do
  kiln.set_num_threads(threads)
  for _, op in ipairs(ops) do
    local us = measure(op[2])
    ours[op[1] .. ":" .. threads] = us
    names[op[1]] = true
    kiln.ui.json{bench = "kernel", impl = "kiln", op = op[1], threads = threads, us = us}
  end
end

common.peer_lines("bench/kernels.py", function(line, threads)
  local op, us = line:match('"op": "([%w_]+)"'), tonumber(line:match('"us": ([%d%.e%-]+)'))
  local k = op and ours[op .. ":" .. threads]
  if k and us then
    kiln.ui.json{bench = "kernel_ratio", op = op, threads = threads, kiln_us = k, pytorch_us = us, ratio = k / us}
  end
end)
