-- tests/dist/model_parallel.lua: the model-parallel layers against the single-process layers with
-- the same weights (built here, on every rank): a ColumnParallelLinear -> RowParallelLinear pair
-- against two nn.Linear, and ParallelLSTM / ParallelGRU against nn.LSTM / nn.GRU; outputs, the
-- input's grad and every weight's grad (gathered) within 1e-6 in f32, and state dicts that load
-- into the single-process layers.
local dist, nn = kiln.dist, kiln.nn
dist.init()
local rank, size = dist.rank(), dist.world_size()
local checks = 0
local function fail(msg) error(string.format("rank %d: %s", rank, msg), 2) end
local function close(a, b, what, tol)
  tol = tol or 1e-6
  local d = (a:double() - b:double()):abs():max():item()
  local scale = math.max(1, b:double():abs():max():item())
  if d > tol * scale then fail(string.format("%s differs by %.3g", what, d)) end
  checks = checks + 1
end

-- Linear pair
do
  kiln.manual_seed(21)
  local col = dist.ColumnParallelLinear(12, 8 * size, {gather_output = false})
  local row = dist.RowParallelLinear(8 * size, 5)
  local ref1, ref2 = nn.Linear(12, 8 * size), nn.Linear(8 * size, 5)
  ref1:load_state_dict(col:state_dict())
  ref2:load_state_dict(row:state_dict())
  kiln.manual_seed(22)
  local x = kiln.randn(7, 12)
  local xa, xb = x:clone():requires_grad_(), x:clone():requires_grad_()
  local y = row(col(xa):tanh())
  local yr = ref2(ref1(xb):tanh())
  close(y, yr, "Column -> Row output")
  local w = kiln.randn(7, 5)
  local loss = (y * w):sum()
  loss:backward()
  local rloss = (yr * w):sum()
  rloss:backward()
  close(xa.grad, xb.grad, "the input's grad")
  -- weight grads: this rank's share against the same share of the whole grad
  local share = 8
  close(col.weight.grad, ref1.weight.grad:narrow(1, rank * share + 1, share), "column weight grad")
  close(col.bias.grad, ref1.bias.grad:narrow(1, rank * share + 1, share), "column bias grad")
  close(row.weight.grad, ref2.weight.grad:narrow(2, rank * share + 1, share), "row weight grad")
  close(row.bias.grad, ref2.bias.grad, "row bias grad")
  -- gathered output too
  local colg = dist.ColumnParallelLinear(12, 8 * size)
  local refg = nn.Linear(12, 8 * size)
  refg:load_state_dict(colg:state_dict())
  close(colg(x), refg(x), "a gathered column output")
end

-- recurrent layers
for _, mode in ipairs{"LSTM", "GRU"} do
  kiln.manual_seed(30)
  local H = 4 * size
  local mp = dist["Parallel" .. mode](6, H, {num_layers = 2})
  local ref = nn[mode](6, H, {num_layers = 2})
  ref:load_state_dict(mp:state_dict())
  kiln.manual_seed(31)
  local x = kiln.randn(5, 3, 6)
  local xa, xb = x:clone():requires_grad_(), x:clone():requires_grad_()
  local out, st = mp(xa)
  local rout, rst = ref(xb)
  close(out, rout, mode .. " output")
  local hn, rhn = mode == "LSTM" and st[1] or st, mode == "LSTM" and rst[1] or rst
  close(hn, rhn, mode .. " h_n")
  if mode == "LSTM" then close(st[2], rst[2], "LSTM c_n") end
  local w = kiln.randn(5, 3, H)
  local loss = (out * w):sum() + hn:sum()
  loss:backward()
  local rloss = (rout * w):sum() + rhn:sum()
  rloss:backward()
  close(xa.grad, xb.grad, mode .. " input grad")
  -- every weight's grad: the gathered shares against the whole
  local G = mode == "LSTM" and 4 or 3
  for l = 0, 1 do
    for _, k in ipairs{"weight_ih", "weight_hh", "bias_ih", "bias_hh"} do
      local key = k .. "_l" .. l
      local share = mp[key].grad
      local whole = ref[key].grad
      local sizes = whole:size()
      local rest = {}
      for d = 2, #sizes do rest[#rest + 1] = sizes[d] end
      local mine = whole:reshape(G, H, unpack(rest)):narrow(2, rank * 4 + 1, 4):reshape(G * 4, unpack(rest))
      close(share, mine, mode .. " " .. key .. " grad")
    end
  end
  -- the state dict loads into the single-process layer (checked above) and round-trips
  local mp2 = dist["Parallel" .. mode](6, H, {num_layers = 2})
  mp2:load_state_dict(ref:state_dict())
  close(mp2(x), ref(x), mode .. " after load_state_dict")
end
print(string.format("rank %d of %d: %d checks passed", rank, size, checks))
