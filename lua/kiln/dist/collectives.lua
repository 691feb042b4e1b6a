-- kiln.dist.collectives: set-up, process groups, work handles and the collectives of kiln.dist,
-- across the ranks of a job started by `kiln launch` or `mpirun`.
--   local dist = kiln.dist
--   dist.init()
--   dist.all_reduce(t, "mean")          -- t changes in place on every rank
--   if dist.rank() == 0 then print(t) end
-- Ranks are the engine's, from 0 (rank 0 is the root that broadcasts parameters and writes
-- checkpoints); they are names of processes, not positions in a Lua table. Tensors are CPU
-- tensors; each collective has a deadline (set_timeout), after which it raises an error naming the
-- collective, the group, the shape and the ranks that had not arrived. CUDA tensors travel by NCCL.
local core = require "kiln.core"
local factory = require "kiln.factory"
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

M.need_init = need_init
M.Group, M.Work = Group, Work
return M
