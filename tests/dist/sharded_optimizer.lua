-- tests/dist/sharded_optimizer.lua: ZeRO stage 1 (kiln.dist.ShardedOptimizer) under DataParallel,
-- against one process running the plain optimizer on the whole global batch (here, on every rank):
-- parameters within 1e-12 (f64) after Adam and SGD-momentum steps; each rank keeps only its share
-- of the state; state_dict() gathers the unsharded format, equal to the plain optimizer's; a
-- fresh ShardedOptimizer and the plain one, both loading it, go on to the same parameters.
local dist, nn, optim = kiln.dist, kiln.nn, kiln.optim
dist.init()
local rank, size = dist.rank(), dist.world_size()
local checks = 0
local function fail(msg) error(string.format("rank %d: %s", rank, msg), 2) end
local function close(a, b, tol, what)
  local d = (a:double() - b:double()):abs():max():item()
  if d > tol then fail(string.format("%s differs by %.3g", what, d)) end
  checks = checks + 1
end

local function make()
  kiln.manual_seed(11)
  return nn.Sequential{nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)}:double()
end

for _, case in ipairs{{"Adam", optim.Adam, {lr = 0.01}}, {"SGD", optim.SGD, {lr = 0.05, momentum = 0.9}}} do
  local name, make_opt, hyper = case[1], case[2], case[3]
  local model, ref = make(), make()
  local dp = dist.DataParallel(model)
  local opt = dist.ShardedOptimizer(make_opt, model:parameters(), hyper)
  local ropt = make_opt(ref:parameters(), hyper)
  local global, per = 8, 8 / size
  local function step(k, o, ro, m, r)
    kiln.manual_seed(500 + k)
    local X, Y = kiln.randn(global, 5, {dtype = "f64"}), kiln.randn(global, 3, {dtype = "f64"})
    o:zero_grad()
    ro:zero_grad()
    local loss = (dp(X:narrow(1, rank * per + 1, per)) - Y:narrow(1, rank * per + 1, per)):pow(2):mean()
    loss:backward()
    local rloss = (r(X) - Y):pow(2):mean()
    rloss:backward()
    o:step()
    ro:step()
  end
  for k = 1, 4 do step(k, opt, ropt, model, ref) end
  for key, t in pairs(model:state_dict()) do close(t, ref:state_dict()[key], 1e-12, name .. " " .. key) end
  -- a share of the state: about 1/size of it
  local total = 0
  for _, st in pairs(ropt.state) do for _, v in pairs(st) do if kiln.is_tensor(v) then total = total + v:numel() end end end
  local mine = dist.all_gather(kiln.tensor({opt:state_numel()}, {dtype = "i64"}))
  if mine:sum():item() ~= total then fail(name .. ": the shards' state does not add up to the whole") end
  if size > 1 and mine:max():item() >= total then fail(name .. ": a rank keeps the whole state") end
  checks = checks + 1
  -- the gathered state dict is the plain optimizer's
  local sd, rsd = opt:state_dict(), ropt:state_dict()
  for i, rs in pairs(rsd.state) do
    for key, v in pairs(rs) do
      local got = sd.state[i] and sd.state[i][key]
      if kiln.is_tensor(v) then close(got, v, 1e-12, name .. " state " .. i .. "." .. key)
      elseif got ~= v then fail(string.format("%s state %d.%s is %s, want %s", name, i, key, tostring(got), tostring(v))) end
    end
  end
  -- resume: a fresh sharded optimizer and a fresh plain one load it and go on alike
  local model2, ref2 = make(), make()
  model2:load_state_dict(model:state_dict())
  ref2:load_state_dict(ref:state_dict())
  local dp2 = dist.DataParallel(model2)
  dp = dp2
  local opt2 = dist.ShardedOptimizer(make_opt, model2:parameters(), hyper)
  opt2:load_state_dict(sd)
  local ropt2 = make_opt(ref2:parameters(), hyper)
  ropt2:load_state_dict(sd)
  for k = 5, 6 do step(k, opt2, ropt2, model2, ref2) end
  for key, t in pairs(model2:state_dict()) do close(t, ref2:state_dict()[key], 1e-12, name .. " resumed " .. key) end
end
print(string.format("rank %d of %d: %d checks passed", rank, size, checks))
