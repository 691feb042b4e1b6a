-- kiln.nn layers: linear, activations, dropout, embedding, flatten, losses; the convolution,
-- pooling and normalisation layers call the fused ops of kiln.functional.
local factory = require "kiln.factory"
local autograd = require "kiln.autograd"
local functional = require "kiln.functional"
local core = require "kiln.core"

return function(nn)
  local init = nn.init
  local function F() return functional end

  -- constructor arguments: an error at the caller's line for a size or option that cannot work
  local function need_int(name, what, v, min)
    min = min or 1
    if type(v) ~= "number" or v ~= math.floor(v) or v < min then
      core.raise(string.format("%s: %s must be %s, got %s", name, what,
                               min == 0 and "a non-negative integer" or "a positive integer", core.describe(v)))
    end
    return v
  end
  -- an integer or a pair of them ({h, w})
  local function need_pair(name, what, v, min)
    if type(v) == "table" then
      if #v ~= 2 then core.raise(string.format("%s: %s must be an integer or a pair {h, w}, got a table of %d", name, what, #v)) end
      need_int(name, what, v[1], min) need_int(name, what, v[2], min)
      return v
    end
    need_int(name, what, v, min)
    return {v, v}
  end
  -- the options table of a constructor, with only the keys it knows (a misspelt one is an error)
  -- A module's options, checked once here; the functional op it hands them to on each call trusts them.
  local function need_opts(name, opts, ...) return core.trust(core.options(opts, core.set(...), name)) end
  local function flag(name, what, v, default) return core.flag(v, default, name, what) end
  local reductions = {mean = true, sum = true, none = true}
  local function need_reduction(name, r)
    if r ~= nil and not reductions[r] then
      core.raise(string.format('%s: reduction must be "mean", "sum" or "none", got %s', name, core.describe(r)))
    end
    return r or "mean"
  end

  -- ---- Linear ----
  local Linear = nn.define("Linear")
  function Linear:init(in_features, out_features, opts)
    opts = need_opts("Linear", opts, "bias", "dtype")
    need_int("Linear", "in_features", in_features) need_int("Linear", "out_features", out_features)
    self.in_features, self.out_features = in_features, out_features
    self.weight = self:parameter(factory.empty(out_features, in_features, {dtype = opts.dtype}))
    if flag("Linear", "bias", opts.bias, true) then self.bias = self:parameter(factory.empty(out_features, {dtype = opts.dtype}))
    else self:register_parameter("bias", nil) end
    self:reset_parameters()
  end
  -- PyTorch's defaults: kaiming_uniform(a = sqrt 5) for the weight, U(-1/sqrt(fan_in), ..) for the bias.
  function Linear:reset_parameters()
    init.kaiming_uniform_(self.weight, {a = math.sqrt(5)})
    if self.bias then
      local bound = 1 / math.sqrt(self.in_features)
      init.uniform_(self.bias, -bound, bound)
    end
  end
  -- fused: "relu" (from nn.Sequential, below) is relu(linear(x)) in one call
  function Linear:forward(x, fused)
    local n = x:dim() > 0 and x:size(-1) or nil
    if n ~= self.in_features then   -- the weight's shape would say it transposed: say it in features
      core.raise(string.format("%s features in its last dim, expected in_features %d", n and tostring(n) or "no",
                               self.in_features))
    end
    return F()[fused == "relu" and "linear_relu" or "linear"](x, self.weight, self.bias)
  end
  function Linear:extra_repr()
    return string.format("%d→%d%s", self.in_features, self.out_features, self.bias and "" or ", no bias")
  end

  local Identity = nn.define("Identity")
  function Identity:forward(x) return x end

  local Flatten = nn.define("Flatten")
  function Flatten:init(start_dim, end_dim) self.start_dim, self.end_dim = start_dim or 2, end_dim or -1 end
  function Flatten:forward(x) return x:flatten(self.start_dim, self.end_dim) end

  -- ---- activations ----
  local function activation(name, fn, repr)
    local A = nn.define(name)
    function A:init(...) self.args = {...} end
    function A:forward(x) return fn(x, unpack(self.args)) end
    if repr then A.extra_repr = repr end
    return A
  end
  local ReLU = activation("ReLU", function(x) return x:relu() end)
  activation("Sigmoid", function(x) return x:sigmoid() end)
  activation("Tanh", function(x) return x:tanh() end)
  activation("LeakyReLU", function(x, slope)
    slope = slope or 0.01
    return x:relu() - (-x):relu() * slope
  end, function(self) return tostring(self.args[1] or 0.01) end)
  activation("ELU", function(x, alpha)
    alpha = alpha or 1
    return x:relu() + ((x:minimum(0)):exp() - 1) * alpha
  end)
  activation("GELU", function(x) return x * ((x * (1 / math.sqrt(2))):erf() + 1) * 0.5 end)
  activation("SiLU", function(x) return x * x:sigmoid() end)
  activation("Softmax", function(x, dim) return F().softmax(x, dim or -1) end)
  activation("LogSoftmax", function(x, dim) return F().log_softmax(x, dim or -1) end)

  -- ---- dropout, embedding ----
  local Dropout = nn.define("Dropout")
  function Dropout:init(p)
    if p ~= nil and (type(p) ~= "number" or not (p >= 0 and p < 1)) then
      core.raise("Dropout: p must be a probability, 0 <= p < 1, got " .. core.describe(p))
    end
    self.p = p or 0.5
  end
  function Dropout:forward(x) return F().dropout(x, self.p, self.training) end
  function Dropout:extra_repr() return "p=" .. self.p end

  local Embedding = nn.define("Embedding")
  function Embedding:init(num, dim, opts)
    opts = need_opts("Embedding", opts, "dtype")
    need_int("Embedding", "num_embeddings", num) need_int("Embedding", "embedding_dim", dim)
    self.num_embeddings, self.embedding_dim = num, dim
    self.weight = self:parameter(factory.randn(num, dim, {dtype = opts.dtype}))
  end
  -- indices count from 1, like every index in kiln's Lua API. The output remembers where it came
  -- from (nn._embedded_rows), so that a recurrent layer it feeds directly can look its input
  -- projection up in the projected table instead of multiplying every row (nn/rnn.lua).
  function Embedding:forward(idx)
    local flat = idx:reshape(-1)
    local rows = self.weight:index_select(1, flat)
    local sizes = idx:size()
    sizes[#sizes + 1] = self.embedding_dim
    local out = rows:view(sizes)
    nn._embedded_rows(out, self.weight, flat)
    return out
  end
  function Embedding:extra_repr() return string.format("%d, %d", self.num_embeddings, self.embedding_dim) end

  -- ---- convolution, pooling, normalisation (kiln.functional) ----
  local function pair(v) if type(v) == "table" then return v end return {v, v} end

  local Conv2d = nn.define("Conv2d")
  function Conv2d:init(cin, cout, k, opts)
    opts = need_opts("Conv2d", opts, "stride", "padding", "dilation", "groups", "bias", "dtype")
    need_int("Conv2d", "in_channels", cin) need_int("Conv2d", "out_channels", cout)
    local ks = need_pair("Conv2d", "kernel_size", k)
    need_pair("Conv2d", "stride", opts.stride or 1) need_pair("Conv2d", "padding", opts.padding or 0, 0)
    need_pair("Conv2d", "dilation", opts.dilation or 1) need_int("Conv2d", "groups", opts.groups or 1)
    self.in_channels, self.out_channels, self.kernel_size = cin, cout, ks
    self.stride, self.padding, self.dilation, self.groups = pair(opts.stride or 1), pair(opts.padding or 0), pair(opts.dilation or 1), opts.groups or 1
    if cin % self.groups ~= 0 or cout % self.groups ~= 0 then
      error(string.format("Conv2d: %d in and %d out channels are not divisible by %d groups", cin, cout, self.groups), 3)
    end
    self.weight = self:parameter(factory.empty(cout, cin / self.groups, ks[1], ks[2], {dtype = opts.dtype}))
    if flag("Conv2d", "bias", opts.bias, true) then self.bias = self:parameter(factory.empty(cout, {dtype = opts.dtype}))
    else self:register_parameter("bias", nil) end
    init.kaiming_uniform_(self.weight, {a = math.sqrt(5)})
    if self.bias then
      local fan_in = init.fans(self.weight)
      local bound = 1 / math.sqrt(fan_in)
      init.uniform_(self.bias, -bound, bound)
    end
  end
  -- fused: "relu_max_pool2d" (from nn.Sequential, below) is max_pool2d(relu(conv), 2) in one call
  function Conv2d:forward(x, fused)
    return F()[fused == "relu_max_pool2d" and "conv2d_relu_max_pool2d" or "conv2d"](x, self.weight, self.bias,
      {stride = self.stride, padding = self.padding, dilation = self.dilation, groups = self.groups})
  end
  function Conv2d:extra_repr()
    local s = string.format("%d→%d, %dx%d", self.in_channels, self.out_channels, self.kernel_size[1], self.kernel_size[2])
    if self.stride[1] ~= 1 or self.stride[2] ~= 1 then s = s .. string.format(", stride %d,%d", self.stride[1], self.stride[2]) end
    if self.padding[1] ~= 0 or self.padding[2] ~= 0 then s = s .. string.format(", padding %d,%d", self.padding[1], self.padding[2]) end
    if self.groups ~= 1 then s = s .. ", groups " .. self.groups end
    return s
  end

  local Conv1d = nn.define("Conv1d")
  function Conv1d:init(cin, cout, k, opts)
    opts = need_opts("Conv1d", opts, "stride", "padding", "dilation", "groups", "bias", "dtype")
    need_int("Conv1d", "in_channels", cin) need_int("Conv1d", "out_channels", cout) need_int("Conv1d", "kernel_size", k)
    need_int("Conv1d", "stride", opts.stride or 1) need_int("Conv1d", "padding", opts.padding or 0, 0)
    need_int("Conv1d", "dilation", opts.dilation or 1)
    local inner = nn.Conv2d(cin, cout, {1, k}, {stride = {1, opts.stride or 1}, padding = {0, opts.padding or 0},
                                               dilation = {1, opts.dilation or 1}, groups = opts.groups, bias = opts.bias, dtype = opts.dtype})
    self.in_channels, self.out_channels, self.kernel_size = cin, cout, k
    -- the parameters keep PyTorch's Conv1d shapes: weight [out, in/groups, k]
    self.weight = self:parameter(inner.weight:squeeze(3))
    if inner.bias then self.bias = self:parameter(inner.bias) else self:register_parameter("bias", nil) end
    self.opts = {stride = {1, opts.stride or 1}, padding = {0, opts.padding or 0}, dilation = {1, opts.dilation or 1}, groups = opts.groups or 1}
  end
  function Conv1d:forward(x)
    local y = F().conv2d(x:unsqueeze(3), self.weight:unsqueeze(3), self.bias, self.opts)
    return y:squeeze(3)
  end
  function Conv1d:extra_repr() return string.format("%d→%d, %d", self.in_channels, self.out_channels, self.kernel_size) end

  local ConvTranspose2d = nn.define("ConvTranspose2d")
  function ConvTranspose2d:init(cin, cout, k, opts)
    opts = need_opts("ConvTranspose2d", opts, "stride", "padding", "output_padding", "dilation", "groups", "bias", "dtype")
    need_int("ConvTranspose2d", "in_channels", cin) need_int("ConvTranspose2d", "out_channels", cout)
    local ks = need_pair("ConvTranspose2d", "kernel_size", k)
    need_pair("ConvTranspose2d", "stride", opts.stride or 1) need_pair("ConvTranspose2d", "padding", opts.padding or 0, 0)
    need_pair("ConvTranspose2d", "output_padding", opts.output_padding or 0, 0)
    need_pair("ConvTranspose2d", "dilation", opts.dilation or 1) need_int("ConvTranspose2d", "groups", opts.groups or 1)
    if cin % (opts.groups or 1) ~= 0 or cout % (opts.groups or 1) ~= 0 then
      core.raise(string.format("ConvTranspose2d: %d in and %d out channels are not divisible by %d groups", cin, cout, opts.groups))
    end
    self.in_channels, self.out_channels, self.kernel_size = cin, cout, ks
    self.stride, self.padding, self.output_padding = pair(opts.stride or 1), pair(opts.padding or 0), pair(opts.output_padding or 0)
    self.dilation, self.groups = pair(opts.dilation or 1), opts.groups or 1
    self.weight = self:parameter(factory.empty(cin, cout / self.groups, ks[1], ks[2], {dtype = opts.dtype}))
    if flag("ConvTranspose2d", "bias", opts.bias, true) then self.bias = self:parameter(factory.empty(cout, {dtype = opts.dtype}))
    else self:register_parameter("bias", nil) end
    init.kaiming_uniform_(self.weight, {a = math.sqrt(5)})
    if self.bias then
      local _, fan_out = init.fans(self.weight)
      local fan_in = self.weight:size(2) * ks[1] * ks[2]
      local bound = 1 / math.sqrt(fan_in)
      init.uniform_(self.bias, -bound, bound)
    end
  end
  function ConvTranspose2d:forward(x)
    return F().conv_transpose2d(x, self.weight, self.bias, {stride = self.stride, padding = self.padding,
      output_padding = self.output_padding, dilation = self.dilation, groups = self.groups})
  end
  function ConvTranspose2d:extra_repr() return string.format("%d→%d, %dx%d", self.in_channels, self.out_channels, self.kernel_size[1], self.kernel_size[2]) end

  local MaxPool2d = nn.define("MaxPool2d")
  function MaxPool2d:init(k, opts)
    opts = need_opts("MaxPool2d", opts, "stride", "padding", "dilation", "ceil_mode")
    need_pair("MaxPool2d", "kernel_size", k) need_pair("MaxPool2d", "stride", opts.stride or k)
    need_pair("MaxPool2d", "padding", opts.padding or 0, 0) need_pair("MaxPool2d", "dilation", opts.dilation or 1)
    self.kernel_size, self.stride = pair(k), pair(opts.stride or k)
    self.padding, self.dilation, self.ceil_mode = pair(opts.padding or 0), pair(opts.dilation or 1), flag("MaxPool2d", "ceil_mode", opts.ceil_mode, false)
  end
  function MaxPool2d:forward(x)
    return F().max_pool2d(x, self.kernel_size, {stride = self.stride, padding = self.padding, dilation = self.dilation, ceil_mode = self.ceil_mode})
  end
  function MaxPool2d:extra_repr() return string.format("%dx%d", self.kernel_size[1], self.kernel_size[2]) end

  -- nn.Sequential runs a Conv2d, a ReLU and a MaxPool2d(2) that follow each other as one call of
  -- F.conv2d_relu_max_pool2d (the same bits as the three: docs/nn.md) unless nn.fusion is false.
  -- Only the modules as kiln defines them fuse: none whose forward was replaced.
  local function plain(m, class) return getmetatable(m) == class and rawget(m, "forward") == nil end
  local function is(v, a, b) return v[1] == a and v[2] == b end
  -- nn.Sequential runs a Linear and a ReLU that follows it as one call of F.linear_relu (the same
  -- bits as the two) unless nn.fusion is false.
  function nn._fuses_linear_relu(linear, relu)
    return nn.fusion ~= false and plain(linear, Linear) and plain(relu, ReLU)
  end
  function nn._fuses_relu_max_pool2d(conv, relu, pool)
    return nn.fusion ~= false and plain(conv, Conv2d) and plain(relu, ReLU) and plain(pool, MaxPool2d) and
           is(pool.kernel_size, 2, 2) and is(pool.stride, 2, 2) and is(pool.padding, 0, 0) and is(pool.dilation, 1, 1) and
           not pool.ceil_mode
  end

  local AvgPool2d = nn.define("AvgPool2d")
  function AvgPool2d:init(k, opts)
    opts = need_opts("AvgPool2d", opts, "stride", "padding", "ceil_mode", "count_include_pad")
    need_pair("AvgPool2d", "kernel_size", k) need_pair("AvgPool2d", "stride", opts.stride or k)
    need_pair("AvgPool2d", "padding", opts.padding or 0, 0)
    self.kernel_size, self.stride, self.padding = pair(k), pair(opts.stride or k), pair(opts.padding or 0)
    self.ceil_mode = flag("AvgPool2d", "ceil_mode", opts.ceil_mode, false)
    self.count_include_pad = flag("AvgPool2d", "count_include_pad", opts.count_include_pad, true)
  end
  function AvgPool2d:forward(x)
    return F().avg_pool2d(x, self.kernel_size, {stride = self.stride, padding = self.padding, ceil_mode = self.ceil_mode,
                                                count_include_pad = self.count_include_pad})
  end
  function AvgPool2d:extra_repr() return string.format("%dx%d", self.kernel_size[1], self.kernel_size[2]) end

  local AdaptiveAvgPool2d = nn.define("AdaptiveAvgPool2d")
  function AdaptiveAvgPool2d:init(size) self.output_size = need_pair("AdaptiveAvgPool2d", "output_size", size) end
  function AdaptiveAvgPool2d:forward(x) return F().adaptive_avg_pool2d(x, self.output_size) end
  function AdaptiveAvgPool2d:extra_repr() return string.format("%dx%d", self.output_size[1], self.output_size[2]) end

  local function batchnorm(name, dims)
    local BN = nn.define(name)
    function BN:init(n, opts)
      opts = need_opts(name, opts, "eps", "momentum", "affine", "track_running_stats", "dtype")
      need_int(name, "num_features", n)
      self.num_features, self.eps, self.momentum = n, opts.eps or 1e-5, opts.momentum or 0.1
      self.affine = flag(name, "affine", opts.affine, true)
      self.track_running_stats = flag(name, "track_running_stats", opts.track_running_stats, true)
      if self.affine then
        self.weight = self:parameter(factory.ones(n, {dtype = opts.dtype}))
        self.bias = self:parameter(factory.zeros(n, {dtype = opts.dtype}))
      end
      if self.track_running_stats then
        self:register_buffer("running_mean", factory.zeros(n, {dtype = opts.dtype}))
        self:register_buffer("running_var", factory.ones(n, {dtype = opts.dtype}))
        self:register_buffer("num_batches_tracked", factory.zeros({}, {dtype = "i64"}))
      end
    end
    function BN:forward(x)
      if x:dim() ~= dims[1] and x:dim() ~= dims[2] then
        error(string.format("%s: expected a %d-d or %d-d input, got %s", name, dims[1], dims[2], tostring(x:size())), 2)
      end
      local training = self.training or not self.track_running_stats
      if self.training and self.track_running_stats then
        autograd.no_grad(function() self.num_batches_tracked:add_(1) end)
      end
      return F().batch_norm(x, self.running_mean, self.running_var, {weight = self.weight, bias = self.bias,
                            training = training, momentum = self.momentum, eps = self.eps})
    end
    function BN:extra_repr() return tostring(self.num_features) end
  end
  batchnorm("BatchNorm1d", {2, 3})
  batchnorm("BatchNorm2d", {4, 4})

  local LayerNorm = nn.define("LayerNorm")
  function LayerNorm:init(shape, opts)
    opts = need_opts("LayerNorm", opts, "eps", "elementwise_affine", "dtype")
    self.normalized_shape = type(shape) == "table" and shape or {shape}
    if #self.normalized_shape == 0 then core.raise("LayerNorm: normalized_shape must name at least one size, got " .. core.describe(shape)) end
    for _, n in ipairs(self.normalized_shape) do need_int("LayerNorm", "normalized_shape", n) end
    self.eps = opts.eps or 1e-5
    if flag("LayerNorm", "elementwise_affine", opts.elementwise_affine, true) then
      self.weight = self:parameter(factory.ones(self.normalized_shape, {dtype = opts.dtype}))
      self.bias = self:parameter(factory.zeros(self.normalized_shape, {dtype = opts.dtype}))
    end
  end
  function LayerNorm:forward(x)
    return F().layer_norm(x, self.normalized_shape, self.weight, self.bias, {eps = self.eps})
  end
  function LayerNorm:extra_repr() return table.concat(self.normalized_shape, "x") end

  local GroupNorm = nn.define("GroupNorm")
  function GroupNorm:init(groups, channels, opts)
    opts = need_opts("GroupNorm", opts, "eps", "affine", "dtype")
    need_int("GroupNorm", "num_groups", groups) need_int("GroupNorm", "num_channels", channels)
    if channels % groups ~= 0 then
      core.raise(string.format("GroupNorm: %d channels are not divisible by %d groups", channels, groups))
    end
    self.num_groups, self.num_channels, self.eps = groups, channels, opts.eps or 1e-5
    if flag("GroupNorm", "affine", opts.affine, true) then
      self.weight = self:parameter(factory.ones(channels, {dtype = opts.dtype}))
      self.bias = self:parameter(factory.zeros(channels, {dtype = opts.dtype}))
    end
  end
  function GroupNorm:forward(x)
    return F().group_norm(x, self.num_groups, self.weight, self.bias, {eps = self.eps})
  end
  function GroupNorm:extra_repr() return string.format("%d groups, %d channels", self.num_groups, self.num_channels) end

  -- ---- losses ----
  local function reduce(loss, reduction)
    if reduction == "none" then return loss end
    if reduction == "sum" then return loss:sum() end
    return loss:mean()
  end

  local CrossEntropyLoss = nn.define("CrossEntropyLoss")
  function CrossEntropyLoss:init(opts)
    self.opts = need_opts("CrossEntropyLoss", opts, "weight", "ignore_index", "label_smoothing", "reduction")
    need_reduction("CrossEntropyLoss", self.opts.reduction)
  end
  function CrossEntropyLoss:forward(logits, target) return F().cross_entropy(logits, target, self.opts) end

  local NLLLoss = nn.define("NLLLoss")
  function NLLLoss:init(opts)
    self.opts = need_opts("NLLLoss", opts, "weight", "ignore_index", "reduction")
    need_reduction("NLLLoss", self.opts.reduction)
  end
  function NLLLoss:forward(logp, target) return F().nll_loss(logp, target, self.opts) end

  -- CTCLoss{blank = 1, reduction = "mean", zero_infinity = false}:
  -- loss = criterion(log_probs [T,N,C], targets, input_lengths, target_lengths); see F.ctc_loss.
  local CTCLoss = nn.define("CTCLoss")
  function CTCLoss:init(opts)
    self.opts = need_opts("CTCLoss", opts, "blank", "reduction", "zero_infinity")
    need_reduction("CTCLoss", self.opts.reduction)
    if self.opts.blank ~= nil then need_int("CTCLoss", "blank", self.opts.blank) end
  end
  function CTCLoss:forward(lp, targets, input_lengths, target_lengths)
    return F().ctc_loss(lp, targets, input_lengths, target_lengths, self.opts)
  end

  local function check_same(name, a, b)
    if not factory.is_tensor(a) or not factory.is_tensor(b) then
      error(string.format("%s: input and target must be tensors, got %s and %s", name, core.describe(a), core.describe(b)), 3)
    end
    if tostring(a:size()) ~= tostring(b:size()) then
      error(string.format("%s: input %s and target %s differ in shape", name, tostring(a:size()), tostring(b:size())), 3)
    end
  end

  local MSELoss = nn.define("MSELoss")
  function MSELoss:init(opts) self.reduction = need_reduction("MSELoss", need_opts("MSELoss", opts, "reduction").reduction) end
  function MSELoss:forward(x, y) check_same("MSELoss", x, y) return reduce((x - y):square(), self.reduction) end

  local L1Loss = nn.define("L1Loss")
  function L1Loss:init(opts) self.reduction = need_reduction("L1Loss", need_opts("L1Loss", opts, "reduction").reduction) end
  function L1Loss:forward(x, y) check_same("L1Loss", x, y) return reduce((x - y):abs(), self.reduction) end

  local SmoothL1Loss = nn.define("SmoothL1Loss")
  function SmoothL1Loss:init(opts)
    opts = need_opts("SmoothL1Loss", opts, "reduction", "beta")
    self.reduction, self.beta = need_reduction("SmoothL1Loss", opts.reduction), opts.beta or 1
    if type(self.beta) ~= "number" or not (self.beta > 0) then core.raise("SmoothL1Loss: beta must be a positive number, got " .. core.describe(self.beta)) end
  end
  function SmoothL1Loss:forward(x, y)
    check_same("SmoothL1Loss", x, y)
    local d = (x - y):abs()
    local beta = self.beta
    local quad = d:square() * (0.5 / beta)
    local lin = d - 0.5 * beta
    return reduce(factory.where(d:lt(beta), quad, lin), self.reduction)
  end

  local BCELoss = nn.define("BCELoss")
  function BCELoss:init(opts) self.reduction = need_reduction("BCELoss", need_opts("BCELoss", opts, "reduction").reduction) end
  function BCELoss:forward(p, y)
    check_same("BCELoss", p, y)
    -- log clamped at -100, as PyTorch does, so that p = 0 or 1 gives a finite loss
    local lp, l1p = p:log():clamp(-100), (1 - p):log():clamp(-100)
    return reduce(-(y * lp + (1 - y) * l1p), self.reduction)
  end

  local BCEWithLogitsLoss = nn.define("BCEWithLogitsLoss")
  function BCEWithLogitsLoss:init(opts) self.reduction = need_reduction("BCEWithLogitsLoss", need_opts("BCEWithLogitsLoss", opts, "reduction").reduction) end
  function BCEWithLogitsLoss:forward(z, y)
    check_same("BCEWithLogitsLoss", z, y)
    -- max(z, 0) - z y + log(1 + exp(-|z|)): stable for large |z|
    return reduce(z:relu() - z * y + (-z:abs()):exp():log1p(), self.reduction)
  end
end
