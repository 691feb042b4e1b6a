-- tests/gpu/dist_nccl.lua: kiln.dist on CUDA tensors through the NCCL engine, in a world of one
-- rank (dist.init{single = true}: no launcher or MPI needed on the GPU machine): every collective
-- and dtype against the CPU path, then DataParallel's step on cuda against the same model stepped
-- without it, and the all-reduce's time on a 64 MB tensor. Writes $OUT/dist_nccl.jsonl.
local dist, nn = kiln.dist, kiln.nn
if kiln.cuda.device_count() < 1 then print("skipped: no CUDA device") return end
dist.init{single = true}
local out = io.open((os.getenv("OUT") or ".") .. "/dist_nccl.jsonl", "w")
local function log(t) local line = kiln.ui.json_encode(t) print(line) out:write(line, "\n") out:flush() end
local failures = 0
local function check(ok, what) if not ok then failures = failures + 1 print("FAILED: " .. what) end end

for _, dt in ipairs{"f32", "f64", "f16", "bf16", "i64", "i32", "u8"} do
  local host = kiln.arange(1, 13):to(dt):view(3, 4)
  for _, op in ipairs{"sum", "max", "min", "prod", "mean"} do
    if op ~= "mean" or dt == "f32" or dt == "f64" or dt == "f16" or dt == "bf16" then
      local t = host:cuda()
      dist.all_reduce(t, op)
      check(t:cpu():eq(host):all():item(), "all_reduce " .. op .. " " .. dt)   -- one rank: unchanged
    end
  end
  local g = dist.all_gather(host:cuda())
  check(g:cpu():eq(host):all():item(), "all_gather " .. dt)
  local b = host:cuda()
  dist.broadcast(b, 0)
  check(b:cpu():eq(host):all():item(), "broadcast " .. dt)
  local r = dist.reduce_scatter(host:cuda())
  check(r:cpu():eq(host):all():item(), "reduce_scatter " .. dt)
end
-- a CPU tensor in the same group still goes by the CPU engine
local c = kiln.ones(3)
dist.all_reduce(c)
check(c:eq(kiln.ones(3)):all():item(), "all_reduce on the CPU beside NCCL")

-- DataParallel on cuda: one rank's mean gradient is its own
kiln.manual_seed(1)
local model = nn.Sequential{nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)}:cuda()
local ref = nn.Sequential{nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)}:cuda()
ref:load_state_dict(model:state_dict())
local dp = dist.DataParallel(model, {bucket_mb = 0.05, first_bucket_mb = 0.01})
local x, y = kiln.randn(32, 64):cuda(), kiln.randint(1, 11, {32}):cuda()
local loss = nn.functional.cross_entropy(dp(x), y)
loss:backward()
local rloss = nn.functional.cross_entropy(ref(x), y)
rloss:backward()
local worst = 0
local rp = ref:parameters()
for i, p in ipairs(model:parameters()) do
  worst = math.max(worst, (p.grad:cpu() - rp[i].grad:cpu()):abs():max():item())
end
check(worst <= 1e-6, string.format("DataParallel grads on cuda differ by %g", worst))
log{check = "data_parallel_cuda", buckets = dp:buckets(), started_early = dp:started_early(), max_grad_diff = worst}

-- the all-reduce of 64 MB on the device (one rank: NCCL's copy, the floor of its call)
local t = kiln.ones(16 * 2 ^ 20):cuda()
for _ = 1, 3 do dist.all_reduce(t) end
kiln.cuda.synchronize()
local clock = kiln.ui.clock
local t0 = clock()
for _ = 1, 20 do dist.all_reduce(t) end
kiln.cuda.synchronize()
log{check = "nccl_all_reduce", engine = "nccl", ranks = 1, bytes = 64 * 2 ^ 20, ms = (clock() - t0) / 20 * 1e3}
out:close()
if failures > 0 then error(failures .. " check(s) failed") end
print("dist_nccl: all checks passed")
