-- kiln against PyTorch itself: tests/fixtures/torch_recurrent.safetensors holds what PyTorch's
-- nn.RNN/GRU/LSTM (2 layers, bidirectional, batch_first, a packed batch of unsorted lengths,
-- initial states), an LSTM without biases, the cells and F.ctc_loss computed in f64, with the
-- gradients of a weighted sum of every output (tools/torch_fixtures.py wrote it). Each case loads
-- PyTorch's state dict into the kiln module unchanged and must give the same values and gradients.
-- KILN_FIXTURE_DEVICE=cuda runs the same on a GPU (tests/gpu/run.sh): cuDNN's and kiln's own
-- recurrent kernels instead of the CPU's two algorithms.
local kiln = kiln or require "kiln"
local F = require "kiln.functional"
local nn = kiln.nn
local DIR = debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/"
package.path = DIR .. "?.lua;" .. package.path
local H = require "helpers"

local fixture, DEV = H.torch_fixture("torch_recurrent.safetensors")
if not fixture then   -- no such device here
  describe("recurrent layers against PyTorch", function() it("needs the device", function() pending(DEV) end) end)
  return
end
local TOL = 1e-10
local ALGORITHMS = DEV == "cpu" and {"gemm", "persistent"} or {"cudnn", "gemm"}

-- The tensors of one case, without the "<case>." prefix; grads under .grad.
local function case(name)
  local c, prefix, found = {grad = {}}, name .. ".", false
  for key, t in pairs(fixture) do
    if key:sub(1, #prefix) == prefix then
      local rest = key:sub(#prefix + 1)
      if t:dtype() ~= "i64" then t = t:to(DEV) end   -- lengths and targets stay on the CPU
      if rest:sub(1, 5) == "grad." then c.grad[rest:sub(6)] = t else c[rest] = t end
      found = true
    end
  end
  assert(found, "no case " .. name .. " in the fixture")
  return c
end

-- PyTorch's state dict: the tensors of the case whose names the module has.
local function load_weights(m, c)
  local sd = {}
  for _, np in ipairs(m:named_parameters()) do sd[np[1]] = assert(c[np[1]], "the fixture lacks " .. np[1]):to("cpu") end
  m:load_state_dict(sd)
  if DEV ~= "cpu" then m:to(DEV) end
end

local function leaf(t) return t:detach():clone():requires_grad_() end

local function near(got, want, what)
  local ok, msg = H.compare(got:to("cpu"), want:to("cpu"):totable(), TOL)
  assert(ok, what .. ": " .. tostring(msg))
end

local function check_grads(m, c, inputs)
  for name, t in pairs(inputs) do near(t.grad, c.grad[name], "grad of " .. name) end
  for _, np in ipairs(m:named_parameters()) do near(np[2].grad, c.grad[np[1]], "grad of " .. np[1]) end
end

describe("recurrent layers against PyTorch", function()
  local classes = {rnn_tanh = "RNN", rnn_relu = "RNN", gru = "GRU", lstm = "LSTM"}
  for _, name in ipairs{"rnn_tanh", "rnn_relu", "gru", "lstm"} do
    for _, algorithm in ipairs(ALGORITHMS) do
      it(name .. " (" .. algorithm .. "): 2 layers, bidirectional, unsorted lengths, initial states: outputs, "
         .. "final states and every gradient", function()
        local c = case(name)
        local m = nn[classes[name]](3, 4, {num_layers = 2, batch_first = true, bidirectional = true, dtype = "f64",
                                           nonlinearity = name == "rnn_relu" and "relu" or nil, algorithm = algorithm})
        load_weights(m, c)
        local lstm = name == "lstm"
        local x, h0 = leaf(c.x), leaf(c.h0)
        local c0 = lstm and leaf(c.c0) or nil
        local out, state = m(x, lstm and {h0, c0} or h0, c.lengths)
        near(out, c.out, "output")
        local h_n = lstm and state[1] or state
        near(h_n, c.h_n, "h_n")
        if lstm then near(state[2], c.c_n, "c_n") end
        local loss = (out * c.r_out):sum() + (h_n * c.r_h):sum()
        if lstm then loss = loss + (state[2] * c.r_c):sum() end
        loss:backward()
        check_grads(m, c, lstm and {x = x, h0 = h0, c0 = c0} or {x = x, h0 = h0})
      end)
    end
  end

  it("lstm without biases, sequence first, no lengths and no initial state", function()
    local c = case("lstm_nobias")
    local m = nn.LSTM(3, 4, {bias = false, dtype = "f64"})
    load_weights(m, c)
    local x = leaf(c.x)
    local out, state = m(x)
    near(out, c.out, "output")
    near(state[1], c.h_n, "h_n")
    near(state[2], c.c_n, "c_n")
    ;(out * c.r_out):sum():backward()
    check_grads(m, c, {x = x})
  end)

  for _, name in ipairs{"rnn_cell", "rnn_relu_cell", "gru_cell", "lstm_cell"} do
    it(name .. ": one step and its gradients", function()
      local c = case(name)
      local m = name == "rnn_cell" and nn.RNNCell(3, 4, {dtype = "f64"})
             or name == "rnn_relu_cell" and nn.RNNCell(3, 4, {nonlinearity = "relu", dtype = "f64"})
             or name == "gru_cell" and nn.GRUCell(3, 4, {dtype = "f64"})
             or nn.LSTMCell(3, 4, {dtype = "f64"})
      load_weights(m, c)
      local lstm = name == "lstm_cell"
      local x, h = leaf(c.x), leaf(c.h)
      local cc = lstm and leaf(c.c) or nil
      local r = m(x, lstm and {h, cc} or h)
      local h1 = lstm and r[1] or r
      near(h1, c.h1, "h'")
      local loss = (h1 * c.r_h):sum()
      if lstm then
        near(r[2], c.c1, "c'")
        loss = loss + (r[2] * c.r_c):sum()
      end
      loss:backward()
      check_grads(m, c, lstm and {x = x, h = h, c = cc} or {x = x, h = h})
    end)
  end
end)

describe("ctc_loss against PyTorch", function()
  for _, spec in ipairs{{"ctc", 1}, {"ctc_blank_last", 5}} do
    local name, blank = spec[1], spec[2]
    it(name .. ": losses of every reduction and their gradients; a target too long for its input", function()
      local c = case(name)
      local targets = c.targets + 1   -- kiln counts labels from 1
      local lp = F.log_softmax(c.logits, 3)
      -- sample 4 cannot fit its target: PyTorch's loss is infinite, kiln says so unless zero_infinity
      assert.equal(math.huge, c.loss_none:to("cpu"):totable()[4])
      local msg = H.error_of(F.ctc_loss, lp, targets, c.input_lengths, c.target_lengths, {blank = blank, reduction = "none"})
      assert.matches("sample 4 has input length 2, too short for its target of length 2", msg, 1, true)
      local three = F.ctc_loss(lp:narrow(2, 1, 3), targets:narrow(1, 1, 3), c.input_lengths:narrow(1, 1, 3),
                               c.target_lengths:narrow(1, 1, 3), {blank = blank, reduction = "none"})
      near(three, c.loss_none:narrow(1, 1, 3), "loss (none) of the first three")
      for _, reduction in ipairs{"none", "sum", "mean"} do
        local z = leaf(c.logits)
        local loss = F.ctc_loss(F.log_softmax(z, 3), targets, c.input_lengths, c.target_lengths,
                                {blank = blank, reduction = reduction, zero_infinity = true})
        near(loss, c["loss_" .. reduction .. "_zero_inf"], "loss (" .. reduction .. ", zero_infinity)")
        if reduction == "none" then loss = (loss * c.r):sum() end
        loss:backward()
        near(z.grad, c["grad_" .. reduction .. "_zero_inf"], "gradient (" .. reduction .. ", zero_infinity)")
      end
    end)
  end
end)
