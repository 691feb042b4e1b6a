-- kiln.dist.simulate: the scaling model of data-parallel training (bench/scaling.lua).
local core = require "kiln.core"
local raise = core.raise

local M = {}

-- ---- the scaling model ----

-- Links written in, per GPU, as alpha (s per message step) and beta (s per byte at the bus
-- bandwidth a collective reaches). Leads, not measurements: NVLink 4 on an 8-GPU H100/H200 board
-- (NCCL's all-reduce bus bandwidth there is of the order of 350-450 GB/s) and one 400 Gb/s
-- InfiniBand NDR port per GPU (50 GB/s, of which about 45 reached).
M.links = {
  nvlink = {alpha = 4e-6, beta = 1 / 400e9},
  infiniband = {alpha = 8e-6, beta = 1 / 45e9},
}

-- The all-reduce time of `bytes` over n GPUs, gpus_per_node to a node. ring: 2(n-1) steps, each
-- at the slowest link's latency, moving 2(n-1)/n of the bytes at the slowest link's bandwidth;
-- tree (NCCL's double binary tree across nodes, a ring inside each): 2 log2(nodes) steps across,
-- the bytes twice at the inter-node bandwidth, plus the intra-node reduce and broadcast.
function M.all_reduce_time(bytes, n, opts)
  opts = opts or {}
  local links, g = opts.links or M.links, math.min(opts.gpus_per_node or 8, n)
  local nodes = math.ceil(n / g)
  local intra, inter = links.nvlink, links.infiniband
  if n == 1 then return 0 end
  local slow = nodes > 1 and inter or intra
  local ring = 2 * (n - 1) * slow.alpha + 2 * (n - 1) / n * bytes * slow.beta
  if nodes == 1 then return ring, "ring" end
  local inside = 2 * (g - 1) * intra.alpha + 2 * (g - 1) / g * bytes * intra.beta
  local tree = inside + 2 * math.log(nodes) / math.log(2) * inter.alpha + 2 * bytes * inter.beta / g
  if opts.algorithm == "ring" then return ring, "ring" end
  if opts.algorithm == "tree" then return tree, "tree" end
  if tree < ring then return tree, "tree" end
  return ring, "ring"
end

-- simulate{step_s =, jitter = 0, forward_fraction = 1/3, buckets = {{bytes =, ready =}, ...},
--          gpus = {8, ...}, gpus_per_node = 8, links =, algorithm = "best"|"ring"|"tree", optimizer_s = 0}:
-- the step at each GPU count, with the batch per GPU fixed (weak scaling). Forward takes
-- forward_fraction of the measured single-GPU step, backward the rest; bucket k is ready at the
-- fraction `ready` of backward and its all-reduce starts then or when the previous one ends,
-- whichever is later (one at a time, in order, as kiln and PyTorch's DDP run them). The step ends
-- when backward and the last all-reduce are both done, then the optimizer runs. Every all-reduce
-- waits for the slowest of the n GPUs: with step times of coefficient of variation `jitter`, the
-- expected maximum of n is about the mean plus jitter * step * sqrt(2 ln n), which the step pays
-- once. Efficiency is the single-GPU step over the step at n.
function M.simulate(o)
  if type(o) ~= "table" or type(o.step_s) ~= "number" or type(o.buckets) ~= "table" then
    raise("dist.simulate: expected {step_s = seconds, buckets = {{bytes =, ready =}, ...}, gpus = {...}}")
  end
  local fwd = o.step_s * (o.forward_fraction or 1 / 3)
  local bwd = o.step_s - fwd
  local rows = {}
  for _, n in ipairs(o.gpus or {8, 16, 32, 64, 128, 256}) do
    local t_comm, algo = fwd, nil
    for _, b in ipairs(o.buckets) do
      local d
      d, algo = M.all_reduce_time(b.bytes, n, o)
      t_comm = math.max(t_comm, fwd + b.ready * bwd) + d
    end
    local straggle = (o.jitter or 0) * o.step_s * math.sqrt(2 * math.log(n))
    local step = math.max(fwd + bwd, t_comm) + straggle + (o.optimizer_s or 0)
    local single = o.step_s + (o.optimizer_s or 0)
    rows[#rows + 1] = {gpus = n, step_s = step, efficiency = single / step, exposed_comm_s = step - single - straggle,
                       straggler_s = straggle, algorithm = algo or "none"}
  end
  return rows
end

-- buckets_of(param_bytes, {bucket_mb = 25, first_bucket_mb = 1}): DataParallel's buckets for
-- parameters of these sizes (in the model's order), each ready when backward has reached its last
-- parameter, taking backward to go through the parameters evenly by size, last first.
function M.buckets_of(param_bytes, opts)
  opts = opts or {}
  local cap, first = (opts.bucket_mb or 25) * 2 ^ 20, (opts.first_bucket_mb or 1) * 2 ^ 20
  local total = 0
  for _, b in ipairs(param_bytes) do total = total + b end
  local buckets, bytes, done = {}, 0, 0
  for i = #param_bytes, 1, -1 do
    bytes, done = bytes + param_bytes[i], done + param_bytes[i]
    local limit = #buckets == 0 and first or cap
    if bytes >= limit or i == 1 then
      buckets[#buckets + 1] = {bytes = bytes, ready = done / total}
      bytes = 0
    end
  end
  return buckets
end

return M
