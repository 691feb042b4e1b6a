-- Arguments of the wrong kind: every function of a tensor, the tensor arguments of ops, numbers,
-- option tables and the nn constructors answer with an error naming the function and the argument,
-- raised at the caller's line; never a crash, a Lua-internal message or a silent default.
local kiln = require "kiln"
local nn = kiln.nn
local H = require "helpers"
local failure = H.error_of

local function assert_clear(msg) assert(not H.lua_internal(msg), "a Lua-internal message: " .. msg) end

-- each case {f, part}: f fails with a message containing part (and, with clear, no Lua-internal words)
local function check_cases(cases, clear)
  for i, c in ipairs(cases) do
    local msg = failure(c[1])
    assert(msg:find(c[2], 1, true), "case " .. i .. ": " .. msg)
    if clear then assert_clear(msg) end
  end
end

describe("arguments of the wrong kind", function()
  it("kiln.f(x) for a method f needs a tensor x, for every method", function()
    local names = {}
    for name, fn in pairs(kiln.Tensor) do
      if type(fn) == "function" and name:sub(1, 1) ~= "_" and type(kiln[name]) == "function" and name ~= "cat" and name ~= "stack"
         and name ~= "where" and name ~= "device" then   -- kiln.device also takes a name
        names[#names + 1] = name
      end
    end
    table.sort(names)
    assert(#names > 100, "only " .. #names .. " methods found")
    for _, name in ipairs(names) do
      for _, bad in ipairs{"x", 2.5, {}, false} do
        local msg = failure(function() return kiln[name](bad, 1) end)
        assert.matches("kiln%." .. name:gsub("_", "%%_") .. ": argument 1 must be a tensor, got ", msg)
      end
    end
    -- the first of these crashed the process (a NULL tensor in C)
    assert.matches("kiln.is_contiguous: argument 1 must be a tensor, got a string", failure(function() return kiln.is_contiguous("x") end))
    assert.matches("kiln.dim: argument 1 must be a tensor, got the number 2.5", failure(function() return kiln.dim(2.5) end))
    assert.matches("kiln.zeros_like: argument 1 must be a tensor, got nil", failure(function() return kiln.zeros_like() end))
    assert.matches("kiln.randn_like: argument 1 must be a tensor", failure(function() return kiln.randn_like({2, 3}) end))
  end)

  it("names the tensor argument an op was given something else for", function()
    local t = kiln.randn(2, 2)
    local cases = {
      {function() return t:mm(3) end, "mm: argument 2 must be a tensor, got the number 3"},
      {function() return t:matmul("x") end, "matmul: argument 2 must be a tensor, got a string"},
      {function() return t:dot(true) end, "dot: argument 2 must be a tensor, got the boolean true"},
      {function() return t:bmm(nil) end, "bmm: argument 2 must be a tensor, got nil"},
      {function() return t:addmm(t, 2) end, "addmm: argument 3 must be a tensor, got the number 2"},
      {function() return t:copy_(print) end, "copy_: the source must be a tensor, got a function"},
      {function() return t:view_as(4) end, "view_as: other must be a tensor, got the number 4"},
      {function() return t:expand_as({2, 2}) end, "expand_as: other must be a tensor, got a table"},
      {function() return t:masked_fill(1, 0) end, "masked_fill: the mask must be a tensor"},
      {function() return t:masked_fill(t:gt(0), "x") end, "masked_fill: the value must be a number, got a string"},
      {function() return t:masked_select("x") end, "masked_select: the mask must be a tensor"},
      {function() return t:scatter_add(1, kiln.ones(2, 2, {dtype = "i64"}), 5) end, "scatter_add: the source must be a tensor"},
      {function() return kiln.where(1, t, t) end, "where: the condition must be a tensor, got the number 1"},
      {function() return kiln.where(t:gt(0), 1, 2) end, "where: argument 2 or 3 must be a tensor"},
      {function() return kiln.cat(t) end, "cat: expected a list of tensors, got a tensor"},
      {function() return kiln.stack(3) end, "stack: expected a list of tensors, got the number 3"},
      {function() local x = kiln.randn(2, {requires_grad = true}) x:sum():backward(7) end,
       "backward: the gradient must be a tensor, got the number 7"},
    }
    check_cases(cases, true)
  end)

  it("names numbers and options given as something else", function()
    local t = kiln.randn(2, 3)
    local cases = {
      {function() return t:fill_("x") end, "fill_: the value must be a number, got a string"},
      {function() return t:fill_(t) end, "fill_: the value must be a number, got a tensor"},
      {function() return t:clamp("a", 1) end, "clamp: min must be a number"},
      {function() return t:clamp({max = {}}) end, "clamp: max must be a number, got a table"},
      {function() return t:full_like(t) end, "full_like: the value must be a number, got a tensor"},
      {function() return t:uniform_("a") end, "uniform_: the low end must be a number"},
      {function() return t:normal_(0, {}) end, "normal_: the std must be a number, got a table"},
      {function() return t:random_("x") end, "random_: the high end must be a number"},
      {function() return t:norm(t) end, "norm: p must be a number, got a tensor"},
      {function() return t:narrow(1, "a", 1) end, "narrow: the start must be a number"},
      {function() return t:chunk("x") end, "chunk: the number of chunks must be a number"},
      {function() return t:split({}) end, "split: sizes add up to 0"},
      {function() return t:sum(print) end, "sum: dim must be an integer or a table of them, got a function"},
      {function() return t:sum({1, 1, 1, 1, 1, 1, 1, 1, 1}) end, "sum: 9 dims given (a tensor has at most 8)"},
      {function() return t:zeros_like(2) end, "zeros_like: the options must be a table"},
      {function() return t:matmul(t:t(), 5) end, "matmul: the options must be a table ({name = value, ...}), got the number 5"},
      {function() return t:var(1, false, "x") end, "var: the options must be a table ({name = value, ...}), got a string"},
      {function() return kiln.tensor({1, 2}, 3) end, "tensor: the options must be a table ({name = value, ...}), got the number 3"},
      {function() return kiln.arange(t) end, "arange: the end must be a number, got a tensor"},
      {function() return kiln.linspace(0, 1, "x") end, "linspace: steps must be a number"},
      {function() return kiln.eye("x") end, "eye: n must be a number"},
      {function() return kiln.randint(0, t, {2}) end, "randint: high must be a number, got a tensor"},
      {function() return kiln.randint(0, 5, 3) end, "randint: the sizes must be a table, got the number 3"},
      {function() return kiln.manual_seed("x") end, "manual_seed: the seed must be a number, got a string"},
      {function() return kiln.set_num_threads("x") end, "set_num_threads: the thread count must be a number"},
      {function() return kiln.set_rng_state(3) end, "set_rng_state: expected a state as get_rng_state returns it"},
      {function() return kiln.set_gc_threshold("x") end, "set_gc_threshold: the byte count must be a number"},
      {function() return kiln.no_grad(3) end, "no_grad: expected a function to run, got the number 3"},
      {function() return kiln.gradcheck(3, {t}) end, "gradcheck: argument 1 must be a function"},
      {function() return kiln.gradcheck(function(x) return x end, t) end, "gradcheck: argument 2 must be a list of input tensors, got a tensor"},
      {function() return kiln.optim.SGD({kiln.randn(2)}, 3) end, "SGD: the options must be a table ({name = value, ...}), got the number 3"},
      {function() return kiln.optim.Adam({kiln.randn(2)}):step("x") end, "Adam.step: the closure must be a function, got a string"},
      {function() return kiln.data.permutation(5, 3) end, "permutation: the options must be a table ({name = value, ...}), got the number 3"},
      {function() return kiln.data.num_batches(kiln.data.TensorDataset(kiln.randn(4)), 2) end, "num_batches: the options must be a table"},
      {function() return kiln.data.read_image("/nonexistent.png", "rgb") end, "read_image: channels must be an integer, got rgb"},
    }
    check_cases(cases, true)
    -- nothing was changed by the calls that failed
    assert.equal(3, t:size(2))
  end)

  it("raises the error at the caller's line", function()
    local line = debug.getinfo(1, "l").currentline + 1
    local ok, err = pcall(function() return kiln.is_contiguous(1) end)
    assert.is_false(ok)
    assert.matches("arguments_spec.lua:" .. line .. ": kiln.is_contiguous", err)
    line = debug.getinfo(1, "l").currentline + 1
    ok, err = pcall(function() return nn.Linear(3) end)
    assert.matches("arguments_spec.lua:" .. line .. ": Linear: out_features", err)
    line = debug.getinfo(1, "l").currentline + 1
    ok, err = pcall(function() return nn.LSTM(3) end)
    assert.matches("arguments_spec.lua:" .. line .. ": LSTM: hidden_size", err)
  end)

  it("checks the nn constructors' sizes and options", function()
    local cases = {
      {function() return nn.Linear() end, "Linear: in_features must be a positive integer, got nil"},
      {function() return nn.Linear(3, 2.5) end, "Linear: out_features must be a positive integer, got the number 2.5"},
      {function() return nn.Linear(3, 4, 1) end, "Linear: the options must be a table"},
      {function() return nn.Conv2d(3, 4) end, "Conv2d: kernel_size must be a positive integer, got nil"},
      {function() return nn.Conv2d(3, 4, {3}) end, "Conv2d: kernel_size must be an integer or a pair {h, w}, got a table of 1"},
      {function() return nn.Conv2d(3, 4, 3, {stride = 0}) end, "Conv2d: stride must be a positive integer, got the number 0"},
      {function() return nn.Conv2d(3, 4, 3, {padding = -1}) end, "Conv2d: padding must be a non-negative integer"},
      {function() return nn.Conv1d(3, 4, "x") end, "Conv1d: kernel_size must be a positive integer, got a string"},
      {function() return nn.ConvTranspose2d(3, 4) end, "ConvTranspose2d: kernel_size must be a positive integer"},
      {function() return nn.ConvTranspose2d(3, 4, 3, {groups = 2}) end, "ConvTranspose2d: 3 in and 4 out channels are not divisible by 2 groups"},
      {function() return nn.Embedding(10) end, "Embedding: embedding_dim must be a positive integer, got nil"},
      {function() return nn.BatchNorm2d("x") end, "BatchNorm2d: num_features must be a positive integer, got a string"},
      {function() return nn.LayerNorm({}) end, "LayerNorm: normalized_shape must name at least one size"},
      {function() return nn.GroupNorm(3, 8) end, "GroupNorm: 8 channels are not divisible by 3 groups"},
      {function() return nn.MaxPool2d() end, "MaxPool2d: kernel_size must be a positive integer, got nil"},
      {function() return nn.AvgPool2d(2, {padding = -1}) end, "AvgPool2d: padding must be a non-negative integer"},
      {function() return nn.AdaptiveAvgPool2d("x") end, "AdaptiveAvgPool2d: output_size must be a positive integer"},
      {function() return nn.Dropout(1.5) end, "Dropout: p must be a probability, 0 <= p < 1, got the number 1.5"},
      {function() return nn.MSELoss{reduction = "avg"} end, 'MSELoss: reduction must be "mean", "sum" or "none", got a string'},
      {function() return nn.CrossEntropyLoss{reduction = 1} end, "CrossEntropyLoss: reduction must be"},
      {function() return nn.CTCLoss{blank = "x"} end, "CTCLoss: blank must be a positive integer, got a string"},
      {function() return nn.SmoothL1Loss{beta = 0} end, "SmoothL1Loss: beta must be a positive number, got the number 0"},
      {function() return nn.RNNBase() end, "RNNBase: a base class"},
      {function() return nn.RNNCellBase() end, "RNNCellBase: a base class"},
      {function() return nn.MSELoss()(kiln.randn(2), 3) end, "MSELoss: input and target must be tensors, got a tensor and the number 3"},
      {function() return nn.Sequential{nn.ReLU()}:add(3) end, 'add_module: child "1" must be a module, got the number 3'},
      {function() return nn.Sequential{nn.ReLU()}:get("x") end, "Sequential:get: the index must be an integer, got a string"},
      {function() return nn.ModuleList(nn.ReLU()) end, "ModuleList: expected a list of modules, got a module"},
      {function() return nn.Linear(2, 2):apply(3) end, "apply: expected a function of a module, got the number 3"},
      {function() return nn.Linear(2, 2):load_state_dict("x") end, "load_state_dict: expected a table of named tensors, got a string"},
      {function() return nn.Linear(2, 2):load_state_dict({weight = 3, bias = kiln.zeros(2)}) end, "load_state_dict: weight is the number 3, not a tensor"},
      {function() return nn.Linear(2, 2):register_buffer(1, kiln.zeros(2)) end, "register_buffer: the name must be a string, got the number 1"},
      {function() return nn.Linear(2, 2):register_parameter("w", {}) end, "register_parameter: w must be a tensor or nil, got a table"},
    }
    check_cases(cases, true)
  end)

  it("factories take dtype, device and requires_grad, and nothing else", function()
    local makers = {
      zeros = function(o) return kiln.zeros(2, 3, o) end, ones = function(o) return kiln.ones({2, 3}, o) end,
      empty = function(o) return kiln.empty(2, 3, o) end, rand = function(o) return kiln.rand(2, 3, o) end,
      randn = function(o) return kiln.randn(2, 3, o) end, full = function(o) return kiln.full(2, 3, 7, o) end,
      tensor = function(o) return kiln.tensor({{1, 2, 3}, {4, 5, 6}}, o) end,
      arange = function(o) return kiln.arange(0, 6, 1, o) end, linspace = function(o) return kiln.linspace(0, 1, 6, o) end,
      eye = function(o) return kiln.eye(2, 3, o) end,
      zeros_like = function(o) return kiln.zeros_like(kiln.ones(2, 3), o) end,
      ones_like = function(o) return kiln.ones_like(kiln.ones(2, 3), o) end,
      full_like = function(o) return kiln.full_like(kiln.ones(2, 3), 2, o) end,
      empty_like = function(o) return kiln.empty_like(kiln.ones(2, 3), o) end,
      rand_like = function(o) return kiln.rand_like(kiln.ones(2, 3), o) end,
      randn_like = function(o) return kiln.randn_like(kiln.ones(2, 3), o) end,
    }
    for name, make in pairs(makers) do
      -- requires_grad: a leaf whose gradient backward fills (sum of 3 x: 3 everywhere)
      local x = make({dtype = "f64", requires_grad = true})
      assert(x.requires_grad and x.is_leaf, name)
      assert.equal("f64", x:dtype(), name)
      local loss = (x * 3):sum()
      loss:backward()
      assert.equal(3 * x:numel(), x.grad:sum():item(), name)
      assert.is_false(make({dtype = "f64"}).requires_grad, name)
      -- a misspelt option is an error, not ignored
      local msg = failure(function() return make({dtyp = "f64"}) end)
      assert(msg:find(name .. ': unknown option "dtyp" (known: device, dtype, requires_grad)', 1, true),
             name .. ": " .. msg)
    end
    assert.matches("only float tensors can require grad", failure(function() return kiln.randint(0, 5, {3}, {requires_grad = true}) end))
    -- kiln.tensor(t): a copy outside t's graph, as torch.tensor(t)
    local src = kiln.randn(2, {requires_grad = true})
    local copy = kiln.tensor(src)
    assert.is_false(copy.requires_grad)
    assert.equal(src:sum():item(), copy:sum():item())
  end)

  it("a misspelt option of a layer, an optimizer group, a scheduler or a loader is named, not ignored", function()
    local p = kiln.randn(2, {requires_grad = true})
    local ds = kiln.data.TensorDataset(kiln.randn(4))
    local cases = {
      {function() return nn.Linear(2, 3, {biass = false}) end, 'Linear: unknown option "biass" (known: bias, dtype)'},
      {function() return nn.Linear(2, 3, {bias = 0}) end, "Linear: bias must be true or false, got the number 0"},
      {function() return nn.Conv2d(1, 2, 3, {padding_mode = "zeros"}) end, 'Conv2d: unknown option "padding_mode"'},
      {function() return nn.BatchNorm2d(4, {affine = "no"}) end, "BatchNorm2d: affine must be true or false, got a string"},
      {function() return nn.MaxPool2d(2, {ceil = true}) end, 'MaxPool2d: unknown option "ceil"'},
      {function() return nn.CrossEntropyLoss{label_smooth = 0.1} end, 'CrossEntropyLoss: unknown option "label_smooth"'},
      {function() return nn.LSTM(3, 4, {num_layer = 2}) end, 'LSTM: unknown option "num_layer"'},
      {function() return nn.GRU(3, 4, {batch_first = 1}) end, "GRU: batch_first must be true or false, got the number 1"},
      {function() return nn.LSTM(3, 4, {nonlinearity = "relu"}) end, "LSTM: nonlinearity is an option of nn.RNN only"},
      {function() return nn.GRUCell(3, 4, {num_layers = 2}) end, 'GRUCell: unknown option "num_layers"'},
      {function() return kiln.optim.SGD({{params = {p}, lrr = 0.5}}) end, 'SGD: unknown option "lrr" in a parameter group'},
      {function() return kiln.optim.Adam({p}):add_param_group{params = {kiln.randn(2, {requires_grad = true})}, beta = {0.5, 0.5}} end,
       'Adam: unknown option "beta" in a parameter group'},
      {function() return kiln.optim.lr_scheduler.StepLR(kiln.optim.SGD({p}), {step_size = 1, gama = 0.5}) end,
       'StepLR: unknown option "gama" (known: gamma, step_size)'},
      {function() return kiln.optim.lr_scheduler.ReduceLROnPlateau(kiln.optim.SGD({p}), {patiance = 3}) end,
       'ReduceLROnPlateau: unknown option "patiance"'},
      {function() return kiln.data.DataLoader{dataset = ds, num_workers = 2} end, 'DataLoader: unknown option "num_workers"'},
      {function() return kiln.data.DataLoader{dataset = ds, shuffle = 1} end, "DataLoader: shuffle must be true or false, got the number 1"},
      {function() return kiln.data.num_batches(ds, {batch_size = 2, drop_last = "yes"}) end, "num_batches: drop_last must be true or false"},
      {function() return kiln.data.permutation(4, {sed = 1}) end, 'permutation: unknown option "sed"'},
      -- load_state_dict takes PyTorch's keyword as an option; backward's and the transforms' too
      {function() local m = nn.Linear(2, 3) return m:load_state_dict(m:state_dict(), {stirct = false}) end,
       'load_state_dict: unknown option "stirct" (known: strict)'},
      {function() local m = nn.Linear(2, 3) return m:load_state_dict(m:state_dict(), "no") end,
       "load_state_dict: strict must be true or false, got a string"},
      {function() return (p * 2):sum():backward{retain_grahp = true} end,
       'backward: unknown option "retain_grahp" (known: retain_graph)'},
      {function() return kiln.data.transforms.RandomCrop{32, pading = 4} end,
       'RandomCrop: unknown option "pading" (known: fill, padding, size)'},
      {function() return kiln.data.transforms.RandomAffine{10, translat = {0.1, 0.1}} end,
       'RandomAffine: unknown option "translat"'},
      {function() return kiln.data.transforms.Normalize{mean = {0.5}, sdt = {0.2}} end, 'Normalize: unknown option "sdt"'},
      -- a tensor given twice to an optimizer would be stepped twice
      {function() return kiln.optim.SGD({p, kiln.randn(2, {requires_grad = true}), p}) end,
       "SGD: group 1: parameters 1 and 3 are the same tensor [2]; give each parameter once"},
      {function() local m = nn.Linear(2, 2) local ps = m:parameters() ps[#ps + 1] = m.weight return kiln.optim.Adam(ps) end,
       "Adam: group 1: parameters 1 and 3 are the same tensor [2, 2]"},
    }
    check_cases(cases)
    -- strict = false as an option is honoured: an unexpected key no longer fails
    local m = nn.Linear(2, 3)
    local sd = m:state_dict()
    sd.extra = kiln.ones(1)
    assert.has_error(function() m:load_state_dict(sd) end)
    m:load_state_dict(sd, {strict = false})
    m:load_state_dict(sd, false)
    assert.equal(4, kiln.data.transforms.RandomCrop{32, padding = 4}.padding)
    -- the right spellings still work, schedulers' keys in a group too
    assert.equal(0.5, kiln.optim.SGD({{params = {p}, lr = 0.5, initial_lr = 0.5}}).param_groups[1].lr)
    assert.is_nil(nn.Linear(2, 3, {bias = false}).bias)
    assert.equal(2, nn.LSTM(3, 4, {num_layers = 2, batch_first = true}).num_layers)
  end)

  it("still builds what the checks let through", function()
    assert.equal("Conv2d(3→4, 3x5, padding 1,0)", (tostring(nn.Conv2d(3, 4, {3, 5}, {padding = {1, 0}})):gsub("  .*", "")))
    assert.equal(0, nn.Dropout(0).p)
    assert.equal("sum", nn.L1Loss{reduction = "sum"}.reduction)
    local y = nn.GroupNorm(2, 4)(kiln.randn(1, 4, 2, 2))
    assert.same({1, 4, 2, 2}, {y:size(1), y:size(2), y:size(3), y:size(4)})
    assert.equal(6, kiln.zeros_like(kiln.ones(2, 3)):add(1):sum():item())
  end)
end)
