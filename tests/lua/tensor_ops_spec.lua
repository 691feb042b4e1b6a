-- The tensor ops added for PyTorch's habits (sort, topk, scans, multinomial, repeat, roll, einsum,
-- pad, interpolate, unfold/fold, diag, ...): values against loops over Lua tables on odd and
-- non-contiguous shapes, edge cases, and the errors of bad input (they name the op, the shapes and
-- the dtype, and the process goes on). PyTorch's own values: torch_ops_fixture_spec.lua; the f64
-- gradient checks: op_gradchecks.lua (run by op_table_spec.lua).
local kiln = require "kiln"
local F = kiln.F
require "kiln.testing"

local function raises(pattern, fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "no error for " .. pattern)
  assert.truthy(tostring(err):find(pattern, 1, true), "expected \"" .. pattern .. "\" in: " .. tostring(err))
end

describe("sort, argsort and topk", function()
  it("sort each line of a transposed tensor, stable, in every dtype", function()
    for _, dt in ipairs({"f32", "f64", "f16", "bf16", "i64", "i32", "u8", "bool"}) do
      local rows = {{3, 1, 2, 1, 0}, {0, 2, 2, 1, 3}, {1, 1, 1, 1, 1}}
      local x = kiln.tensor(rows, {dtype = dt == "bool" and "f32" or dt}):to(dt):t()   -- [5,3], columns are the rows
      local v, i = x:sort(1)
      assert.equal(dt, v:dtype())
      for c = 1, 3 do
        local line = {}
        for r = 1, 5 do line[r] = {value = x[r][c], at = r} end
        table.sort(line, function(a, b)
          local av, bv = a.value, b.value
          if type(av) == "boolean" then av, bv = av and 1 or 0, bv and 1 or 0 end
          if av ~= bv then return av < bv end
          return a.at < b.at   -- stable
        end)
        for r = 1, 5 do
          assert.equal(line[r].at, i[r][c], dt .. " column " .. c)
          assert.equal(line[r].value, v[r][c], dt .. " column " .. c)
        end
      end
    end
  end)

  it("topk's partial selection gives the stable sort's first k, with ties and NaN, both ways, along either dim", function()
    for _, dt in ipairs({"f32", "f64", "i64"}) do
      local x = kiln.randint(0, 6, {200, 9}, {dtype = "i64"}):to(dt)   -- [200,9]: lines of 200 along dim 1
      if dt ~= "i64" then x[5][2] = 0 / 0 x[77][2] = 0 / 0 end
      for _, k in ipairs({1, 3, 10, 25, 30, 200}) do   -- up to 25: selection; 30 and 200: the whole sort
        for _, largest in ipairs({true, false}) do
          local v, i = x:topk(k, 1, largest)
          local want = x:argsort(1, largest):narrow(1, 1, k)
          assert.same(want:totable(), i:totable(), string.format("%s k=%d largest=%s", dt, k, tostring(largest)))
          local vt, it_ = x:t():topk(k, 2, largest)
          assert.same(want:t():totable(), it_:totable(), dt .. " along dim 2 of the transpose")
          assert.same(x:gather(1, i):isnan():totable(), v:isnan():totable())
        end
      end
    end
  end)

  it("handle empty tensors, 0-d tensors and k = 0", function()
    local e = kiln.zeros(3, 0)
    local v, i = e:sort(2)
    assert.same({3, 0}, {v:size(1), v:size(2)})
    assert.equal("i64", i:dtype())
    local s = kiln.tensor(4)
    assert.equal(4, (s:sort()):item())
    assert.equal(1, s:argsort():item())
    local tv = kiln.randn(3, 4):topk(0)
    assert.same({3, 0}, {tv:size(1), tv:size(2)})
  end)

  it("refuse a bad k, dim or option by name", function()
    local x = kiln.randn(3, 4)
    raises("topk: k = 5 is out of range for dim 2 of size 4 (tensor [3,4])", function() x:topk(5) end)
    raises("sort: dim 3 out of range for a tensor of 2 dims", function() x:sort(3) end)
    raises("argsort: unknown option \"decending\"", function() x:argsort{decending = true} end)
    raises("cumsum: give the dim", function() x:cumsum() end)
    assert.equal(12, x:numel())   -- and the process goes on
  end)
end)

describe("cumsum and cumprod", function()
  it("run along any dim of a non-contiguous tensor, integers giving i64", function()
    local x = kiln.tensor({{1, 2, 3}, {4, 5, 6}}):t()   -- [3,2]
    assert.same({{1, 4}, {3, 9}, {6, 15}}, x:cumsum(1):totable())
    assert.same({{1, 4}, {2, 10}, {3, 18}}, x:cumprod(2):totable())
    local i = kiln.tensor({1, 2, 3}, {dtype = "i32"})
    assert.equal("i64", i:cumsum(1):dtype())
    assert.same({1, 3, 6}, i:cumsum(1):totable())
    assert.equal("i64", kiln.tensor({true, true, false}):cumsum(1):dtype())
    assert.equal("f16", kiln.ones(4, {dtype = "f16"}):cumsum(1):dtype())
    assert.same({1, 0, 0}, kiln.tensor({1, 0, 5}):cumprod(1):totable())
  end)
end)

-- Pearson's chi-square statistic of observed counts against expected probabilities.
local function chi_square(counts, probs, n)
  local x2 = 0
  for k, p in ipairs(probs) do
    local e = n * p
    x2 = x2 + ((counts[k] or 0) - e) ^ 2 / e
  end
  return x2
end

describe("multinomial", function()
  -- The thresholds are the chi-square quantiles at 0.999 (16.27 for 3 degrees of freedom, 31.26 for
  -- 11): a correct sampler exceeds them for 1 seed in 1000, and the seed is fixed, so the test is
  -- deterministic; an off-by-one category or weights taken unnormalised give statistics in the
  -- thousands at these sample sizes.
  it("draws with replacement in proportion to the weights (chi-square, 3 dof, 20000 draws)", function()
    kiln.manual_seed(2024)
    local w = kiln.tensor({{1, 2, 3, 4}, {4, 0, 0, 1}})   -- unnormalised; a zero weight is never drawn
    local n = 20000
    local draws = w:multinomial(n, true)
    assert.same({2, n}, {draws:size(1), draws:size(2)})
    assert.equal("i64", draws:dtype())
    local rows = draws:totable()
    local c1, c2 = {}, {}
    for i = 1, n do
      c1[rows[1][i]] = (c1[rows[1][i]] or 0) + 1
      c2[rows[2][i]] = (c2[rows[2][i]] or 0) + 1
    end
    local x2 = chi_square(c1, {0.1, 0.2, 0.3, 0.4}, n)
    if os.getenv("KILN_SHOW_CHI2") then print("chi2 with replacement", x2) end
    assert.is_true(x2 < 16.27, "chi-square " .. x2)
    assert.is_nil(c2[2]) assert.is_nil(c2[3])
    assert.is_true(chi_square({c2[1], c2[4]}, {0.8, 0.2}, n) < 10.83)   -- 1 dof
  end)

  it("draws without replacement: distinct, the ordered pairs as p_i p_j / (1 - p_i) (chi-square, 11 dof)", function()
    kiln.manual_seed(7)
    local p = {0.1, 0.2, 0.3, 0.4}
    local trials = 6000
    local w = kiln.tensor(p):view(1, 4):expand(trials, 4):contiguous()
    local draws = w:multinomial(2):totable()   -- one pair per row
    local counts, probs, cell = {}, {}, {}
    for i = 1, 4 do
      for j = 1, 4 do
        if i ~= j then
          probs[#probs + 1] = p[i] * p[j] / (1 - p[i])
          cell[i * 10 + j] = #probs
        end
      end
    end
    for r = 1, trials do
      local a, b = draws[r][1], draws[r][2]
      assert.are_not.equal(a, b)
      local k = cell[a * 10 + b]
      counts[k] = (counts[k] or 0) + 1
    end
    local x2 = chi_square(counts, probs, trials)
    if os.getenv("KILN_SHOW_CHI2") then print("chi2 without replacement", x2) end
    assert.is_true(x2 < 31.26, "chi-square " .. x2)
    -- all 4 categories of 4 without replacement: a permutation
    local perm = kiln.tensor(p):multinomial(4):totable()
    table.sort(perm)
    assert.same({1, 2, 3, 4}, perm)
  end)

  it("with replacement is the inverse CDF at the generator's uniform draws, in chunks for many categories", function()
    local k, n = 3000, 3000   -- 9M comparisons: three chunks
    local w = kiln.rand(k, {dtype = "f64"})
    kiln.manual_seed(99)
    local u = kiln.rand(1, n, {dtype = "f64"}):totable()[1]
    kiln.manual_seed(99)
    local draws = w:multinomial(n, true):totable()
    local cdf, acc = {}, 0
    for i, v in ipairs(w:totable()) do acc = acc + v cdf[i] = acc end
    local cdf_t = kiln.tensor(cdf, {dtype = "f64"}):totable()   -- the same sums as kiln's cumsum (in order, in double)
    for j = 1, n, 97 do
      local at, c = u[j] * cdf_t[k], 0
      for i = 1, k do if cdf_t[i] <= at then c = i end end
      assert.equal(math.min(c + 1, k), draws[j], "draw " .. j)
    end
  end)

  it("is reproducible from the seed, and refuses bad weights and counts", function()
    kiln.manual_seed(3)
    local a = kiln.tensor({0.5, 0.5, 1}):multinomial(10, true):totable()
    kiln.manual_seed(3)
    assert.same(a, kiln.tensor({0.5, 0.5, 1}):multinomial(10, true):totable())
    raises("multinomial: cannot draw 3 samples without replacement from 2 categories with a positive weight ([3])",
           function() kiln.tensor({1, 0, 1}):multinomial(3) end)
    raises("multinomial: the weights [2] must be finite and >= 0", function() kiln.tensor({1, -1}):multinomial(1) end)
    raises("multinomial: probabilities [2] are i64 (expected a float dtype)",
           function() kiln.tensor({1, 1}, {dtype = "i64"}):multinomial(1) end)
    raises("multinomial: probabilities must be 1-d or 2-d, got [1,1,2]", function() kiln.ones(1, 1, 2):multinomial(1) end)
  end)
end)

describe("repeat, tile, repeat_interleave and roll", function()
  it("follow PyTorch's shapes and orders on a transposed tensor", function()
    local x = kiln.tensor({{1, 2, 3}, {4, 5, 6}}):t()   -- [3,2]: {{1,4},{2,5},{3,6}}
    assert.same({{1, 4, 1, 4}, {2, 5, 2, 5}, {3, 6, 3, 6}}, x:tile(2):totable())
    assert.same({2, 3, 4}, {x["repeat"](x, 2, 1, 2):size(1), x["repeat"](x, 2, 1, 2):size(2), x["repeat"](x, 2, 1, 2):size(3)})
    assert.same({{1, 4}, {1, 4}, {3, 6}}, x:repeat_interleave({2, 0, 1}, 1):totable())
    assert.same({1, 1, 4, 4, 2, 2, 5, 5, 3, 3, 6, 6}, x:repeat_interleave(2):totable())
    assert.same({{3, 6}, {1, 4}, {2, 5}}, x:roll(1, 1):totable())
    assert.same({{6, 3}, {4, 1}, {5, 2}}, x:roll({1, 1}, {1, 2}):totable())
    assert.same({{6, 1}, {4, 2}, {5, 3}}, x:roll(1):totable())
    assert.equal(0, x:tile(0, 1):numel())
    raises("repeat: 1 repeats for a tensor of 2 dims [3,2]", function() x["repeat"](x, 2) end)
    raises("repeat_interleave: 2 repeats for dim 1 of size 3 (tensor [3,2])", function() x:repeat_interleave({1, 2}, 1) end)
    raises("roll: 2 shifts for 1 dims", function() x:roll({1, 2}, 1) end)
  end)
end)

describe("einsum, pad, interpolate, unfold and fold", function()
  it("einsum against matmul and loops, and its errors", function()
    local a, b = kiln.randn(3, 4, {dtype = "f64"}), kiln.randn(4, 5, {dtype = "f64"}):t():contiguous():t()
    assert.is_true((kiln.einsum("ij,jk->ik", a, b) - a:matmul(b)):abs():max():item() < 1e-12)
    local m = kiln.randn(4, 4, {dtype = "f64"})
    assert.is_true(math.abs(kiln.einsum("ii", m):item() - m:trace():item()) < 1e-12)
    assert.is_true(math.abs(kiln.einsum("ij->", a):item() - a:sum():item()) < 1e-12)
    raises("einsum: subscript j has size 5 in operand 2 [5,2] but 4 before", function()
      kiln.einsum("ij,jk->ik", a, kiln.randn(5, 2, {dtype = "f64"}))
    end)
    raises("einsum: operand 1 [3,4] has 2 dims but \"ijk\" names 3", function() kiln.einsum("ijk->i", a) end)
    raises("einsum: operand 1 [3,4] has 2 dims but \"...ijk\" names 3 besides \"...\"", function() kiln.einsum("...ijk->i", a) end)
    raises("einsum: output subscript z is in no operand", function() kiln.einsum("ij->z", a) end)
  end)

  it("einsum's \"...\": the unnamed dims, aligned from the right, against matmul and sums", function()
    kiln.manual_seed(7)
    local a = kiln.randn(2, 3, 4, 5, {dtype = "f64"}):requires_grad_()
    local b = kiln.randn(2, 3, 5, 6, {dtype = "f64"}):requires_grad_()
    local y = kiln.einsum("...ij,...jk->...ik", a, b)
    assert.are.same({2, 3, 4, 6}, y:size())
    assert.is_true((y - a:matmul(b)):abs():max():item() < 1e-12)
    -- its gradients are matmul's
    local w = kiln.randn(2, 3, 4, 6, {dtype = "f64"})
    local loss = (y * w):sum()
    loss:backward()
    local ga, gb = a.grad:clone(), b.grad:clone()
    a.grad, b.grad = nil, nil
    local ref = (a:matmul(b) * w):sum()
    ref:backward()
    assert.is_true((ga - a.grad):abs():max():item() < 1e-12 and (gb - b.grad):abs():max():item() < 1e-12)
    local x = kiln.randn(4, 5, 6, {dtype = "f64"})
    assert.is_true((kiln.einsum("...i->...", x) - x:sum(3)):abs():max():item() < 1e-12)
    assert.is_true((kiln.einsum("i...->...", x) - x:sum(1)):abs():max():item() < 1e-12)
    -- the implicit output: the "..." dims first, then the letters seen once, alphabetically
    local c = kiln.randn(5, 2, {dtype = "f64"})
    local implicit = kiln.einsum("...ij,jk", a:detach(), c)
    assert.are.same({2, 3, 4, 2}, implicit:size())
    assert.is_true((implicit - kiln.einsum("abij,jk->abik", a:detach(), c)):abs():max():item() < 1e-12)
    -- an operand with fewer "..." dims lines up from the right
    local v = kiln.randn(3, 5, {dtype = "f64"})
    assert.is_true((kiln.einsum("...ij,...j->...i", a:detach(), v) - kiln.einsum("abij,bj->abi", a:detach(), v)):abs():max():item() < 1e-12)
  end)

  it("einsum broadcasts a size-1 dim against the same letter's other size, as torch.einsum; naive loops", function()
    kiln.manual_seed(11)
    local a, b = kiln.randn(3, 1, {dtype = "f64"}), kiln.randn(4, 5, {dtype = "f64"})
    -- "ij,jk->ik" with j of size 1 in a: y[i][k] = a[i][1] * sum_j b[j][k]
    local y = kiln.einsum("ij,jk->ik", a, b)
    assert.same({3, 5}, y:size())
    for i = 1, 3 do
      for k = 1, 5 do
        local want = 0
        for j = 1, 4 do want = want + a[{i, 1}] * b[{j, k}] end
        assert.is_true(math.abs(y[{i, k}] - want) < 1e-12, "ij,jk->ik at " .. i .. "," .. k)
      end
    end
    -- elementwise and under "...": [2,1,3] against [4,3] gives [2,4,3]
    local u, v = kiln.randn(2, 1, 3, {dtype = "f64"}), kiln.randn(4, 3, {dtype = "f64"})
    local z = kiln.einsum("...i,...i->...i", u, v)
    assert.same({2, 4, 3}, z:size())
    for p = 1, 2 do
      for q = 1, 4 do
        for i = 1, 3 do assert.is_true(math.abs(z[{p, q, i}] - u[{p, 1, i}] * v[{q, i}]) < 1e-15) end
      end
    end
    -- a letter of size 1 everywhere stays 1; a 1 against 0 gives 0, as in broadcasting
    assert.same({3, 1}, kiln.einsum("ij,ij->ij", a, a):size())
    assert.same({3, 0}, kiln.einsum("ij,ij->ij", a, kiln.zeros(3, 0, {dtype = "f64"})):size())
    -- the operand given as a table is left as it was
    local list = {a, kiln.randn(3, 4, {dtype = "f64"})}
    kiln.einsum("ij,ij->ij", list)
    assert.same({3, 1}, list[1]:size())
    -- two sizes neither of which is 1, and a diagonal of unequal sizes, are errors naming them
    raises("einsum: subscript j has size 4 in operand 2 [3,4] but 2 before, and neither is 1", function()
      kiln.einsum("ij,ij->ij", kiln.randn(3, 2), kiln.randn(3, 4))
    end)
    raises('einsum: dim 1 (under "...") has size 4 in operand 2 [4,3] but 2 before, and neither is 1', function()
      kiln.einsum("...i,...i->...i", kiln.randn(2, 3), kiln.randn(4, 3))
    end)
    raises("einsum: subscript i is repeated in operand 1 [1,3] with sizes 1 and 3", function()
      kiln.einsum("ii,i->i", kiln.randn(1, 3), kiln.randn(3))
    end)
  end)

  it("pad, interpolate, unfold and fold refuse bad input by name", function()
    local x = kiln.randn(1, 2, 3, 4)
    raises("pad: reflect pads 3 and 0 must be 0 to 2 for dim 3 of size 3 (tensor [1,2,3,4])", function()
      F.pad(x, {0, 0, 3, 0}, "reflect")
    end)
    raises("pad: mode \"reflekt\"", function() F.pad(x, {1, 1}, "reflekt") end)
    raises("pad: 10 pads are 5 pairs, for a tensor of 4 dims [1,2,3,4]", function() F.pad(x, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}) end)
    raises("pad: unknown option \"valeu\"", function() F.pad(x, {1, 1}, {valeu = 1}) end)
    raises("interpolate: give either size or scale_factor", function() F.interpolate(x, {}) end)
    raises("interpolate: mode \"linear\" needs a [N,C,W] input, got [1,2,3,4]", function() F.interpolate(x, {size = 2, mode = "linear"}) end)
    raises("interpolate: mode \"bicubic\" needs a [N,C,H,W] input, got [1,2,3]", function()
      F.interpolate(kiln.randn(1, 2, 3), {size = 2, mode = "bicubic"})
    end)
    raises("interpolate: mode \"trilinear\" needs a [N,C,D,H,W] input, got [1,2,3,4]", function()
      F.interpolate(x, {size = 2, mode = "trilinear"})
    end)
    raises("interpolate: mode \"area\" needs a float input, got i64", function()
      F.interpolate(kiln.ones(1, 1, 4, 4, {dtype = "i64"}), {size = 2, mode = "area"})
    end)
    raises('interpolate: mode "bicubik" (expected "nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear" or '
           .. '"area"); did you mean bicubic?', function() F.interpolate(x, {size = 2, mode = "bicubik"}) end)
    raises('interpolate: align_corners only applies to the modes "linear", "bilinear", "bicubic" and "trilinear", not "area"',
           function() F.interpolate(x, {size = 2, mode = "area", align_corners = false}) end)
    raises("interpolate: input [1,1,1,1,1,1] has 6 dims (expected [N,C,W], [N,C,H,W] or [N,C,D,H,W])", function()
      F.interpolate(kiln.ones(1, 1, 1, 1, 1, 1), {size = 2})
    end)
    -- area is the mean of PyTorch's adaptive windows: [1,2,3,4] to 2 is {1.5, 3.5} (windows {1,2}, {3,4})
    -- and to 3 is {1.5, 2.5, 3.5} (windows overlap); bicubic keeps a constant, borders included (its
    -- 4 weights sum to 1), and over- and undershoots a step (Keys's A = -0.75)
    local line = kiln.tensor({1, 2, 3, 4}, {dtype = "f64"}):view(1, 1, 4)
    assert.same({1.5, 3.5}, F.interpolate(line, {size = 2, mode = "area"}):view(-1):totable())
    assert.same({1.5, 2.5, 3.5}, F.interpolate(line, {size = 3, mode = "area"}):view(-1):totable())
    -- a linear mode whose every dim keeps its size still gives a new tensor
    local same = kiln.ones(1, 1, 3, 4)
    local copy = F.interpolate(same, {scale_factor = 1.2, mode = "bilinear"})
    copy:fill_(3)
    assert.equal(1, same:max():item())
    local flat = F.interpolate(kiln.full({1, 1, 3, 4}, 2.5, {dtype = "f64"}), {size = {7, 9}, mode = "bicubic"})
    assert.is_true((flat - 2.5):abs():max():item() < 1e-14)
    local step = kiln.tensor({0, 0, 1, 1}, {dtype = "f64"}):view(1, 1, 1, 4)
    local s8 = F.interpolate(step, {size = {1, 8}, mode = "bicubic"}):view(-1)
    -- output 5 sits at 1.75 (from 0): lines 0..3 at t = 0.75, weights -0.03515625, 0.26171875, 0.87890625,
    -- -0.10546875 (by hand from the cubic); output 6 at 2.25: lines 1, 2, 3, 3 (clamped) at t = 0.25
    assert.is_true(math.abs(s8[5] - (0.87890625 - 0.10546875)) < 1e-15, "step at 1.75: " .. s8[5])
    assert.is_true(math.abs(s8[6] - (0.87890625 + 0.26171875 - 0.03515625)) < 1e-15, "step at 2.25: " .. s8[6])
    raises("interpolate: mode \"bilinear\" needs a float input, got i64", function()
      F.interpolate(kiln.ones(1, 1, 2, 2, {dtype = "i64"}), {size = 3, mode = "bilinear"})
    end)
    raises("unfold: input [2,3,4] has 3 dims (expected [N,C,H,W])", function() F.unfold(kiln.randn(2, 3, 4), 2) end)
    raises("fold: input [1,8,5] does not fit output_size {3,4} (expected [N, C * 4, 6])", function()
      F.fold(kiln.randn(1, 8, 5), {3, 4}, 2)
    end)
    -- nearest picks PyTorch's source where j * scale is near an integer: in float for f32, the
    -- double product rounded to float for f64 (PyTorch 2.15: 10 and 20 at 42 of 82; 20 at 50 of 98)
    local two32, two64 = kiln.tensor({10, 20}):view(1, 1, 2), kiln.tensor({10, 20}, {dtype = "f64"}):view(1, 1, 2)
    assert.equal(10, F.interpolate(two32, {size = 82}):view(-1)[42])
    assert.equal(20, F.interpolate(two64, {size = 82}):view(-1)[42])
    assert.equal(20, F.interpolate(two64, {size = 98}):view(-1)[50])
    -- nearest keeps integers; fold(unfold(x)) counts each pixel once per block that covers it
    assert.equal("i64", F.interpolate(kiln.ones(1, 1, 2, 2, {dtype = "i64"}), {scale_factor = 2}):dtype())
    local ones = kiln.ones(1, 1, 3, 3)
    assert.same({{{{1, 2, 1}, {2, 4, 2}, {1, 2, 1}}}}, F.fold(F.unfold(ones, 2), {3, 3}, 2):totable())
  end)

  it("diag, trace, outer, baddbmm and clamp with tensor bounds refuse bad shapes by name", function()
    raises("diag: expects a 1-d or 2-d tensor, got [2,2,2]", function() kiln.ones(2, 2, 2):diag() end)
    raises("trace: expects a 2-d tensor, got [3]", function() kiln.ones(3):trace() end)
    raises("outer: expects two 1-d tensors, got [2,2] and [3]", function() kiln.ones(2, 2):outer(kiln.ones(3)) end)
    raises("baddbmm: unknown option \"betta\"", function() kiln.ones(2, 2):baddbmm(kiln.ones(1, 2, 2), kiln.ones(1, 2, 2), {betta = 1}) end)
    -- baddbmm's input broadcasts to the product [B,n,m] and no further (beta = 0 too), as PyTorch's
    assert.same({2, 3, 4}, kiln.ones(2, 1, 4):baddbmm(kiln.ones(2, 3, 5), kiln.ones(2, 5, 4)):size())
    for _, beta in ipairs({1, 0}) do
      raises("baddbmm: input [3,2,3,4] does not broadcast to the product's shape [2,3,4] (batch1 [2,3,5] @ batch2 [2,5,4])",
             function() kiln.ones(3, 2, 3, 4):baddbmm(kiln.ones(2, 3, 5), kiln.ones(2, 5, 4), {beta = beta}) end)
    end
    raises("baddbmm: input [5] does not broadcast", function() kiln.ones(5):baddbmm(kiln.ones(2, 3, 5), kiln.ones(2, 5, 4)) end)
    -- addcmul, addcdiv, lerp and clamp broadcast their three operands, and name them when they cannot
    assert.same({2, 3, 4}, kiln.ones(4):addcmul(kiln.ones(3, 1), kiln.ones(2, 1, 4)):size())
    assert.same({2, 3, 4}, kiln.ones(4):lerp(kiln.ones(3, 1), kiln.ones(2, 1, 1)):size())
    assert.same({2, 3, 4}, kiln.ones(4):clamp(kiln.ones(3, 1), kiln.ones(2, 1, 1)):size())
    raises("addcmul: input [5], tensor1 [3,1] and tensor2 [2,1,4] do not broadcast (dim 3: 5 in input vs 4 in tensor2)",
           function() kiln.ones(5):addcmul(kiln.ones(3, 1), kiln.ones(2, 1, 4)) end)
    raises("addcdiv: input [3,4], tensor1 [2] and tensor2 [1] do not broadcast (dim 2: 4 in input vs 2 in tensor1)",
           function() kiln.ones(3, 4):addcdiv(kiln.ones(2), kiln.ones(1)) end)
    raises("lerp: input [4] and end [3] do not broadcast (dim 1: 4 in input vs 3 in end)", function()
      kiln.ones(4):lerp(kiln.ones(3), 0.5)
    end)
    raises("clamp: input [3], min [2] and max [3] do not broadcast", function()
      kiln.ones(3):clamp(kiln.ones(2), kiln.ones(3))
    end)
    local x = kiln.tensor({-2, 0, 2})
    assert.same({-1, 0, 1}, x:clamp(kiln.tensor({-1, -1, -1}), kiln.tensor({1, 1, 1})):totable())
    assert.same({-1, 0, 2}, x:clamp(kiln.tensor({-1, -1, -1})):totable())
    assert.same({-2, 0, 0.5}, x:clamp(nil, kiln.tensor({5, 5, 0.5})):totable())
  end)
end)
