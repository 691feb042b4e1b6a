-- Autograd: every differentiable op against f64 central differences (non-contiguous inputs and
-- broadcasting on purpose), and the semantics of the graph: accumulation, no_grad, detach,
-- retain_graph, non-scalar outputs, and the errors for a used-up graph or an in-place change.
local kiln = kiln or require "kiln"
require "kiln.testing"

local function leaf(...)
  return kiln.randn({...}, {dtype = "f64"}):requires_grad_()
end
-- A non-contiguous f64 leaf of the given 2-d shape.
local function leaf_t(r, c)
  return kiln.randn(c, r, {dtype = "f64"}):t():requires_grad_()
end
local function positive(...)
  local t = kiln.rand({...}, {dtype = "f64"})
  return (t + 0.5):detach():requires_grad_()
end

describe("gradients of elementwise ops", function()
  before_each(function() kiln.manual_seed(11) end)

  local unary = {"neg", "abs", "sqrt", "rsqrt", "exp", "log", "log1p", "expm1", "sin", "cos", "tanh", "sigmoid",
                 "relu", "reciprocal", "square", "erf"}
  for _, name in ipairs(unary) do
    it(name .. " matches finite differences", function()
      local needs_positive = name == "sqrt" or name == "rsqrt" or name == "log" or name == "log1p" or name == "reciprocal"
      local x = needs_positive and positive(3, 4) or leaf_t(3, 4)
      if name == "abs" or name == "relu" then   -- keep away from the kink at 0
        x = kiln.no_grad(function() return (x + x:sign() * 0.1):detach() end):requires_grad_()
      end
      assert.gradcheck(function(a) return a[name](a) end, {x})
    end)
  end

  for _, name in ipairs{"add", "sub", "mul", "div", "maximum", "minimum"} do
    it(name .. " with broadcasting matches finite differences", function()
      local a, b = leaf_t(3, 4), leaf(1, 4)
      if name == "div" then b = positive(1, 4) end
      assert.gradcheck(function(x, y) return x[name](x, y) end, {a, b})
    end)
  end

  it("pow of two tensors and with scalars", function()
    local a, b = positive(2, 3), leaf(2, 3)
    assert.gradcheck(function(x, y) return x ^ y end, {a, b})
    assert.gradcheck(function(x) return x ^ 3 end, {a})
    assert.gradcheck(function(x) return 2 ^ x end, {b})
  end)

  it("maximum and minimum with a scalar, ties included", function()
    local a = kiln.tensor({-1, 0, 2}, {dtype = "f64"}):requires_grad_()
    a:minimum(0):sum():backward()
    assert.are.same({1, 0.5, 0}, a.grad:totable())
    a.grad = nil
    a:maximum(0):sum():backward()
    assert.are.same({0, 0.5, 1}, a.grad:totable())
  end)

  it("scalar operands on either side", function()
    local a = positive(3, 2)
    assert.gradcheck(function(x) return (1 - x) * 3 + x / 2 - 4 / x + (x % 0.7) end, {a})
  end)

  it("remainder of two tensors", function()
    local a, b = positive(3, 3), positive(3, 3)
    assert.gradcheck(function(x, y) return x % y end, {a, b})
  end)

  it("where and clamp", function()
    local a, b = leaf(4, 3), leaf(3)
    local cond = kiln.randn(4, 3):gt(0)
    assert.gradcheck(function(x, y) return kiln.where(cond, x, y) end, {a, b})
    assert.gradcheck(function(x) return x:clamp(-0.5, 0.7) end, {a})
  end)
end)

describe("gradients of reductions", function()
  before_each(function() kiln.manual_seed(12) end)
  local x
  before_each(function() x = kiln.randn(5, 3, 4, {dtype = "f64"}):transpose(1, 3):requires_grad_() end)

  for _, name in ipairs{"sum", "mean", "logsumexp"} do
    it(name .. " over all, one and two dims", function()
      assert.gradcheck(function(a) return a[name](a) end, {x})
      assert.gradcheck(function(a) return a[name](a, 2) end, {x})
      assert.gradcheck(function(a) return a[name](a, {1, 3}, true) end, {x})
    end)
  end

  it("prod", function()
    local p = positive(3, 4)
    assert.gradcheck(function(a) return a:prod(2) end, {p})
  end)

  it("max and min (values of the dim form, and of everything)", function()
    assert.gradcheck(function(a) return (a:max(2)) end, {x})
    assert.gradcheck(function(a) return a:min() end, {x})
  end)

  it("var and std, with and without correction", function()
    assert.gradcheck(function(a) return a:var(2) end, {x})
    assert.gradcheck(function(a) return a:std({1, 2}, true, {correction = 0}) end, {x})
  end)

  it("norm for p = 1, 2, 3, inf and -inf", function()
    for _, p in ipairs{1, 2, 3, math.huge, -math.huge} do
      assert.gradcheck(function(a) return a:norm(p, 3) end, {x})
    end
  end)
end)

describe("gradients of products, views and indexing", function()
  before_each(function() kiln.manual_seed(13) end)

  it("matmul: 2-d, transposed, batched with broadcasting, 1-d", function()
    assert.gradcheck(function(a, b) return a:matmul(b) end, {leaf_t(3, 4), leaf(4, 5)})
    assert.gradcheck(function(a, b) return a:matmul(b) end, {leaf(2, 1, 3, 4), leaf(5, 4, 2)})
    assert.gradcheck(function(a, b) return a:matmul(b) end, {leaf(4), leaf(4, 3)})
    assert.gradcheck(function(a, b) return a:matmul(b) end, {leaf(3, 4), leaf(4)})
  end)

  it("addmm with broadcast bias, alpha and beta", function()
    assert.gradcheck(function(c, a, b) return c:addmm(a, b, {beta = 0.5, alpha = 2}) end, {leaf(5), leaf(3, 4), leaf(4, 5)})
  end)

  it("views: view, reshape, transpose, permute, narrow, select, squeeze, unsqueeze, expand, flatten", function()
    local x = leaf(2, 3, 4)
    assert.gradcheck(function(a) return a:view(6, 4) * 2 end, {x})
    assert.gradcheck(function(a) return a:transpose(1, 3):reshape(4, 6) end, {x})
    assert.gradcheck(function(a) return a:permute(3, 1, 2) * 1 end, {x})
    assert.gradcheck(function(a) return a:narrow(2, 2, 2) * 1 end, {x})
    assert.gradcheck(function(a) return a:select(3, -1) * 1 end, {x})
    assert.gradcheck(function(a) return a:unsqueeze(2):squeeze(2) * 1 end, {x})
    assert.gradcheck(function(a) return a:narrow(1, 1, 1):expand(5, 3, 4) * 1 end, {x})
    assert.gradcheck(function(a) return a:flatten(2) * 1 end, {x})
  end)

  it("copies between dtypes pass the grad back", function()
    local x = leaf(3, 3)
    assert.gradcheck(function(a) return a:to("f32"):to("f64") * 2 end, {x}, {atol = 1e-3, rtol = 1e-3, eps = 1e-3})
    assert.gradcheck(function(a) return a:clone() end, {x})
  end)

  it("cat and stack", function()
    assert.gradcheck(function(a, b) return kiln.cat({a, b}, 2) end, {leaf(2, 3), leaf(2, 5)})
    assert.gradcheck(function(a, b) return kiln.stack({a, b}, 1) end, {leaf(2, 3), leaf(2, 3)})
  end)

  it("index_select, gather, scatter_add, masked_fill, masked_select", function()
    local x = leaf(4, 3)
    local idx = kiln.tensor({3, 1, 3}, {dtype = "i64"})
    assert.gradcheck(function(a) return a:index_select(1, idx) end, {x})
    local gi = kiln.tensor({{1, 1}, {3, 2}, {2, 2}, {1, 3}}, {dtype = "i64"})
    assert.gradcheck(function(a) return a:gather(2, gi) end, {x})
    local src = leaf(4, 2)
    assert.gradcheck(function(a, s) return a:scatter_add(2, gi, s) end, {x, src})
    local mask = kiln.randn(4, 3):gt(0)
    assert.gradcheck(function(a) return a:masked_fill(mask, 0.5) end, {x})
    assert.gradcheck(function(a) return a:masked_select(mask) end, {x})
  end)
end)

describe("the graph", function()
  it("accumulates into leaves over several backwards", function()
    local x = kiln.tensor({1, 2, 3}, {dtype = "f64"}):requires_grad_()
    ;(x * x):sum():backward()
    ;(x * 3):sum():backward()
    assert.are.same({5, 7, 9}, x.grad:totable())
  end)

  it("sums the grads of a tensor used twice", function()
    local x = kiln.tensor({2}, {dtype = "f64"}):requires_grad_()
    local y = x * x + x          -- dy/dx = 2x + 1 = 5
    y:sum():backward()
    assert.are.same({5}, x.grad:totable())
  end)

  it("records nothing under no_grad, and detach cuts the history", function()
    local x = kiln.ones(2):requires_grad_()
    local y = kiln.no_grad(function() return x * 2 end)
    assert.is_false(y.requires_grad)
    local z = (x * 2):detach()
    assert.is_false(z.requires_grad)
    assert.is_true(z.is_leaf)
    assert.is_true(kiln.is_grad_enabled())
  end)

  it("takes the grad of a non-scalar output, and needs it", function()
    local x = kiln.tensor{1, 2, 3}:requires_grad_()
    local y = x * 2
    local ok, err = pcall(function() y:backward() end)
    assert.is_false(ok)
    assert.matches("give the grad of a non%-scalar output", err)
    y:backward(kiln.tensor{1, 0, -1})
    assert.are.same({2, 0, -2}, x.grad:totable())
  end)

  it("refuses a second backward through a freed graph unless retain_graph", function()
    local x = kiln.tensor{1, 2}:requires_grad_()
    local y = (x:exp()):sum()
    y:backward{retain_graph = true}
    y:backward()
    local ok, err = pcall(function() y:backward() end)
    assert.is_false(ok)
    assert.matches("retain_graph", err)
    assert.matches("autograd_spec", err)
    assert.are.equal(2, #x.grad:totable())
  end)

  it("detects an in-place change of a saved tensor", function()
    local w = kiln.tensor{1, 2}:requires_grad_()
    local x = kiln.tensor{3, 4}
    local y = (w * x):sum()
    x:mul_(2)                     -- x was saved by mul
    local ok, err = pcall(function() y:backward() end)
    assert.is_false(ok)
    assert.matches("changed in place", err)
  end)

  it("refuses in-place ops on tensors that require grad, but not under no_grad", function()
    local w = kiln.ones(3):requires_grad_()
    local ok, err = pcall(function() w:add_(1) end)
    assert.is_false(ok)
    assert.matches("add_: in%-place change of %[3%]", err)
    kiln.no_grad(function() w:add_(1) end)
    assert.are.same({2, 2, 2}, w:totable())
  end)

  it("records in-place ops on activations: the grads of the same computation out of place", function()
    kiln.manual_seed(3)
    local x = kiln.randn(4, 3, {dtype = "f64"}):requires_grad_()
    local w = kiln.randn(5, 3, {dtype = "f64"}):requires_grad_()
    local b = kiln.randn(5, {dtype = "f64"}):requires_grad_()
    local c = kiln.rand(4, 5, {dtype = "f64"}) + 0.5
    local function in_place(x_, w_, b_)
      local h = x_:matmul(w_:t())
      h:add_(b_)                 -- a tensor that requires grad, into an activation
      h:relu_()
      h:mul_(c)                  -- a tensor that does not
      h:tanh_()
      return h
    end
    local function out_of_place(x_, w_, b_)
      local h = (x_:matmul(w_:t()) + b_):relu()
      return (h * c):tanh()
    end
    local y = in_place(x, w, b)
    assert.equal("TanhBackward", y.grad_fn)
    y:pow(2):sum():backward()
    local gx, gw, gb = x.grad:clone(), w.grad:clone(), b.grad:clone()
    x.grad, w.grad, b.grad = nil, nil, nil
    out_of_place(x, w, b):pow(2):sum():backward()
    assert.is_true((gx - x.grad):abs():max():item() < 1e-12)
    assert.is_true((gw - w.grad):abs():max():item() < 1e-12)
    assert.is_true((gb - b.grad):abs():max():item() < 1e-12)
    local ok, report = kiln.gradcheck(in_place, {x, w, b})
    assert.is_true(ok, report)
  end)

  it("keeps what the in-place op's own derivative reads (t:mul_(u) with u requiring grad)", function()
    local x = kiln.randn(6, {dtype = "f64"}):requires_grad_()
    local u = kiln.randn(6, {dtype = "f64"}):requires_grad_()
    local ok, report = kiln.gradcheck(function(x_, u_)
      local h = x_:sin()
      h:mul_(u_)                 -- mul saves h before the change: d/du needs the old h
      h:masked_fill_(u_:detach():gt(1), 0)
      return h
    end, {x, u})
    assert.is_true(ok, report)
  end)

  it("gives a plain tensor the history of what is added into it in place", function()
    local x = kiln.randn(3, {dtype = "f64"}):requires_grad_()
    local acc = kiln.zeros(3, {dtype = "f64"})
    acc:add_(x * 2)
    acc:add_(x:exp())
    assert.is_true(acc.requires_grad)
    acc:sum():backward()
    assert.is_true((x.grad - (x:exp() + 2)):abs():max():item() < 1e-12)
    -- fill_ cuts what came before: no grad flows through it
    local y = x * 3
    y:fill_(1)
    assert.is_false(y.requires_grad)
  end)

  it("refuses at backward only a tensor that backward really saved, naming the op", function()
    local x = kiln.randn(2, 3):requires_grad_()
    local h = x * 2          -- mul by a number saves nothing: relu_ after it is fine
    h:relu_()
    h:sum():backward()
    local e = x:exp()        -- exp saves its output
    e:relu_()
    local ok, err = pcall(function() e:sum():backward() end)
    assert.is_false(ok)
    assert.matches("backward: exp saved its output %[2,3%] for its derivative, and it was changed in place", err)
    assert.falsy(err:find("no_grad", 1, true))
    -- a view taken before an in-place change of its base follows the change (inplace_view_spec)
    x.grad = nil
    local a = x * 1
    local v = a:narrow(2, 1, 2)
    a:mul_(3)
    v:sum():backward()
    assert.are.same({{3, 3, 0}, {3, 3, 0}}, x.grad:totable())
  end)

  it("changes a view with history and its base in place, and refuses a leaf that requires grad", function()
    local x = kiln.randn(2, 3):requires_grad_()
    local base = x * 2
    local v = base:view(-1)
    v:relu_()                     -- base sees it: CopySlices (inplace_view_spec)
    assert.equal("CopySlices", base.grad_fn)
    base:sum():backward()
    assert.are.same((x:gt(0):double() * 2):totable(), x.grad:double():totable())
    -- a view of a temporary nothing else can reach: the same grads, whenever the collector last ran
    x.grad = nil
    local w = (x * 2):view(-1)
    w:relu_()
    w:sum():backward()
    assert.are.same((x:gt(0):double() * 2):totable(), x.grad:double():totable())
    local ok, err = pcall(function() x:relu_() end)
    assert.is_false(ok)
    assert.matches("relu_: in%-place change of %[2,3%], a leaf that requires grad", err)
  end)

  it("only float tensors can require grad", function()
    local ok, err = pcall(function() kiln.ones(2, {dtype = "i64"}):requires_grad_() end)
    assert.is_false(ok)
    assert.matches("only float tensors", err)
  end)

  it("names the op that made a tensor", function()
    local x = kiln.ones(2):requires_grad_()
    assert.are.equal("MulBackward", (x * 2).grad_fn)
    assert.is_nil(x.grad_fn)
  end)

  it("frees a long chain without exhausting the C stack", function()
    local x = kiln.ones(1):requires_grad_()
    local y = x
    for _ = 1, 100000 do y = y + 1 end
    y = nil
    collectgarbage()
    collectgarbage()
  end)
end)

describe("gradcheck itself", function()
  it("fails on a wrong derivative", function()
    -- (x:detach() * x) has derivative x, not 2x: a function whose backward disagrees with its values
    local x = kiln.tensor({1, 2}, {dtype = "f64"}):requires_grad_()
    local ok = kiln.gradcheck(function(a) return a:detach() * a end, {x})
    assert.is_false(ok)
  end)
end)
