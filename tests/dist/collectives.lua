-- tests/dist/collectives.lua: every collective and dtype, checked on each rank against the
-- result computed in this one process from what every rank must have sent (rank r's input is a
-- known function of r). Run by ctest under `kiln launch -n 2` and `-n 4`.
local dist = kiln.dist
dist.init()
local rank, size = dist.rank(), dist.world_size()
local checks = 0

local function fail(msg) error(string.format("rank %d: %s", rank, msg), 2) end
local function same(got, want, what, tol)
  tol = tol or 0
  local g, w = got:double():reshape(-1):totable(), want:double():reshape(-1):totable()
  if #g ~= #w then fail(what .. ": " .. #g .. " elements, want " .. #w) end
  for i = 1, #w do
    if math.abs(g[i] - w[i]) > tol * math.max(1, math.abs(w[i])) then
      fail(string.format("%s: element %d is %.17g, want %.17g", what, i, g[i], w[i]))
    end
  end
  checks = checks + 1
end

-- rank r's values: small integers, so that every dtype holds them exactly (bool: odd or not)
local function input(r, dtype, n)
  local v = {}
  for i = 1, n do v[i] = ((r + 1) * 3 + i * 5) % 7 + (dtype == "u8" and 0 or -2) end
  if dtype == "bool" then for i = 1, n do v[i] = (v[i] % 2 ~= 0) end end
  return kiln.tensor(v, {dtype = dtype})
end

local reduce = {
  sum = function(a, b) return a + b end, prod = function(a, b) return a * b end,
  max = math.max, min = math.min,
}

local dtypes = {"f32", "f64", "f16", "bf16", "i64", "i32", "u8", "bool"}
for _, dt in ipairs(dtypes) do
  local n = 11
  for _, op in ipairs{"sum", "max", "min", "prod", "mean"} do
    local float = dt == "f32" or dt == "f64" or dt == "f16" or dt == "bf16"
    if op ~= "mean" or float then
      local want = {}
      for i = 1, n do
        local acc
        for r = 0, size - 1 do
          local x = input(r, dt, n):double()[i]
          if dt == "bool" then x = x ~= 0 and 1 or 0 end
          if acc == nil then acc = x
          elseif op == "mean" then acc = acc + x
          elseif dt == "bool" then acc = (op == "sum" or op == "max") and math.max(acc, x) or math.min(acc, x)
          else acc = reduce[op](acc, x) end
        end
        if op == "mean" then acc = acc / size end
        if dt == "u8" and op == "prod" then acc = acc % 256 end
        want[i] = acc
      end
      local t = input(rank, dt, n)
      dist.all_reduce(t, op)
      local tol = (dt == "f16" or dt == "bf16") and 1e-2 or dt == "f32" and 1e-6 or 1e-12
      same(t, kiln.tensor(want, {dtype = "f64"}), "all_reduce " .. op .. " " .. dt, tol)
    end
  end
  -- broadcast from every root
  for root = 0, size - 1 do
    local t = input(rank, dt, n)
    dist.broadcast(t, root)
    same(t, input(root, dt, n), "broadcast from " .. root .. " " .. dt)
  end
  -- all_gather: every rank's input in rank order
  local g = dist.all_gather(input(rank, dt, n):view(1, n))
  local parts = {}
  for r = 0, size - 1 do parts[#parts + 1] = input(r, dt, n):view(1, n) end
  same(g, kiln.cat(parts, 1), "all_gather " .. dt)
  -- reduce_scatter (sum): block r of the sum of every rank's [size, n]
  if dt ~= "bool" then
    local function big(r) local rows = {} for k = 0, size - 1 do rows[#rows + 1] = input(r + k, dt, n):view(1, n) end return kiln.cat(rows, 1) end
    local out = dist.reduce_scatter(big(rank), "sum")
    local want = big(0):double() * 0
    for r = 0, size - 1 do want = want + big(r):double() end
    if dt == "u8" then want = want:remainder(256) end
    same(out, want[rank + 1]:view(1, n), "reduce_scatter " .. dt, (dt == "f16" or dt == "bf16") and 1e-2 or 0)
  end
end

-- send and recv around the ring, and async handles
do
  local nxt, prev = (rank + 1) % size, (rank - 1 + size) % size
  local buf = kiln.zeros(5, {dtype = "f64"})
  if rank % 2 == 0 then
    dist.send(input(rank, "f64", 5), nxt, {tag = 3})
    dist.recv(buf, prev, {tag = 3})
  else
    dist.recv(buf, prev, {tag = 3})
    dist.send(input(rank, "f64", 5), nxt, {tag = 3})
  end
  same(buf, input(prev, "f64", 5), "send/recv around the ring")
  local works = {}
  for k = 1, 3 do works[k] = dist.all_reduce(kiln.full({4}, k), {async = true}) end
  for k = 1, 3 do same(works[k]:wait(), kiln.full({4}, k * size), "async all_reduce " .. k) end
  dist.barrier()
end

-- a sub-group of the even ranks: its members reduce among themselves; the others may not use it
do
  local evens = {}
  for r = 0, size - 1, 2 do evens[#evens + 1] = r end
  local g = dist.new_group(evens)
  if rank % 2 == 0 then
    local t = kiln.full({3}, rank)
    dist.all_reduce(t, {group = g})
    local want = 0
    for _, r in ipairs(evens) do want = want + r end
    same(t, kiln.full({3}, want), "all_reduce on the even ranks' group")
    if g:rank() ~= rank / 2 or g:size() ~= #evens then fail("group rank/size") end
  else
    local ok, e = pcall(dist.all_reduce, kiln.ones(3), {group = g})
    if ok or not tostring(e):find("is not a member of group") then fail("a non-member's all_reduce: " .. tostring(e)) end
    checks = checks + 1
  end
end

-- bad arguments: an error naming what is wrong, and the group still works after
local function refuses(f, pattern, what)
  local ok, e = pcall(f)
  if ok or not tostring(e):find(pattern, 1, true) then fail(what .. ": want an error with '" .. pattern .. "', got " .. tostring(e)) end
  checks = checks + 1
end
refuses(function() dist.all_reduce(kiln.ones(3, 4):t()) end, "is not contiguous", "non-contiguous")
refuses(function() dist.all_reduce(kiln.ones(3, {dtype = "i64"}), "mean") end, "mean needs a float dtype", "mean of i64")
refuses(function() dist.all_reduce(kiln.ones(3), "median") end, 'op "median" is not', "unknown op")
refuses(function() dist.broadcast(kiln.ones(3), size) end, "root " .. size .. " is not a rank", "bad root")
refuses(function() dist.all_reduce(kiln.ones(3), {opp = "sum"}) end, 'unknown option "opp"', "misspelt option")
refuses(function() dist.all_gather(kiln.ones(3), {out = kiln.ones(2)}) end, "must hold", "all_gather size")
refuses(function() dist.send(kiln.ones(3), rank) end, "is not another rank", "send to self")
local t = kiln.ones(2)
dist.all_reduce(t)
same(t, kiln.full({2}, size), "all_reduce after the refused calls")
print(string.format("rank %d of %d: %d checks passed", rank, size, checks))
