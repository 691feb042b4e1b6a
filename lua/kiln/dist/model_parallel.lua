-- kiln.dist.model_parallel: layers whose weights are split across the ranks of a group, for layers
-- too large for one device (Megatron-LM's tensor parallelism, and the split recurrent layers of
-- the speech models that trained on 128 GPUs):
--   ColumnParallelLinear: each rank holds out_features / n rows of the weight; the input is the
--     same on every rank, the output is split by features (or gathered);
--   RowParallelLinear: each rank holds in_features / n columns; the input is split by features,
--     the output is the all-reduced sum;
--   a ColumnParallelLinear followed by a RowParallelLinear costs one all-reduce forward and one
--   backward;
--   ParallelLSTM, ParallelGRU: each layer's hidden units split across ranks: every step computes
--     this rank's units' gates from the whole previous h, then all-gathers h (one all-gather per
--     step forward, the matching reduce-scatter backward).
-- Their state dicts hold the whole weights under nn.Linear's and nn.LSTM's names (gathered, a
-- collective), so they load into the single-process layers, and load_state_dict takes those.
local core = require "kiln.core"
local factory = require "kiln.factory"
local autograd = require "kiln.autograd"
local nn = require "kiln.nn"
local dist = require "kiln.dist.collectives"
local raise = core.raise

local M = {}

-- ---- the communication, as autograd functions ----

local function sum_over(x, group) return dist.all_reduce(x:contiguous():clone(), "sum", {group = group}) end

-- Every rank's x side by side along the last dim, in rank order.
local function gather_last(x, group)
  local d = x:dim()
  local moved = x:transpose(1, d):contiguous()              -- the last dim first
  local all = dist.all_gather(moved, {group = group})       -- [n * w, ...]
  return all:transpose(1, d):contiguous()
end

-- This rank's block of the last dim.
local function own_slice(x, group)
  local n, r = group:size(), group:rank()
  local w = x:size(-1) / n
  return x:narrow(x:dim(), r * w + 1, w):contiguous()
end

-- The sum over ranks of x, each rank keeping its block of the last dim.
local function reduce_scatter_last(x, group)
  local d = x:dim()
  local moved = x:transpose(1, d):contiguous()
  return dist.reduce_scatter(moved, "sum", {group = group}):transpose(1, d):contiguous()
end

-- An autograd function over a group: forward(x, group) and backward(g, group), each a function of
-- the tensor and the group (the group itself gets no grad).
local function group_function(name, forward, backward)
  local f = autograd.Function(name)
  function f.forward(ctx, x, group)
    ctx.group = group
    return forward(x, group)
  end
  function f.backward(ctx, g) return backward(g, ctx.group), nil end
  return f
end

-- forward: x as it is; backward: the sum of every rank's grad (x fed computations that differ
-- from rank to rank).
local CopyToGroup = group_function("CopyToModelParallel", function(x) return x:clone() end, sum_over)
-- forward: the sum over ranks; backward: the grad as it is (every rank's copy is the same).
local ReduceFromGroup = group_function("ReduceFromModelParallel", sum_over, function(g) return g end)
-- forward: every rank's x along the last dim; backward: this rank's block of the grad. For an
-- output that every rank then uses the same way (the gathered output of a layer).
local GatherFromGroup = group_function("GatherFromModelParallel", gather_last, own_slice)
-- forward: every rank's x along the last dim; backward: the sum of every rank's grad, this
-- rank's block of it. For a value each rank uses differently (the h of a split recurrent layer,
-- which each rank multiplies by its own rows of the weights).
local GatherPartial = group_function("GatherHiddenModelParallel", gather_last, reduce_scatter_last)
-- forward: this rank's block of the last dim; backward: every rank's grad block side by side.
local ScatterToGroup = group_function("ScatterToModelParallel", own_slice, gather_last)

M.copy_to_group = function(x, group) return CopyToGroup.apply(x, group or dist.world()) end
M.reduce_from_group = function(x, group) return ReduceFromGroup.apply(x, group or dist.world()) end
M.gather_from_group = function(x, group) return GatherFromGroup.apply(x, group or dist.world()) end
M.scatter_to_group = function(x, group) return ScatterToGroup.apply(x, group or dist.world()) end

-- ---- helpers ----

local function group_and_share(what, size, opts)
  dist.need_init(what)
  local group = opts.group or dist.world()
  local n = group:size()
  if size % n ~= 0 then
    raise(string.format("%s: %d does not split into %d equal shares (one per rank of group %s)", what, size, n, tostring(group)))
  end
  return group, n, group:rank(), size / n
end

-- The whole tensor from every rank's block along dim (blocks in rank order).
local function gather_dim(t, dim, group)
  local moved = t:transpose(1, dim):contiguous()
  return dist.all_gather(moved, {group = group}):transpose(1, dim):contiguous()
end

-- Copy src into the parameter dst (its values, not its identity), shapes checked.
local function copy_into(dst, src, name)
  local a, b = dst:size(), src:size()
  if table.concat(a, ",") ~= table.concat(b, ",") then
    raise(string.format("load_state_dict: %s is [%s], the layer's share needs [%s]", name, table.concat(b, ","), table.concat(a, ",")))
  end
  autograd.no_grad(function() dst:detach():copy_(src) end)
end

-- ---- Linear ----

-- The share of an nn.Linear(in, out) this rank keeps, its weight cut along dim (1: rows, the
-- outputs; 2: columns, the inputs); the bias is cut with the rows, whole with the columns. The
-- whole layer is drawn as nn.Linear draws it (same seed, same weights on every rank).
local function split_linear(self, name, in_features, out_features, opts, dim)
  local group, _, r, share = group_and_share(name, dim == 1 and out_features or in_features, opts)
  local full = nn.Linear(in_features, out_features, {bias = opts.bias ~= false})
  if opts.dtype then full:to(opts.dtype) end
  self.in_features, self.out_features = in_features, out_features
  self._group, self._share, self._dim = group, share, dim
  self.weight = self:parameter(full.weight:narrow(dim, r * share + 1, share):contiguous())
  if full.bias then
    self.bias = self:parameter(dim == 1 and full.bias:narrow(1, r * share + 1, share):contiguous() or full.bias:clone())
  end
end

-- The whole weights under nn.Linear's names (a collective), and loading them back.
local function linear_state_dict(self)
  local sd = {weight = gather_dim(self.weight:detach(), self._dim, self._group)}
  if self.bias then
    sd.bias = self._dim == 1 and gather_dim(self.bias:detach(), 1, self._group) or self.bias:detach():clone()
  end
  return sd
end

local function linear_load_state_dict(self, sd)
  local r, share = self._group:rank(), self._share
  copy_into(self.weight, sd.weight:narrow(self._dim, r * share + 1, share), "weight")
  if self.bias then copy_into(self.bias, self._dim == 1 and sd.bias:narrow(1, r * share + 1, share) or sd.bias, "bias") end
end

local Column = nn.define("ColumnParallelLinear")
M.ColumnParallelLinear, nn.ColumnParallelLinear = nn.ColumnParallelLinear, nil
local column_options = core.set("bias", "gather_output", "group", "dtype")

-- ColumnParallelLinear(in, out[, {bias = true, gather_output = true, group}]): y = x W^T + b with W's
-- rows split across ranks.
function Column:init(in_features, out_features, opts)
  opts = core.options(opts, column_options, "ColumnParallelLinear")
  split_linear(self, "ColumnParallelLinear", in_features, out_features, opts, 1)
  self.gather_output = opts.gather_output ~= false
end

function Column:forward(x)
  local y = M.copy_to_group(x, self._group):matmul(self.weight:t())
  if self.bias then y = y + self.bias end
  if self.gather_output then y = GatherFromGroup.apply(y, self._group) end
  return y
end

Column.state_dict, Column.load_state_dict = linear_state_dict, linear_load_state_dict

function Column:extra_repr()
  return string.format("%d -> %d, %d per rank%s", self.in_features, self.out_features, self._share,
                       self.gather_output and ", gathered" or "")
end

local Row = nn.define("RowParallelLinear")
M.RowParallelLinear, nn.RowParallelLinear = nn.RowParallelLinear, nil
local row_options = core.set("bias", "input_is_parallel", "group", "dtype")

-- RowParallelLinear(in, out[, {bias = true, input_is_parallel = true, group}]): y = x W^T + b with
-- W's columns split across ranks; x is this rank's block of the features (input_is_parallel, as a
-- ColumnParallelLinear without gather_output gives it) or the whole x, split here.
function Row:init(in_features, out_features, opts)
  opts = core.options(opts, row_options, "RowParallelLinear")
  split_linear(self, "RowParallelLinear", in_features, out_features, opts, 2)
  self.input_is_parallel = opts.input_is_parallel ~= false
end

function Row:forward(x)
  if not self.input_is_parallel then x = ScatterToGroup.apply(x, self._group) end
  local y = ReduceFromGroup.apply(x:matmul(self.weight:t()), self._group)
  if self.bias then y = y + self.bias end
  return y
end

Row.state_dict, Row.load_state_dict = linear_state_dict, linear_load_state_dict

function Row:extra_repr()
  return string.format("%d -> %d, %d inputs per rank", self.in_features, self.out_features, self._share)
end

-- ---- recurrent layers, hidden units split across ranks ----

-- The rows of this rank's units in a [G * H, ...] gate-stacked weight: G blocks of share rows.
local function gate_rows(t, G, H, r, share)
  local sizes = t:size()
  local rest = {}
  for d = 2, #sizes do rest[#rest + 1] = sizes[d] end
  local v = t:reshape(G, H, unpack(rest))
  local mine = v:narrow(2, r * share + 1, share):contiguous()
  return mine:reshape(G * share, unpack(rest))
end

-- The whole [G * H, ...] weight from every rank's [G * share, ...] rows (a collective).
local function gather_gate_rows(t, G, group)
  local sizes = t:size()
  local rest = {}
  for d = 2, #sizes do rest[#rest + 1] = sizes[d] end
  local share = sizes[1] / G
  local whole = gather_dim(t:reshape(G, share, unpack(rest)), 2, group)
  return whole:reshape(G * share * group:size(), unpack(rest))
end

local recurrent_options = core.set("num_layers", "bias", "group", "dtype")
local GATES = {LSTM = 4, GRU = 3}

local function define_recurrent(mode)
  local name = "Parallel" .. mode
  local class = nn.define(name)
  M[name], nn[name] = nn[name], nil
  local G = GATES[mode]

  -- ParallelLSTM / ParallelGRU(input_size, hidden_size[, {num_layers = 1, bias = true, group}]): as
  -- nn.LSTM / nn.GRU (x [T, B, input], gates in PyTorch's order), each layer's hidden units split
  -- across the group's ranks. The whole weights are drawn as nn's layer draws them (the same seed
  -- gives the same weights), then each rank keeps its units' rows.
  function class:init(input_size, hidden_size, opts)
    opts = core.options(opts, recurrent_options, name)
    local group, n, r, share = group_and_share(name, hidden_size, opts)
    local full = nn[mode](input_size, hidden_size, {num_layers = opts.num_layers or 1, bias = opts.bias ~= false,
                                                   dtype = opts.dtype})
    self.mode, self.input_size, self.hidden_size, self.num_layers = mode, input_size, hidden_size, opts.num_layers or 1
    self.bias = opts.bias ~= false
    self._group, self._share = group, share
    for l = 0, self.num_layers - 1 do
      local sfx = "_l" .. l
      self["weight_ih" .. sfx] = self:parameter(gate_rows(full["weight_ih" .. sfx], G, hidden_size, r, share))
      self["weight_hh" .. sfx] = self:parameter(gate_rows(full["weight_hh" .. sfx], G, hidden_size, r, share))
      if self.bias then
        self["bias_ih" .. sfx] = self:parameter(gate_rows(full["bias_ih" .. sfx], G, hidden_size, r, share))
        self["bias_hh" .. sfx] = self:parameter(gate_rows(full["bias_hh" .. sfx], G, hidden_size, r, share))
      end
    end
  end

  -- One layer over x [T, B, in] (the same on every rank) from h0 [B, H] (and c0 for the LSTM):
  -- the output [T, B, H] and the last h and c, whole on every rank.
  local function layer(self, l, x, h0, c0)
    local group, share, r = self._group, self._share, self._group:rank()
    local sfx = "_l" .. l
    local w_ih, w_hh = self["weight_ih" .. sfx], self["weight_hh" .. sfx]
    local b_ih, b_hh = self["bias_ih" .. sfx], self["bias_hh" .. sfx]
    local T, B = x:size(1), x:size(2)
    local xw = M.copy_to_group(x, group):reshape(T * B, x:size(3)):matmul(w_ih:t())
    if b_ih then xw = xw + b_ih end
    xw = xw:reshape(T, B, G * share)
    -- a given first state that needs a grad is used differently on each rank: its grad is the sum
    if h0.requires_grad then h0 = M.copy_to_group(h0, group) end
    if c0 and c0.requires_grad then c0 = M.copy_to_group(c0, group) end
    local h = h0                                           -- whole [B, H]
    local h_mine = h0:narrow(2, r * share + 1, share)      -- this rank's units
    local c = c0 and c0:narrow(2, r * share + 1, share)
    local outs = {}
    for t = 1, T do
      local hw = h:matmul(w_hh:t())
      if b_hh then hw = hw + b_hh end
      local gi = xw[t]
      if mode == "LSTM" then
        local z = gi + hw
        local i, f = z:narrow(2, 1, share):sigmoid(), z:narrow(2, share + 1, share):sigmoid()
        local g, o = z:narrow(2, 2 * share + 1, share):tanh(), z:narrow(2, 3 * share + 1, share):sigmoid()
        c = f * c + i * g
        h_mine = o * c:tanh()
      else
        local rg = (gi:narrow(2, 1, share) + hw:narrow(2, 1, share)):sigmoid()
        local zg = (gi:narrow(2, share + 1, share) + hw:narrow(2, share + 1, share)):sigmoid()
        local ng = (gi:narrow(2, 2 * share + 1, share) + rg * hw:narrow(2, 2 * share + 1, share)):tanh()
        h_mine = (1 - zg) * ng + zg * h_mine
      end
      outs[t] = h_mine
      if t < T then h = GatherPartial.apply(h_mine, group) end   -- the one all-gather of the step
    end
    local out = GatherFromGroup.apply(factory.stack(outs, 1), group)   -- [T, B, H]
    return out, out[T], c and GatherFromGroup.apply(c, group)
  end

  -- forward(x[, state]): output [T, B, H] and h_n [layers, B, H] (LSTM: {h_n, c_n}), as nn's.
  function class:forward(x, state)
    local L, B, H = self.num_layers, x:size(2), self.hidden_size
    local h0, c0
    if mode == "LSTM" and state then h0, c0 = state[1], state[2] elseif state then h0 = state end
    local zeros = factory.zeros(L, B, H, {dtype = x:dtype()})
    h0 = h0 or zeros
    if mode == "LSTM" then c0 = c0 or zeros end
    local hs, cs = {}, {}
    local out = x
    for l = 0, L - 1 do
      local hn, cn
      out, hn, cn = layer(self, l, out, h0[l + 1], c0 and c0[l + 1])
      hs[l + 1], cs[l + 1] = hn, cn
    end
    local h_n = factory.stack(hs, 1)
    if mode == "LSTM" then return out, {h_n, factory.stack(cs, 1)} end
    return out, h_n
  end

  -- The whole weights under nn's names (a collective: every rank calls it).
  function class:state_dict()
    local sd = {}
    for l = 0, self.num_layers - 1 do
      for _, k in ipairs{"weight_ih", "weight_hh", "bias_ih", "bias_hh"} do
        local p = self[k .. "_l" .. l]
        if p then sd[k .. "_l" .. l] = gather_gate_rows(p:detach(), G, self._group) end
      end
    end
    return sd
  end

  function class:load_state_dict(sd)
    local r, share = self._group:rank(), self._share
    for l = 0, self.num_layers - 1 do
      for _, k in ipairs{"weight_ih", "weight_hh", "bias_ih", "bias_hh"} do
        local key = k .. "_l" .. l
        local p = self[key]
        if p then
          if sd[key] == nil then raise("load_state_dict: " .. key .. " is missing") end
          copy_into(p, gate_rows(sd[key], G, self.hidden_size, r, share), key)
        end
      end
    end
  end

  function class:extra_repr()
    return string.format("%d, %d, %d layer(s), %d units per rank", self.input_size, self.hidden_size, self.num_layers,
                         self._share)
  end
end
define_recurrent("LSTM")
define_recurrent("GRU")

-- full_state_dict(model): model's state dict with each model-parallel layer's whole weights
-- (gathered: every rank calls it), so that it loads into the same model built of nn's layers.
function M.full_state_dict(model)
  local sd = model:state_dict()
  local function walk(m, prefix)
    if rawget(m, "_group") and rawget(m, "_share") and m.state_dict ~= nn.Module.state_dict then
      for k, v in pairs(m:state_dict()) do sd[prefix .. k] = v end
      return
    end
    for _, k in ipairs(m._child_names or {}) do walk(m._children[k], prefix .. k .. ".") end
  end
  walk(model, "")
  return sd
end

return M
