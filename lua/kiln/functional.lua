-- kiln.functional: the fused neural-network ops with PyTorch's torch.nn.functional names and
-- arguments, options in a trailing table: F.conv2d(x, w, b, {stride = 2, padding = 1}).
-- As everywhere in kiln's Lua API, dims count from 1 (-1 is the last) and so do class labels:
-- F.cross_entropy(logits, labels) takes labels 1..C (and ignore_index in the same counting).
local ffi = require "ffi"
local core = require "kiln.core"
local C = core.C
local wrap, cdim, raise, is_tensor = core.wrap, core.cdim, core.raise, core.is_tensor

local F = {}

-- ---- argument helpers ----

local function integer(v, what)
  if type(v) ~= "number" or v ~= math.floor(v) then raise(string.format("%s must be an integer, got %s", what, tostring(v))) end
  return v
end

-- A size that is one number for both dims, or {h, w}.
local function pair(v, what)
  if type(v) == "number" then integer(v, what) return v, v end
  if type(v) == "table" and #v == 2 then return integer(v[1], what), integer(v[2], what) end
  raise(string.format("%s must be a number or a pair {h, w}, got %s", what, tostring(v)))
end

-- The trailing options table, checked against the names the op knows.
local options, set = core.options, core.set

local function tensor(x, what, op)
  if not is_tensor(x) then raise(string.format("%s: %s must be a tensor, got %s", op, what, type(x))) end
  return x
end

local function optional_tensor(x, what, op)
  if x == nil then return nil end
  return tensor(x, what, op).p
end

-- (a, b, opts) where b may be left out: the options are the first plain table.
local function split_optional(b, opts)
  if opts == nil and type(b) == "table" and not is_tensor(b) then return nil, b end
  return b, opts
end

local reductions = {none = C.KILN_REDUCTION_NONE, mean = C.KILN_REDUCTION_MEAN, sum = C.KILN_REDUCTION_SUM}
local function reduction(r, op)
  local v = reductions[r or "mean"]
  if not v then raise(string.format("%s: reduction %q (expected \"none\", \"mean\" or \"sum\")", op, tostring(r))) end
  return v
end

-- ---- convolution ----

-- padding: a number, {h, w}, "valid" (none) or "same" (stride 1; the output keeps the input's size).
local function conv_padding(p, w, dh, dw, sh, sw, op)
  if p == "valid" then return 0, 0 end
  if p == "same" then
    if sh ~= 1 or sw ~= 1 then raise(op .. ": padding \"same\" needs stride 1") end
    local eh, ew = dh * (tonumber(w.p.sizes[2]) - 1), dw * (tonumber(w.p.sizes[3]) - 1)
    if eh % 2 ~= 0 or ew % 2 ~= 0 then
      raise(op .. ": padding \"same\" needs an odd (dilated) kernel; pad the input by hand for an even one")
    end
    return eh / 2, ew / 2
  end
  return pair(p or 0, op .. ": padding")
end

local conv_opts = set("stride", "padding", "dilation", "groups")

-- conv2d(input [N,C,H,W], weight [O,C/groups,kh,kw], bias [O] or nil, {stride, padding, dilation, groups})
local function conv_call(fn, op, x, w, b, opts)
  b, opts = split_optional(b, opts)
  opts = options(opts, conv_opts, op)
  tensor(x, "input", op) tensor(w, "weight", op)
  local sh, sw = pair(opts.stride or 1, op .. ": stride")
  local dh, dw = pair(opts.dilation or 1, op .. ": dilation")
  local ph, pw = conv_padding(opts.padding, w, dh, dw, sh, sw, op)
  return wrap(fn(x.p, w.p, optional_tensor(b, "bias", op), sh, sw, ph, pw, dh, dw, integer(opts.groups or 1, op .. ": groups")))
end
function F.conv2d(x, w, b, opts) return conv_call(C.kiln_conv2d, "conv2d", x, w, b, opts) end

-- conv2d_relu_max_pool2d(input, weight, bias, {stride, padding, dilation, groups}): max_pool2d(relu(conv2d(...)), 2)
-- as one kernel where kiln has one (f32 and bf16 on a CPU with AVX-512: docs/cpu.md), the three
-- ops elsewhere; the result and the grads are the same bits either way. nn.Sequential calls it for
-- a Conv2d, ReLU, MaxPool2d(2) run of layers.
function F.conv2d_relu_max_pool2d(x, w, b, opts)
  return conv_call(C.kiln_conv2d_relu_max_pool2d, "conv2d_relu_max_pool2d", x, w, b, opts)
end

-- conv1d(input [N,C,L], weight [O,C/groups,k], bias, {stride, padding, dilation, groups}): conv2d with H = 1.
function F.conv1d(x, w, b, opts)
  b, opts = split_optional(b, opts)
  opts = options(opts, conv_opts, "conv1d")
  tensor(x, "input", "conv1d") tensor(w, "weight", "conv1d")
  if x.p.ndim ~= 3 then raise(string.format("conv1d: input %s has %d dims (expected 3: [N,C,L])", tostring(x:size()), x.p.ndim)) end
  if w.p.ndim ~= 3 then raise(string.format("conv1d: weight %s has %d dims (expected 3: [out,in/groups,k])", tostring(w:size()), w.p.ndim)) end
  local padding = opts.padding or 0
  if type(padding) == "number" then padding = {0, padding} end
  local y = F.conv2d(x:unsqueeze(3), w:unsqueeze(3), b, {stride = {1, integer(opts.stride or 1, "conv1d: stride")},
                     padding = padding, dilation = {1, integer(opts.dilation or 1, "conv1d: dilation")},
                     groups = opts.groups})
  return y:squeeze(3)
end

-- conv_transpose2d(input [N,C,H,W], weight [C,O/groups,kh,kw], bias [O] or nil,
--                  {stride, padding, output_padding, groups, dilation})
local conv_transpose2d_options = set("stride", "padding", "output_padding", "groups", "dilation")   -- the options conv_transpose2d knows
function F.conv_transpose2d(x, w, b, opts)
  b, opts = split_optional(b, opts)
  opts = options(opts, conv_transpose2d_options, "conv_transpose2d")
  tensor(x, "input", "conv_transpose2d") tensor(w, "weight", "conv_transpose2d")
  local sh, sw = pair(opts.stride or 1, "conv_transpose2d: stride")
  local ph, pw = pair(opts.padding or 0, "conv_transpose2d: padding")
  local oh, ow = pair(opts.output_padding or 0, "conv_transpose2d: output_padding")
  local dh, dw = pair(opts.dilation or 1, "conv_transpose2d: dilation")
  return wrap(C.kiln_conv_transpose2d(x.p, w.p, optional_tensor(b, "bias", "conv_transpose2d"), sh, sw, ph, pw, oh, ow,
                                      dh, dw, integer(opts.groups or 1, "conv_transpose2d: groups")))
end

-- ---- pooling ----

-- (x, kernel_size, stride, opts) or (x, kernel_size, opts): stride defaults to the kernel size.
local function pool_args(stride, opts)
  if type(stride) == "table" and #stride == 0 and opts == nil then return nil, stride end
  return stride, opts
end

-- max_pool2d(input, kernel_size, [stride], {stride, padding, dilation, ceil_mode})
local max_pool2d_options = set("stride", "padding", "dilation", "ceil_mode")   -- the options max_pool2d knows
function F.max_pool2d(x, k, stride, opts)
  stride, opts = pool_args(stride, opts)
  opts = options(opts, max_pool2d_options, "max_pool2d")
  tensor(x, "input", "max_pool2d")
  local kh, kw = pair(k, "max_pool2d: kernel_size")
  local sh, sw = pair(stride or opts.stride or {kh, kw}, "max_pool2d: stride")
  local ph, pw = pair(opts.padding or 0, "max_pool2d: padding")
  local dh, dw = pair(opts.dilation or 1, "max_pool2d: dilation")
  return wrap(C.kiln_max_pool2d(x.p, kh, kw, sh, sw, ph, pw, dh, dw, opts.ceil_mode and 1 or 0))
end

-- avg_pool2d(input, kernel_size, [stride], {stride, padding, ceil_mode, count_include_pad = true})
local avg_pool2d_options = set("stride", "padding", "ceil_mode", "count_include_pad")   -- the options avg_pool2d knows
function F.avg_pool2d(x, k, stride, opts)
  stride, opts = pool_args(stride, opts)
  opts = options(opts, avg_pool2d_options, "avg_pool2d")
  tensor(x, "input", "avg_pool2d")
  local kh, kw = pair(k, "avg_pool2d: kernel_size")
  local sh, sw = pair(stride or opts.stride or {kh, kw}, "avg_pool2d: stride")
  local ph, pw = pair(opts.padding or 0, "avg_pool2d: padding")
  return wrap(C.kiln_avg_pool2d(x.p, kh, kw, sh, sw, ph, pw, opts.ceil_mode and 1 or 0,
                                opts.count_include_pad == false and 0 or 1))
end

-- adaptive_avg_pool2d(input, output_size): a number, or {h, w} where either may be nil (keep that size).
function F.adaptive_avg_pool2d(x, size)
  tensor(x, "input", "adaptive_avg_pool2d")
  local nd = x.p.ndim
  local h, w
  if type(size) == "number" then h, w = size, size
  elseif type(size) == "table" then h, w = size[1], size[2]
  else raise("adaptive_avg_pool2d: output_size must be a number or {h, w}, got " .. tostring(size)) end
  if nd >= 2 then
    h = h or tonumber(x.p.sizes[nd - 2])
    w = w or tonumber(x.p.sizes[nd - 1])
  end
  return wrap(C.kiln_adaptive_avg_pool2d(x.p, integer(h, "adaptive_avg_pool2d: output height"),
                                         integer(w, "adaptive_avg_pool2d: output width")))
end

-- ---- normalisation ----

-- batch_norm(input, running_mean, running_var, [weight, bias], {weight, bias, training = false, momentum = 0.1, eps = 1e-5})
-- In training the running stats (when given) are updated in place.
local batch_norm_options = set("weight", "bias", "training", "momentum", "eps")   -- the options batch_norm knows
function F.batch_norm(x, rm, rv, w, b, opts)
  if opts == nil and type(b) == "table" and not is_tensor(b) then b, opts = nil, b end
  if opts == nil and b == nil and type(w) == "table" and not is_tensor(w) then w, opts = nil, w end
  opts = options(opts, batch_norm_options, "batch_norm")
  tensor(x, "input", "batch_norm")
  w, b = w or opts.weight, b or opts.bias
  return wrap(C.kiln_batch_norm(x.p, optional_tensor(w, "weight", "batch_norm"), optional_tensor(b, "bias", "batch_norm"),
                                optional_tensor(rm, "running_mean", "batch_norm"),
                                optional_tensor(rv, "running_var", "batch_norm"), opts.training and 1 or 0,
                                opts.momentum or 0.1, opts.eps or 1e-5))
end

-- layer_norm(input, normalized_shape, [weight, bias], {eps = 1e-5}): over the last #normalized_shape dims.
local layer_norm_options = set("eps")   -- the options layer_norm knows
function F.layer_norm(x, shape, w, b, opts)
  if opts == nil and type(b) == "table" and not is_tensor(b) then b, opts = nil, b end
  if opts == nil and b == nil and type(w) == "table" and not is_tensor(w) then w, opts = nil, w end
  opts = options(opts, layer_norm_options, "layer_norm")
  tensor(x, "input", "layer_norm")
  if type(shape) == "number" then shape = {shape} end
  if type(shape) ~= "table" or #shape == 0 then raise("layer_norm: normalized_shape must be a number or a list of sizes") end
  local k, nd = #shape, x.p.ndim
  local ok = k <= nd
  for i = 1, k do ok = ok and tonumber(x.p.sizes[nd - k + i - 1]) == shape[i] end
  if not ok then
    raise(string.format("layer_norm: normalized_shape [%s] does not match the last dims of input %s",
                        table.concat(shape, ", "), tostring(x:size())))
  end
  return wrap(C.kiln_layer_norm(x.p, k, optional_tensor(w, "weight", "layer_norm"), optional_tensor(b, "bias", "layer_norm"),
                                opts.eps or 1e-5))
end

-- group_norm(input [N,C,...], num_groups, [weight, bias], {eps = 1e-5})
local group_norm_options = set("eps")   -- the options group_norm knows
function F.group_norm(x, groups, w, b, opts)
  if opts == nil and type(b) == "table" and not is_tensor(b) then b, opts = nil, b end
  if opts == nil and b == nil and type(w) == "table" and not is_tensor(w) then w, opts = nil, w end
  opts = options(opts, group_norm_options, "group_norm")
  tensor(x, "input", "group_norm")
  return wrap(C.kiln_group_norm(x.p, integer(groups, "group_norm: num_groups"), optional_tensor(w, "weight", "group_norm"),
                                optional_tensor(b, "bias", "group_norm"), opts.eps or 1e-5))
end

-- ---- softmax ----

function F.softmax(x, dim)
  tensor(x, "input", "softmax")
  if dim == nil then raise("softmax: give the dim to normalise over (dims count from 1; -1 is the last)") end
  return wrap(C.kiln_softmax(x.p, cdim(x, dim, "softmax")))
end

function F.log_softmax(x, dim)
  tensor(x, "input", "log_softmax")
  if dim == nil then raise("log_softmax: give the dim to normalise over (dims count from 1; -1 is the last)") end
  return wrap(C.kiln_log_softmax(x.p, cdim(x, dim, "log_softmax")))
end

-- ---- losses ----

-- No ignore_index: a C value no label minus one can reach.
local NO_IGNORE = -2 ^ 63

-- Labels count from 1 in Lua and from 0 in C.
local function c_target(t, op)
  if type(t) == "table" and not is_tensor(t) then t = core.from_table(t, "i64") end
  tensor(t, "target", op)
  if t.p.dtype ~= C.KILN_I64 and t.p.dtype ~= C.KILN_I32 then
    raise(string.format("%s: target %s is %s (expected i64 class labels, counting from 1)", op, tostring(t:size()),
                        core.dtype_names[t.p.dtype]))
  end
  return wrap(C.kiln_binary_scalar(C.KILN_OP_SUB, t.p, 1, 0))
end

local function ignore(opts, op)
  if opts.ignore_index == nil then return NO_IGNORE end
  return integer(opts.ignore_index, op .. ": ignore_index") - 1
end

-- nll_loss(log_probs [N,C] or [N,C,d1,...], target [N] or [N,d1,...], [weight], {weight, ignore_index, reduction = "mean"})
local nll_loss_options = set("weight", "ignore_index", "reduction")   -- the options nll_loss knows
function F.nll_loss(x, target, w, opts)
  w, opts = split_optional(w, opts)
  opts = options(opts, nll_loss_options, "nll_loss")
  tensor(x, "input", "nll_loss")
  local t = c_target(target, "nll_loss")
  return wrap(C.kiln_nll_loss(x.p, t.p, optional_tensor(w or opts.weight, "weight", "nll_loss"), ignore(opts, "nll_loss"),
                              reduction(opts.reduction, "nll_loss")))
end

-- cross_entropy(logits [N,C] or [N,C,d1,...], target, [weight], {weight, ignore_index, label_smoothing = 0, reduction = "mean"})
local cross_entropy_options = set("weight", "ignore_index", "label_smoothing", "reduction")   -- the options cross_entropy knows
function F.cross_entropy(x, target, w, opts)
  w, opts = split_optional(w, opts)
  opts = options(opts, cross_entropy_options, "cross_entropy")
  tensor(x, "input", "cross_entropy")
  local t = c_target(target, "cross_entropy")
  return wrap(C.kiln_cross_entropy(x.p, t.p, optional_tensor(w or opts.weight, "weight", "cross_entropy"),
                                   ignore(opts, "cross_entropy"), opts.label_smoothing or 0,
                                   reduction(opts.reduction, "cross_entropy")))
end

-- ---- connectionist temporal classification ----

-- Lengths: a Lua list of integers, or an integer tensor.
local function lengths(v, what, op)
  if type(v) == "table" and not is_tensor(v) then
    for i = 1, #v do integer(v[i], string.format("%s: %s[%d]", op, what, i)) end
    v = #v == 0 and core.from_table({}, "i64") or core.from_table(v, "i64")
  end
  return tensor(v, what, op)
end


-- ctc_loss(log_probs [T,N,C], targets, input_lengths, target_lengths, {blank = 1, reduction = "mean", zero_infinity = false})
-- log_probs: log_softmax over the classes. targets: labels counting from 1 (the blank is a class
-- too, 1 by default), as an [N,S] tensor padded past each target's length, a 1-d tensor or list
-- of the targets concatenated, or a list of lists (then target_lengths may be left out).
-- Lengths: lists or integer tensors [N].
local ctc_loss_options = set("blank", "reduction", "zero_infinity")   -- the options ctc_loss knows
function F.ctc_loss(lp, targets, input_lengths, target_lengths, opts)
  if opts == nil and type(target_lengths) == "table" and not is_tensor(target_lengths) and target_lengths[1] == nil
     and next(target_lengths) ~= nil then
    target_lengths, opts = nil, target_lengths
  end
  opts = options(opts, ctc_loss_options, "ctc_loss")
  tensor(lp, "log_probs", "ctc_loss")
  if type(targets) == "table" and not is_tensor(targets) and type(targets[1]) == "table" then
    local flat, lens = {}, {}
    for i, seq in ipairs(targets) do
      lens[i] = #seq
      for _, l in ipairs(seq) do flat[#flat + 1] = integer(l, "ctc_loss: a target label") end
    end
    targets, target_lengths = flat, target_lengths or lens
  end
  if type(targets) == "table" and not is_tensor(targets) and #targets == 0 then targets = core.from_table({}, "i64") end
  if target_lengths == nil then raise("ctc_loss: give target_lengths (or the targets as a list of lists)") end
  local t = c_target(targets, "ctc_loss")
  local il = lengths(input_lengths, "input_lengths", "ctc_loss")
  local tl = lengths(target_lengths, "target_lengths", "ctc_loss")
  local blank = integer(opts.blank or 1, "ctc_loss: blank") - 1
  local p = C.kiln_ctc_loss(lp.p, t.p, il.p, tl.p, blank, reduction(opts.reduction, "ctc_loss"), opts.zero_infinity and 1 or 0)
  -- samples, positions and labels in the message count from 1 (core.lua_message)
  if p == nil then raise(core.lua_message(core.ffi.string(C.kiln_error_message()))) end
  return wrap(p)
end

-- The log-probabilities of a [T,N,C] tensor as nested Lua tables [T][N][C], and the input lengths.
local function decode_input(lp, input_lengths, op)
  tensor(lp, "log_probs", op)
  if lp.p.ndim ~= 3 then raise(string.format("%s: log_probs %s has %d dims (expected 3: [T,N,C])", op, tostring(lp:size()), lp.p.ndim)) end
  local T, N = tonumber(lp.p.sizes[0]), tonumber(lp.p.sizes[1])
  local lens = {}
  if input_lengths == nil then
    for n = 1, N do lens[n] = T end
  else
    local l = is_tensor(input_lengths) and input_lengths:totable() or input_lengths
    if type(l) ~= "table" or #l ~= N then raise(string.format("%s: input_lengths must hold %d lengths, one per sample", op, N)) end
    for n = 1, N do
      lens[n] = integer(l[n], op .. ": an input length")
      if lens[n] < 0 or lens[n] > T then raise(string.format("%s: input length %d of sample %d is out of range 0..%d", op, lens[n], n, T)) end
    end
  end
  return lens, T, N
end

-- ctc_greedy_decode(log_probs [T,N,C], [input_lengths], [blank = 1]) -> a list of N label lists:
-- the most likely class at each step, repeats merged, blanks removed; labels count from 1.
function F.ctc_greedy_decode(lp, input_lengths, blank)
  if type(input_lengths) == "number" and blank == nil then input_lengths, blank = nil, input_lengths end
  local lens, _, N = decode_input(lp, input_lengths, "ctc_greedy_decode")
  blank = integer(blank or 1, "ctc_greedy_decode: blank")
  local best = lp:detach():argmax(3):totable()   -- [T][N], classes from 1
  local out = {}
  for n = 1, N do
    local seq, prev = {}, nil
    for t = 1, lens[n] do
      local c = best[t][n]
      if c ~= prev and c ~= blank then seq[#seq + 1] = c end
      prev = c
    end
    out[n] = seq
  end
  return out
end

local NEG_INF = -math.huge
local function log_add(a, b)
  if a < b then a, b = b, a end
  if a == NEG_INF then return a end
  return a + math.log(1 + math.exp(b - a))
end

-- ctc_beam_decode(log_probs [T,N,C], [input_lengths], {beam = 8, blank = 1}) -> sequences, log_probs:
-- prefix beam search in log space (Hannun et al. 2014): each prefix carries the probability of
-- its alignments ending in a blank and in a label; the beam keeps the most likely prefixes at each
-- step. Gives, per sample, the best label list (from 1) and its log-probability (exact when the
-- beam holds every prefix).
local ctc_beam_decode_options = set("beam", "blank")   -- the options ctc_beam_decode knows
function F.ctc_beam_decode(lp, input_lengths, opts)
  if opts == nil and type(input_lengths) == "table" and not is_tensor(input_lengths) and input_lengths[1] == nil then
    input_lengths, opts = nil, input_lengths
  end
  opts = options(opts, ctc_beam_decode_options, "ctc_beam_decode")
  local lens, _, N = decode_input(lp, input_lengths, "ctc_beam_decode")
  local width = integer(opts.beam or 8, "ctc_beam_decode: beam")
  if width < 1 then raise("ctc_beam_decode: beam must be >= 1, got " .. width) end
  local C = tonumber(lp.p.sizes[2])
  local blank = integer(opts.blank or 1, "ctc_beam_decode: blank")
  if blank < 1 or blank > C then raise(string.format("ctc_beam_decode: blank %d is out of range 1..%d", blank, C)) end
  local x = lp:detach():to("f64"):totable()
  local seqs, scores = {}, {}
  for n = 1, N do
    local beams = {{key = "", seq = {}, pb = 0, pnb = NEG_INF}}
    for t = 1, lens[n] do
      local p = x[t][n]
      local nxt, order = {}, {}
      local function entry(key, seq, c)
        local e = nxt[key]
        if not e then
          local s = seq
          if c then s = {unpack(seq)} s[#s + 1] = c end
          e = {key = key, seq = s, pb = NEG_INF, pnb = NEG_INF}
          nxt[key] = e
          order[#order + 1] = e
        end
        return e
      end
      for _, b in ipairs(beams) do
        local total = log_add(b.pb, b.pnb)
        local e = entry(b.key, b.seq)
        e.pb = log_add(e.pb, total + p[blank])
        local last = b.seq[#b.seq]
        for c = 1, C do
          if c ~= blank then
            local ext = entry(b.key .. "," .. c, b.seq, c)
            if c == last then
              -- a repeat needs a blank in between; without one the alignment stays on the prefix
              ext.pnb = log_add(ext.pnb, b.pb + p[c])
              local same = entry(b.key, b.seq)
              same.pnb = log_add(same.pnb, b.pnb + p[c])
            else
              ext.pnb = log_add(ext.pnb, total + p[c])
            end
          end
        end
      end
      for _, e in ipairs(order) do e.score = log_add(e.pb, e.pnb) end
      table.sort(order, function(a, b)
        if a.score ~= b.score then return a.score > b.score end
        return a.key < b.key
      end)
      beams = {}
      for i = 1, math.min(width, #order) do beams[i] = order[i] end
    end
    local best = beams[1]
    for _, b in ipairs(beams) do
      local s = log_add(b.pb, b.pnb)
      if s > log_add(best.pb, best.pnb) then best = b end
    end
    seqs[n], scores[n] = best.seq, log_add(best.pb, best.pnb)
  end
  return seqs, scores
end

-- ---- dropout ----

-- dropout(input, p = 0.5, [training = true]) or dropout(input, {p = 0.5, training = true})
local dropout_options = set("p", "training")   -- the options dropout knows
local dropout_training_options = set("training")   -- and after p
function F.dropout(x, p, training)
  if type(p) == "table" then
    local opts = options(p, dropout_options, "dropout")
    p, training = opts.p, opts.training
  elseif type(training) == "table" then
    training = options(training, dropout_training_options, "dropout").training
  end
  tensor(x, "input", "dropout")
  if p == nil then p = 0.5 end
  if type(p) ~= "number" then raise("dropout: p must be a number, got " .. type(p)) end
  return wrap(C.kiln_dropout(x.p, p, training == false and 0 or 1))
end

-- ---- recurrent layers ----

local rnn_modes = {rnn_tanh = C.KILN_RNN_TANH, rnn_relu = C.KILN_RNN_RELU, gru = C.KILN_RNN_GRU, lstm = C.KILN_RNN_LSTM}
local rnn_algos = {auto = C.KILN_RNN_AUTO, gemm = C.KILN_RNN_GEMM, persistent = C.KILN_RNN_PERSISTENT,
                   cudnn = C.KILN_RNN_CUDNN}
local rnn_algo_names = {[tonumber(C.KILN_RNN_GEMM)] = "gemm", [tonumber(C.KILN_RNN_PERSISTENT)] = "persistent",
                        [tonumber(C.KILN_RNN_CUDNN)] = "cudnn"}

local function rnn_mode(m, op)
  local v = rnn_modes[m]
  if v == nil then raise(string.format("%s: mode %s (expected rnn_tanh, rnn_relu, gru or lstm)", op, tostring(m))) end
  return v
end

local function rnn_algo(a, op)
  local v = rnn_algos[a or "auto"]
  if v == nil then raise(string.format("%s: algorithm %s (expected auto, gemm, persistent or cudnn)", op, tostring(a))) end
  return v
end

-- Sequence lengths as an i64 CPU tensor: a Lua list of numbers or a tensor.
function F.rnn_lengths(lengths, op)
  if lengths == nil then return nil end
  if is_tensor(lengths) then return lengths:to{dtype = "i64", device = "cpu"} end
  if type(lengths) ~= "table" then raise(string.format("%s: lengths must be a list of numbers or a tensor, got %s", op, type(lengths))) end
  return core.from_table(lengths, "i64")
end

-- rnn_layer(mode, input [T,B,I], h0 [B,H] or nil, c0 or nil, w_ih, w_hh, b_ih, b_hh,
--           {lengths =, reverse =, algorithm =}) -> Z [T+S,B,H]: the outputs Z[1..T], the final
-- hidden state Z[T+1] and, for an LSTM, the final cell state Z[T+2] (kiln/rnn.h). With {index =
-- [T,B]} (counting from 1) and w_ih nil, input is a table [V,G*H] of rows already multiplied by
-- w_ih that index names (CPU, f32 or f64; a bf16 layer under bf16 autocast).
local rnn_layer_options = set("lengths", "reverse", "algorithm", "index")   -- the options rnn_layer knows
function F.rnn_layer(mode, x, h0, c0, w_ih, w_hh, b_ih, b_hh, opts)
  opts = options(opts, rnn_layer_options, "rnn_layer")
  local m = rnn_mode(mode, "rnn_layer")
  tensor(x, "input", mode) tensor(w_hh, "weight_hh", mode)
  if opts.index == nil then tensor(w_ih, "weight_ih", mode) end
  local lengths = F.rnn_lengths(opts.lengths, mode)
  if opts.index ~= nil then   -- x is a table of projected rows, index [T,B] (from 1) names each step's
    if w_ih ~= nil then raise(string.format("%s: an index looks the projected input up in x; weight_ih must be nil", mode)) end
    tensor(opts.index, "index", mode)
    local idx = opts.index:to{dtype = "i64", device = "cpu"} - 1
    return wrap(C.kiln_rnn_layer_lookup(m, x.p, idx.p, optional_tensor(h0, "h0", mode), optional_tensor(c0, "c0", mode), w_hh.p,
                                        optional_tensor(b_ih, "bias_ih", mode), optional_tensor(b_hh, "bias_hh", mode),
                                        lengths and lengths.p or nil, opts.reverse and 1 or 0, rnn_algo(opts.algorithm, mode)))
  end
  return wrap(C.kiln_rnn_layer(m, x.p, optional_tensor(h0, "h0", mode), optional_tensor(c0, "c0", mode), w_ih.p, w_hh.p,
                               optional_tensor(b_ih, "bias_ih", mode), optional_tensor(b_hh, "bias_hh", mode),
                               lengths and lengths.p or nil, opts.reverse and 1 or 0, rnn_algo(opts.algorithm, mode)))
end

-- rnn_algorithm(mode, batch, hidden, {dtype =, device =, algorithm =}) -> "gemm", "persistent" or "cudnn", why
function F.rnn_algorithm(mode, batch, hidden, opts)
  opts = opts or {}
  local why = ffi.new("char[256]")
  local a = C.kiln_rnn_choose_algo(rnn_mode(mode, "rnn_algorithm"), batch, hidden, core.dtype(opts.dtype, "rnn_algorithm"),
                                   core.device(opts.device), rnn_algo(opts.algorithm, "rnn_algorithm"), why, 256)
  return rnn_algo_names[tonumber(a)], ffi.string(why)
end

-- ---- composites: ops written with the ops above, their derivatives those of their parts ----

-- linear(x [*, in], weight [out, in], bias [out] or nil): x weight^T + bias, as nn.Linear; one op
-- (kiln_linear): on the CPU in f32 and f64 the product's stores add the bias, elsewhere matmul and
-- add. linear_relu(x, weight, bias): relu(linear(...)) the same way, the same bits as the ops;
-- nn.Sequential calls it for a Linear and a ReLU in a row.
local function linear_call(op, x, w, b, relu)
  tensor(x, "input", op) tensor(w, "weight", op)
  return wrap(C.kiln_linear(x.p, w.p, optional_tensor(b, "bias", op), relu))
end
function F.linear(x, w, b) return linear_call("linear", x, w, b, 0) end
function F.linear_relu(x, w, b) return linear_call("linear_relu", x, w, b, 1) end

local loss_options = set("reduction")
local function reduced(v, r, op)
  if r == nil or r == "mean" then return v:mean() end
  if r == "sum" then return v:sum() end
  if r == "none" then return v end
  raise(string.format('%s: reduction %q (expected "none", "mean" or "sum")', op, tostring(r)))
end
local function same_shape(op, x, y)
  tensor(x, "input", op) tensor(y, "target", op)
  if tostring(x:size()) ~= tostring(y:size()) then
    raise(string.format("%s: input %s and target %s differ in shape", op, tostring(x:size()), tostring(y:size())))
  end
end

-- mse_loss(input, target, {reduction = "mean"}) and l1_loss: the mean (or sum) of (x - y)^2, |x - y|.
function F.mse_loss(x, y, opts)
  opts = options(opts, loss_options, "mse_loss")
  same_shape("mse_loss", x, y)
  return reduced((x - y):square(), opts.reduction, "mse_loss")
end
function F.l1_loss(x, y, opts)
  opts = options(opts, loss_options, "l1_loss")
  same_shape("l1_loss", x, y)
  return reduced((x - y):abs(), opts.reduction, "l1_loss")
end

-- gelu(x, {approximate = "none"}): x * Phi(x) with the error function, or "tanh" for the
-- tanh approximation, as PyTorch's.
local gelu_options = set("approximate")
function F.gelu(x, opts)
  opts = options(opts, gelu_options, "gelu")
  tensor(x, "input", "gelu")
  local a = opts.approximate or "none"
  if a == "none" then return x * ((x * (1 / math.sqrt(2))):erf() + 1) * 0.5 end
  if a == "tanh" then return x * ((x + x:square() * x * 0.044715) * math.sqrt(2 / math.pi)):tanh():add(1) * 0.5 end
  raise(string.format('gelu: approximate %q (expected "none" or "tanh")', tostring(a)))
end

function F.relu(x) return tensor(x, "input", "relu"):relu() end
function F.sigmoid(x) return tensor(x, "input", "sigmoid"):sigmoid() end
function F.tanh(x) return tensor(x, "input", "tanh"):tanh() end

-- one_hot(labels, num_classes): i64 [..., num_classes] with a 1 at each label (labels count from
-- 1, as everywhere in kiln; num_classes defaults to the largest label).
function F.one_hot(labels, num_classes)
  tensor(labels, "labels", "one_hot")
  if labels:dtype() ~= "i64" and labels:dtype() ~= "i32" and labels:dtype() ~= "u8" then
    raise("one_hot: labels must be an integer tensor, got " .. labels:dtype())
  end
  local n = num_classes or (labels:numel() > 0 and labels:max():item() or 0)
  integer(n, "one_hot: num_classes")
  if labels:numel() > 0 and (labels:min():item() < 1 or labels:max():item() > n) then
    raise(string.format("one_hot: labels must be in 1..%d (counting from 1), got %d..%d", n, labels:min():item(),
                        labels:max():item()))
  end
  local classes = wrap(C.kiln_tensor_arange(1, n + 1, 1, C.KILN_I64, labels.p.device))
  return labels:to("i64"):unsqueeze(-1):eq(classes):to("i64")
end

-- ---- padding, resizing, im2col: composites of index_select, cat and scatter_add (their gradients
-- come from those ops, and they run wherever those do) ----

local function shape_of(x) return ffi.string(C.kiln_shape_string(x.p)) end

local function full(sizes, value, like)
  local a = ffi.new("int64_t[?]", math.max(#sizes, 1))
  for i = 1, #sizes do a[i - 1] = sizes[i] end
  return wrap(C.kiln_tensor_full(#sizes, a, value, like.p.dtype, like.p.device))
end

local function cat(parts, d)
  local arr = ffi.new("struct kiln_tensor *[?]", #parts)
  for i = 1, #parts do arr[i - 1] = parts[i].p end
  local r = wrap(C.kiln_cat(#parts, arr, d))
  return r, parts   -- parts stay referenced until the call has returned
end

local function gather_along(x, d, list) return wrap(C.kiln_index_select(x.p, d, core.index_tensor(list, x.p.device).p)) end

local function sizes_of(x)
  local s = {}
  for i = 0, x.p.ndim - 1 do s[i + 1] = tonumber(x.p.sizes[i]) end
  return s
end

-- Where the element at position j (from 0; outside [0, n) in the padding) comes from.
local pad_source = {
  reflect = function(j, n) if j < 0 then return -j elseif j >= n then return 2 * (n - 1) - j end return j end,
  replicate = function(j, n) return j < 0 and 0 or j >= n and n - 1 or j end,
  circular = function(j, n) return j % n end,
}

-- pad(x, pad[, mode = "constant"[, value = 0]]) or pad(x, pad, {mode =, value =}): pad is
-- {left, right, top, bottom, front, back} in PyTorch's order (the last dim first); negative
-- constant pads crop. Modes: constant, reflect (pads < the size), replicate, circular (<= the size).
local pad_options = set("mode", "value")
function F.pad(x, pad, mode, value)
  tensor(x, "input", "pad")
  if type(mode) == "table" then
    local o = options(mode, pad_options, "pad")
    mode, value = o.mode, o.value
  end
  mode = mode or "constant"
  if mode ~= "constant" and not pad_source[mode] then
    raise(string.format('pad: mode %q (expected "constant", "reflect", "replicate" or "circular")', tostring(mode)))
  end
  if mode ~= "constant" and value ~= nil and value ~= 0 then
    raise(string.format("pad: mode %q takes no value (only \"constant\" does)", mode))
  end
  if value ~= nil and type(value) ~= "number" then raise("pad: value must be a number, got " .. core.describe(value)) end
  if type(pad) ~= "table" or #pad % 2 ~= 0 or #pad == 0 then
    raise("pad: pad must be a table of pairs {left, right[, top, bottom, ...]} (the last dim first), got " .. core.describe(pad))
  end
  local m = #pad / 2
  if m > x:dim() then
    raise(string.format("pad: %d pads are %d pairs, for a tensor of %d dims %s", #pad, m, x:dim(), shape_of(x)))
  end
  local y = x
  for k = 1, m do
    local d = x:dim() - k   -- the C dim: the last dim first
    local l, r = integer(pad[2 * k - 1], "pad: pad " .. (2 * k - 1)), integer(pad[2 * k], "pad: pad " .. (2 * k))
    local n = tonumber(y.p.sizes[d])
    if mode == "constant" then
      if n + math.min(l, 0) + math.min(r, 0) < 0 then
        raise(string.format("pad: pads %d and %d crop more than dim %d of size %d (tensor %s)", l, r, d + 1, n, shape_of(x)))
      end
      if l < 0 then y, n, l = wrap(C.kiln_narrow(y.p, d, -l, n + l)), n + l, 0 end
      if r < 0 then y, n, r = wrap(C.kiln_narrow(y.p, d, 0, n + r)), n + r, 0 end
      local parts = {}
      local sizes = sizes_of(y)
      if l > 0 then sizes[d + 1] = l parts[#parts + 1] = full(sizes, value or 0, y) end
      parts[#parts + 1] = y
      if r > 0 then sizes[d + 1] = r parts[#parts + 1] = full(sizes, value or 0, y) end
      if #parts > 1 then y = cat(parts, d) end
    else
      local limit = mode == "circular" and n or n - 1
      if l < 0 or r < 0 or l > limit or r > limit or n == 0 then
        raise(string.format("pad: %s pads %d and %d must be 0 to %d for dim %d of size %d (tensor %s)", mode, l, r,
                            math.max(limit, 0), d + 1, n, shape_of(x)))
      end
      local idx, src = {}, pad_source[mode]
      for j = -l, n - 1 + r do idx[#idx + 1] = src(j, n) end
      y = gather_along(y, d, idx)
    end
  end
  if y == x then return x:clone() end
  return y
end

-- interpolate(x, {size =, scale_factor =, mode = "nearest", align_corners = false}): x [N,C,W],
-- [N,C,H,W] or [N,C,D,H,W] resized to size, or by scale_factor (a number or one per dim), as
-- torch.nn.functional.interpolate. Modes: nearest and nearest-exact (any of the three), linear
-- ([N,C,W]), bilinear and bicubic ([N,C,H,W]), trilinear ([N,C,D,H,W]), area (adaptive average
-- pooling to the output size, any of the three). The source positions are PyTorch's (a given scale
-- is used as given, unless recompute_scale_factor = true). Each dim but area's is resized on its
-- own: index_select of 1, 2 or 4 source lines and their weights, which give the gradient.
local interp_options = set("size", "scale_factor", "mode", "align_corners", "recompute_scale_factor")
local interp_dims = {nearest = {1, 2, 3}, ["nearest-exact"] = {1, 2, 3}, area = {1, 2, 3}, linear = {1}, bilinear = {2},
                     bicubic = {2}, trilinear = {3}}
local interp_inputs = {"[N,C,W]", "[N,C,H,W]", "[N,C,D,H,W]"}
local interp_aligned = {linear = true, bilinear = true, bicubic = true, trilinear = true}

-- x rounded to float, as C's (float) conversion (PyTorch's floorf of a double rounds it first)
local float_box = ffi.new("float[1]")
local function to_float(v)
  float_box[0] = v
  return float_box[0]
end

-- The source index (from 0) of output j along a dim of n, for nearest and nearest-exact, as PyTorch's
-- CPU computes it (its results depend on it where a position is near an integer). [N,C,W] and
-- [N,C,D,H,W]: in float for f32 (and f16, bf16), the scale rounded to float once, nearest-exact's
-- scale * (j + 0.5) - 0.5 rounded once (an fma); in double for f64, the result rounded to float
-- by floorf. [N,C,H,W] (PyTorch's nearest_idx, nearest_exact_idx): in float for every dtype, and
-- nearest copies a dim kept or doubled (j, j // 2) whatever the scale given. Checked against
-- PyTorch 2.15 on every size 1..7 to 1..100, and scale factors, for each dtype and input rank.
local function nearest_source(exact, j, n, out, scale, f64, two_d)
  local fs = to_float(scale)
  if two_d then
    if exact then return math.min(math.floor(to_float((j + 0.5) * fs)), n - 1) end
    if out == n then return j elseif out == 2 * n then return math.floor(j / 2) end
    return math.min(math.floor(to_float(j * fs)), n - 1)
  end
  local r
  if f64 then
    r = exact and math.max(scale * (j + 0.5) - 0.5, 0) + 0.5 or j * scale
  elseif exact then
    r = to_float(math.max(to_float(fs * (j + 0.5) - 0.5), 0) + 0.5)
  else
    r = j * fs
  end
  return math.min(math.floor(to_float(r)), n - 1)
end

-- Keys's cubic convolution weights of the 4 source lines around a position t in [0, 1] past the
-- second, with A = -0.75, as PyTorch's upsample_bicubic2d
local CUBIC_A = -0.75
local function cubic_near(x) return ((CUBIC_A + 2) * x - (CUBIC_A + 3)) * x * x + 1 end
local function cubic_far(x) return ((CUBIC_A * x - 5 * CUBIC_A) * x + 8 * CUBIC_A) * x - 4 * CUBIC_A end

function F.interpolate(x, opts)
  tensor(x, "input", "interpolate")
  opts = options(opts, interp_options, "interpolate")
  local mode = opts.mode or "nearest"
  local spatial = x:dim() - 2
  if spatial < 1 or spatial > 3 then
    raise(string.format("interpolate: input %s has %d dims (expected [N,C,W], [N,C,H,W] or [N,C,D,H,W])", shape_of(x),
                        x:dim()))
  end
  local dims = interp_dims[mode]
  if not dims then
    raise(string.format('interpolate: mode %q (expected "nearest", "nearest-exact", "linear", "bilinear", "bicubic", '
                        .. '"trilinear" or "area")%s', tostring(mode), core.did_you_mean(mode, interp_dims)))
  end
  local fits = false
  for _, k in ipairs(dims) do fits = fits or k == spatial end
  if not fits then
    local want = {}
    for _, k in ipairs(dims) do want[#want + 1] = interp_inputs[k] end
    raise(string.format("interpolate: mode %q needs a %s input, got %s", mode, table.concat(want, " or "), shape_of(x)))
  end
  if not interp_aligned[mode] and opts.align_corners ~= nil then
    raise(string.format('interpolate: align_corners only applies to the modes "linear", "bilinear", "bicubic" and '
                        .. '"trilinear", not %q', mode))
  end
  local align = core.flag(opts.align_corners, false, "interpolate", "align_corners")
  if mode ~= "nearest" and mode ~= "nearest-exact" and not x:is_floating_point() then
    raise(string.format("interpolate: mode %q needs a float input, got %s %s", mode, x:dtype(), shape_of(x)))
  end
  if (opts.size == nil) == (opts.scale_factor == nil) then raise("interpolate: give either size or scale_factor") end
  local function per_dim(v, what)
    if type(v) == "number" then local t = {} for i = 1, spatial do t[i] = v end return t end
    if type(v) == "table" and #v == spatial then return v end
    raise(string.format("interpolate: %s must be a number or %d numbers, got %s", what, spatial, core.describe(v)))
  end
  -- each dim's output size and scale (input positions per output position)
  local outs, scales = {}, {}
  for i = 1, spatial do
    local d = 1 + i
    local n = tonumber(x.p.sizes[d])
    local out, scale
    if opts.size then
      out = integer(per_dim(opts.size, "size")[i], "interpolate: size")
      scale = n / out
    else
      local sf = per_dim(opts.scale_factor, "scale_factor")[i]
      if type(sf) ~= "number" or not (sf > 0) then raise("interpolate: scale_factor must be > 0, got " .. tostring(sf)) end
      out = math.floor(n * sf)
      scale = opts.recompute_scale_factor and n / out or 1 / sf
    end
    if out < 1 or n < 1 then
      raise(string.format("interpolate: dim %d of size %d cannot be resized to %d (input %s)", d + 1, n, out, shape_of(x)))
    end
    outs[i], scales[i] = out, scale
  end
  if mode == "area" then   -- adaptive average pooling: a window per output, PyTorch's bounds
    local s = sizes_of(x)
    local N, Cc = s[1], s[2]
    if spatial == 1 then
      return F.adaptive_avg_pool2d(x:reshape(N, Cc, 1, s[3]), {1, outs[1]}):reshape(N, Cc, outs[1])
    elseif spatial == 2 then
      return F.adaptive_avg_pool2d(x, {outs[1], outs[2]})
    end
    -- a box's mean is the mean over D of the means over (H, W)
    local hw = F.adaptive_avg_pool2d(x:reshape(N, Cc * s[3], s[4], s[5]), {outs[2], outs[3]})
    return F.adaptive_avg_pool2d(hw:reshape(N, Cc, s[3], outs[2] * outs[3]), {outs[1], outs[2] * outs[3]})
             :reshape(N, Cc, outs[1], outs[2], outs[3])
  end
  local f64 = x.p.dtype == C.KILN_F64
  local y = x
  for i = 1, spatial do
    local d = 1 + i
    local n, out, scale = tonumber(x.p.sizes[d]), outs[i], scales[i]
    if out == n and (mode == "linear" or mode == "bilinear" or mode == "trilinear") then
      -- PyTorch's linear modes copy a dim whose size does not change, whatever the scale given
    elseif mode == "nearest" or mode == "nearest-exact" then
      local idx = {}
      for j = 0, out - 1 do idx[j + 1] = nearest_source(mode == "nearest-exact", j, n, out, scale, f64, spatial == 2) end
      y = gather_along(y, d, idx)
    else
      if align then scale = out > 1 and (n - 1) / (out - 1) or 0 end
      local lines, weights = {}, {}   -- per source line k: the index and the weight of each output j
      local taps = mode == "bicubic" and 4 or 2
      for k = 1, taps do lines[k], weights[k] = {}, {} end
      for j = 0, out - 1 do
        if mode == "bicubic" then
          -- the position unclamped (PyTorch's cubic), its floor (floorf) and the fraction past it;
          -- the lines outside [0, n) are the border's
          local src = align and j * scale or scale * (j + 0.5) - 0.5
          local lo = math.min(math.floor(to_float(src)), n - 1)
          local t = math.min(math.max(src - lo, 0), 1)
          local w = {cubic_far(t + 1), cubic_near(t), cubic_near(1 - t), cubic_far(2 - t)}
          for k = 1, 4 do
            lines[k][j + 1] = math.max(math.min(lo + k - 2, n - 1), 0)
            weights[k][j + 1] = w[k]
          end
        else
          local src = align and j * scale or math.max((j + 0.5) * scale - 0.5, 0)
          local lo = math.min(math.floor(src), n - 1)
          local l1 = src - lo
          lines[1][j + 1], lines[2][j + 1], weights[1][j + 1], weights[2][j + 1] = lo, math.min(lo + 1, n - 1), 1 - l1, l1
        end
      end
      local shape = {}
      for k = 1, y:dim() do shape[k] = k == d + 1 and out or 1 end
      local function column(w)
        local a = ffi.new("double[?]", out)
        for j = 1, out do a[j - 1] = w[j] end
        return wrap(C.kiln_tensor_from_f64(1, ffi.new("int64_t[1]", out), a, y.p.dtype, y.p.device)):view(shape)
      end
      local r = gather_along(y, d, lines[1]) * column(weights[1])
      for k = 2, taps do r = r + gather_along(y, d, lines[k]) * column(weights[k]) end
      y = r
    end
  end
  if y == x then return x:clone() end   -- every dim copied: a new tensor still, as PyTorch's
  return y
end

-- The geometry of unfold and fold: the flat positions (from 0) in the padded [Hp, Wp] image of each
-- (channel-free) column row (ki, kj) and block (a, b), PyTorch's order.
local fold_options = set("dilation", "padding", "stride")
local function fold_geometry(op, H, W, kernel_size, opts)
  local kh, kw = pair(kernel_size, op .. ": kernel_size")
  local dh, dw = pair(opts.dilation or 1, op .. ": dilation")
  local ph, pw = pair(opts.padding or 0, op .. ": padding")
  local sh, sw = pair(opts.stride or 1, op .. ": stride")
  if kh < 1 or kw < 1 or dh < 1 or dw < 1 or sh < 1 or sw < 1 or ph < 0 or pw < 0 then
    raise(string.format("%s: kernel_size {%d,%d}, dilation {%d,%d} and stride {%d,%d} must be >= 1, padding {%d,%d} >= 0",
                        op, kh, kw, dh, dw, sh, sw, ph, pw))
  end
  local Hp, Wp = H + 2 * ph, W + 2 * pw
  local oh, ow = math.floor((Hp - dh * (kh - 1) - 1) / sh) + 1, math.floor((Wp - dw * (kw - 1) - 1) / sw) + 1
  if oh < 1 or ow < 1 then
    raise(string.format("%s: a kernel {%d,%d} with dilation {%d,%d} does not fit the padded image [%d,%d]", op, kh, kw, dh, dw,
                        Hp, Wp))
  end
  local idx = {}
  for ki = 0, kh - 1 do
    for kj = 0, kw - 1 do
      for a = 0, oh - 1 do
        for b = 0, ow - 1 do idx[#idx + 1] = (a * sh + ki * dh) * Wp + b * sw + kj * dw end
      end
    end
  end
  return {idx = idx, k = kh * kw, L = oh * ow, Hp = Hp, Wp = Wp, ph = ph, pw = pw}
end

-- unfold(x [N,C,H,W], kernel_size[, {dilation =, padding =, stride =}]): the sliding blocks as
-- columns [N, C * kh * kw, L] (im2col), as torch.nn.functional.unfold.
function F.unfold(x, kernel_size, opts)
  tensor(x, "input", "unfold")
  opts = options(opts, fold_options, "unfold")
  if x:dim() ~= 4 then raise(string.format("unfold: input %s has %d dims (expected [N,C,H,W])", shape_of(x), x:dim())) end
  local N, Cc, H, W = x:size(1), x:size(2), x:size(3), x:size(4)
  local g = fold_geometry("unfold", H, W, kernel_size, opts)
  local xp = (g.ph > 0 or g.pw > 0) and F.pad(x, {g.pw, g.pw, g.ph, g.ph}) or x
  return gather_along(xp:reshape(N, Cc, g.Hp * g.Wp), 2, g.idx):reshape(N, Cc * g.k, g.L)
end

-- fold(cols [N, C * kh * kw, L], output_size, kernel_size[, {dilation =, padding =, stride =}]): the
-- columns summed back into [N, C, H, W] (col2im; where blocks overlap, their values add), as
-- torch.nn.functional.fold.
function F.fold(cols, output_size, kernel_size, opts)
  tensor(cols, "input", "fold")
  opts = options(opts, fold_options, "fold")
  local H, W = pair(output_size, "fold: output_size")
  if cols:dim() ~= 3 then raise(string.format("fold: input %s has %d dims (expected [N, C * kh * kw, L])", shape_of(cols), cols:dim())) end
  local g = fold_geometry("fold", H, W, kernel_size, opts)
  local N, rows, L = cols:size(1), cols:size(2), cols:size(3)
  if rows % g.k ~= 0 or L ~= g.L then
    raise(string.format("fold: input %s does not fit output_size {%d,%d} (expected [N, C * %d, %d])", shape_of(cols), H, W, g.k, g.L))
  end
  local Cc = rows / g.k
  local src = cols:reshape(N, Cc, g.k * L)
  local index = core.index_tensor(g.idx, cols.p.device):view(1, 1, g.k * L):expand(N, Cc, g.k * L):contiguous()
  local zeros = full({N, Cc, g.Hp * g.Wp}, 0, cols)
  local out = wrap(C.kiln_scatter_add(zeros.p, 2, index.p, src.p)):view(N, Cc, g.Hp, g.Wp)
  if g.ph > 0 or g.pw > 0 then out = out:narrow(3, g.ph + 1, H):narrow(4, g.pw + 1, W) end
  return out
end

-- ---- einsum ----

-- einsum("ij,jk->ik", a, b) or einsum(eq, {a, b}): a sum of products over named dims, as torch.einsum.
-- Without "->" the output is the letters seen once, in alphabetical order. A letter repeated within
-- an operand takes its diagonal ("ii->i", "ii" the trace). Operands are folded left to right, each
-- pair contracted as one batched matrix product (bmm); letters used nowhere after are summed first.
-- "..." names the dims no letter names (aligned from the right, as torch.einsum). A letter of size 1
-- in one operand broadcasts against the same letter of another size in another (within "..." too),
-- as torch.einsum: that operand does not depend on it, so the dim is dropped from it (a view) and
-- the letter summed or kept where the others have it. Two sizes other than 1 are an error.
local function letters_of(s)
  local t = {}
  for c in s:gmatch(".") do t[#t + 1] = c end
  return t
end

local function product(list, size)
  local p = 1
  for _, c in ipairs(list) do p = p * size[c] end
  return p
end

function F.einsum(eq, ...)
  if type(eq) ~= "string" then raise("einsum: the equation must be a string (\"ij,jk->ik\"), got " .. core.describe(eq)) end
  local ops = {...}
  if #ops == 1 and type(ops[1]) == "table" and not is_tensor(ops[1]) then ops = ops[1] end
  local spec = eq:gsub("%s", "")
  local lhs, rhs = spec:match("^(.-)%->(.*)$")
  lhs = lhs or spec
  local terms = {}
  for term in (lhs .. ","):gmatch("([^,]*),") do terms[#terms + 1] = term end
  if #terms ~= #ops then raise(string.format("einsum: %q names %d operands, %d given", eq, #terms, #ops)) end
  -- "..." stands for the dims no letter names, aligned from the right across operands: each is
  -- given a letter of its own that the equation does not use (its k-th dim from the right, the
  -- same letter in every operand), and the output takes them first, as torch.einsum does
  local ellipsis_dim   -- the letters given to "..." dims (a set)
  if spec:find("...", 1, true) then
    local free = {}
    for c in ("ZYXWVUTSRQPONMLKJIHGFEDCBAzyxwvutsrqponmlkjihgfedcba"):gmatch(".") do
      if not spec:find(c, 1, true) then free[#free + 1] = c end
    end
    local most = 0
    ellipsis_dim = {}
    for i, term in ipairs(terms) do
      local a, b = term:find("...", 1, true)
      if a then
        if not is_tensor(ops[i]) then raise(string.format("einsum: operand %d must be a tensor, got %s", i, core.describe(ops[i]))) end
        local named = #term - 3
        local k = ops[i]:dim() - named
        if k < 0 then
          raise(string.format("einsum: operand %d %s has %d dims but %q names %d besides \"...\"", i, shape_of(ops[i]),
                              ops[i]:dim(), term, named))
        end
        if k > #free then raise("einsum: \"...\" covers more dims than there are letters left (" .. eq .. ")") end
        local fill = {}
        for j = k, 1, -1 do fill[#fill + 1] = free[j] ellipsis_dim[free[j]] = true end   -- dim j from the right: free[j]
        terms[i] = term:sub(1, a - 1) .. table.concat(fill) .. term:sub(b + 1)
        most = math.max(most, k)
      end
    end
    local ellipsis = {}
    for j = most, 1, -1 do ellipsis[#ellipsis + 1] = free[j] end
    ellipsis = table.concat(ellipsis)
    if rhs then
      rhs = rhs:gsub("%.%.%.", ellipsis, 1)
    else   -- torch.einsum's implicit output: the "..." dims, then the letters seen once, in order
      local count = {}
      for _, term in ipairs(terms) do for c in term:gmatch(".") do count[c] = (count[c] or 0) + 1 end end
      local once = {}
      for c, n in pairs(count) do if n == 1 and not ellipsis:find(c, 1, true) then once[#once + 1] = c end end
      table.sort(once)
      rhs = ellipsis .. table.concat(once)
    end
  end
  local function named(c, k)   -- letter c, at dim k of its operand
    if ellipsis_dim and ellipsis_dim[c] then return string.format('dim %d (under "...")', k) end
    return "subscript " .. c
  end
  -- each letter's size: the sizes other than 1 must agree; 1 broadcasts against any (0 included)
  local size, count = {}, {}
  for i, term in ipairs(terms) do
    local x = ops[i]
    if not is_tensor(x) then raise(string.format("einsum: operand %d must be a tensor, got %s", i, core.describe(x))) end
    if not term:match("^[%a]*$") then raise(string.format("einsum: subscripts are letters, got %q in %q", term, eq)) end
    if #term ~= x:dim() then
      raise(string.format("einsum: operand %d %s has %d dims but %q names %d", i, shape_of(x), x:dim(), term, #term))
    end
    local own = {}
    for k, c in ipairs(letters_of(term)) do
      local n = x:size(k)
      if own[c] and own[c] ~= n then   -- a diagonal needs equal sizes, as in torch.einsum
        raise(string.format("einsum: subscript %s is repeated in operand %d %s with sizes %d and %d (%q)", c, i,
                            shape_of(x), own[c], n, eq))
      end
      own[c] = n
      if size[c] and size[c] ~= n and size[c] ~= 1 and n ~= 1 then
        raise(string.format("einsum: %s has size %d in operand %d %s but %d before, and neither is 1 (%q)", named(c, k), n, i,
                            shape_of(x), size[c], eq))
      end
      if size[c] == nil or size[c] == 1 then size[c] = n end
      count[c] = (count[c] or 0) + 1
    end
  end
  -- an operand's dim of size 1 under a letter of another size: the operand is constant along it, so
  -- it loses the dim (a reshape), and the letter is left to the operands that have it at full size
  local where = {}
  local xs = {}
  for i, term in ipairs(terms) do
    local x, kept, shape = ops[i], {}, {}
    for k, c in ipairs(letters_of(term)) do
      local n = x:size(k)
      if n == size[c] then kept[#kept + 1], shape[#shape + 1] = c, n end   -- else n is 1
    end
    if #kept < #term then x, terms[i] = x:reshape(shape), table.concat(kept) end
    xs[i] = x
    for _, c in ipairs(kept) do
      where[c] = where[c] or {}
      where[c][i] = true
    end
  end
  ops = xs
  local out
  if rhs then
    out = letters_of(rhs)
    local seen = {}
    for _, c in ipairs(out) do
      if not size[c] then raise(string.format("einsum: output subscript %s is in no operand (%q)", c, eq)) end
      if seen[c] then raise(string.format("einsum: output subscript %s appears twice (%q)", c, eq)) end
      seen[c] = true
    end
  else
    out = {}
    for c, n in pairs(count) do if n == 1 then out[#out + 1] = c end end
    table.sort(out)
  end
  local in_out = {}
  for _, c in ipairs(out) do in_out[c] = true end

  -- one operand: its diagonals taken, and the letters needed nowhere else summed
  local function prepare(i)
    local x, L = ops[i], letters_of(terms[i])
    while true do
      local p, q
      for a = 1, #L do
        for b = a + 1, #L do if L[a] == L[b] then p, q = a, b break end end
        if p then break end
      end
      if not p then break end
      local perm, rest = {}, {}
      for a = 1, #L do if a ~= p and a ~= q then perm[#perm + 1] = a rest[#rest + 1] = L[a] end end
      perm[#perm + 1], perm[#perm + 2] = p, q
      local n = size[L[p]]
      local sizes = {}
      for _, c in ipairs(rest) do sizes[#sizes + 1] = size[c] end
      sizes[#sizes + 1] = n * n
      local diag = {}
      for j = 0, n - 1 do diag[j + 1] = j * (n + 1) end
      x = gather_along(x:permute(perm):reshape(sizes), #sizes - 1, diag)
      rest[#rest + 1] = L[p]
      L = rest
    end
    return x, L
  end
  local function needed_after(i, c)
    if in_out[c] then return true end
    for j = i + 1, #ops do if where[c][j] then return true end end
    return false
  end
  local function sum_out(x, L, keep)
    local dims, rest = {}, {}
    for k, c in ipairs(L) do if keep(c) then rest[#rest + 1] = c else dims[#dims + 1] = k end end
    if #dims == 0 then return x, L end
    return x:sum(dims), rest
  end

  local cur, curL = prepare(1)
  for i = 2, #ops do
    local nxt, nxtL = prepare(i)
    local in_cur, in_nxt = {}, {}
    for _, c in ipairs(curL) do in_cur[c] = true end
    for _, c in ipairs(nxtL) do in_nxt[c] = true end
    cur, curL = sum_out(cur, curL, function(c) return in_nxt[c] or needed_after(i, c) end)
    nxt, nxtL = sum_out(nxt, nxtL, function(c) return in_cur[c] or needed_after(i, c) end)
    local batch, only_a, contract, only_b = {}, {}, {}, {}
    for _, c in ipairs(curL) do
      if in_nxt[c] then
        if needed_after(i, c) then batch[#batch + 1] = c else contract[#contract + 1] = c end
      else only_a[#only_a + 1] = c end
    end
    for _, c in ipairs(nxtL) do if not in_cur[c] then only_b[#only_b + 1] = c end end
    local function arrange(x, L, order)
      local pos = {}
      for k, c in ipairs(L) do pos[c] = k end
      local perm = {}
      for _, c in ipairs(order) do perm[#perm + 1] = pos[c] end
      return #perm > 0 and x:permute(perm) or x
    end
    local ab, ac, bc = {}, {}, {}
    for _, c in ipairs(batch) do ab[#ab + 1] = c bc[#bc + 1] = c end
    for _, c in ipairs(only_a) do ab[#ab + 1] = c end
    for _, c in ipairs(contract) do ab[#ab + 1] = c bc[#bc + 1] = c end
    for _, c in ipairs(only_b) do bc[#bc + 1] = c end
    local B, M, K, N = product(batch, size), product(only_a, size), product(contract, size), product(only_b, size)
    local a3 = arrange(cur, curL, ab):reshape(B, M, K)
    local b3 = arrange(nxt, nxtL, bc):reshape(B, K, N)
    local sizes = {}
    curL = {}
    for _, list in ipairs({batch, only_a, only_b}) do
      for _, c in ipairs(list) do sizes[#sizes + 1] = size[c] curL[#curL + 1] = c end
    end
    cur = a3:bmm(b3):reshape(sizes)
  end
  cur, curL = sum_out(cur, curL, function(c) return in_out[c] end)
  if #out == 0 then return cur end
  local pos = {}
  for k, c in ipairs(curL) do pos[c] = k end
  local perm, identity = {}, true
  for k, c in ipairs(out) do perm[k] = pos[c] identity = identity and pos[c] == k end
  if identity then return cur end
  return cur:permute(perm)
end

return F
