-- kiln.nn: the Module contract (names, state dicts, modes, errors with the module path) and the
-- layers written in Lua, each against an independent reference and an f64 gradient check.
local kiln = kiln or require "kiln"
require "kiln.testing"
local nn = kiln.nn

local function close(a, b, tol)
  local x, y = a:to("f64"):reshape(-1):totable(), b:to("f64"):reshape(-1):totable()
  assert.are.equal(#y, #x)
  for i = 1, #x do
    if math.abs(x[i] - y[i]) > (tol or 1e-5) * (1 + math.abs(y[i])) then
      error(string.format("element %d: %.9g vs %.9g", i, x[i], y[i]), 2)
    end
  end
end

describe("Module", function()
  local function mlp() return nn.Sequential{nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)} end

  it("names parameters like PyTorch and counts them", function()
    local m = mlp()
    local names = {}
    for _, np in ipairs(m:named_parameters()) do names[#names + 1] = np[1] end
    assert.are.same({"0.weight", "0.bias", "2.weight", "2.bias"}, names)
    assert.are.equal(4 * 3 + 3 + 3 * 2 + 2, m:num_parameters())
    for _, p in ipairs(m:parameters()) do assert.is_true(p.requires_grad and p.is_leaf) end
  end)

  it("registers fields of a module defined in Lua, children included", function()
    local Net = nn.define("SpecNet")
    function Net:init()
      self.fc = nn.Linear(2, 2)
      self.scale = self:parameter(kiln.ones(1))
      self:register_buffer("steps", kiln.zeros(1))
    end
    function Net:forward(x) return self.fc(x) * self.scale end
    local m = nn.SpecNet()
    local names = {}
    for _, np in ipairs(m:named_parameters()) do names[#names + 1] = np[1] end
    table.sort(names)
    assert.are.same({"fc.bias", "fc.weight", "scale"}, names)
    local sd = m:state_dict()
    assert.is_not_nil(sd["steps"])
    local y = m(kiln.ones(3, 2))
    assert.are.same({3, 2}, {y:size(1), y:size(2)})
  end)

  it("round-trips a state dict into a fresh model", function()
    kiln.manual_seed(1)
    local a, b = mlp(), mlp()
    local x = kiln.randn(5, 4)
    b:load_state_dict(a:state_dict())
    close(b(x), a(x), 0)
  end)

  it("names missing, unexpected and mis-shaped keys", function()
    local m = mlp()
    local sd = m:state_dict()
    sd["0.weight"] = kiln.zeros(2, 2)
    sd["9.weight"] = kiln.zeros(1)
    sd["2.bias"] = nil
    local ok, err = pcall(function() m:load_state_dict(sd) end)
    assert.is_false(ok)
    assert.matches("missing keys: 2.bias", err)
    assert.matches("unexpected keys: 9.weight", err)
    assert.matches("0.weight: checkpoint %[2, 2%], model %[3, 4%]", err)
    assert.matches("nn_spec", err)
    -- non-strict ignores missing and unexpected keys but never a shape mismatch
    sd["0.weight"] = nil
    local r = m:load_state_dict(sd, false)
    assert.are.same({"0.weight", "2.bias"}, r.missing)
  end)

  it("ties weights the PyTorch way: decoder.weight = encoder.weight", function()
    kiln.manual_seed(3)
    local model = nn.Sequential{nn.Embedding(10, 4), nn.Linear(4, 10, {bias = false})}
    local enc, dec = model["0"], model["1"]
    local old = dec.weight
    dec.weight = enc.weight
    -- one parameter, not two; the old decoder weight is gone from every listing
    assert.are.equal(1, #model:parameters())
    assert.are.equal(40, model:num_parameters())
    assert.is_true(rawequal(model:parameters()[1], enc.weight))
    local sd = model:state_dict()
    assert.is_not_nil(sd["0.weight"])
    assert.is_not_nil(sd["1.weight"])   -- both names, as PyTorch saves them, sharing the values
    assert.same(sd["0.weight"]:totable(), sd["1.weight"]:totable())
    assert.are_not.same(old:totable(), sd["1.weight"]:totable())
    -- a step updates the shared tensor once, with the sum of both grads
    local opt = kiln.optim.SGD(model:parameters(), {lr = 0.5})
    local before = enc.weight:clone()
    local idx = kiln.tensor({1, 3}, {dtype = "i64"})
    local loss = model(idx):sum()
    loss:backward()
    local g = enc.weight.grad:clone()
    opt:step()
    assert.are.equal(0, (enc.weight - (before - g * 0.5)):abs():max():item())
    assert.is_true(rawequal(dec.weight, enc.weight))
    -- loading its own state dict keeps it tied; to() moves the shared tensor once
    model:load_state_dict(model:state_dict())
    model:to("f64")
    assert.are.equal("f64", enc.weight:dtype())
    assert.is_true(rawequal(dec.weight, enc.weight))
    assert.are.equal(1, #model:parameters())
  end)

  it("makes a leaf that requires grad, assigned to a new field, a parameter", function()
    local M = nn.define("ScaleByHand")
    function M:init() self.scale = kiln.ones(3):requires_grad_() self.cache = kiln.zeros(3) end
    function M:forward(x) return x * self.scale end
    local m = nn.ScaleByHand()
    local names = {}
    for _, np in ipairs(m:named_parameters()) do names[#names + 1] = np[1] end
    assert.same({"scale"}, names)   -- the plain tensor (no grad) stays a field
    assert.is_not_nil(m:state_dict().scale)
  end)

  it("switches train and eval through the tree", function()
    local m = nn.Sequential{nn.Linear(2, 2), nn.Sequential{nn.Dropout(0.5)}}
    m:eval()
    for _, sub in ipairs(m:modules()) do assert.is_false(sub.training) end
    m:train()
    for _, sub in ipairs(m:modules()) do assert.is_true(sub.training) end
  end)

  it("indexes a Sequential and a ModuleList from 1: seq[1] is the child PyTorch names \"0\"", function()
    local a, b, c = nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)
    local m = nn.Sequential{a, b, c}
    assert.equal(a, m[1])
    assert.equal(a, m["0"])
    assert.equal(c, m[3])
    assert.equal(c, m[-1])
    assert.is_nil(m[4])
    assert.equal(tostring(m[3].weight:size()), tostring(m:state_dict()["2.weight"]:size()))
    local l = nn.ModuleList{b, c}
    assert.equal(b, l[1])
    assert.equal(c, l[2])
    assert.error_matches(function() return m[1.5] end, "the index must be an integer")
  end)

  it("zero_grad clears the grads", function()
    local m = mlp()
    m(kiln.randn(2, 4)):sum():backward()
    assert.is_not_nil(m:get(1).weight.grad)
    m:zero_grad()
    assert.is_nil(m:get(1).weight.grad)
  end)

  it("prints as an indented tree with parameter counts", function()
    local s = tostring(mlp())
    assert.matches("^Sequential  %[23 params%]\n  0: Linear%(4→3%)  %[15 params%]\n  1: ReLU\n  2: Linear%(3→2%)  %[8 params%]$", s)
  end)

  it("names the module path and the input in errors, at the caller's line", function()
    local m = nn.Sequential{nn.Linear(4, 3), nn.ReLU(), nn.Sequential{nn.Linear(5, 2)}}
    local ok, err = pcall(function() return m(kiln.randn(6, 4)) end)
    assert.is_false(ok)
    assert.matches("nn_spec%.lua:%d+: Sequential%.2%.0 %(Linear 5→2%): input %[6,3%]: ", err)
    assert.matches("3 features in its last dim, expected in_features 5", err)
    -- the model still works
    local ok2 = pcall(function() return nn.Linear(4, 3)(kiln.randn(6, 4)) end)
    assert.is_true(ok2)
  end)

  -- the error of a misspelt method, at the caller's line (this file)
  local function misspelt(f, want)
    local ok, err = pcall(f)
    assert.is_false(ok, "no error for " .. want)
    assert.equal("nn_spec.lua", tostring(err):match("([%w_]+%.lua):%d+: "), "the error is not at the caller's line: " .. tostring(err))
    assert.equal(want, tostring(err):match("%.lua:%d+: (.*)$"))
  end

  it("says which method a misspelt one meant (did you mean), while an absent field reads nil", function()
    local m = nn.Linear(3, 2)
    misspelt(function() return m:paramters() end, "Linear: no method or field 'paramters'; did you mean 'parameters'?")
    misspelt(function() return m:Parameters() end, "Linear: no method or field 'Parameters'; did you mean 'parameters'?")
    misspelt(function() return m:zero_gard() end, "Linear: no method or field 'zero_gard'; did you mean 'zero_grad'?")
    misspelt(function() return m:stat_dict() end, "Linear: no method or field 'stat_dict'; did you mean 'state_dict'?")
    -- reading the key raises too, not only calling it
    misspelt(function() return m.trian end, "Linear: no method or field 'trian'; did you mean 'train'?")
    -- absent fields that misspell no method (more than 2 edits, or more than a third of a short name)
    -- are nil, as a module's own code tests them (if self.bias then)
    assert.is_nil(m.foo)
    assert.is_nil(m.parameters_of_the_encoder)
    assert.is_nil(m.running_mean)
    assert.is_nil(m.h0)
    assert.is_nil(nn.Linear(3, 2, {bias = false}).bias)
    assert.is_nil(m._private_thing)
    -- a module class defined in Lua, its own methods and its base's
    local Enc = nn.define("SpecEncoder")
    function Enc:init() self.proj = nn.Linear(2, 2) end
    function Enc:encode(x) return self.proj(x) end
    function Enc:forward(x) if self.skip then return x end return self:encode(x) end
    local e = nn.SpecEncoder()
    assert.same({4, 2}, e(kiln.randn(4, 2)):size())   -- self.skip: absent, nil
    misspelt(function() return e:encdoe(kiln.randn(1, 2)) end, "SpecEncoder: no method or field 'encdoe'; did you mean 'encode'?")
    misspelt(function() return e:eval_() end, "SpecEncoder: no method or field 'eval_'; did you mean 'eval'?")
    -- Sequential and ModuleList keep their numeric indexing
    local seq = nn.Sequential{m, nn.ReLU()}
    assert.equal(m, seq[1])
    assert.is_nil(seq[3])
    misspelt(function() return seq:ad(nn.ReLU()) end, "Sequential: no method or field 'ad'; did you mean 'add'?")
    misspelt(function() return nn.ModuleList{m}:apend(m) end, "ModuleList: no method or field 'apend'; did you mean 'append'?")
    -- the REPL still completes a module's methods through its class
    local repl = require "kiln.repl"
    local found = {}
    for _, c in ipairs(repl.complete("m:param", "m:param", {m = m})) do found[c] = true end
    assert.is_true(found["m:parameters"] and found["m:parameter"])
  end)

  it("says the same for optimizers, schedulers, datasets and the DataLoader", function()
    local m = nn.Linear(3, 2)
    local opt = kiln.optim.SGD(m:parameters(), {lr = 0.1})
    misspelt(function() return opt:zero_gard() end, "SGD: no method or field 'zero_gard'; did you mean 'zero_grad'?")
    misspelt(function() return kiln.optim.AdamW(m:parameters()):Step() end, "AdamW: no method or field 'Step'; did you mean 'step'?")
    assert.is_nil(opt.foo)
    local sched = kiln.optim.StepLR(opt, {step_size = 2})
    misspelt(function() return sched:stpe() end, "StepLR: no method or field 'stpe'; did you mean 'step'?")
    misspelt(function() return sched:get_last_rl() end, "StepLR: no method or field 'get_last_rl'; did you mean 'get_last_lr'?")
    local ds = kiln.data.TensorDataset(kiln.zeros(4, 2), kiln.zeros(4))
    misspelt(function() return ds:lenn() end, "TensorDataset: no method or field 'lenn'; did you mean 'len'?")
    local loader = kiln.data.DataLoader{dataset = ds, batch_size = 2}
    misspelt(function() return loader:epcoh(0) end, "DataLoader: no method or field 'epcoh'; did you mean 'epoch'?")
    assert.equal("number", type(loader.wait_seconds))
    assert.is_nil(loader.foo)
    -- they still work
    local n = 0
    for x in loader do n = n + 1 assert.same({2, 2}, x:size()) end
    assert.equal(2, n)
    opt:zero_grad()
    sched:step()
  end)
end)

describe("layers", function()
  before_each(function() kiln.manual_seed(5) end)

  it("Linear computes x W^T + b", function()
    local l = nn.Linear(3, 2)
    local x = kiln.randn(4, 3)
    local w, b = l.weight:totable(), l.bias:totable()
    local xs = x:totable()
    local want = {}
    for i = 1, 4 do
      want[i] = {}
      for j = 1, 2 do
        local s = b[j]
        for k = 1, 3 do s = s + xs[i][k] * w[j][k] end
        want[i][j] = s
      end
    end
    close(l(x), kiln.tensor(want))
    -- a batch of sequences goes through matmul with broadcasting
    close(l(x:view(2, 2, 3)):view(4, 2), kiln.tensor(want))
  end)

  it("Linear initialises like PyTorch: within +-1/sqrt(fan_in)", function()
    local l = nn.Linear(100, 50)
    local bound = 1 / math.sqrt(100)
    assert.is_true(l.weight:abs():max():item() <= bound + 1e-7)
    assert.is_true(l.bias:abs():max():item() <= bound + 1e-7)
    assert.is_true(l.weight:std():item() > bound / 3)
  end)

  it("activations match their formulas", function()
    local x = kiln.tensor({-2, -0.5, 0, 0.5, 2}, {dtype = "f64"})
    local xs = x:totable()
    local function map(f) local r = {} for i, v in ipairs(xs) do r[i] = f(v) end return kiln.tensor(r, {dtype = "f64"}) end
    close(nn.ReLU()(x), map(function(v) return math.max(v, 0) end))
    close(nn.LeakyReLU(0.1)(x), map(function(v) return v > 0 and v or 0.1 * v end))
    close(nn.ELU()(x), map(function(v) return v > 0 and v or math.exp(v) - 1 end))
    close(nn.Sigmoid()(x), map(function(v) return 1 / (1 + math.exp(-v)) end))
    close(nn.Tanh()(x), map(math.tanh))
    close(nn.SiLU()(x), map(function(v) return v / (1 + math.exp(-v)) end))
    -- GELU(x) = x Phi(x); Phi from the erf of kiln's own tensor op, checked at known values
    close(nn.GELU()(kiln.tensor({0, 1, -1}, {dtype = "f64"})), kiln.tensor({0, 0.8413447460685429, -0.15865525393145707}, {dtype = "f64"}))
  end)

  it("Linear and the activations pass gradient checks in f64", function()
    local l = nn.Linear(3, 2, {dtype = "f64"})
    local x = kiln.randn(4, 3, {dtype = "f64"}):requires_grad_()
    assert.gradcheck(function(a, w, b) return l(a) end, {x, l.weight, l.bias})
    for _, act in ipairs{nn.LeakyReLU(0.2), nn.ELU(), nn.GELU(), nn.SiLU()} do
      local z = (kiln.randn(3, 4, {dtype = "f64"}) + 0.05):requires_grad_()
      assert.gradcheck(function(a) return act(a) end, {z})
    end
  end)

  it("Embedding looks rows up with indices counted from 1", function()
    local e = nn.Embedding(5, 3)
    local idx = kiln.tensor({{1, 5}, {2, 2}}, {dtype = "i64"})
    local y = e(idx)
    assert.are.same({2, 2, 3}, {y:size(1), y:size(2), y:size(3)})
    close(y[1][2], e.weight[5])
    y:sum():backward()
    close(e.weight.grad:sum(2), kiln.tensor{3, 6, 0, 0, 3})   -- 3 dims per lookup
  end)

  it("Flatten keeps the batch dim", function()
    assert.are.same({2, 12}, {nn.Flatten()(kiln.ones(2, 3, 4)):size(1), nn.Flatten()(kiln.ones(2, 3, 4)):size(2)})
  end)
end)

describe("losses", function()
  local x = kiln.tensor({{0.2, 0.7}, {0.9, 0.1}}, {dtype = "f64"})
  local y = kiln.tensor({{0, 1}, {1, 0}}, {dtype = "f64"})

  it("MSE, L1 and SmoothL1 against hand-computed values", function()
    assert.is_true(math.abs(nn.MSELoss()(x, y):item() - (0.04 + 0.09 + 0.01 + 0.01) / 4) < 1e-12)
    assert.is_true(math.abs(nn.L1Loss{reduction = "sum"}(x, y):item() - (0.2 + 0.3 + 0.1 + 0.1)) < 1e-12)
    local big = kiln.tensor({3}, {dtype = "f64"})
    assert.is_true(math.abs(nn.SmoothL1Loss()(big, kiln.zeros(1, {dtype = "f64"})):item() - 2.5) < 1e-12)
    assert.is_true(math.abs(nn.SmoothL1Loss()(x, y):item() - 0.5 * (0.04 + 0.09 + 0.01 + 0.01) / 4) < 1e-12)
  end)

  it("BCE and BCE with logits agree and match the formula", function()
    local p = x
    local want = -(math.log(0.8) + math.log(0.7) + math.log(0.9) + math.log(0.9)) / 4
    assert.is_true(math.abs(nn.BCELoss()(p, y):item() - want) < 1e-12)
    local z = (p / (1 - p)):log()
    assert.is_true(math.abs(nn.BCEWithLogitsLoss()(z, y):item() - want) < 1e-12)
    -- large logits stay finite
    local huge = kiln.tensor({100, -100}, {dtype = "f64"})
    assert.is_true(nn.BCEWithLogitsLoss()(huge, kiln.tensor({0, 1}, {dtype = "f64"})):item() > 99)
  end)

  it("losses name mismatched shapes", function()
    local ok, err = pcall(function() return nn.MSELoss()(kiln.ones(2, 3), kiln.ones(3, 2)) end)
    assert.is_false(ok)
    assert.matches("MSELoss: input %[2, 3%] and target %[3, 2%] differ in shape", err)
  end)

  it("pass gradient checks in f64", function()
    local a = kiln.rand(3, 2, {dtype = "f64"}):mul(0.8):add(0.1):detach():requires_grad_()
    local t = kiln.rand(3, 2, {dtype = "f64"})
    for _, loss in ipairs{nn.MSELoss(), nn.L1Loss(), nn.SmoothL1Loss(), nn.BCELoss(), nn.BCEWithLogitsLoss()} do
      assert.gradcheck(function(v) return loss(v, t) end, {a})
    end
  end)
end)

describe("nn.init", function()
  it("kaiming and xavier bounds follow the fans", function()
    local w = kiln.empty(64, 32, 3, 3)
    nn.init.kaiming_uniform_(w, {nonlinearity = "relu"})
    local bound = math.sqrt(2) * math.sqrt(3 / (32 * 9))
    assert.is_true(w:abs():max():item() <= bound + 1e-6)
    assert.is_true(w:abs():max():item() > bound * 0.9)
    nn.init.xavier_uniform_(w)
    local xb = math.sqrt(6 / (32 * 9 + 64 * 9))
    assert.is_true(w:abs():max():item() <= xb + 1e-6)
    nn.init.zeros_(w)
    assert.are.equal(0, w:abs():max():item())
  end)
end)

describe("convolution and normalisation modules", function()
  before_each(function() kiln.manual_seed(9) end)

  it("BatchNorm2d normalises with batch statistics in training and running ones in eval", function()
    local bn = nn.BatchNorm2d(3, {dtype = "f64"})
    local x = kiln.randn(4, 3, 5, 5, {dtype = "f64"}) * 2 + 1
    local y = bn(x)
    -- per channel: mean 0 and (biased) variance 1 over N, H, W
    close(y:mean({1, 3, 4}), kiln.zeros(3, {dtype = "f64"}), 1e-9)
    close(y:var({1, 3, 4}, false, {correction = 0}), kiln.ones(3, {dtype = "f64"}), 1e-4)
    -- running stats moved 10% of the way to the batch's (unbiased) statistics
    local m = x:mean({1, 3, 4})
    local v = x:var({1, 3, 4})
    close(bn.running_mean, m * 0.1, 1e-9)
    close(bn.running_var, v * 0.1 + 0.9, 1e-9)
    assert.are.equal(1, bn.num_batches_tracked:item())
    bn:eval()
    local z = bn(x)
    local want = (x - bn.running_mean:view(1, 3, 1, 1)) / (bn.running_var:view(1, 3, 1, 1) + 1e-5):sqrt()
    close(z, want, 1e-9)
    assert.are.equal(1, bn.num_batches_tracked:item())
    local names = {}
    for k in pairs(bn:state_dict()) do names[#names + 1] = k end
    table.sort(names)
    assert.are.same({"bias", "num_batches_tracked", "running_mean", "running_var", "weight"}, names)
  end)

  it("Conv1d matches a naive loop and keeps PyTorch's weight shape", function()
    local conv = nn.Conv1d(2, 3, 3, {padding = 1, dtype = "f64"})
    assert.are.same({3, 2, 3}, {conv.weight:size(1), conv.weight:size(2), conv.weight:size(3)})
    local x = kiln.randn(2, 2, 6, {dtype = "f64"})
    local y = conv(x)
    local w, b, xs = conv.weight:totable(), conv.bias:totable(), x:totable()
    local want = {}
    for n = 1, 2 do
      want[n] = {}
      for o = 1, 3 do
        want[n][o] = {}
        for t = 1, 6 do
          local s = b[o]
          for c = 1, 2 do
            for k = 1, 3 do
              local i = t + k - 2
              if i >= 1 and i <= 6 then s = s + xs[n][c][i] * w[o][c][k] end
            end
          end
          want[n][o][t] = s
        end
      end
    end
    close(y, kiln.tensor(want, {dtype = "f64"}), 1e-12)
    y:sum():backward()
    assert.is_not_nil(conv.weight.grad)
  end)

  it("Conv2d, pooling and LayerNorm modules keep shapes and print their settings", function()
    local m = nn.Sequential{nn.Conv2d(1, 4, 3, {padding = 1}), nn.MaxPool2d(2), nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1),
                            nn.Flatten(), nn.LayerNorm(4)}
    local y = m(kiln.randn(2, 1, 8, 8))
    assert.are.same({2, 4}, {y:size(1), y:size(2)})
    assert.matches("Conv2d%(1→4, 3x3, padding 1,1%)", tostring(m))
  end)
end)

describe("GroupNorm module", function()
  it("normalises each group of channels", function()
    local gn = nn.GroupNorm(2, 4, {dtype = "f64"})
    local x = kiln.randn(3, 4, 5, {dtype = "f64"}) * 3 + 2
    local y = gn(x):view(3, 2, 10)
    close(y:mean(3), kiln.zeros(3, 2, {dtype = "f64"}), 1e-9)
    close(y:var(3, false, {correction = 0}), kiln.ones(3, 2, {dtype = "f64"}), 1e-4)
  end)
end)
