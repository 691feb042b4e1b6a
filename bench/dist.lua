-- bench/dist.lua: kiln.dist at 2 ranks on this machine, JSON lines from rank 0:
--   all_reduce (sum, f32) bus bandwidth from 4 KB to 256 MB, beside Open MPI's own MPI_Allreduce
--   (dist.raw_all_reduce) in the same run, alternating, medians;
--   the main job's training step (LeNet on Fashion-MNIST-sized batches) at 1 and 2 ranks: ms per
--   step and samples/s, with the global batch fixed (each rank takes global / ranks).
-- usage: kiln bench/dist.lua [--quick]   (it starts itself under kiln launch -n 2)
-- Bus bandwidth is NCCL's measure: bytes * 2 (n - 1) / n / time, comparable across rank counts.
local kiln = kiln or require "kiln"
local common = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "bench/") .. "common.lua")
local dist = kiln.dist

if not dist.launched() then
  local self = debug.getinfo(1, "S").source:sub(2)
  local exe = arg and arg[-1] or "kiln"
  local extra = common.quick and " --quick" or ""
  local ok = os.execute(string.format("%s launch -n 2 %s%s", exe, self, extra))
  if ok ~= 0 and ok ~= true then os.exit(1) end
  return
end

dist.init()
local rank, size = dist.rank(), dist.world_size()
kiln.set_num_threads(1)
local function json(t) if rank == 0 then kiln.ui.json(t) end end

-- seconds per call of fn, every rank in step: a barrier, then reps of n calls; the median rep
local function timed(fn, n, reps)
  local times = {}
  for _ = 1, reps do
    dist.barrier()
    local t0 = common.now()
    for _ = 1, n do fn() end
    times[#times + 1] = (common.now() - t0) / n
  end
  return common.median(times)
end

local sizes = {}
local kb = common.quick and {4, 64, 1024, 16384} or {4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144}
for _, k in ipairs(kb) do sizes[#sizes + 1] = k * 1024 end
for _, bytes in ipairs(sizes) do
  local t = kiln.ones(bytes / 4)
  local n = math.max(1, math.min(200, math.floor(64 * 1024 * 1024 / bytes)))
  local reps = common.quick and 3 or 15   -- alternating; a 1 MB all-reduce moves by 10% from rep to rep here
  for _ = 1, 2 do dist.all_reduce(t) dist.raw_all_reduce(t) end
  local ours, theirs = {}, {}
  for _ = 1, reps do   -- alternate, so that both see the same machine
    ours[#ours + 1] = timed(function() dist.all_reduce(t) end, n, 1)
    theirs[#theirs + 1] = timed(function() dist.raw_all_reduce(t) end, n, 1)
  end
  local a, b = common.median(ours), common.median(theirs)
  local bus = function(s) return bytes * 2 * (size - 1) / size / s / 1e9 end
  json{bench = "all_reduce", ranks = size, bytes = bytes, kiln_us = a * 1e6, mpi_us = b * 1e6,
       kiln_busbw_gbs = bus(a), mpi_busbw_gbs = bus(b), ratio = bus(a) / bus(b), engine = dist.engine()}
end

-- the main job's step, data parallel, with a fixed global batch: each rank steps on its share;
-- at 1 rank the same script steps on the whole batch without DataParallel.
local lenet = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "bench/") .. "../models/lenet.lua")
local F = kiln.nn.functional
local global = 128
local function step_time(ranks, deterministic)
  local group = ranks == size and dist.world() or dist.new_group({0})
  local ms
  if rank < ranks then
    kiln.manual_seed(1)
    local model = lenet()
    local net = (ranks > 1 or deterministic) and dist.DataParallel(model, {group = group, deterministic = deterministic}) or model
    local opt = kiln.optim.SGD(model:parameters(), {lr = 0.01, momentum = 0.9})
    local per = global / ranks
    local x, y = kiln.randn(per, 1, 28, 28), kiln.randint(1, 11, {per})
    local function step()
      opt:zero_grad()
      if deterministic then
        net:backward(function(m, xs, ys) return F.cross_entropy(m(xs), ys) end, x, y)
      else
        local loss = F.cross_entropy(net(x), y)
        loss:backward()
      end
      opt:step()
    end
    for _ = 1, 3 do step() end
    local times = {}
    for _ = 1, common.quick and 5 or 15 do
      local t0 = common.now()
      step()
      times[#times + 1] = common.now() - t0
    end
    ms = common.median(times) * 1e3
  end
  dist.barrier()
  return ms
end
local one = step_time(1)
local two = step_time(2)
local det = step_time(2, true)
if rank == 0 then
json{bench = "dp_step", model = "lenet", global_batch = global, threads_per_rank = 1, ranks = 1, ms = one,
     samples_per_s = global / one * 1e3}
json{bench = "dp_step", model = "lenet", global_batch = global, threads_per_rank = 1, ranks = 2, ms = two,
     samples_per_s = global / two * 1e3, speedup = one / two, efficiency = one / two / 2}
json{bench = "dp_step_deterministic", model = "lenet", global_batch = global, threads_per_rank = 1, ranks = 2, shards = 4,
     ms = det, samples_per_s = global / det * 1e3, cost_vs_usual = det / two}
end
