-- Ops written with other ops (kiln.functional's linear, mse_loss, l1_loss, gelu, one_hot; tensors'
-- flip, tril, triu, any, all): values against loops over Lua tables, f64 gradient checks, errors.
local kiln = require "kiln"
local H = require "helpers"
require "kiln.testing"
local F = kiln.F

local function f64(...) local s = {...} s[#s + 1] = {dtype = "f64"} return kiln.randn(unpack(s)) end

describe("composite ops", function()
  it("linear is x W^T + b, with its gradients", function()
    local x, w, b = f64(3, 4), f64(5, 4), f64(5)
    local xs, ws, bs = x:totable(), w:totable(), b:totable()
    local want = {}
    for i = 1, 3 do
      want[i] = {}
      for j = 1, 5 do
        local s = bs[j]
        for k = 1, 4 do s = s + xs[i][k] * ws[j][k] end
        want[i][j] = s
      end
    end
    assert.tensor_near(F.linear(x, w, b), want, 1e-12)
    assert.gradcheck(function(a, c, d) return F.linear(a, c, d) end,
                     {x:requires_grad_(), w:requires_grad_(), b:requires_grad_()})
    assert.gradcheck(function(a, c) return F.linear(a, c) end, {f64(2, 3):requires_grad_(), f64(4, 3):requires_grad_()})
  end)

  it("mse_loss and l1_loss reduce (x - y)^2 and |x - y| as asked", function()
    local x, y = f64(2, 3), f64(2, 3)
    local sq, ab = 0, 0
    for _, v in ipairs(H.flatten(H.zip(x:totable(), y:totable(), function(a, b) return a - b end))) do
      sq, ab = sq + v * v, ab + math.abs(v)
    end
    assert.is_true(math.abs(F.mse_loss(x, y):item() - sq / 6) < 1e-12)
    assert.is_true(math.abs(F.mse_loss(x, y, {reduction = "sum"}):item() - sq) < 1e-12)
    assert.is_true(math.abs(F.l1_loss(x, y):item() - ab / 6) < 1e-12)
    assert.same({2, 3}, {F.l1_loss(x, y, {reduction = "none"}):size(1), F.l1_loss(x, y, {reduction = "none"}):size(2)})
    assert.gradcheck(function(a, b) return F.mse_loss(a, b) end, {x:requires_grad_(), y:requires_grad_()})
    assert.has_error(function() F.mse_loss(x, f64(3, 2)) end, nil)
    local ok, err = pcall(F.mse_loss, x, y, {reducton = "sum"})
    assert.is_false(ok)
    assert.matches('mse_loss: unknown option "reducton"', err)
  end)

  it("gelu is x Phi(x), exactly or by tanh, with its gradient", function()
    local x = f64(7)
    local exact, approx = {}, {}
    for i, v in ipairs(x:totable()) do
      exact[i] = v * 0.5 * (1 + H.erf(v / math.sqrt(2)))
      approx[i] = 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ^ 3)))
    end
    assert.tensor_near(F.gelu(x), exact, 1e-12)
    assert.tensor_near(F.gelu(x, {approximate = "tanh"}), approx, 1e-12)
    assert.gradcheck(function(a) return F.gelu(a) end, {x:requires_grad_()})
    assert.gradcheck(function(a) return F.gelu(a, {approximate = "tanh"}) end, {f64(5):requires_grad_()})
    assert.has_error(function() F.gelu(x, {approximate = "erf"}) end)
  end)

  it("one_hot puts a 1 at each label, counted from 1", function()
    assert.same({{0, 1, 0, 0}, {1, 0, 0, 0}, {0, 0, 0, 1}},
                F.one_hot(kiln.tensor({2, 1, 4}, {dtype = "i64"})):totable())
    assert.same({{0, 1, 0, 0, 0}}, F.one_hot(kiln.tensor({2}, {dtype = "i64"}), 5):totable())
    local ok, err = pcall(F.one_hot, kiln.tensor({0, 2}, {dtype = "i64"}), 3)
    assert.is_false(ok)
    assert.matches("labels must be in 1..3 %(counting from 1%), got 0..2", err)
  end)

  it("flip, tril and triu, through views, with their gradients", function()
    local x = f64(3, 4):t()   -- [4,3], transposed storage
    local t = x:totable()
    local flipped, lower, upper = {}, {}, {}
    for i = 1, 4 do
      flipped[i], lower[i], upper[i] = {}, {}, {}
      for j = 1, 3 do
        flipped[i][j] = t[5 - i][4 - j]
        lower[i][j] = (j - i <= -1) and t[i][j] or 0      -- tril(-1)
        upper[i][j] = (j - i >= 1) and t[i][j] or 0       -- triu(1)
      end
    end
    assert.tensor_near(x:flip(1, 2), flipped, 0)
    assert.tensor_near(x:flip{1, 2}, flipped, 0)
    assert.tensor_near(x:tril(-1), lower, 0)
    assert.tensor_near(x:triu(1), upper, 0)
    assert.tensor_near(kiln.ones(2, 3, 3):tril():sum(1), {{2, 0, 0}, {2, 2, 0}, {2, 2, 2}}, 0)   -- batched
    assert.gradcheck(function(a) return a:flip(1) end, {x:detach():requires_grad_()})
    assert.gradcheck(function(a) return a:tril(1) end, {x:detach():requires_grad_()})
    assert.gradcheck(function(a) return a:triu() end, {x:detach():requires_grad_()})
    local ok, err = pcall(function() return kiln.ones(3):tril() end)
    assert.is_false(ok)
    assert.matches("tril: needs a tensor of at least 2 dims, got %[3%]", err)
  end)

  it("any and all, over everything or a dim", function()
    local t = kiln.tensor{{0, 1, 0}, {0, 0, 0}}
    assert.is_true(t:any():item())
    assert.is_false(t:all():item())
    assert.same({true, false}, t:any(2):totable())
    assert.same({false, false}, t:all(2):totable())
    assert.same({{true}, {false}}, t:any(2, true):totable())
    assert.is_true(kiln.ones(2, 2):all():item())
    assert.is_true(kiln.zeros(0):all():item())    -- as PyTorch: all of nothing is true
    assert.is_false(kiln.zeros(0):any():item())
  end)
end)
