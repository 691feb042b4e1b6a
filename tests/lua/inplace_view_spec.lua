-- In-place ops on views under autograd, as PyTorch's CopySlices does them: the view's base takes
-- the change (its history becomes the old one outside the view and the written value's inside),
-- a buffer without history gets one when a value with history is written into a view of it, and a
-- view taken before its base changed follows the change. Each case is checked against the same
-- computation written out of place (cat, stack, or a hand-derived gradient) and, where noted,
-- against the values PyTorch 2.15 gives (tests/lua constants, computed with torch in f64), and the
-- functions that write into views pass an f64 gradcheck.
local kiln = kiln or require "kiln"
require "kiln.testing"

local F64 = {dtype = "f64"}

local function tensor(t) return kiln.tensor(t, F64) end

-- The largest difference between two tensors (or a tensor and nested tables).
local function diff(a, b)
  if type(b) == "table" then b = tensor(b) end
  return (a:double() - b:double()):abs():max():item()
end

local function assert_close(a, b, tol)
  local d = diff(a, b)
  assert.is_true(d < (tol or 1e-12), string.format("largest difference %.3g", d))
end

-- backward of the sum of t (of t itself, a scalar, when summed is true)
local function backward(t, summed)
  if not summed then t = t:sum() end
  t:backward()
end

local function y34() return kiln.arange(1, 13, F64):reshape(3, 4):requires_grad_() end
local C34 = {{1, -2, 3, 0.5}, {2, 1, -1, 4}, {-3, 0.25, 2, 1}}

describe("in-place ops on a view of a tensor with history", function()
  before_each(function() kiln.manual_seed(5) end)

  it("change the base: z = y * 1; z[1]:mul_(3) gives y.grad 3 on row 1, 1 elsewhere", function()
    local y = y34()
    local z = y * 1
    z[1]:mul_(3)
    assert.equal("CopySlices", z.grad_fn)
    z:sum():backward()
    assert.are.same({{3, 3, 3, 3}, {1, 1, 1, 1}, {1, 1, 1, 1}}, y.grad:totable())
    -- weighted: PyTorch's y.grad, and the out-of-place formulation (cat of the pieces)
    y.grad = nil
    local c = tensor(C34)
    local z2 = y * 1
    local row = z2[1]
    row:mul_(3)
    assert.equal("AsStridedBackward", row.grad_fn)
    assert.are.same(z2:totable(), kiln.cat({y:narrow(1, 1, 1) * 3, y:narrow(1, 2, 2)}, 1):totable())
    backward(z2 * c)
    assert_close(y.grad, {{3, -6, 9, 1.5}, {2, 1, -1, 4}, {-3, 0.25, 2, 1}})
    local ref = y34()
    backward(kiln.cat({ref:narrow(1, 1, 1) * 3, ref:narrow(1, 2, 2)}, 1) * c)
    assert_close(y.grad, ref.grad)
  end)

  it("pass gradcheck: ops that read the base, through narrow, select, transpose and views of views", function()
    local y = kiln.randn(3, 4, F64):requires_grad_()
    local u = kiln.randn(4, F64):requires_grad_()
    assert.gradcheck(function(y_, u_)
      local z = y_:sin()                           -- (exp would save z, which changes: refused at backward)
      z:narrow(2, 2, 2):mul_(y_:narrow(2, 1, 2))
      z[2]:mul_(z[1])                              -- reads another row of the base
      z[3]:tanh_()
      z:t()[4]:mul_(u_:narrow(1, 1, 3))             -- column 4: transpose, then select
      z:narrow(1, 1, 2):narrow(2, 3, 2)[2]:add_(u_:narrow(1, 3, 2))   -- a view of a view of a view
      return z
    end, {y, u})
  end)
end)

describe("a value with history written into a view of a buffer without history", function()
  before_each(function() kiln.manual_seed(6) end)

  it("gives the buffer that history: out[1]:copy_(x * 2) (x.grad 3, where it used to be 1)", function()
    local x = kiln.randn(3):requires_grad_()
    local out = kiln.zeros(2, 3)
    out[1]:copy_(x * 2)
    assert.is_true(out.requires_grad)
    assert.equal("CopySlices", out.grad_fn)
    local loss = out:sum() + x:sum()
    loss:backward()
    assert.are.same({3, 3, 3}, x.grad:totable())
    -- the same through kiln.stack
    local x2 = x:detach():requires_grad_()
    local ref = kiln.stack({x2 * 2, kiln.zeros(3)})
    assert.are.same(ref:totable(), out:detach():totable())
    backward(ref:sum() + x2:sum(), true)
    assert.are.same(x2.grad:totable(), x.grad:totable())
  end)

  it("through narrow, select on dim 2, and t[i] = v, t[{i, j}] = v, t[mask] = v", function()
    local x = kiln.randn(4, F64):requires_grad_()
    local h = kiln.randn(3, 2, F64):requires_grad_()
    local c = kiln.randn(3, 4, F64)
    local function in_place(x_, h_)
      local out = kiln.zeros(3, 4, F64)
      out:narrow(2, 2, 2):add_(h_)                 -- columns 2 and 3
      if kiln.is_grad_enabled() then assert.equal("CopySlices", out.grad_fn) end
      out:select(2, 4):copy_(x_:narrow(1, 1, 3))   -- column 4
      out[1] = x_ * x_                             -- row 1
      out[{3, 1}] = x_:select(1, 2) * 5            -- one element
      if kiln.is_grad_enabled() then assert.equal("CopySlices", out.grad_fn) end
      out[out:detach():gt(1)] = 1                  -- a mask: masked_fill_
      return out
    end
    local function out_of_place(x_, h_)
      local col4 = x_:narrow(1, 1, 3):view(3, 1)
      local rows23 = kiln.cat({kiln.zeros(2, 1, F64), h_:narrow(1, 2, 2), col4:narrow(1, 2, 2)}, 2)
      local row3 = rows23[2]
      row3 = kiln.cat({(x_:select(1, 2) * 5):view(1), row3:narrow(1, 2, 3)})
      local out = kiln.stack({x_ * x_, rows23[1], row3})
      return out:masked_fill(out:detach():gt(1), 1)
    end
    local a = in_place(x, h)
    assert_close(a, out_of_place(x, h))
    backward(a * c)
    local gx, gh = x.grad:clone(), h.grad:clone()
    x.grad, h.grad = nil, nil
    backward(out_of_place(x, h) * c)
    assert_close(gx, x.grad)
    assert_close(gh, h.grad)
    assert.gradcheck(in_place, {x, h})
  end)

  it("through transpose then select, and select on dim 2 of a 3-d buffer (PyTorch's grads)", function()
    local x = kiln.tensor({1, 2, 3}, F64):requires_grad_()
    local buf = kiln.zeros(3, 4, F64)
    buf:t()[2]:copy_(x * x)                                              -- column 2
    local buf3 = kiln.zeros(2, 3, 2, F64)
    buf3:select(2, 3):add_(x:narrow(1, 1, 2):unsqueeze(2) * x:select(1, 3))
    local loss = (buf * tensor(C34)):sum() + (buf3 * kiln.arange(1, 13, F64):reshape(2, 3, 2)):sum()
    loss:backward()
    assert_close(x.grad, {29, 73, 58.5})
  end)

  it("into a base that is not contiguous (a detached transpose)", function()
    local x = kiln.randn(4, F64):requires_grad_()
    local function in_place(x_)
      local d = kiln.zeros(4, 3, F64):t():detach()   -- [3,4], strides {1,3}: not a view, not contiguous
      d[2]:copy_(x_ * 3)
      d:narrow(2, 2, 2):mul_(x_:narrow(1, 1, 3):view(3, 1))
      d:select(2, 4):add_(x_:narrow(1, 2, 3):exp())
      return d
    end
    local function out_of_place(x_)
      local row2 = (x_ * 3):view(1, 4)
      local d = kiln.cat({kiln.zeros(1, 4, F64), row2, kiln.zeros(1, 4, F64)}, 1)
      local mid = d:narrow(2, 2, 2) * x_:narrow(1, 1, 3):view(3, 1)
      local last = d:narrow(2, 4, 1) + x_:narrow(1, 2, 3):exp():view(3, 1)
      return kiln.cat({d:narrow(2, 1, 1), mid, last}, 2)
    end
    assert_close(in_place(x), out_of_place(x))
    in_place(x):sum():backward()
    local g = x.grad:clone()
    x.grad = nil
    out_of_place(x):sum():backward()
    assert_close(g, x.grad)
    assert.gradcheck(in_place, {x})
  end)
end)

describe("successive in-place writes into slices of one base", function()
  before_each(function() kiln.manual_seed(7) end)

  local function inputs()
    local x = kiln.tensor({0.5, -1.0, 2.0}, F64):requires_grad_()
    local W = kiln.tensor({{0.1, 0.2, -0.3}, {0.4, -0.5, 0.6}, {-0.7, 0.8, 0.9}}, F64):requires_grad_()
    return x, W
  end
  local weights = kiln.arange(1, 13, F64):reshape(4, 3)
  -- PyTorch: for t in range(4): h = tanh(W @ h); out[t].copy_(h)
  local torch_gx = {-5.590135940902106, 7.182698622537181, 6.515340174156711}
  local torch_gW = {{-1.7260300474540082, -0.750608152988157, 17.52570015007389},
                    {-11.48878356925414, 16.47847298216165, 16.18697425951524},
                    {1.1162572983918517, -8.336307239759357, 30.180688238588836}}

  it("the loop RNN code writes: out[t]:copy_(step(h))", function()
    local x, W = inputs()
    local out = kiln.zeros(4, 3, F64)
    local h = x
    for t = 1, 4 do
      h = W:matmul(h):tanh()
      out[t]:copy_(h)
    end
    backward(out * weights)
    assert_close(x.grad, torch_gx, 1e-12)
    assert_close(W.grad, torch_gW, 1e-12)
    -- against kiln.stack of the steps
    local x2, W2 = inputs()
    local steps = {}
    h = x2
    for t = 1, 4 do h = W2:matmul(h):tanh() steps[t] = h end
    backward(kiln.stack(steps) * weights)
    assert_close(x.grad, x2.grad)
    assert_close(W.grad, W2.grad)
  end)

  it("into views taken before the first write (split), which follow the base's new history", function()
    local x, W = inputs()
    local out = kiln.zeros(4, 3, F64)
    local rows = out:split(1)        -- four [1,3] views, none with history yet
    local h = x
    for t = 1, 4 do
      h = W:matmul(h):tanh()
      rows[t]:copy_(h:view(1, 3))
    end
    assert.is_true(rows[1].requires_grad)
    backward(out * weights)
    assert_close(x.grad, torch_gx, 1e-12)
    assert_close(W.grad, torch_gW, 1e-12)
    assert.gradcheck(function(x_, W_)
      local o = kiln.zeros(4, 3, F64)
      local r = o:split(1)
      local hh = x_
      for t = 1, 4 do
        hh = W_:matmul(hh):tanh()
        r[t]:copy_(hh:view(1, 3))
        r[t]:mul_(r[1] + 1)          -- reads a row written before, through its old view
      end
      return o
    end, {x, W})
  end)

  it("that overlap (PyTorch's grads), also through views all taken before the writes", function()
    local function run(early)
      local a = kiln.tensor({1, 2, 3}, F64):requires_grad_()
      local b = kiln.tensor({4, 5, 6}, F64):requires_grad_()
      local out = kiln.zeros(5, F64)
      local v1, v2, v3 = out:narrow(1, 1, 3), out:narrow(1, 2, 3), out:narrow(1, 3, 1)
      if not early then v1, v2, v3 = nil, nil, nil end
      local v1_ = v1 or out:narrow(1, 1, 3)
      v1_:copy_(a)
      local v2_ = v2 or out:narrow(1, 2, 3)
      v2_:mul_(b)
      local v3_ = v3 or out:narrow(1, 3, 1)
      v3_:add_(a:narrow(1, 1, 1) * 7)
      assert.are.same({1, 8, 22, 0, 0}, out:totable())
      backward(out * kiln.tensor({1, 2, 3, 4, 5}, F64))
      assert_close(a.grad, {22, 8, 15})
      assert_close(b.grad, {4, 9, 0})
    end
    run(false)
    run(true)
    local a = kiln.randn(3, F64):requires_grad_()
    local b = kiln.randn(3, F64):requires_grad_()
    assert.gradcheck(function(a_, b_)
      local out = kiln.zeros(5, F64)
      out:narrow(1, 1, 3):copy_(a_)
      out:narrow(1, 2, 3):mul_(b_)
      out:narrow(1, 3, 2):mul_(out:narrow(1, 1, 2))   -- reads what an earlier write wrote
      out:narrow(1, 4, 2):add_(out:narrow(1, 1, 2) * 3)
      return out
    end, {a, b})
  end)
end)

describe("a view taken before its base changed in place", function()
  it("follows the change when used afterwards (PyTorch regenerates its grad_fn)", function()
    local y = y34()
    local a = y * 1
    local v = a:narrow(2, 1, 2)
    a:mul_(3)
    backward(v * tensor(C34):narrow(2, 1, 2))
    assert_close(y.grad, {{3, -6, 0, 0}, {6, 3, 0, 0}, {-9, 0.75, 0, 0}})
    -- what used the view before the change keeps the grads of then
    y.grad = nil
    local a2 = y * 1
    local v2 = a2:narrow(2, 1, 2)
    local s = v2:sum()
    a2:mul_(3)
    s:backward()
    assert.are.same({{1, 1, 0, 0}, {1, 1, 0, 0}, {1, 1, 0, 0}}, y.grad:totable())
  end)

  it("is still caught at backward when an op saved it (its values changed under the op)", function()
    local y = y34()
    local w = kiln.randn(3, 2, F64):requires_grad_()
    local a = y * 1
    local p = a:narrow(2, 1, 2) * w   -- mul saves the view for w's grad
    a[2]:mul_(3)
    local ok, err = pcall(function() p:sum():backward() end)
    assert.is_false(ok)
    assert.matches("mul saved its input 1 %[3,2%] for its derivative, and it was changed in place", err)
  end)
end)

describe("in-place ops on views: what stays refused or unrecorded", function()
  it("refuses a view of a leaf that requires grad, unless under no_grad", function()
    local w = kiln.ones(3, 4):requires_grad_()
    local ok, err = pcall(function() w[1]:mul_(2) end)
    assert.is_false(ok)
    assert.matches("mul_: in%-place change of %[4%], a view of a leaf that requires grad %(a parameter %[3,4%]%)", err)
    ok, err = pcall(function() w:narrow(2, 1, 2):copy_(kiln.randn(3, 2):requires_grad_()) end)
    assert.is_false(ok)
    assert.matches("a view of a leaf that requires grad", err)
    kiln.no_grad(function() w[1]:mul_(2) end)
    assert.are.same({2, 2, 2, 2}, w[1]:totable())
    assert.is_true(w.is_leaf)
  end)

  it("refuses a view taken under no_grad of a tensor that requires grad, changed with grad on", function()
    local z = kiln.randn(3, 4):requires_grad_() * 2
    local v = kiln.no_grad(function() return z[1] end)
    assert.is_false(v.requires_grad)
    local ok, err = pcall(function() v:mul_(2) end)
    assert.is_false(ok)
    assert.matches("in%-place change of %[4%], a view taken under no_grad of a tensor that requires grad", err)
    ok, err = pcall(function() v:copy_(kiln.randn(4):requires_grad_()) end)
    assert.is_false(ok)
    assert.matches("a view taken under no_grad", err)
  end)

  it("refuses a view whose elements share memory (an expand) of a buffer in use", function()
    local out = kiln.zeros(2, 3)
    local e = out:narrow(1, 1, 1):expand(4, 3)
    local ok, err = pcall(function() e:copy_(kiln.randn(4, 3):requires_grad_()) end)
    assert.is_false(ok)
    assert.matches("in%-place change of %[4,3%], a view of %[2,3%] whose elements share memory", err)
  end)

  it("records nothing under no_grad: the values change, the history stays", function()
    local y = y34()
    local z = y * 1
    kiln.no_grad(function() z[2]:fill_(0) end)
    assert.equal("MulBackward", z.grad_fn)
    assert.are.same({0, 0, 0, 0}, z[2]:totable())
    z:sum():backward()
    assert.are.same({1, 1, 1, 1}, y.grad[2]:totable())
  end)

  it("writing all of the base through a view replaces its history, as on the base itself", function()
    local y = y34()
    local x = kiln.randn(12, F64):requires_grad_()
    local z = y * 1
    z:view(12):copy_(x * 2)
    z:sum():backward()
    assert.is_nil(y.grad)
    assert.are.same({2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}, x.grad:totable())
    local z2 = y * 1
    z2:view(12):fill_(1)     -- fill_ cuts the history
    assert.is_false(z2.requires_grad)
  end)

  it("a view of a temporary nothing else sees is changed like any tensor, and is a view no more", function()
    local x = kiln.randn(4, 3):requires_grad_()
    local w = kiln.randn(5, 3):requires_grad_()
    local h = x:matmul(w:t())     -- a view of matmul's 3-d result
    h:relu_()
    assert.equal("ReluBackward", h.grad_fn)
    h:sum():backward()
    local gx = x.grad:clone()
    x.grad = nil
    x:matmul(w:t()):relu():sum():backward()
    assert_close(gx, x.grad)
  end)

  it("lets go of everything: no storage outlives the tensors", function()
    collectgarbage()
    collectgarbage()
    local before = kiln.memory_stats().live_bytes
    do
      local x = kiln.randn(50):requires_grad_()
      local out = kiln.zeros(20, 50)
      local rows = out:split(1)
      local h = x
      for t = 1, 20 do
        h = (h * 0.5):tanh()
        if t % 2 == 0 then out[t]:copy_(h) else rows[t]:copy_(h:view(1, 50)) end
      end
      out:narrow(1, 3, 5):mul_(2)
      local stale = out:narrow(2, 1, 10)
      out[1]:add_(x)
      local loss = out:sum() + stale:sum()
      loss:backward()
      assert.is_true(x.grad ~= nil)
    end
    collectgarbage()
    collectgarbage()
    assert.equal(before, kiln.memory_stats().live_bytes)
  end)
end)
