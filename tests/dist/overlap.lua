-- tests/dist/overlap.lua: run by ctest under kiln launch -n 2 with the slow engine
-- (tests/dist/slow_engine.c: every all-reduce waits $KILN_SLOW_ENGINE_US first, as over a slow
-- network). DataParallel's step must grow, over the same step without communication, by less than
-- the sum of its buckets' all-reduce times: the buckets travel while backward goes on.
local dist, nn = kiln.dist, kiln.nn
dist.init()
kiln.set_num_threads(1)
local rank = dist.rank()
local delay = tonumber(os.getenv("KILN_SLOW_ENGINE_US") or "0") * 1e-6
assert(delay > 0, "run with the slow engine (KILN_MPI_LIB, KILN_SLOW_ENGINE_US)")
local common = dofile("bench/common.lua")

-- convolutions: much computing for few parameters (147 KB a layer), so that the test is about the
-- latency, not about two ranks' copies competing for this machine's memory and cores
local function make()
  kiln.manual_seed(1)
  local layers = {}
  for i = 1, 4 do layers[#layers + 1] = nn.Conv2d(64, 64, 3, {padding = 1}) layers[#layers + 1] = nn.Tanh() end
  return nn.Sequential(layers)
end
local x, y = kiln.randn(12, 64, 32, 32), kiln.randn(12, 64, 32, 32)
-- a step, timed from a barrier to a barrier: the plain step's time then includes waiting for the
-- slower rank too, as DataParallel's all-reduces do
local function one_step(net)
  dist.barrier()
  local t0 = common.now()
  local loss = (net(x) - y):pow(2):mean()
  loss:backward()
  dist.barrier()
  return common.now() - t0
end

-- the same model without DataParallel (no communication) and with it, measured in turns so that
-- both see the same machine; medians, and the growth as the median of each turn's difference (a
-- shared machine slows both steps of a turn, not the plain steps of some turns and DataParallel's
-- of others)
local plain, model = make(), make()
local dp = dist.DataParallel(model, {bucket_mb = 0.1, first_bucket_mb = 0.1})   -- a bucket a layer
local plain_times, dp_times, growths = {}, {}, {}
for i = 1, 13 do
  local a, b = one_step(plain), one_step(dp)
  if i > 2 then plain_times[#plain_times + 1], dp_times[#dp_times + 1], growths[#growths + 1] = a, b, b - a end
end
local compute, step = common.median(plain_times), common.median(dp_times)
local buckets = dp:buckets()
-- each bucket's all-reduce on its own, timed the same way
local sum_all_reduce = 0
for _, n in ipairs(dp:bucket_sizes()) do
  local t = kiln.zeros(n)
  local times = {}
  for _ = 1, 3 do
    dist.barrier()
    local t0 = common.now()
    dist.all_reduce(t, "mean")
    times[#times + 1] = common.now() - t0
  end
  sum_all_reduce = sum_all_reduce + common.median(times)
end
local growth = common.median(growths)
if rank == 0 then
  kiln.ui.json{test = "overlap", buckets = buckets, delay_ms = delay * 1e3, compute_ms = compute * 1e3, dp_step_ms = step * 1e3,
               growth_ms = growth * 1e3, sum_all_reduce_ms = sum_all_reduce * 1e3, started_early = dp:started_early()}
end
if buckets < 3 then error("expected several buckets, got " .. buckets) end
if not (growth < sum_all_reduce) then
  error(string.format("the step grew by %.1f ms, not less than the %d all-reduces' %.1f ms: no overlap", growth * 1e3, buckets,
                      sum_all_reduce * 1e3))
end
