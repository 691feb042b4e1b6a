-- kiln.dist.data_parallel: DataParallel (gradients averaged over ranks while backward runs, and the
-- deterministic mode), ShardedOptimizer (ZeRO stage 1), and the samplers that share out global
-- batches by sample index.
local core = require "kiln.core"
local factory = require "kiln.factory"
local nn = require "kiln.nn"
local order = require "kiln.data.order"
local dist = require "kiln.dist.collectives"
local ffi, C = core.ffi, core.C
local raise, is_tensor, check = core.raise, core.is_tensor, core.check

local M = {}

-- ---- data parallelism ----

-- DataParallel(model[, {bucket_mb = 25, first_bucket_mb = 1, group, broadcast = true}]): model,
-- whose gradients are averaged over the group's ranks while backward runs. At construction every
-- parameter and buffer is broadcast from rank 0 (broadcast = false: the caller made them equal).
-- Each rank then feeds its own part of the batch; after loss:backward() every rank holds the mean
-- gradient, as one process would get on the whole batch with a mean loss, and the optimizer steps
-- are identical. state_dict and load_state_dict are the model's own (no "module." prefix), so a
-- checkpoint loads in one process.
local DataParallel = nn.define("DataParallel")
M.DataParallel, nn.DataParallel = nn.DataParallel, nil   -- kiln.dist's, not kiln.nn's
local dp_options = core.set("bucket_mb", "first_bucket_mb", "group", "broadcast", "deterministic", "shards")
local TensorList = ffi.typeof("struct kiln_tensor *[?]")

function DataParallel:init(model, opts)
  dist.need_init("DataParallel")
  if not nn.is_module(model) then raise("DataParallel: expected a module, got " .. core.describe(model)) end
  opts = core.options(opts, dp_options, "DataParallel")
  local group = opts.group or dist.world()
  self.module = model
  if opts.broadcast ~= false then
    for _, np in ipairs(model:named_parameters()) do
      local p = np[2]
      if not p:is_contiguous() then raise("DataParallel: parameter " .. np[1] .. " is not contiguous") end
      dist.broadcast(p.requires_grad and p:detach() or p, 0, {group = group})
    end
    for _, nb in ipairs(model:named_buffers()) do dist.broadcast(nb[2], 0, {group = group}) end
  end
  local params = {}
  for _, p in ipairs(model:parameters()) do if p.requires_grad then params[#params + 1] = p end end
  if #params == 0 then raise("DataParallel: the model has no parameter that requires grad") end
  rawset(self, "_params_list", params)
  if opts.deterministic then
    local S, n = opts.shards or 4, group:size()
    local function pow2(k) return k >= 1 and k == 2 ^ math.floor(math.log(k) / math.log(2) + 0.5) end
    if not pow2(S) or not pow2(n) or S % n ~= 0 then
      raise(string.format("DataParallel: the deterministic mode needs shards (%s) and ranks (%d) powers of 2, "
                          .. "with ranks dividing shards", tostring(S), n))
    end
    rawset(self, "_shards", S)
    rawset(self, "_group", group)
    return   -- no reducer: dp:backward sums the shards' gradients in a fixed tree
  end
  local arr = TensorList(#params)
  for i, p in ipairs(params) do arr[i - 1] = p.p end
  local mb = 1024 * 1024
  local r = C.kiln_reducer_new(group.p, arr, #params, (opts.bucket_mb or 25) * mb, (opts.first_bucket_mb or 1) * mb)
  if r == nil then check(C.kiln_error_code()) end
  rawset(self, "_reducer", ffi.gc(r, C.kiln_reducer_free))
  rawset(self, "_group", group)
end

function DataParallel:forward(...) return self.module(...) end

-- Sum a list of tensors (length a power of 2) in the fixed tree ((1+2)+(3+4))+...
local function tree_sum(list)
  while #list > 1 do
    local next = {}
    for i = 1, #list, 2 do next[#next + 1] = list[i] + list[i + 1] end
    list = next
  end
  return list[1]
end

-- dp:backward(loss_fn, x, y): the deterministic mode's step. x and y are this rank's share of the
-- global batch (dist.sampler's); it is cut into shards / ranks equal shards, and loss_fn(model, xs,
-- ys) gives each shard's mean loss, whose gradient is computed on its own. The shards' gradients are
-- added in a fixed binary tree over the global shard order (this rank's subtree here, then the
-- ranks' sums, gathered, in the same tree on every rank) and divided by the shard count. So 1, 2 or
-- 4 ranks reach bitwise the same gradients, hence parameters, from the same global batch (each rank
-- with the same thread count). Returns the global batch's mean loss, a number.
function DataParallel:backward(loss_fn, x, y)
  local S = rawget(self, "_shards")
  if not S then raise("DataParallel:backward: only in the deterministic mode (DataParallel(model, {deterministic = true}))") end
  local group = self._group
  local n = group:size()
  local local_shards = S / n
  local rows = x:size(1)
  if rows % local_shards ~= 0 then
    raise(string.format("DataParallel:backward: this rank's batch of %d does not split into %d equal shards", rows, local_shards))
  end
  local per = rows / local_shards
  local params = self._params_list
  local sums, losses = {}, {}
  for k = 0, local_shards - 1 do
    for _, p in ipairs(params) do p.grad = nil end
    local loss = loss_fn(self.module, x:narrow(1, k * per + 1, per), y and y:narrow(1, k * per + 1, per))
    loss:backward()
    local flat = {}
    for i, p in ipairs(params) do
      local g = p.grad
      flat[i] = g and g:reshape(-1) or factory.zeros({p:numel()}, {dtype = p:dtype()})
    end
    sums[#sums + 1] = factory.cat(flat, 1)
    losses[#losses + 1] = loss:detach():double():reshape(1)
  end
  local mine = tree_sum(sums)
  local loss_sum = tree_sum(losses)
  local all = dist.all_gather(factory.cat({mine, loss_sum:to(mine:dtype())}, 1):view(1, -1), {group = group})
  local rows_of = {}
  for r = 1, n do rows_of[r] = all[r] end
  local total = tree_sum(rows_of) / S
  local at = 0
  for _, p in ipairs(params) do
    local numel = p:numel()
    p.grad = total:narrow(1, at + 1, numel):view(p:size()):clone()
    at = at + numel
  end
  return total[at + 1]   -- indexing a 1-d tensor gives the number
end

-- dp:no_sync(fn, ...): run fn with the gradient averaging off (gradient accumulation); the first
-- backward after it averages everything accumulated.
function DataParallel:no_sync(fn, ...)
  check(C.kiln_reducer_set_enabled(self._reducer, 0))
  local ok, a, b, c = pcall(fn, ...)
  check(C.kiln_reducer_set_enabled(self._reducer, 1))
  if not ok then error(a, 0) end
  return a, b, c
end

function DataParallel:state_dict() return self.module:state_dict() end
function DataParallel:load_state_dict(sd, strict) return self.module:load_state_dict(sd, strict) end
-- buckets(): how many buckets the gradients travel in; started_early(): of the last backward,
-- the buckets whose all-reduce started before backward ended.
function DataParallel:buckets() return self._reducer and C.kiln_reducer_bucket_count(self._reducer) or 0 end
-- bucket_sizes(): the elements of each bucket, in the order they travel
function DataParallel:bucket_sizes()
  local sizes = {}
  for k = 0, self:buckets() - 1 do sizes[#sizes + 1] = tonumber(C.kiln_reducer_bucket_numel(self._reducer, k)) end
  return sizes
end
function DataParallel:started_early() return self._reducer and C.kiln_reducer_started_early(self._reducer) or 0 end

-- ---- ZeRO stage 1: optimizer state sharded across ranks ----

-- ShardedOptimizer(make, params, opts[, {group}]): the optimizer make (optim.SGD, optim.Adam, ...)
-- over params, with its state split among the group's ranks: each parameter belongs to one rank
-- (greedily by size, in order, the same on every rank), whose optimizer alone keeps its state and
-- steps it; after each step every parameter is broadcast from its owner. The gradients must be the
-- same on every rank (DataParallel's). param_groups holds every parameter and the hyperparameters
-- (so learning-rate schedulers work on it); state_dict() gathers every rank's state into the
-- unsharded optimizer's format (so a checkpoint resumes at any number of ranks, or in one process
-- with make itself), and load_state_dict takes that format.
local Sharded = {}
Sharded.__index = Sharded

function M.ShardedOptimizer(make, params, opts, dist_opts)
  dist.need_init("ShardedOptimizer")
  if type(make) ~= "function" then raise("ShardedOptimizer: expected an optimizer constructor (optim.Adam, ...), got " .. type(make)) end
  if type(params) ~= "table" or #params == 0 then raise("ShardedOptimizer: expected a list of parameters") end
  dist_opts = core.options(dist_opts, core.set("group"), "ShardedOptimizer")
  local group = dist_opts.group or dist.world()
  local n, me = group:size(), group:rank()
  local load, owner = {}, {}
  for r = 0, n - 1 do load[r] = 0 end
  local mine = {}
  for i, p in ipairs(params) do
    if not is_tensor(p) then raise("ShardedOptimizer: parameter " .. i .. " is not a tensor") end
    local best = 0
    for r = 1, n - 1 do if load[r] < load[best] then best = r end end
    owner[i] = best
    load[best] = load[best] + p:numel()
    if best == me then mine[#mine + 1] = p end
  end
  local inner = #mine > 0 and make(mine, opts) or nil
  -- the hyperparameters of the one group, as the optimizer would have them
  local probe = inner or make({params[1]}, opts)
  local g = {}
  for k, v in pairs(probe.param_groups[1]) do if k ~= "params" then g[k] = v end end
  g.params = params
  return setmetatable({inner = inner, make = make, opts = opts, group = group, owner = owner, params = params,
                       param_groups = {g}, defaults = probe.defaults}, Sharded)
end

-- The numbers of state elements this rank keeps (its share), and the whole optimizer's.
function Sharded:state_numel()
  local mine = 0
  if self.inner then
    for _, st in pairs(self.inner.state) do
      for _, v in pairs(st) do if is_tensor(v) then mine = mine + v:numel() end end
    end
  end
  return mine
end

function Sharded:zero_grad()
  for _, p in ipairs(self.params) do p.grad = nil end
end

function Sharded:step()
  if self.inner then
    local mine = self.inner.param_groups[1]
    for k, v in pairs(self.param_groups[1]) do if k ~= "params" then mine[k] = v end end
    self.inner:step()
  end
  local works = {}
  for i, p in ipairs(self.params) do
    works[#works + 1] = dist.broadcast(p:detach(), self.owner[i], {group = self.group, async = true})
  end
  for _, w in ipairs(works) do w:wait() end
end

-- Send a description (a string) from rank root to all: its length, then its bytes.
local function broadcast_string(text, root, group)
  local len = factory.tensor({text and #text or 0}, {dtype = "i64"})
  dist.broadcast(len, root, {group = group})
  local n = len[1]
  if n == 0 then return "" end
  local buf = factory.zeros({n}, {dtype = "u8"})
  if text then ffi.copy(ffi.cast("uint8_t *", buf.p.storage.data) + buf.p.offset, text, n) end
  dist.broadcast(buf, root, {group = group})
  return ffi.string(ffi.cast("uint8_t *", buf.p.storage.data) + buf.p.offset, n)
end

function Sharded:state_dict()
  local me = self.group:rank()
  local inner_sd = self.inner and self.inner:state_dict()
  local local_index = {}   -- global index -> the inner optimizer's 0-based index
  local k = 0
  for i = 1, #self.params do
    if self.owner[i] == me then local_index[i] = k k = k + 1 end
  end
  local state = {}
  for i = 1, #self.params do
    local root = self.owner[i]
    local st = root == me and inner_sd.state[local_index[i]] or nil
    -- "name=t:f32:2x3;step=n;..." then the numbers, then the tensors in that order
    local desc
    if root == me and st then
      local parts = {}
      local keys = {}
      for key in pairs(st) do keys[#keys + 1] = key end
      table.sort(keys)
      for _, key in ipairs(keys) do
        local v = st[key]
        if is_tensor(v) then parts[#parts + 1] = key .. "=t:" .. v:dtype() .. ":" .. table.concat(v:size(), "x")
        elseif type(v) == "number" then parts[#parts + 1] = key .. "=n"
        elseif type(v) == "boolean" then parts[#parts + 1] = key .. "=b" .. (v and "1" or "0") end
      end
      desc = table.concat(parts, ";")
    elseif root == me then
      desc = ""
    end
    desc = broadcast_string(desc, root, self.group)
    if desc ~= "" then
      local s, numbers = {}, {}
      for item in desc:gmatch("[^;]+") do
        local key, kind = item:match("^(.-)=(.*)$")
        if kind == "n" then numbers[#numbers + 1] = key
        elseif kind:sub(1, 1) == "b" then s[key] = kind == "b1"
        else
          local dt, shape = kind:match("^t:([^:]+):(.*)$")
          local sizes = {}
          for d in shape:gmatch("%d+") do sizes[#sizes + 1] = tonumber(d) end
          local t = root == me and st[key]:contiguous() or factory.zeros(sizes, {dtype = dt})
          dist.broadcast(t, root, {group = self.group})
          s[key] = t
        end
      end
      if #numbers > 0 then
        local vals = factory.zeros({#numbers}, {dtype = "f64"})
        if root == me then for j, key in ipairs(numbers) do vals[j] = st[key] end end
        dist.broadcast(vals, root, {group = self.group})
        for j, key in ipairs(numbers) do s[key] = vals[j] end
      end
      state[i - 1] = s
    end
  end
  local g = {}
  for key, v in pairs(self.param_groups[1]) do if key ~= "params" then g[key] = v end end
  g.params = {}
  for i = 1, #self.params do g.params[i] = i - 1 end
  return {state = state, param_groups = {g}}
end

function Sharded:load_state_dict(sd)
  if type(sd) ~= "table" or type(sd.state) ~= "table" or type(sd.param_groups) ~= "table" or #sd.param_groups ~= 1 then
    raise("ShardedOptimizer.load_state_dict: expected the state dict of an optimizer with one parameter group")
  end
  local me = self.group:rank()
  local saved = sd.param_groups[1]
  if type(saved.params) ~= "table" or #saved.params ~= #self.params then
    raise(string.format("ShardedOptimizer.load_state_dict: the state dict has %d parameters, the optimizer %d",
                        type(saved.params) == "table" and #saved.params or 0, #self.params))
  end
  for key, v in pairs(saved) do if key ~= "params" then self.param_groups[1][key] = v end end
  if not self.inner then return end
  local inner_state, ids, k = {}, {}, 0
  for i = 1, #self.params do
    if self.owner[i] == me then
      inner_state[k] = sd.state[saved.params[i]]
      ids[#ids + 1] = k
      k = k + 1
    end
  end
  local g = {}
  for key, v in pairs(saved) do if key ~= "params" then g[key] = v end end
  g.params = ids
  self.inner:load_state_dict({state = inner_state, param_groups = {g}})
end

-- ---- samplers ----

local sampler_options = core.set("batch_size", "shuffle", "seed", "rank", "world_size")

-- sampler{batch_size = B, shuffle = true, seed = 1[, rank, world_size]}: a DataLoader sampler for
-- training that shards each epoch by global sample index. The epoch's order (from seed and epoch,
-- the same on every rank) is cut into global batches of B; rank r takes the r-th of world_size
-- equal shares of each. Give the DataLoader batch_size = B / world_size: its batch k on rank r is
-- share r of global batch k, whatever the number of ranks, so a job's global batches do not depend
-- on it. The last global batch is dropped when it is not full (so every rank has as many batches).
function M.sampler(opts)
  opts = core.options(opts, sampler_options, "dist.sampler")
  local B = opts.batch_size
  if type(B) ~= "number" or B < 1 or B ~= math.floor(B) then raise("dist.sampler: batch_size (the global batch) must be an integer >= 1") end
  local rank = opts.rank or (dist.is_initialized() and dist.rank() or 0)
  local size = opts.world_size or (dist.is_initialized() and dist.world_size() or 1)
  if B % size ~= 0 then
    raise(string.format("dist.sampler: the global batch %d does not split into %d equal shares", B, size))
  end
  local per, seed, shuffle = B / size, opts.seed or 1, opts.shuffle ~= false
  return function(epoch, n)
    local perm = order.order0(n, shuffle, seed, epoch)   -- 0-based
    local all = ffi.cast("int64_t *", perm.p.storage.data) + perm.p.offset
    local batches = math.floor(n / B)
    local mine = factory.empty({batches * per}, {dtype = "i64"})
    local out = ffi.cast("int64_t *", mine.p.storage.data) + mine.p.offset
    for b = 0, batches - 1 do
      for k = 0, per - 1 do out[b * per + k] = all[b * B + rank * per + k] + 1 end
    end
    return mine
  end
end

-- shard(n[, {rank, world_size}]): first, count: this rank's contiguous block of n samples for
-- evaluation (the first n % world_size ranks take one more); every sample on exactly one rank, none
-- twice, so that summing counts over ranks gives exact metrics.
function M.shard(n, opts)
  opts = core.options(opts, core.set("rank", "world_size"), "dist.shard")
  local rank = opts.rank or (dist.is_initialized() and dist.rank() or 0)
  local size = opts.world_size or (dist.is_initialized() and dist.world_size() or 1)
  local base, extra = math.floor(n / size), n % size
  local first = rank * base + math.min(rank, extra) + 1
  return first, base + (rank < extra and 1 or 0)
end

return M
