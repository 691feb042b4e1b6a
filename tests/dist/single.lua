-- tests/dist/single.lua: kiln.dist.init{single = true}, a world of one rank without a launcher or
-- MPI: every collective leaves its tensor as it is (the reduction of one), DataParallel and
-- ShardedOptimizer step as the plain model and optimizer do, and what needs another rank says so.
local dist, nn, optim = kiln.dist, kiln.nn, kiln.optim
assert(not dist.launched())
dist.init{single = true}
assert(dist.rank() == 0 and dist.world_size() == 1, "a world of one")
assert(dist.engine() == "one rank (no engine)", dist.engine())
local t = kiln.tensor{1.5, -2, 3}
for _, op in ipairs{"sum", "mean", "max", "min", "prod"} do
  dist.all_reduce(t, op)
  assert(t:eq(kiln.tensor{1.5, -2, 3}):all():item(), op)
end
assert(dist.all_gather(t):eq(t):all():item())
assert(dist.reduce_scatter(t):eq(t):all():item())
dist.broadcast(t, 0)
dist.barrier()
local ok, e = pcall(dist.send, t, 0)
assert(not ok and tostring(e):find("is not another rank"), tostring(e))

kiln.manual_seed(2)
local model = nn.Sequential{nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)}:double()
local ref = nn.Sequential{nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)}:double()
ref:load_state_dict(model:state_dict())
local dp = dist.DataParallel(model)
local opt = dist.ShardedOptimizer(optim.Adam, model:parameters(), {lr = 0.01})
local ropt = optim.Adam(ref:parameters(), {lr = 0.01})
for step = 1, 3 do
  local x, y = kiln.randn(6, 4, {dtype = "f64"}), kiln.randn(6, 2, {dtype = "f64"})
  opt:zero_grad() ropt:zero_grad()
  local loss = (dp(x) - y):pow(2):mean()
  loss:backward()
  local rloss = (ref(x) - y):pow(2):mean()
  rloss:backward()
  opt:step() ropt:step()
end
for k, v in pairs(model:state_dict()) do
  assert(v:eq(ref:state_dict()[k]):all():item(), "DataParallel + ShardedOptimizer at one rank: " .. k .. " differs")
end
print("single: all checks passed")
