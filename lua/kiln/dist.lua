-- kiln.dist: process groups and collectives across the ranks of a job started by `kiln launch`
-- or `mpirun`, and data parallelism (kiln.dist.DataParallel).
--   local dist = kiln.dist
--   dist.init()
--   dist.all_reduce(t, "mean")          -- t changes in place on every rank
--   if dist.rank() == 0 then print(t) end
-- Ranks are the engine's, from 0 (rank 0 is the root that broadcasts parameters and writes
-- checkpoints); they are names of processes, not positions in a Lua table. Tensors are CPU
-- tensors; each collective has a deadline (set_timeout), after which it raises an error naming the
-- collective, the group, the shape and the ranks that had not arrived.
local core = require "kiln.core"
local factory = require "kiln.factory"
local nn = require "kiln.nn"
local order = require "kiln.data.order"
local ffi, C = core.ffi, core.C
local raise, is_tensor, check = core.raise, core.is_tensor, core.check

local M = {}

local OPS = {sum = C.KILN_REDUCE_SUM, max = C.KILN_REDUCE_MAX, min = C.KILN_REDUCE_MIN, prod = C.KILN_REDUCE_PROD,
             mean = C.KILN_REDUCE_MEAN}
local LAUNCH_HINT = "start the job with `kiln launch -n 2 script.lua` (or `mpirun -np 2 kiln script.lua`)"

local function need_init(what)
  if C.kiln_dist_is_initialized() == 0 then
    if C.kiln_dist_launched() == 0 then
      raise(what .. ": this process was not started by a launcher; " .. LAUNCH_HINT .. ", then call kiln.dist.init()")
    end
    raise(what .. ": call kiln.dist.init() first")
  end
end

-- ---- set-up ----

-- init([{timeout = seconds, single = false}]): join the job. Outside a launcher it is an error that
-- says how to launch, but with single = true: a world of one rank, without MPI (distributed code
-- run alone).
function M.init(opts)
  opts = core.options(opts, core.set("timeout", "single"), "dist.init")
  if opts.timeout then check(C.kiln_dist_set_timeout(opts.timeout)) end
  if opts.single then check(C.kiln_dist_init_single()) return end
  if C.kiln_dist_launched() == 0 then raise("dist.init: this process was not started by a launcher; " .. LAUNCH_HINT) end
  check(C.kiln_dist_init())
end

function M.is_initialized() return C.kiln_dist_is_initialized() ~= 0 end
function M.launched() return C.kiln_dist_launched() ~= 0 end
function M.finalize() check(C.kiln_dist_finalize()) end
-- abort([code]): end every rank of the job now.
function M.abort(code) C.kiln_dist_abort(code or 1) end
function M.engine() return ffi.string(C.kiln_dist_engine_name()) end
function M.set_timeout(seconds)
  if type(seconds) ~= "number" then raise("dist.set_timeout: expected a number of seconds, got " .. type(seconds)) end
  check(C.kiln_dist_set_timeout(seconds))
end
function M.timeout() return tonumber(C.kiln_dist_timeout()) end

-- ---- groups ----

local Group = {}
Group.__index = Group
local world

local function wrap_group(p) return setmetatable({p = p}, Group) end

function M.world()
  need_init("dist.world")
  if not world then world = wrap_group(C.kiln_dist_world()) end
  return world
end

-- rank([group]): this process's rank (in group, or the world); world_size([group]).
function M.rank(group)
  need_init("dist.rank")
  return C.kiln_group_rank((group or M.world()).p)
end
function M.world_size(group)
  need_init("dist.world_size")
  return C.kiln_group_size((group or M.world()).p)
end
function Group:rank() return C.kiln_group_rank(self.p) end
function Group:size() return C.kiln_group_size(self.p) end
function Group:__tostring() return "kiln.dist group " .. ffi.string(C.kiln_group_name(self.p)) end

-- new_group(ranks): a group of the world ranks listed; every rank of the world calls it.
function M.new_group(ranks)
  need_init("dist.new_group")
  if type(ranks) ~= "table" then raise("dist.new_group: expected a list of world ranks, got " .. type(ranks)) end
  local arr = ffi.new("int[?]", #ranks)
  for i, r in ipairs(ranks) do
    if type(r) ~= "number" or r ~= math.floor(r) then raise("dist.new_group: rank " .. i .. " is not an integer") end
    arr[i - 1] = r
  end
  local p = C.kiln_dist_new_group(arr, #ranks)
  if p == nil then check(C.kiln_error_code()) end
  return wrap_group(p)
end

-- ---- work handles ----

local Work = {}
Work.__index = Work
local WorkPtr = ffi.typeof("struct kiln_work *[1]")

local function work_of(box, result)
  local w = setmetatable({p = ffi.gc(box[0], C.kiln_work_release), result = result}, Work)
  return w
end

-- work:wait(): the result (the tensor the collective wrote), once it is there.
function Work:wait()
  check(C.kiln_work_wait(self.p))
  return self.result
end
function Work:is_completed() return C.kiln_work_is_done(self.p) ~= 0 end

-- ---- collectives ----

local function tensor_arg(op, t, role)
  if not is_tensor(t) then raise(string.format("dist.%s: %s must be a tensor, got %s", op, role or "the first argument", type(t))) end
  return t
end

local function parse(op, opts, fields)
  if opts == nil then return {} end
  if type(opts) ~= "table" then raise("dist." .. op .. ": options must be a table, got " .. type(opts)) end
  fields.group, fields.async = true, true
  return core.options(opts, fields, "dist." .. op)
end

local function reduce_op(op, name)
  local v = OPS[name or "sum"]
  if not v then raise(string.format("dist.%s: op %q is not sum, mean, max, min or prod", op, tostring(name))) end
  return v
end

-- Run a collective: with async, return a Work; else wait and return result.
local function go(opts, result, call)
  local box = opts.async and WorkPtr() or nil
  check(call(box))
  if box then return work_of(box, result) end
  return result
end

local function group_of(opts) return (opts.group or M.world()).p end

-- all_reduce(t[, op = "sum"][, {op, group, async}]): every rank's t becomes the reduction over ranks.
function M.all_reduce(t, op, opts)
  need_init("dist.all_reduce")
  tensor_arg("all_reduce", t)
  if type(op) == "table" then op, opts = nil, op end
  opts = parse("all_reduce", opts, {op = "string"})
  local o = reduce_op("all_reduce", op or opts.op)
  return go(opts, t, function(box) return C.kiln_all_reduce(group_of(opts), t.p, o, box) end)
end

-- broadcast(t[, src = 0][, {src, group, async}]): t of rank src is copied into t on every rank.
function M.broadcast(t, src, opts)
  need_init("dist.broadcast")
  tensor_arg("broadcast", t)
  if type(src) == "table" then src, opts = nil, src end
  opts = parse("broadcast", opts, {src = "number"})
  local root = src or opts.src or 0
  return go(opts, t, function(box) return C.kiln_broadcast(group_of(opts), t.p, root, box) end)
end

-- all_gather(t[, {out, group, async}]): a tensor [size * n, ...] of every rank's t, in rank order.
function M.all_gather(t, opts)
  need_init("dist.all_gather")
  tensor_arg("all_gather", t)
  opts = parse("all_gather", opts, {out = "cdata"})
  local out = opts.out
  if not out then
    local sizes = t:size()
    local n = C.kiln_group_size(group_of(opts))
    if #sizes == 0 then sizes = {n} else sizes[1] = sizes[1] * n end
    out = factory.empty(sizes, {dtype = t:dtype()})
  end
  return go(opts, out, function(box) return C.kiln_all_gather(group_of(opts), out.p, t.p, box) end)
end

-- reduce_scatter(t[, op = "sum"][, {op, out, group, async}]): rank r gets the reduction of block r
-- of t (t's first dim split in size equal blocks).
function M.reduce_scatter(t, op, opts)
  need_init("dist.reduce_scatter")
  tensor_arg("reduce_scatter", t)
  if type(op) == "table" then op, opts = nil, op end
  opts = parse("reduce_scatter", opts, {op = "string", out = "cdata"})
  local o = reduce_op("reduce_scatter", op or opts.op)
  local out = opts.out
  if not out then
    local n = C.kiln_group_size(group_of(opts))
    local sizes = t:size()
    if #sizes == 0 or sizes[1] % n ~= 0 then
      raise(string.format("dist.reduce_scatter: the first dim of %s does not split into %d equal blocks", "[" .. table.concat(t:size(), ", ") .. "]", n))
    end
    sizes[1] = sizes[1] / n
    out = factory.empty(sizes, {dtype = t:dtype()})
  end
  return go(opts, out, function(box) return C.kiln_reduce_scatter(group_of(opts), out.p, t.p, o, box) end)
end

-- barrier([{group, async}]): returns when every rank of the group has entered it.
function M.barrier(opts)
  need_init("dist.barrier")
  opts = parse("barrier", opts, {})
  return go(opts, nil, function(box) return C.kiln_barrier(group_of(opts), box) end)
end

-- send(t, dst[, {tag = 0, group, async}]) and recv(t, src[, {tag, group, async}]): t is filled by recv.
function M.send(t, dst, opts)
  need_init("dist.send")
  tensor_arg("send", t)
  if type(dst) ~= "number" then raise("dist.send: the destination rank must be a number, got " .. type(dst)) end
  opts = parse("send", opts, {tag = "number"})
  return go(opts, t, function(box) return C.kiln_send(group_of(opts), t.p, dst, opts.tag or 0, box) end)
end

function M.recv(t, src, opts)
  need_init("dist.recv")
  tensor_arg("recv", t)
  if type(src) ~= "number" then raise("dist.recv: the source rank must be a number, got " .. type(src)) end
  opts = parse("recv", opts, {tag = "number"})
  return go(opts, t, function(box) return C.kiln_recv(group_of(opts), t.p, src, opts.tag or 0, box) end)
end

-- raw_all_reduce(t[, {group}]): the engine's own all-reduce (sum), for benchmarks.
function M.raw_all_reduce(t, opts)
  need_init("dist.raw_all_reduce")
  tensor_arg("raw_all_reduce", t)
  opts = parse("raw_all_reduce", opts, {})
  check(C.kiln_dist_raw_all_reduce(group_of(opts), t.p))
  return t
end

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
  need_init("DataParallel")
  if not nn.is_module(model) then raise("DataParallel: expected a module, got " .. core.describe(model)) end
  opts = core.options(opts, dp_options, "DataParallel")
  local group = opts.group or M.world()
  self.module = model
  if opts.broadcast ~= false then
    for _, np in ipairs(model:named_parameters()) do
      local p = np[2]
      if not p:is_contiguous() then raise("DataParallel: parameter " .. np[1] .. " is not contiguous") end
      M.broadcast(p.requires_grad and p:detach() or p, 0, {group = group})
    end
    for _, nb in ipairs(model:named_buffers()) do M.broadcast(nb[2], 0, {group = group}) end
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
  local all = M.all_gather(factory.cat({mine, loss_sum:to(mine:dtype())}, 1):view(1, -1), {group = group})
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
  need_init("ShardedOptimizer")
  if type(make) ~= "function" then raise("ShardedOptimizer: expected an optimizer constructor (optim.Adam, ...), got " .. type(make)) end
  if type(params) ~= "table" or #params == 0 then raise("ShardedOptimizer: expected a list of parameters") end
  dist_opts = core.options(dist_opts, core.set("group"), "ShardedOptimizer")
  local group = dist_opts.group or M.world()
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
    works[#works + 1] = M.broadcast(p:detach(), self.owner[i], {group = self.group, async = true})
  end
  for _, w in ipairs(works) do w:wait() end
end

-- Send a description (a string) from rank root to all: its length, then its bytes.
local function broadcast_string(text, root, group)
  local len = factory.tensor({text and #text or 0}, {dtype = "i64"})
  M.broadcast(len, root, {group = group})
  local n = len[1]
  if n == 0 then return "" end
  local buf = factory.zeros({n}, {dtype = "u8"})
  if text then ffi.copy(ffi.cast("uint8_t *", buf.p.storage.data) + buf.p.offset, text, n) end
  M.broadcast(buf, root, {group = group})
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
          M.broadcast(t, root, {group = self.group})
          s[key] = t
        end
      end
      if #numbers > 0 then
        local vals = factory.zeros({#numbers}, {dtype = "f64"})
        if root == me then for j, key in ipairs(numbers) do vals[j] = st[key] end end
        M.broadcast(vals, root, {group = self.group})
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

-- ---- the scaling model ----

-- Links written in, per GPU, as alpha (s per message step) and beta (s per byte at the bus
-- bandwidth a collective reaches). Leads, not measurements: NVLink 4 on an 8-GPU H100/H200 board
-- (NCCL's all-reduce bus bandwidth there is of the order of 350-450 GB/s) and one 400 Gb/s
-- InfiniBand NDR port per GPU (50 GB/s, of which about 45 reached).
M.links = {
  nvlink = {alpha = 4e-6, beta = 1 / 400e9},
  infiniband = {alpha = 8e-6, beta = 1 / 45e9},
}

-- The all-reduce time of `bytes` over n GPUs, gpus_per_node to a node. ring: 2(n-1) steps, each
-- at the slowest link's latency, moving 2(n-1)/n of the bytes at the slowest link's bandwidth;
-- tree (NCCL's double binary tree across nodes, a ring inside each): 2 log2(nodes) steps across,
-- the bytes twice at the inter-node bandwidth, plus the intra-node reduce and broadcast.
function M.all_reduce_time(bytes, n, opts)
  opts = opts or {}
  local links, g = opts.links or M.links, math.min(opts.gpus_per_node or 8, n)
  local nodes = math.ceil(n / g)
  local intra, inter = links.nvlink, links.infiniband
  if n == 1 then return 0 end
  local slow = nodes > 1 and inter or intra
  local ring = 2 * (n - 1) * slow.alpha + 2 * (n - 1) / n * bytes * slow.beta
  if nodes == 1 then return ring, "ring" end
  local inside = 2 * (g - 1) * intra.alpha + 2 * (g - 1) / g * bytes * intra.beta
  local tree = inside + 2 * math.log(nodes) / math.log(2) * inter.alpha + 2 * bytes * inter.beta / g
  if opts.algorithm == "ring" then return ring, "ring" end
  if opts.algorithm == "tree" then return tree, "tree" end
  if tree < ring then return tree, "tree" end
  return ring, "ring"
end

-- simulate{step_s =, jitter = 0, forward_fraction = 1/3, buckets = {{bytes =, ready =}, ...},
--          gpus = {8, ...}, gpus_per_node = 8, links =, algorithm = "best"|"ring"|"tree", optimizer_s = 0}:
-- the step at each GPU count, with the batch per GPU fixed (weak scaling). Forward takes
-- forward_fraction of the measured single-GPU step, backward the rest; bucket k is ready at the
-- fraction `ready` of backward and its all-reduce starts then or when the previous one ends,
-- whichever is later (one at a time, in order, as kiln and PyTorch's DDP run them). The step ends
-- when backward and the last all-reduce are both done, then the optimizer runs. Every all-reduce
-- waits for the slowest of the n GPUs: with step times of coefficient of variation `jitter`, the
-- expected maximum of n is about the mean plus jitter * step * sqrt(2 ln n), which the step pays
-- once. Efficiency is the single-GPU step over the step at n.
function M.simulate(o)
  if type(o) ~= "table" or type(o.step_s) ~= "number" or type(o.buckets) ~= "table" then
    raise("dist.simulate: expected {step_s = seconds, buckets = {{bytes =, ready =}, ...}, gpus = {...}}")
  end
  local fwd = o.step_s * (o.forward_fraction or 1 / 3)
  local bwd = o.step_s - fwd
  local rows = {}
  for _, n in ipairs(o.gpus or {8, 16, 32, 64, 128, 256}) do
    local t_comm, algo = fwd, nil
    for _, b in ipairs(o.buckets) do
      local d
      d, algo = M.all_reduce_time(b.bytes, n, o)
      t_comm = math.max(t_comm, fwd + b.ready * bwd) + d
    end
    local straggle = (o.jitter or 0) * o.step_s * math.sqrt(2 * math.log(n))
    local step = math.max(fwd + bwd, t_comm) + straggle + (o.optimizer_s or 0)
    local single = o.step_s + (o.optimizer_s or 0)
    rows[#rows + 1] = {gpus = n, step_s = step, efficiency = single / step, exposed_comm_s = step - single - straggle,
                       straggler_s = straggle, algorithm = algo or "none"}
  end
  return rows
end

-- buckets_of(param_bytes, {bucket_mb = 25, first_bucket_mb = 1}): DataParallel's buckets for
-- parameters of these sizes (in the model's order), each ready when backward has reached its last
-- parameter, taking backward to go through the parameters evenly by size, last first.
function M.buckets_of(param_bytes, opts)
  opts = opts or {}
  local cap, first = (opts.bucket_mb or 25) * 2 ^ 20, (opts.first_bucket_mb or 1) * 2 ^ 20
  local total = 0
  for _, b in ipairs(param_bytes) do total = total + b end
  local buckets, bytes, done = {}, 0, 0
  for i = #param_bytes, 1, -1 do
    bytes, done = bytes + param_bytes[i], done + param_bytes[i]
    local limit = #buckets == 0 and first or cap
    if bytes >= limit or i == 1 then
      buckets[#buckets + 1] = {bytes = bytes, ready = done / total}
      bytes = 0
    end
  end
  return buckets
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
  local rank = opts.rank or (M.is_initialized() and M.rank() or 0)
  local size = opts.world_size or (M.is_initialized() and M.world_size() or 1)
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
  local rank = opts.rank or (M.is_initialized() and M.rank() or 0)
  local size = opts.world_size or (M.is_initialized() and M.world_size() or 1)
  local base, extra = math.floor(n / size), n % size
  local first = rank * base + math.min(rank, extra) + 1
  return first, base + (rank < extra and 1 or 0)
end

M.Group, M.Work = Group, Work
return M
