-- tests/dist/data_parallel.lua: DataParallel training against one process training the same
-- model on the whole global batch (computed here, on every rank, as the reference): the
-- parameters agree within 1e-6 (f32) and 1e-12 (f64) after several SGD steps with momentum, with
-- gradient accumulation (no_sync), and with a parameter that gets no gradient on some steps.
local dist, nn, optim = kiln.dist, kiln.nn, kiln.optim
dist.init()
local rank, size = dist.rank(), dist.world_size()
local checks = 0
local function fail(msg) error(string.format("rank %d: %s", rank, msg), 2) end

-- A model with a branch used only when asked: its parameters get no gradient on other steps.
local NetClass = nn.define("TestDPNet")
local Net = nn.TestDPNet
function NetClass:init(dtype)
  self.body = nn.Sequential{nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh()}
  self.head = nn.Linear(32, 3)
  self.extra = nn.Linear(32, 3)
  self:to(dtype)
end
function NetClass:forward(x, use_extra)
  local h = self.body(x)
  local y = self.head(h)
  if use_extra then y = y + self.extra(h) end
  return y
end

local function run(dtype, tol)
  kiln.manual_seed(100 + rank)           -- each rank starts different; DataParallel broadcasts rank 0's
  local model = Net(dtype)
  local dp = dist.DataParallel(model, {bucket_mb = 0.004, first_bucket_mb = 0.001})
  local ref = Net(dtype)
  ref:load_state_dict(model:state_dict())   -- after the broadcast: rank 0's start, on every rank
  local opt = optim.SGD(model:parameters(), {lr = 0.05, momentum = 0.9})
  local ropt = optim.SGD(ref:parameters(), {lr = 0.05, momentum = 0.9})
  local global = 8
  local per = global / size
  for step = 1, 6 do
    kiln.manual_seed(step)
    local X, Y = kiln.randn(2 * global, 6, {dtype = dtype}), kiln.randn(2 * global, 3, {dtype = dtype})
    local use_extra = step % 3 == 0
    opt:zero_grad()
    ropt:zero_grad()
    if step % 2 == 0 then
      -- two micro-batches: the first under no_sync, the second reduces what accumulated
      for micro = 0, 1 do
        local base = micro * global
        local x, y = X:narrow(1, base + rank * per + 1, per), Y:narrow(1, base + rank * per + 1, per)
        local function go() local loss = (dp(x, use_extra) - y):pow(2):mean() / 2 loss:backward() end
        if micro == 0 then dp:no_sync(go) else go() end
      end
      local rloss = (ref(X, use_extra) - Y):pow(2):mean()
      rloss:backward()
    else
      local x, y = X:narrow(1, rank * per + 1, per), Y:narrow(1, rank * per + 1, per)
      local loss = (dp(x, use_extra) - y):pow(2):mean()
      loss:backward()
      local rloss = (ref(X:narrow(1, 1, global), use_extra) - Y:narrow(1, 1, global)):pow(2):mean()
      rloss:backward()
    end
    opt:step()
    ropt:step()
    local sd, rsd = model:state_dict(), ref:state_dict()
    for _, k in ipairs(sd.keys()) do
      local d = (sd[k]:double() - rsd[k]:double()):abs():max():item()
      if d > tol then fail(string.format("%s step %d: %s differs from one process by %.3g (> %g)", dtype, step, k, d, tol)) end
      checks = checks + 1
    end
  end
  if dp:buckets() < 2 then fail("expected several buckets, got " .. dp:buckets()) end
  if dp:started_early() < 1 then fail("no bucket's all-reduce started before backward ended") end
  checks = checks + 1
end

run("f64", 1e-12)
run("f32", 1e-6)

-- every rank holds the same parameters, bit for bit
do
  kiln.manual_seed(5 + rank)
  local model = Net("f32")
  dist.DataParallel(model)
  for _, p in ipairs(model:parameters()) do
    local mine = p:detach():clone()
    local first = mine:clone()
    dist.broadcast(first, 0)
    if not mine:eq(first):all():item() then fail("parameters differ between ranks after the broadcast") end
    checks = checks + 1
  end
end
print(string.format("rank %d of %d: %d checks passed", rank, size, checks))
