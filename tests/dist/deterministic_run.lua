-- tests/dist/deterministic_run.lua OUT FROM TO [RESUME]: train a small MLP in DataParallel's
-- deterministic mode (4 shards) from step FROM to step TO on global batches made from the step's
-- seed, then rank 0 writes the parameters to OUT.safetensors and a checkpoint (model, optimizer,
-- step) to OUT.ckpt. With RESUME, start from that checkpoint (written by any number of ranks).
local dist, nn, optim = kiln.dist, kiln.nn, kiln.optim
local out, from, to, resume = arg[1], tonumber(arg[2]), tonumber(arg[3]), arg[4]
dist.init()
kiln.set_num_threads(1)   -- a shard's gradient is then the same bits on any rank
local rank, size = dist.rank(), dist.world_size()
kiln.manual_seed(3)
local model = nn.Sequential{nn.Linear(10, 24), nn.Tanh(), nn.Linear(24, 24), nn.ReLU(), nn.Linear(24, 4)}
local plain = os.getenv("KILN_TEST_PLAIN_DP") == "1"   -- the usual mode, for contrast
local dp = dist.DataParallel(model, {deterministic = not plain, shards = not plain and 4 or nil})
local opt = optim.SGD(model:parameters(), {lr = 0.1, momentum = 0.9})
if resume then kiln.checkpoint.load(resume, {model = model, optimizer = opt}) end
local global = 32
local per = global / size
for step = from, to do
  kiln.manual_seed(1000 + step)
  local X, Y = kiln.randn(global, 10), kiln.randn(global, 4)
  opt:zero_grad()
  local x, y = X:narrow(1, rank * per + 1, per), Y:narrow(1, rank * per + 1, per)
  if plain then
    local loss = (dp(x) - y):pow(2):mean()
    loss:backward()
  else
    dp:backward(function(m, xs, ys) return (m(xs) - ys):pow(2):mean() end, x, y)
  end
  opt:step()
end
if rank == 0 then
  kiln.save(out .. ".safetensors", model:state_dict())
  kiln.checkpoint.save(out .. ".ckpt", {model = model, optimizer = opt, step = to})
end
