-- Recurrent layers: every mode against a step-by-step reference written here with Lua numbers
-- (lengths, reverse, initial states, layers, directions, batch_first), f64 gradient checks of
-- every mode on both algorithms, the persistent path equal to the GEMM path (f32, forward and
-- backward), the avx512 gate loop against the generic one (bits, in a child at the avx2 level),
-- the cells, PyTorch's parameter names, and misuse errors.
local kiln = kiln or require "kiln"
require "kiln.testing"
local F = require "kiln.functional"
local nn = kiln.nn
local helpers = require "helpers"

local function sigmoid(v) return 1 / (1 + math.exp(-v)) end
local gates = {rnn_tanh = 1, rnn_relu = 1, gru = 3, lstm = 4}

-- One layer, one direction, in plain Lua: x[t][b][i], w_ih[r][i], w_hh[r][k], b[r] (or nil),
-- h0[b][j] / c0 (or nil). Returns y[t][b][j] (zeros past each length), h_n[b][j], c_n[b][j].
local function reference(mode, x, h0, c0, w_ih, w_hh, b_ih, b_hh, lengths, reverse)
  local T, B, I, H = #x, #x[1], #x[1][1], #w_hh[1]
  local G = gates[mode]
  local y, h, c = {}, {}, {}
  for t = 1, T do y[t] = {} for b = 1, B do y[t][b] = {} for j = 1, H do y[t][b][j] = 0 end end end
  for b = 1, B do
    h[b], c[b] = {}, {}
    for j = 1, H do h[b][j] = h0 and h0[b][j] or 0; c[b][j] = c0 and c0[b][j] or 0 end
  end
  for b = 1, B do
    local L = lengths and lengths[b] or T
    for s = 1, L do
      local t = reverse and L - s + 1 or s
      local xi, hh = {}, {}
      for r = 1, G * H do
        local a = b_ih and b_ih[r] or 0
        for i = 1, I do a = a + w_ih[r][i] * x[t][b][i] end
        local q = b_hh and b_hh[r] or 0
        for k = 1, H do q = q + w_hh[r][k] * h[b][k] end
        xi[r], hh[r] = a, q
      end
      local hn = {}
      for j = 1, H do
        if mode == "lstm" then
          local i_, f_ = sigmoid(xi[j] + hh[j]), sigmoid(xi[H + j] + hh[H + j])
          local g_, o_ = math.tanh(xi[2 * H + j] + hh[2 * H + j]), sigmoid(xi[3 * H + j] + hh[3 * H + j])
          c[b][j] = f_ * c[b][j] + i_ * g_
          hn[j] = o_ * math.tanh(c[b][j])
        elseif mode == "gru" then
          local r_, z_ = sigmoid(xi[j] + hh[j]), sigmoid(xi[H + j] + hh[H + j])
          local n_ = math.tanh(xi[2 * H + j] + r_ * hh[2 * H + j])
          hn[j] = (1 - z_) * n_ + z_ * h[b][j]
        else
          local p = xi[j] + hh[j]
          hn[j] = mode == "rnn_tanh" and math.tanh(p) or math.max(p, 0)
        end
      end
      h[b] = hn
      for j = 1, H do y[t][b][j] = hn[j] end
    end
  end
  return y, h, c
end

local function randn(...) return kiln.randn(...) end
local function f64(...) local s = {...} return kiln.randn(s, {dtype = "f64"}) end

local function assert_error(fn, pattern)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error matching " .. pattern)
  assert(tostring(err):find(pattern), string.format("error %q does not match %q", tostring(err), pattern))
end

local function leaves(list)
  local out = {}
  for i = 1, table.maxn(list) do out[i] = list[i] and list[i]:detach():requires_grad_() end
  return out
end

local function assert_near(got, want, tol, what)
  local function walk(g, w, path)
    if type(w) == "table" then
      assert(type(g) == "table" and #g == #w, what .. ": shape differs at " .. path)
      for i = 1, #w do walk(g[i], w[i], path .. "[" .. i .. "]") end
    else
      assert(math.abs(g - w) <= tol * (1 + math.abs(w)),
             string.format("%s%s = %.12g, expected %.12g", what, path, g, w))
    end
  end
  walk(got, want, "")
end

describe("rnn_layer", function()
  local T, B, I, H = 5, 3, 4, 6
  for _, mode in ipairs{"rnn_tanh", "rnn_relu", "gru", "lstm"} do
    for _, algo in ipairs{"gemm", "persistent"} do
      it(mode .. " (" .. algo .. ") matches the step-by-step reference with lengths, reverse and initial states", function()
        kiln.manual_seed(3)
        local G = gates[mode]
        local x, h0 = f64(T, B, I), f64(B, H)
        local c0 = mode == "lstm" and f64(B, H) or nil
        local w_ih, w_hh = f64(G * H, I) * 0.5, f64(G * H, H) * 0.5
        local b_ih, b_hh = f64(G * H), f64(G * H)
        local lengths = {5, 2, 4}
        for _, reverse in ipairs{false, true} do
          local z = F.rnn_layer(mode, x, h0, c0, w_ih, w_hh, b_ih, b_hh,
                                {lengths = lengths, reverse = reverse, algorithm = algo})
          local y, hn, cn = reference(mode, x:totable(), h0:totable(), c0 and c0:totable(), w_ih:totable(),
                                      w_hh:totable(), b_ih:totable(), b_hh:totable(), lengths, reverse)
          assert.same({T + (mode == "lstm" and 2 or 1), B, H}, z:size())
          assert_near(z:narrow(1, 1, T):totable(), y, 1e-12, "output")
          assert_near(z:select(1, T + 1):totable(), hn, 1e-12, "h_n")
          if mode == "lstm" then assert_near(z:select(1, T + 2):totable(), cn, 1e-12, "c_n") end
        end
      end)

      it(mode .. " (" .. algo .. ") passes an f64 gradient check w.r.t. every input", function()
        kiln.manual_seed(4)
        local G = gates[mode]
        local x, h0 = f64(4, 2, 3), f64(2, 3)
        local c0 = mode == "lstm" and f64(2, 3) or nil
        local w_ih, w_hh, b_ih, b_hh = f64(G * 3, 3) * 0.5, f64(G * 3, 3) * 0.5, f64(G * 3), f64(G * 3)
        -- with lengths (padded steps) and without (every step of every sequence: the states
        -- before each step are read in place for w_hh's grad)
        for _, lengths in ipairs{{4, 3}, false} do
          for _, reverse in ipairs{false, true} do
            local inputs = leaves{x, h0, w_ih, w_hh, b_ih, b_hh, c0}
            assert.gradcheck(function(a, h, wi, wh, bi, bh, c)
              return F.rnn_layer(mode, a, h, c, wi, wh, bi, bh, {lengths = lengths or nil, reverse = reverse, algorithm = algo})
            end, inputs)
          end
        end
      end)
    end
  end

  it("runs without initial states or biases, as zeros", function()
    kiln.manual_seed(5)
    local x, w_ih, w_hh = f64(3, 2, 2), f64(8, 2), f64(8, 2)
    local z = F.rnn_layer("lstm", x, nil, nil, w_ih, w_hh, nil, nil)
    local y, hn = reference("lstm", x:totable(), nil, nil, w_ih:totable(), w_hh:totable(), nil, nil, nil, false)
    assert_near(z:narrow(1, 1, 3):totable(), y, 1e-12, "output")
    assert_near(z:select(1, 4):totable(), hn, 1e-12, "h_n")
    assert.gradcheck(function(a, wi, wh) return F.rnn_layer("lstm", a, nil, nil, wi, wh, nil, nil) end, leaves{x, w_ih, w_hh})
  end)

  it("saturates the f32 gates to exactly 0 and 1, and keeps NaN, on both paths (units in and past whole vectors)", function()
    -- one step from zero states, every weight 0: the gates are sigmoid / tanh of the biases. Unit j
    -- has i = sigmoid(v), g = tanh(u), f = 0, o = 1 (biases of +-100), so c_n = i * g is each gate
    -- alone when the other is 1: tanh beyond 9.02 and sigmoid beyond 87 are exactly +-1 and 1 in f32
    local H = 19   -- a whole vector of 16 units and a part
    local vs = {100, 9.03, 50, -100, -9.03, 0 / 0, 9.01, 0.5, -0.5, 1e30, -1e30, 1 / 0, -1 / 0, 0, 88, -88, 3, -3, 20}
    for _, algo in ipairs{"gemm", "persistent"} do
      for _, which in ipairs{"tanh", "sigmoid"} do
        local b = {}
        for j = 1, H do
          local v = vs[j]
          b[j], b[H + j] = which == "sigmoid" and v or 100, -100
          b[2 * H + j], b[3 * H + j] = which == "tanh" and v or 100, 100
        end
        local z = F.rnn_layer("lstm", kiln.zeros(1, 1, 1), nil, nil, kiln.zeros(4 * H, 1), kiln.zeros(4 * H, H),
                              kiln.tensor(b), kiln.zeros(4 * H), {algorithm = algo})
        local cn = z:select(1, 3):totable()[1]
        for j = 1, H do
          local v, got = vs[j], cn[j]
          local want = which == "tanh" and math.tanh(v) or sigmoid(v)
          local where = string.format("%s %s(%g): %.9g", algo, which, v, got)
          if v ~= v then assert.is_true(got ~= got, where)
          elseif math.abs(v) > 9.02 and which == "tanh" then assert.equal(v > 0 and 1 or -1, got, where)
          elseif v > 88 and which == "sigmoid" then assert.equal(1, got, where)
          elseif v == -1 / 0 then assert.equal(0, got, where)
          else assert.is_true(math.abs(got - want) <= 6e-7 * math.max(math.abs(want), 1e-30), where) end
        end
      end
    end
  end)

  it("runs the LSTM forward's gates at the avx512 level with the bits of the generic loop (avx2, a child process)", function()
    local exe = helpers.kiln_exe()
    if not exe then pending("not running under the kiln launcher") return end
    local level = kiln.info().cpu.level
    if level ~= "avx512" then pending("the kernels run at the " .. level .. " level (KILN_CPU_LEVEL, a KILN_NATIVE build, or no AVX-512)") return end
    -- the weights 0, so that the products are exactly 0 and the gates are sigmoid / tanh of the
    -- biases alone: values across the clamps, specials, and random ones; three steps from random
    -- states (c carried through the multiply-adds); 37 units (a masked last pass); f32 on both
    -- paths and the bf16 team (its output rounded in the loop)
    local a, g = unpack(helpers.children_outputs(exe, [[
      local kiln = require "kiln"
      local F, out = kiln.F, {}
      local U, B = 37, 5
      kiln.manual_seed(21)
      local b = (kiln.randn(4 * U) * 6):totable()
      local specials = {0 / 0, 1 / 0, -1 / 0, -0.0, 9.02, -9.03, 88.5, -88.5, 87.3, -87.3, 1e30, -1e30, 20, -20}
      for k, v in ipairs(specials) do b[3 * k] = v end
      local x, h0, c0 = kiln.zeros(3, B, 2), kiln.randn(B, U), kiln.randn(B, U) * 3
      local w_ih, w_hh = kiln.zeros(4 * U, 2), kiln.zeros(4 * U, U)
      for _, algo in ipairs{"gemm", "persistent"} do
        out[algo] = F.rnn_layer("lstm", x, h0, c0, w_ih, w_hh, kiln.tensor(b), kiln.randn(4 * U), {algorithm = algo})
        kiln.manual_seed(22)
      end
      out.bf16 = F.rnn_layer("lstm", x:to("bf16"), h0, c0, w_ih, w_hh, kiln.tensor(b), kiln.zeros(4 * U), {algorithm = "persistent"})
      kiln.save(arg[1], out)
    ]], {"KILN_CPU_LEVEL=avx512", "KILN_CPU_LEVEL=avx2"}))
    for _, name in ipairs{"gemm", "persistent", "bf16"} do
      local x, y = a[name]:float():reshape(a[name]:numel()):totable(), g[name]:float():reshape(g[name]:numel()):totable()
      assert.equal(#y, #x, name)
      for i = 1, #x do
        local same = x[i] == y[i] and (x[i] ~= 0 or 1 / x[i] == 1 / y[i]) or (x[i] ~= x[i] and y[i] ~= y[i])
        assert.is_true(same, string.format("%s element %d: avx512 %.9g, avx2 %.9g", name, i, x[i], y[i]))
      end
    end
  end)

  it("leaves padded steps out of the outputs and the gradients", function()
    kiln.manual_seed(6)
    local x = randn(6, 2, 3):requires_grad_()
    local w_ih, w_hh = randn(12, 3):requires_grad_(), randn(12, 4):requires_grad_()
    local z = F.rnn_layer("gru", x, nil, nil, w_ih, w_hh, nil, nil, {lengths = {6, 2}})
    local y = z:narrow(1, 1, 6)
    assert.equal(0, y:narrow(1, 3, 4):select(2, 2):abs():sum():item())
    z:sum():backward()
    assert.equal(0, x.grad:narrow(1, 3, 4):select(2, 2):abs():sum():item())
    assert.is_true(x.grad:narrow(1, 1, 2):select(2, 2):abs():sum():item() > 0)
  end)

  -- rnn_layer on the GEMM path and on the persistent path from the same inputs (inputs[2] and
  -- [3]: h0 and c0, or false), a random grad of the output; the largest difference of the output
  -- and of each input's grad must stay within tol (times the tensor's largest value when scaled)
  local function assert_paths_agree(mode, inputs, opts, tol, scaled, label)
    local got = {}
    for k, algo in ipairs{"gemm", "persistent"} do
      local ps = {}
      for i, t in ipairs(inputs) do ps[i] = t and t:clone():requires_grad_() or false end
      local o = {algorithm = algo}
      for key, v in pairs(opts) do o[key] = v end
      local z = F.rnn_layer(mode, ps[1], ps[2] or nil, ps[3] or nil, ps[4], ps[5], ps[6], ps[7], o)
      kiln.manual_seed(8)
      local loss = (z * kiln.randn(z:size(), {dtype = z:dtype()})):sum()
      loss:backward()
      got[k] = {z:detach()}
      for i, t in ipairs(ps) do if t then got[k][#got[k] + 1] = t.grad end end
    end
    for i = 1, #got[1] do
      local d = (got[1][i] - got[2][i]):abs():max():item()
      local scale = scaled and math.max(1, got[1][i]:abs():max():item()) or 1
      assert(d <= tol * scale, string.format("%s, tensor %d: persistent differs by %g", label, i, d))
    end
  end

  it("gives the same result on the persistent path as on the GEMM path (f32, within 1e-6)", function()
    local threads = kiln.get_num_threads()
    for _, n in ipairs{1, 2, 3} do
      kiln.set_num_threads(n)
      -- 37 units: partial panels and blocks of the packed weights, and 7 sequences (blocks of 4
      -- and 3 against each panel at the avx512 level); 64: whole ones only, and 11 sequences
      -- (blocks of 6 and 5), or 14 (6 and two of 4)
      local fourteen = {12, 12, 12, 11, 10, 10, 9, 9, 7, 6, 5, 4, 3, 1}
      for _, case in ipairs{{"rnn_tanh", 37}, {"gru", 37}, {"lstm", 37}, {"rnn_tanh", 64}, {"gru", 64}, {"lstm", 64},
                            {"lstm", 64, fourteen}} do
        local mode, Hs = case[1], case[2]
        local lengths = case[3] or Hs == 37 and {12, 7, 9, 5, 11, 2, 8} or {12, 12, 11, 10, 9, 9, 7, 5, 4, 3, 1}
        kiln.manual_seed(7)
        local G = gates[mode]
        local x = randn(12, #lengths, 16)
        -- w_hh scaled with the width, so that rounding differences are not amplified step by step
        local w_ih, w_hh = randn(G * Hs, 16) * 0.2, randn(G * Hs, Hs) * (0.2 * math.sqrt(37 / Hs))
        local b_ih, b_hh = randn(G * Hs) * 0.1, randn(G * Hs) * 0.1
        assert_paths_agree(mode, {x, false, false, w_ih, w_hh, b_ih, b_hh}, {lengths = lengths, reverse = true}, 1e-6, true,
                           string.format("%s, %d units, %d threads", mode, Hs, n))
      end
    end
    kiln.set_num_threads(threads)
  end)

  it("gives the same result on both paths in f64 too, with the input projection folded in (batch 9)", function()
    local threads = kiln.get_num_threads()
    for _, n in ipairs{1, 2} do
      kiln.set_num_threads(n)
      for _, mode in ipairs{"lstm", "rnn_tanh", "gru"} do
        kiln.manual_seed(9)
        local G, Hs = gates[mode], 16
        local x, h0 = f64(7, 9, 5), f64(9, Hs)
        local w_ih, w_hh, b_ih, b_hh = f64(G * Hs, 5) * 0.3, f64(G * Hs, Hs) * 0.3, f64(G * Hs), f64(G * Hs)
        assert_paths_agree(mode, {x, h0, false, w_ih, w_hh, b_ih, b_hh},
                           {lengths = {7, 7, 6, 6, 5, 4, 3, 2, 1}, reverse = n == 2}, 1e-12, false,
                           string.format("%s f64, %d threads", mode, n))
      end
    end
    kiln.set_num_threads(threads)
  end)

  it("says which algorithm it runs and why", function()
    -- AUTO's rule: G * (hidden / threads) * hidden * batch multiply-adds per thread per step
    -- against 350k (batch 1-3) or 150k (4-128; 600k for the plain RNN), batch <= 128, and hidden
    -- >= 256 above batch 16; at 1 thread persistent up to batch 128; asked at 2 threads, then at 1
    local threads = kiln.get_num_threads()
    kiln.set_num_threads(2)
    local ok, err = pcall(function()
      local a, why = F.rnn_algorithm("lstm", 4, 256)        -- 4 * 128 * 256 * 4 = 524k
      assert.equal("persistent", a)
      assert.matches("batch 4, 2 threads, 524k multiply%-adds", why)
      a, why = F.rnn_algorithm("lstm", 2, 256)              -- 262k < 350k
      assert.equal("gemm", a)
      assert.matches("262k multiply%-adds a step %(below 350k%)", why)
      a, why = F.rnn_algorithm("lstm", 129, 1024)
      assert.equal("gemm", a)
      assert.matches("batch 129 is above 128", why)
      a, why = F.rnn_algorithm("lstm", 17, 255)
      assert.equal("gemm", a)
      assert.matches("batch 17 and hidden size 255 %(below 256%)", why)
      assert.equal("persistent", (F.rnn_algorithm("lstm", 128, 256)))
      assert.equal("persistent", (F.rnn_algorithm("lstm", 12, 1024)))
      assert.equal("persistent", (F.rnn_algorithm("lstm", 16, 128)))
      assert.equal("persistent", (F.rnn_algorithm("lstm", 12, 256)))
      assert.equal("persistent", (F.rnn_algorithm("lstm", 1, 8192)))   -- weights far beyond the caches: still faster
      assert.equal("gemm", (F.rnn_algorithm("lstm", 1, 256)))
      assert.equal("persistent", (F.rnn_algorithm("lstm", 1, 512)))     -- 524k
      assert.equal("gemm", (F.rnn_algorithm("rnn_tanh", 4, 512)))      -- 524k < 600k for one gate
      assert.equal("persistent", (F.rnn_algorithm("rnn_tanh", 1, 1024)))
      assert.equal("persistent", (F.rnn_algorithm("gru", 8, 128)))     -- 3 * 64 * 128 * 8 = 196k
      assert.equal("gemm", (F.rnn_algorithm("gru", 4, 128)))           -- 98k
      kiln.set_num_threads(1)   -- no barrier: persistent up to batch 128, whatever the work
      assert.equal("persistent", (F.rnn_algorithm("lstm", 2, 256)))
      a, why = F.rnn_algorithm("lstm", 1, 256)
      assert.equal("persistent", a)
      assert.matches("batch 1, 1 thread %(no barrier to wait at%), 262k multiply%-adds", why)
      assert.equal("persistent", (F.rnn_algorithm("gru", 64, 32)))
      assert.equal("persistent", (F.rnn_algorithm("rnn_tanh", 1, 16)))
      assert.equal("gemm", (F.rnn_algorithm("lstm", 129, 256)))
      a, why = F.rnn_algorithm("gru", 64, 64, {algorithm = "persistent"})
      assert.equal("persistent", a)
      assert.matches("as asked", why)
    end)
    kiln.set_num_threads(threads)
    assert(ok, err)
  end)

  it("takes the cudnn algorithm: CUDA only, GEMM on the CPU, cuDNN by default on CUDA when built with it", function()
    local a, why = F.rnn_algorithm("lstm", 2, 64, {algorithm = "cudnn"})
    assert.equal("gemm", a)
    assert.matches("cuDNN runs on CUDA; this layer is on cpu", why)
    -- no device needed to ask: the answer follows the CUDA backend's build
    a, why = F.rnn_algorithm("lstm", 8, 64, {device = "cuda"})
    if kiln.cuda.has_cudnn() then
      assert.equal("cudnn", a)
      assert.matches("cuDNN's RNN", why)
      assert.equal("cudnn", (F.rnn_algorithm("gru", 8, 64, {device = "cuda", dtype = "f64", algorithm = "persistent"})))
    else
      assert.equal("gemm", a)
      assert.matches("no cuDNN", why)
    end
    a, why = F.rnn_algorithm("lstm", 8, 64, {device = "cuda", algorithm = "gemm"})
    assert.equal("gemm", a)
    assert.matches("own kernels", why)
    -- on the CPU a layer asked for cudnn runs, and gives what GEMM gives
    local x, w_ih, w_hh, b = kiln.randn(5, 3, 4), kiln.randn(12, 4), kiln.randn(12, 4), kiln.randn(12)
    local o = {lengths = {5, 2, 4}, reverse = true}
    local g = F.rnn_layer("gru", x, nil, nil, w_ih, w_hh, b, b, o)
    o.algorithm = "cudnn"
    local d = F.rnn_layer("gru", x, nil, nil, w_ih, w_hh, b, b, o)
    assert.equal(0, (g - d):abs():max():item())
    local m = nn.LSTM(4, 6, {algorithm = "cudnn"})
    assert.equal("gemm", (m:algorithm_for(3)))
    assert.matches("algorithm=cudnn", tostring(m))
  end)

  it("names what is wrong", function()
    local x, w_ih, w_hh = randn(4, 2, 3), randn(8, 3), randn(8, 2)
    assert_error(function() F.rnn_layer("lstm", randn(4, 2, 5), nil, nil, w_ih, w_hh) end,
                           "lstm: input %[4,2,5%] has 5 features but weight_ih %[8,3%] expects 3")
    assert_error(function() F.rnn_layer("lstm", x, randn(3, 2), nil, w_ih, w_hh) end,
                           "initial hidden state is %[3,2%], expected %[2,2%]")
    assert_error(function() F.rnn_layer("lstm", x, nil, nil, w_ih, w_hh, nil, nil, {lengths = {4, 5}}) end,
                           "sequence 2 has length 5, outside 1..4")
    assert_error(function() F.rnn_layer("lstm", x, nil, nil, w_ih, w_hh, nil, nil, {lengths = {4}}) end,
                           "lengths .* expected i64 %[2%]")
    assert_error(function() F.rnn_layer("gru", x, nil, randn(2, 2), randn(6, 3), w_hh:narrow(1, 1, 6)) end,
                           "only an LSTM has one")
    assert_error(function() F.rnn_layer("lstm", x, nil, nil, w_ih, randn(8, 3)) end,
                           "weight_hh %[8,3%] is not %[4%*hidden, hidden%]")
    assert_error(function() F.rnn_layer("lstm", x:to{dtype = "f64"}, nil, nil, w_ih, w_hh) end,
                           "weight_ih %[8,3%] is f32 but the input %[4,2,3%] is f64")
    assert_error(function() F.rnn_layer("lstm", x, nil, nil, w_ih, w_hh, nil, nil, {algorithm = "fast"}) end,
                           "algorithm fast %(expected auto, gemm, persistent or cudnn%)")
    -- the runtime is fine afterwards
    assert.same({6, 2, 2}, F.rnn_layer("lstm", x, nil, nil, w_ih, w_hh):size())
  end)
end)

describe("nn.RNN, nn.GRU, nn.LSTM", function()
  -- The module's layers and directions put together from the reference, reading its parameters.
  local function module_reference(m, mode, x, lengths)
    local T, B = #x, #x[1]
    local D = m.bidirectional and 2 or 1
    local input, hn, cn = x, {}, {}
    local function p(name) local t = m[name] return t and t:totable() or nil end
    for l = 0, m.num_layers - 1 do
      local outs = {}
      for d = 0, D - 1 do
        local sfx = "_l" .. l .. (d == 1 and "_reverse" or "")
        local y, h, c = reference(mode, input, nil, nil, p("weight_ih" .. sfx), p("weight_hh" .. sfx), p("bias_ih" .. sfx),
                                  p("bias_hh" .. sfx), lengths, d == 1)
        outs[d + 1] = y
        hn[#hn + 1], cn[#cn + 1] = h, c
      end
      local nxt = {}
      for t = 1, T do
        nxt[t] = {}
        for b = 1, B do
          nxt[t][b] = {}
          for _, y in ipairs(outs) do for _, v in ipairs(y[t][b]) do nxt[t][b][#nxt[t][b] + 1] = v end end
        end
      end
      input = nxt
    end
    return input, hn, cn
  end

  for _, name in ipairs{"RNN", "GRU", "LSTM"} do
    it(name .. ": 2 layers, bidirectional, batch_first, lengths: the reference, and f64 gradients", function()
      kiln.manual_seed(9)
      local mode = name == "RNN" and "rnn_tanh" or name:lower()
      local m = nn[name](3, 4, {num_layers = 2, bidirectional = true, batch_first = true, dtype = "f64"})
      local x = f64(2, 5, 3)   -- [B,T,I]
      local lengths = {5, 3}
      local out, h = m(x, nil, lengths)
      assert.same({2, 5, 8}, out:size())
      local want, hn, cn = module_reference(m, mode, x:transpose(1, 2):totable(), lengths)
      assert_near(out:transpose(1, 2):totable(), want, 1e-12, "output")
      local h_n = name == "LSTM" and h[1] or h
      assert.same({4, 2, 4}, h_n:size())
      assert_near(h_n:totable(), hn, 1e-12, "h_n")
      if name == "LSTM" then assert_near(h[2]:totable(), cn, 1e-12, "c_n") end
      local h0 = f64(4, 2, 4)
      local c0 = f64(4, 2, 4)
      assert.gradcheck(function(a, hh, cc)
        local o, s = m(a, name == "LSTM" and {hh, cc} or hh, lengths)
        local hs = name == "LSTM" and kiln.cat({s[1], s[2]}, 1) or s
        return kiln.cat({o:reshape(-1), hs:reshape(-1)}, 1)
      end, leaves{x, h0, c0})
    end)
  end

  it("carries PyTorch's parameter names and shapes", function()
    local m = nn.LSTM(10, 20, {num_layers = 2, bidirectional = true})
    local names = {}
    for _, np in ipairs(m:named_parameters()) do names[#names + 1] = np[1] .. "=" .. table.concat(np[2]:size(), "x") end
    assert.same({"weight_ih_l0=80x10", "weight_hh_l0=80x20", "bias_ih_l0=80", "bias_hh_l0=80",
                 "weight_ih_l0_reverse=80x10", "weight_hh_l0_reverse=80x20", "bias_ih_l0_reverse=80", "bias_hh_l0_reverse=80",
                 "weight_ih_l1=80x40", "weight_hh_l1=80x20", "bias_ih_l1=80", "bias_hh_l1=80",
                 "weight_ih_l1_reverse=80x40", "weight_hh_l1_reverse=80x20", "bias_ih_l1_reverse=80", "bias_hh_l1_reverse=80"},
                names)
    local g = nn.GRU{input_size = 5, hidden_size = 7, bias = false}
    assert.equal(2, #g:parameters())
    assert.same({21, 5}, g.weight_ih_l0:size())
    for _, p in ipairs(m:parameters()) do assert(p:abs():max():item() <= 1 / math.sqrt(20)) end
  end)

  it("applies dropout between layers only in training", function()
    kiln.manual_seed(10)
    local m = nn.GRU(3, 5, {num_layers = 2, dropout = 0.5})
    local x = randn(4, 2, 3)
    local a = m(x)
    local b = m(x)
    assert.is_true((a - b):abs():max():item() > 0)
    m:eval()
    local c, d = m(x), m(x)
    assert.equal(0, (c - d):abs():max():item())
  end)

  it("takes one unbatched sequence", function()
    kiln.manual_seed(11)
    local m = nn.LSTM(3, 4)
    local x = randn(5, 3)
    local out, h = m(x)
    assert.same({5, 4}, out:size())
    assert.same({1, 4}, h[1]:size())
    local out2 = m(x:unsqueeze(2))
    assert.equal(0, (out2:squeeze(2) - out):abs():max():item())
  end)

  it("names the module and what is wrong", function()
    local m = nn.LSTM(3, 4, {num_layers = 2})
    assert_error(function() m(randn(5, 2, 6)) end, "input %[5,2,6%] has 6 features, expected input_size 3")
    assert_error(function() m(randn(5, 2, 3), {randn(1, 2, 4), randn(2, 2, 4)}) end,
                           "h0 is %[1,2,4%], expected %[2,2,4%]")
    assert_error(function() m(randn(5, 2, 3), randn(2, 2, 4)) end, "hx must be {h0, c0}")
    assert_error(function() m(randn(5, 2, 3), nil, {3, 9}) end, "sequence 2 has length 9")
    assert_error(function() nn.GRU(3, 0) end, "hidden_size must be a positive integer")
    assert.same({5, 2, 4}, (m(randn(5, 2, 3))):size())
  end)
end)

describe("nn.RNNCell, nn.GRUCell, nn.LSTMCell", function()
  for _, name in ipairs{"RNNCell", "GRUCell", "LSTMCell"} do
    it(name .. " is one step of the reference, with f64 gradients", function()
      kiln.manual_seed(12)
      local mode = name == "RNNCell" and "rnn_tanh" or name:sub(1, -5):lower()
      local cell = nn[name](3, 4, {dtype = "f64"})
      local x, h, c = f64(2, 3), f64(2, 4), f64(2, 4)
      local hx = mode == "lstm" and {h, c} or h
      local got = cell(x, hx)
      local y, hn, cn = reference(mode, {x:totable()}, h:totable(), c:totable(), cell.weight_ih:totable(),
                                  cell.weight_hh:totable(), cell.bias_ih:totable(), cell.bias_hh:totable(), nil, false)
      if mode == "lstm" then
        assert_near(got[1]:totable(), hn, 1e-12, "h'")
        assert_near(got[2]:totable(), cn, 1e-12, "c'")
      else
        assert_near(got:totable(), hn, 1e-12, "h'")
      end
      assert.gradcheck(function(a, hh, cc)
        local r = cell(a, mode == "lstm" and {hh, cc} or hh)
        return mode == "lstm" and kiln.cat({r[1], r[2]}, 1) or r
      end, leaves{x, h, c})
    end)
  end

  it("names what is wrong", function()
    local cell = nn.GRUCell(3, 4)
    assert_error(function() cell(randn(2, 5)) end, "input %[2,5%], expected %[batch,3%]")
    assert_error(function() cell(randn(2, 3), randn(3, 4)) end, "h is %[3,4%], expected %[2,4%]")
  end)
end)

describe("an Embedding feeding a recurrent layer", function()
  -- F.rnn_layer, watched: whether each call had a weight_ih (nil: the projected input)
  local calls, orig
  before_each(function()
    calls, orig = {}, F.rnn_layer
    F.rnn_layer = function(mode, x, h0, c0, w_ih, ...)
      calls[#calls + 1] = w_ih == nil and "projected" or "product"
      return orig(mode, x, h0, c0, w_ih, ...)
    end
  end)
  after_each(function() F.rnn_layer = orig nn.fold_embedding = nil end)

  -- the output and every grad of sum(out * g), the fold on or off; prep may change x after the lookup
  local function run(mode, o, fold, prep)
    nn.fold_embedding = fold
    kiln.manual_seed(3)
    local T, V, E, H, B = 6, 9, 5, 4, 11
    local emb = nn.Embedding(V, E, {dtype = "f64"})
    local rnn = nn[mode](E, H, {dtype = "f64", batch_first = o.batch_first, bidirectional = o.bidirectional,
                                num_layers = o.layers or 1, algorithm = o.algorithm})
    local idx = kiln.randint(1, V + 1, o.batch_first and {B, T} or {T, B})
    local x = emb(idx)
    if prep then x = prep(x, emb) end
    local out = rnn(x, nil, o.lengths)
    kiln.manual_seed(5)
    local g = randn(out:size()):double()
    out:mul(g):sum():backward()
    local r = {out:detach(), emb.weight.grad}
    for _, p in ipairs(rnn:parameters()) do r[#r + 1] = p.grad end
    return r
  end
  local function close(a, b, tol, what)
    assert.equal(#a, #b, what)
    for i = 1, #a do
      local d = (a[i] - b[i]):abs():max():item()
      assert(d <= tol, string.format("%s: tensor %d differs by %.3g", what, i, d))
    end
  end
  local lengths = {6, 3, 5, 1, 6, 2, 4, 6, 5, 3, 2}

  it("looks the first layer's input projection up in the projected table, with the product's results", function()
    for _, mode in ipairs{"LSTM", "GRU", "RNN"} do
      for n, o in ipairs{{}, {batch_first = true, bidirectional = true, layers = 2}, {algorithm = "gemm", lengths = lengths},
                         {algorithm = "persistent", lengths = lengths, bidirectional = true}} do
        local what = mode .. " case " .. n
        calls = {}
        local product = run(mode, o, false)
        assert.same({}, (function() local p = {} for _, c in ipairs(calls) do if c == "projected" then p[#p + 1] = c end end return p end)(), what)
        calls = {}
        local folded = run(mode, o, nil)
        -- the first layer's directions took the table's rows; a second layer multiplies as before
        assert.equal("projected", calls[1], what)
        if o.bidirectional then assert.equal("projected", calls[2], what) end
        if o.layers == 2 then assert.equal("product", calls[#calls], what) end
        close(product, folded, 1e-12, what)
      end
    end
  end)

  it("multiplies as before when the lookup's output, its table or its indices were written since", function()
    local o = {algorithm = "persistent"}
    for _, prep in ipairs{
      function(x) return x:mul_(2) end,                                                -- the output
      function(x, emb) kiln.no_grad(function() emb.weight:add_(1) end) return x end,   -- the table
    } do
      calls = {}
      local a = run("LSTM", o, nil, prep)
      assert.same({"product"}, calls)
      local b = run("LSTM", o, false, prep)
      close(a, b, 0, "in-place write")
    end
    -- a copy of the rows is not the lookup's output either
    calls = {}
    run("LSTM", o, nil, function(x) return x:clone() end)
    assert.same({"product"}, calls)
  end)

  it("sums the table's grad as the persistent team goes, in one order at any thread count, near f64's", function()
    -- reversed directions and short sequences; f32 bits compared across thread counts
    local function grads(mode, algorithm, dtype, threads)
      local saved = kiln.get_num_threads()
      kiln.set_num_threads(threads)
      kiln.manual_seed(3)
      local T, V, E, H, B = 7, 9, 5, 20, 11
      local emb = nn.Embedding(V, E, {dtype = dtype})
      local rnn = nn[mode](E, H, {dtype = dtype, bidirectional = true, algorithm = algorithm})
      local idx = kiln.randint(1, V + 1, {T, B})
      local out = rnn(emb(idx), nil, lengths)
      kiln.manual_seed(5)
      out:mul(randn(out:size()):to(dtype)):sum():backward()
      kiln.set_num_threads(saved)
      return emb.weight.grad
    end
    for _, mode in ipairs{"LSTM", "GRU"} do
      local want = grads(mode, "gemm", "f64", 1)
      local one = grads(mode, "persistent", "f32", 1)
      assert.equal(0, (grads(mode, "persistent", "f32", 2) - one):abs():max():item(), mode .. " at 2 threads")
      for _, got in ipairs{one, grads(mode, "gemm", "f32", 1)} do
        local d = (got:double() - want):abs():max():item()
        assert(d < 1e-5 * math.max(want:abs():max():item(), 1), mode .. ": f32 table grad differs from f64's by " .. d)
      end
      local d64 = (grads(mode, "persistent", "f64", 1) - want):abs():max():item()
      assert(d64 < 1e-12, mode .. ": the persistent f64 table grad differs from the GEMM path's by " .. d64)
    end
  end)

  it("in f32 and under bf16 autocast gives the product's results within rounding; under f16 it multiplies", function()
    kiln.manual_seed(6)
    local emb, lstm = nn.Embedding(9, 8), nn.LSTM(8, 16)
    local idx = kiln.randint(1, 10, {12, 5})
    local function run(fold, dtype)
      nn.fold_embedding = fold
      emb:zero_grad() lstm:zero_grad()
      local out = kiln.amp.autocast(dtype, function() return lstm(emb(idx)) end)
      out:float():sum():backward()
      return {out:float():detach(), emb.weight.grad, lstm.weight_ih_l0.grad, lstm.weight_hh_l0.grad, lstm.bias_ih_l0.grad}
    end
    for _, dtype in ipairs{"f32", "bf16"} do
      calls = {}
      local a = run(nil, dtype ~= "f32" and dtype or nil)
      local b = run(false, dtype ~= "f32" and dtype or nil)
      assert.same({"projected", "product"}, calls, dtype)
      for i = 1, #a do
        local scale = math.max(b[i]:abs():max():item(), 1)
        local d = (a[i] - b[i]):abs():max():item() / scale
        assert(d < (dtype == "f32" and 1e-6 or 2e-2), string.format("%s: tensor %d differs by %.3g (relative)", dtype, i, d))
      end
    end
    calls = {}
    kiln.amp.autocast("f16", function() return lstm(emb(idx)) end)
    assert.same({"product"}, calls)
  end)

  it("looks a projected input up in a table by index in F.rnn_layer: the rows' results, an f64 gradient check, bad indices named", function()
    kiln.manual_seed(8)
    local tbl, h0, w_hh, b_ih = f64(5, 8), f64(3, 2), f64(8, 2) * 0.5, f64(8)
    local index = kiln.tensor({{1, 5, 2}, {5, 5, 3}, {4, 1, 1}, {2, 3, 5}}, {dtype = "i64"})
    for _, algo in ipairs{"gemm", "persistent"} do
      for _, lengths in ipairs{false, {4, 2, 3}} do
        local o = {algorithm = algo, lengths = lengths or nil}
        local rows = tbl:index_select(1, index:reshape(-1)):view(4, 3, 8)
        -- the rows as an input multiplied by an identity weight_ih: the same sums
        local want = orig("lstm", rows, h0, nil, kiln.eye(8):double(), w_hh, b_ih, nil, o)
        o.index = index
        local got = orig("lstm", tbl, h0, nil, nil, w_hh, b_ih, nil, o)
        assert.is_true((got - want):abs():max():item() < 1e-14, algo)
        assert.gradcheck(function(t, h, wh, bi) return orig("lstm", t, h, nil, nil, wh, bi, nil, o) end, leaves{tbl, h0, w_hh, b_ih})
      end
    end
    assert_error(function() orig("lstm", tbl, nil, nil, nil, w_hh, nil, nil, {index = index + 1}) end,
                 "lstm: index 5 at step 0, sequence 1 is outside the table %[5,8%] %(rows 0..4%)")
    assert_error(function() orig("lstm", f64(5, 6), nil, nil, nil, w_hh, nil, nil, {index = index}) end,
                 "lstm: the looked%-up table %[5,6%] has 6 columns, expected gates%*hidden = 8")
    assert_error(function() orig("lstm", tbl, nil, nil, f64(8, 3), w_hh, nil, nil, {index = index}) end, "weight_ih must be nil")
    assert_error(function() orig("lstm", tbl:view(5, 1, 8), nil, nil, nil, w_hh, nil, nil) end, "weight_ih")
    assert_error(function() orig("lstm", tbl:to("bf16"), nil, nil, nil, w_hh:float(), nil, nil, {index = index}) end,
                 "lstm: a looked%-up table runs on the CPU in f32 or f64; table %[5,8%] is bf16 on cpu")
  end)
end)
