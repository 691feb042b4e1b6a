-- Connectionist temporal classification (F.ctc_loss, nn.CTCLoss, the greedy and beam decoders):
-- values against a brute-force sum over every alignment written here, f64 gradient checks of
-- every reduction (padded inputs, zero_infinity), misuse errors, and decoders against brute force.
local kiln = kiln or require "kiln"
require "kiln.testing"
local F = require "kiln.functional"
local nn = kiln.nn

local function flat(t) return t:contiguous():reshape(-1):totable() end
local function leaf(t) return t:detach():requires_grad_() end
-- Random log-probabilities [T,N,C] (log_softmax of normal logits).
local function random_lp(T, N, C, dtype) return kiln.randn(T, N, C, {dtype = dtype or "f64"}):mul(2):log_softmax(3) end

local function assert_near(got, want, tol, what)
  tol = tol or 1e-10
  local ok = got == want or math.abs(got - want) <= tol * (1 + math.abs(want))
  assert(ok, string.format("%s: got %.17g, expected %.17g", what or "value", got, want))
end

local function error_of(fn, ...)
  local ok, e = pcall(fn, ...)
  assert(not ok, "expected an error")
  return tostring(e)
end
local function assert_contains(msg, ...)
  for _, part in ipairs({...}) do
    assert(msg:find(part, 1, true), string.format("message %q lacks %q", msg, part))
  end
end

-- ---- the reference: every alignment of length Tn over C classes, collapsed ----

-- Labels count from 1; blank is a label. collapse merges repeats, then drops blanks.
local function collapse(path, blank)
  local out, prev = {}, nil
  for _, c in ipairs(path) do
    if c ~= prev and c ~= blank then out[#out + 1] = c end
    prev = c
  end
  return out
end

-- Calls fn(path, logp) for every path of length Tn over classes 1..C; lp is the flat [T,N,C] list.
local function each_path(lp, N, C, n, Tn, fn)
  local path = {}
  local function walk(t, acc)
    if t > Tn then fn(path, acc) return end
    for c = 1, C do
      path[t] = c
      walk(t + 1, acc + lp[((t - 1) * N + (n - 1)) * C + c])
    end
    path[t] = nil
  end
  walk(1, 0)
end

local function same(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

-- -log of the summed probability of the alignments of sample n that collapse to target.
local function brute_nll(lp, N, C, n, Tn, target, blank)
  local p = 0
  each_path(lp, N, C, n, Tn, function(path, logp)
    if same(collapse(path, blank), target) then p = p + math.exp(logp) end
  end)
  return -math.log(p)
end

-- Every label sequence's probability for sample n: key -> {seq, p}.
local function brute_sequences(lp, N, C, n, Tn, blank)
  local seqs = {}
  each_path(lp, N, C, n, Tn, function(path, logp)
    local s = collapse(path, blank)
    local key = table.concat(s, ",")
    local e = seqs[key]
    if not e then e = {seq = s, p = 0} seqs[key] = e end
    e.p = e.p + math.exp(logp)
  end)
  return seqs
end

describe("ctc_loss", function()
  before_each(function() kiln.manual_seed(11) end)

  it("T = 1, two classes, target {2}: the loss is -log p(2)", function()
    local lp = kiln.tensor({{{math.log(0.3), math.log(0.7)}}}, {dtype = "f64"})
    local loss = F.ctc_loss(lp, {{2}}, {1}, {1}, {reduction = "none"})
    assert_near(flat(loss)[1], -math.log(0.7))
  end)

  it("T = 2, two classes, written out by hand", function()
    -- p(blank) and p(a) per step; the target {a} has the alignments (b,a), (a,b), (a,a)
    local b1, a1, b2, a2 = 0.6, 0.4, 0.25, 0.75
    local lp = kiln.tensor({{{math.log(b1), math.log(a1)}}, {{math.log(b2), math.log(a2)}}}, {dtype = "f64"})
    assert_near(F.ctc_loss(lp, {{2}}, {2}, {1}, {reduction = "sum"}):item(), -math.log(b1 * a2 + a1 * b2 + a1 * a2))
    -- the target {a, a} needs a blank in between: three steps; two are too few
    assert_contains(error_of(F.ctc_loss, lp, {{2, 2}}, {2}, {2}), "too short", "needs 3 steps")
    -- the empty target: only (b, b)
    assert_near(F.ctc_loss(lp, {{}}, {2}, {0}, {reduction = "sum"}):item(), -math.log(b1 * b2))
  end)

  local cases = {
    {name = "three samples, padded input lengths", T = 5, N = 3, C = 3, il = {5, 3, 4},
     targets = {{2, 3}, {3}, {2, 2}}, blank = 1},
    {name = "a blank that is not the first class, an empty target", T = 4, N = 3, C = 4, il = {4, 4, 2},
     targets = {{1, 3, 1}, {}, {4}}, blank = 2},
    {name = "one sample, repeats", T = 6, N = 1, C = 3, il = {6}, targets = {{2, 2, 3}}, blank = 1},
  }
  for _, cs in ipairs(cases) do
    local tl = {}
    for i, t in ipairs(cs.targets) do tl[i] = #t end

    it(cs.name .. ": every reduction matches the brute-force sum over alignments", function()
      local lp = random_lp(cs.T, cs.N, cs.C)
      local lpl = flat(lp)
      local nll = {}
      for n = 1, cs.N do nll[n] = brute_nll(lpl, cs.N, cs.C, n, cs.il[n], cs.targets[n], cs.blank) end
      local none = flat(F.ctc_loss(lp, cs.targets, cs.il, tl, {blank = cs.blank, reduction = "none"}))
      local sum, mean = 0, 0
      for n = 1, cs.N do
        assert_near(none[n], nll[n], 1e-10, "loss of sample " .. n)
        sum = sum + nll[n]
        mean = mean + nll[n] / math.max(tl[n], 1)
      end
      assert_near(F.ctc_loss(lp, cs.targets, cs.il, tl, {blank = cs.blank, reduction = "sum"}):item(), sum)
      assert_near(F.ctc_loss(lp, cs.targets, cs.il, tl, {blank = cs.blank}):item(), mean / cs.N)
    end)

    for _, reduction in ipairs({"none", "mean", "sum"}) do
      it(cs.name .. ", reduction " .. reduction .. ": gradient matches finite differences", function()
        local lp = leaf(random_lp(cs.T, cs.N, cs.C))
        assert.gradcheck(function(a)
          return F.ctc_loss(a, cs.targets, cs.il, tl, {blank = cs.blank, reduction = reduction})
        end, {lp})
      end)
    end

    it(cs.name .. ": f32 agrees with f64", function()
      local lp = random_lp(cs.T, cs.N, cs.C)
      local a = leaf(lp)
      local b = leaf(lp:float())
      local la = F.ctc_loss(a, cs.targets, cs.il, tl, {blank = cs.blank, reduction = "sum"})
      local lb = F.ctc_loss(b, cs.targets, cs.il, tl, {blank = cs.blank, reduction = "sum"})
      assert_near(lb:item(), la:item(), 1e-5)
      la:backward() lb:backward()
      local ga, gb = flat(a.grad), flat(b.grad)
      for i = 1, #ga do assert(math.abs(ga[i] - gb[i]) < 1e-5, "grad element " .. i) end
    end)
  end

  it("time steps past a sample's input length get zero gradient", function()
    local lp = leaf(random_lp(6, 2, 4))
    F.ctc_loss(lp, {{2, 3}, {4}}, {6, 3}, {2, 1}):backward()
    local g = lp.grad
    for t = 4, 6 do
      for c = 1, 4 do assert.are.equal(0, g[t][2][c]) end
    end
    local nonzero = false
    for c = 1, 4 do nonzero = nonzero or g[3][2][c] ~= 0 end
    assert.is_true(nonzero)
  end)

  it("through log_softmax, the gradient of each step sums to zero over the classes", function()
    local x = leaf(kiln.randn(5, 2, 4, {dtype = "f64"}))
    F.ctc_loss(x:log_softmax(3), {{2, 3}, {2}}, {5, 5}, {2, 1}, {reduction = "sum"}):backward()
    for t = 1, 5 do
      for n = 1, 2 do
        local s = 0
        for c = 1, 4 do s = s + x.grad[t][n][c] end
        assert(math.abs(s) < 1e-12, string.format("step %d, sample %d: %g", t, n, s))
      end
    end
    -- and w.r.t. free log_probs each step's gradient sums to -1 (each alignment passes one class)
    local lp = leaf(random_lp(5, 1, 4))
    F.ctc_loss(lp, {{2, 4}}, {5}, {2}, {reduction = "sum"}):backward()
    for t = 1, 5 do
      local s = 0
      for c = 1, 4 do s = s + lp.grad[t][1][c] end
      assert_near(s, -1, 1e-12, "step " .. t)
    end
  end)

  it("takes targets padded, concatenated, as a list of lists, or i32; lengths as tensors", function()
    local lp = random_lp(5, 2, 4)
    local ref = F.ctc_loss(lp, {{2, 3}, {4}}, {5, 4}, {2, 1}, {reduction = "none"})
    local forms = {
      F.ctc_loss(lp, kiln.tensor({{2, 3, 0}, {4, 9, 9}}, {dtype = "i64"}), {5, 4}, {2, 1}, {reduction = "none"}),
      F.ctc_loss(lp, kiln.tensor({2, 3, 4}, {dtype = "i64"}), kiln.tensor({5, 4}, {dtype = "i64"}),
                 kiln.tensor({2, 1}, {dtype = "i64"}), {reduction = "none"}),
      F.ctc_loss(lp, {2, 3, 4}, {5, 4}, {2, 1}, {reduction = "none"}),
      F.ctc_loss(lp, kiln.tensor({2, 3, 4}, {dtype = "i32"}), kiln.tensor({5, 4}, {dtype = "i32"}), {2, 1}, {reduction = "none"}),
      F.ctc_loss(lp, {{2, 3}, {4}}, {5, 4}, {reduction = "none"}),
    }
    local want = flat(ref)
    for k, got in ipairs(forms) do
      local g = flat(got)
      for i = 1, #want do assert_near(g[i], want[i], 0, "form " .. k .. ", sample " .. i) end
    end
  end)

  it("nn.CTCLoss calls ctc_loss with its options", function()
    local lp = random_lp(5, 2, 4)
    local crit = nn.CTCLoss{blank = 4, reduction = "sum"}
    local a = crit(lp, {{2, 3}, {1}}, {5, 4}, {2, 1})
    local b = F.ctc_loss(lp, {{2, 3}, {1}}, {5, 4}, {2, 1}, {blank = 4, reduction = "sum"})
    assert_near(a:item(), b:item(), 0)
    assert.are.equal(F.ctc_loss, kiln.nn.functional.ctc_loss)
  end)
end)

describe("ctc_loss zero_infinity", function()
  before_each(function() kiln.manual_seed(12) end)

  it("a sample too short for its target: an error without zero_infinity, zero loss and gradient with it", function()
    local lp = leaf(random_lp(3, 2, 4))
    local targets, il, tl = {{2, 3}, {2, 2, 3}}, {3, 3}, {2, 3}
    assert_contains(error_of(F.ctc_loss, lp, targets, il, tl), "ctc_loss: sample 2 has input length 3",
                    "target of length 3 with 1 repeated", "zero_infinity")
    local none = flat(F.ctc_loss(lp, targets, il, tl, {reduction = "none", zero_infinity = true}))
    assert.are.equal(0, none[2])
    assert_near(none[1], brute_nll(flat(lp), 2, 4, 1, 3, {2, 3}, 1))
    local mean = F.ctc_loss(lp, targets, il, tl, {zero_infinity = true})
    assert_near(mean:item(), none[1] / 2 / 2)
    mean:backward()
    for t = 1, 3 do for c = 1, 4 do assert.are.equal(0, lp.grad[t][2][c]) end end
    for _, reduction in ipairs({"none", "mean", "sum"}) do
      assert.gradcheck(function(a)
        return F.ctc_loss(a, targets, il, tl, {reduction = reduction, zero_infinity = true})
      end, {leaf(lp)})
    end
  end)

  it("an infinite loss from log-probabilities of -inf: inf without zero_infinity, 0 with it", function()
    local lp = random_lp(3, 1, 3)
    lp:select(3, 3):fill_(-math.huge)   -- class 3 never occurs
    assert.are.equal(math.huge, F.ctc_loss(lp, {{3}}, {3}, {1}, {reduction = "sum"}):item())
    local x = leaf(lp)
    local loss = F.ctc_loss(x, {{3}}, {3}, {1}, {reduction = "sum", zero_infinity = true})
    assert.are.equal(0, loss:item())
    loss:backward()
    for _, v in ipairs(flat(x.grad)) do assert.are.equal(0, v) end
  end)

  it("an input length of 0: loss 0 for the empty target, and 0 gradient", function()
    local lp = leaf(random_lp(3, 2, 3))
    local none = F.ctc_loss(lp, {{}, {2}}, {0, 3}, {0, 1}, {reduction = "none"})
    assert.are.equal(0, flat(none)[1])
    none:sum():backward()
    for t = 1, 3 do for c = 1, 3 do assert.are.equal(0, lp.grad[t][1][c]) end end
  end)
end)

describe("ctc_loss misuse", function()
  local lp = kiln.zeros(4, 2, 3, {dtype = "f64"}):log_softmax(3)

  it("names the op, the shapes and the sample (counting from 1)", function()
    assert_contains(error_of(F.ctc_loss, kiln.zeros(4, 3), {{2}}, {4}, {1}), "ctc_loss: log_probs [4,3] has 2 dims", "[T,N,C]")
    assert_contains(error_of(F.ctc_loss, kiln.zeros(4, 2, 3, {dtype = "i64"}), {{2}, {2}}, {4, 4}, {1, 1}),
                    "log_probs [4,2,3] is i64")
    assert_contains(error_of(F.ctc_loss, lp, {{2}, {2}}, {4, 4}, {1, 1}, {blank = 4}), "blank 4 is out of range for the 3 classes")
    assert_contains(error_of(F.ctc_loss, lp, {{2}, {2}}, {4, 4}, {1, 1}, {blank = 0}), "blank 0 is out of range")
    assert_contains(error_of(F.ctc_loss, lp, {{2}, {2}}, {4, 4, 4}, {1, 1}), "input_lengths [3] does not fit log_probs [4,2,3]",
                    "expected [2]")
    assert_contains(error_of(F.ctc_loss, lp, {{2}, {2}}, {4, 5}, {1, 1}), "input length 5 of sample 2 is out of range 0..4")
    assert_contains(error_of(F.ctc_loss, lp, kiln.tensor({{2, 3}, {2, 3}}, {dtype = "i64"}), {4, 4}, {1, 3}),
                    "target length 3 of sample 2 is out of range 0..2")
    assert_contains(error_of(F.ctc_loss, lp, kiln.tensor({2, 3}, {dtype = "i64"}), {4, 4}, {1, 2}),
                    "target_lengths add up to more than the 2 labels of targets [2]")
    assert_contains(error_of(F.ctc_loss, lp, kiln.tensor({{2}, {2}, {2}}, {dtype = "i64"}), {4, 4}, {1, 1}),
                    "targets [3,1] do not fit log_probs [4,2,3]")
    assert_contains(error_of(F.ctc_loss, lp, {{2}, {2, 4}}, {4, 4}, {1, 2}),
                    "label 4 at position 2 of the target of sample 2 is out of range for 3 classes")
    assert_contains(error_of(F.ctc_loss, lp, {{2, 1}, {2}}, {4, 4}, {2, 1}),
                    "label 1 at position 2 of the target of sample 1 is the blank")
    assert_contains(error_of(F.ctc_loss, lp, kiln.tensor({{2}, {2}}, {dtype = "f32"}), {4, 4}, {1, 1}), "target [2, 1] is f32", "expected i64 class labels")
    assert_contains(error_of(F.ctc_loss, lp, {{2}, {2}}, {4, 4}, {1, 1}, {reduction = "avg"}), "reduction \"avg\"")
    assert_contains(error_of(F.ctc_loss, lp, {{2}, {2}}, {4, 4}, {1, 1}, {blanks = 2}), "unknown option \"blanks\"")
    -- and the op still works
    assert_near(flat(F.ctc_loss(lp, {{2}, {3}}, {4, 4}, {1, 1}, {reduction = "none"}))[1],
                brute_nll(flat(lp), 2, 3, 1, 4, {2}, 1))
  end)
end)

describe("ctc decoding", function()
  before_each(function() kiln.manual_seed(13) end)

  -- One-hot-ish log-probabilities from a table of the most likely class per step.
  local function peaked(best, C, blank)
    local T, N = #best, #best[1]
    local data = {}
    for t = 1, T do
      data[t] = {}
      for n = 1, N do
        local row = {}
        for c = 1, C do row[c] = math.log(c == best[t][n] and 0.9 or 0.1 / (C - 1)) end
        data[t][n] = row
      end
    end
    return kiln.tensor(data, {dtype = "f64"})
  end

  it("greedy: repeats merged, blanks removed, input lengths respected", function()
    -- columns are samples; 1 is the blank
    local best = {{2, 1, 3}, {2, 3, 3}, {1, 3, 1}, {2, 1, 3}, {3, 4, 3}, {3, 4, 1}}
    local lp = peaked(best, 4)
    assert.are.same({{2, 2, 3}, {3, 4}, {3, 3}}, F.ctc_greedy_decode(lp))
    assert.are.same({{2, 2, 3}, {3, 4}, {3}}, F.ctc_greedy_decode(lp, {6, 6, 3}))
    assert.are.same({{2}, {}, {3}}, F.ctc_greedy_decode(lp, kiln.tensor({2, 1, 2}, {dtype = "i64"})))
    -- another blank: class 3
    assert.are.same({{2, 1, 2}, {1, 1, 4}, {1}}, F.ctc_greedy_decode(lp, {6, 6, 3}, 3))
  end)

  for _, cs in ipairs({{T = 4, C = 3, blank = 1}, {T = 5, C = 3, blank = 2}, {T = 3, C = 4, blank = 1}}) do
    it(string.format("beam search with a full beam finds the brute-force best sequence (T = %d, C = %d)", cs.T, cs.C), function()
      for _ = 1, 3 do
        local lp = kiln.randn(cs.T, 2, cs.C, {dtype = "f64"}):mul(1.5):log_softmax(3)
        local lpl = flat(lp)
        local seqs, scores = F.ctc_beam_decode(lp, {cs.T, cs.T - 1}, {beam = 1000, blank = cs.blank})
        for n = 1, 2 do
          local best
          for _, e in pairs(brute_sequences(lpl, 2, cs.C, n, n == 1 and cs.T or cs.T - 1, cs.blank)) do
            if not best or e.p > best.p then best = e end
          end
          assert.are.same(best.seq, seqs[n])
          assert_near(scores[n], math.log(best.p), 1e-12, "log-probability of sample " .. n)
          -- the same number from ctc_loss
          local L = #best.seq
          if L > 0 then
            local loss = F.ctc_loss(lp:narrow(2, n, 1), {best.seq}, {n == 1 and cs.T or cs.T - 1}, {L},
                                    {blank = cs.blank, reduction = "sum"})
            assert_near(-loss:item(), scores[n], 1e-12, "ctc_loss of the best sequence")
          end
        end
      end
    end)
  end

  it("beam search on peaked inputs gives the greedy answer; a narrow beam still returns a sequence", function()
    local best = {{2, 1}, {2, 3}, {1, 3}, {2, 1}, {3, 4}}
    local lp = peaked(best, 4)
    local seqs = F.ctc_beam_decode(lp, nil, {beam = 4})
    assert.are.same(F.ctc_greedy_decode(lp), seqs)
    local one = F.ctc_beam_decode(lp, {5, 5}, {beam = 1})
    assert.are.equal(2, #one)
    assert_contains(error_of(F.ctc_beam_decode, lp, {5, 5}, {beam = 0}), "beam must be >= 1")
    assert_contains(error_of(F.ctc_greedy_decode, lp, {5, 6}), "input length 6 of sample 2 is out of range 0..5")
  end)
end)
