-- kiln.autograd.Function: custom ops with a Lua forward and backward, checked against f64 central
-- differences (gradcheck) and against the same computation written with kiln's own ops.
local kiln = kiln or require "kiln"
local Function = kiln.autograd.Function
local C = kiln.C

local function f64(...) return kiln.randn({...}, {dtype = "f64"}) end

local function max_diff(a, b) return (a - b):abs():max():item() end

-- y = x * w + c (c a number), z = sin(x): two inputs, a non-tensor argument, two outputs
local function mul_add_sin()
  local F = Function("MulAddSin")
  function F.forward(ctx, x, w, c)
    ctx:save_for_backward(x, w)
    ctx.c = c
    return x * w + c, x:sin()
  end
  function F.backward(ctx, gy, gz)
    local x, w = unpack(ctx.saved_tensors)
    local gx = gy * w + gz * x:cos()
    local gw = ctx.needs_input_grad[2] and (gy * x) or nil
    return gx, gw, nil
  end
  return F
end

describe("autograd.Function", function()
  it("passes an f64 gradient check, with two inputs, a number argument and two outputs", function()
    local F = mul_add_sin()
    local x, w = f64(3, 4):requires_grad_(), f64(3, 4):requires_grad_()
    local ok, report = kiln.gradcheck(function(a, b) return F.apply(a, b, 0.5) end, {x, w})
    assert.is_true(ok, report)
    -- and inside a larger graph: ops before and after it
    ok, report = kiln.gradcheck(function(a, b)
      local y, z = F(a:tanh(), b * 2, 1.5)
      return (y * z):exp():sum(2)
    end, {x, w})
    assert.is_true(ok, report)
  end)

  it("gives the same grads as the computation written with kiln's ops", function()
    local F = mul_add_sin()
    local x, w = f64(5, 2):requires_grad_(), f64(5, 2):requires_grad_()
    local y, z = F(x, w, 3)
    assert.equal("MulAddSinBackward", y.grad_fn)
    ;(y:pow(2):sum() + z:sum()):backward()
    local gx, gw = x.grad:clone(), w.grad:clone()
    x.grad, w.grad = nil, nil
    local y2, z2 = x * w + 3, x:sin()
    ;(y2:pow(2):sum() + z2:sum()):backward()
    assert.is_true(max_diff(gx, x.grad) < 1e-12)
    assert.is_true(max_diff(gw, w.grad) < 1e-12)
  end)

  it("tells backward which inputs need a grad (ctx.needs_input_grad)", function()
    local seen
    local F = Function("Scale")
    function F.forward(ctx, x, s) seen = ctx.needs_input_grad return x * s end
    function F.backward(ctx, g) return g * 2, nil end
    local x = kiln.randn(3):requires_grad_()
    F(x, kiln.ones(3))
    assert.are.same({true, false}, seen)
    kiln.no_grad(function() F(x, 2) end)
    assert.are.same({false, false}, seen)
  end)

  it("gives zeros for an output no grad reached, and leaves non-differentiable outputs out", function()
    local got
    local F = Function("MaxWithIndex")
    function F.forward(ctx, x)
      local v, i = x:max(1)
      ctx:mark_non_differentiable(i)
      ctx:save_for_backward(x, i)
      return v, i, x * 3
    end
    function F.backward(ctx, gv, gi, g3)
      got = {gv, gi, g3}
      local x, i = unpack(ctx.saved_tensors)
      local gx = kiln.zeros_like(x):scatter_add(1, i:view(1, -1), gv:view(1, -1))
      return gx + g3 * 3
    end
    local x = kiln.tensor({{1, 5}, {4, 2}, {0, 3}}, {dtype = "f64"}):requires_grad_()
    local v, i, t = F(x)
    assert.is_false(i.requires_grad)
    assert.is_true(v.requires_grad and t.requires_grad)
    v:sum():backward()
    assert.are.same({{0, 1}, {1, 0}, {0, 0}}, x.grad:totable())
    assert.is_nil(got[2])
    assert.are.same({{0, 0}, {0, 0}, {0, 0}}, got[3]:totable())   -- t got no grad: zeros
  end)

  it("refuses a backward after a saved tensor changed in place, naming the function", function()
    local Exp = Function("MyExp")
    function Exp.forward(ctx, x) local y = x:exp() ctx:save_for_backward(y) return y end
    function Exp.backward(ctx, g) return g * ctx.saved_tensors[1] end
    local x = kiln.randn(4):requires_grad_()
    local y = Exp(x)
    kiln.no_grad(function() y:mul_(2) end)
    assert.error_matches(function() y:sum():backward() end, "saved by MyExp %(ctx:save_for_backward argument 1%), was changed in place")
    -- the runtime is still usable, and a fresh graph works
    local y2 = Exp(x)
    y2:sum():backward()
    assert.is_true(max_diff(x.grad, x:exp()) < 1e-6)
  end)

  it("frees its saved tensors after backward, and says how to keep them", function()
    local Exp = Function("KeptExp")
    function Exp.forward(ctx, x) local y = x:exp() ctx:save_for_backward(y) return y end
    function Exp.backward(ctx, g) return g * ctx.saved_tensors[1] end
    local x = kiln.randn(3, {dtype = "f64"}):requires_grad_()
    local s = Exp(x):sum()
    s:backward()
    assert.error_matches(function() s:backward() end, "retain_graph = true")
    x.grad = nil
    local s2 = Exp(x):sum()
    s2:backward{retain_graph = true}
    s2:backward()
    assert.is_true(max_diff(x.grad, x:exp() * 2) < 1e-12)
  end)

  it("checks what backward returns", function()
    local Bad = Function("BadShape")
    function Bad.forward(ctx, x) return x * 2 end
    function Bad.backward(ctx, g) return g:sum() end
    local x = kiln.randn(3):requires_grad_()
    assert.error_matches(function() Bad(x):sum():backward() end, "backward of BadShape: the grad of input 1 is %[%], but the input is %[3%]")
    local Many = Function("TooMany")
    function Many.forward(ctx, x) return x * 2 end
    function Many.backward(ctx, g) return g, g end
    assert.error_matches(function() Many(x):sum():backward() end, "backward of TooMany: returned 2 grads for 1 inputs")
    local Err = Function("Raises")
    function Err.forward(ctx, x) return x * 2 end
    function Err.backward(ctx, g) error("my backward failed") end
    assert.error_matches(function() Err(x):sum():backward() end, "my backward failed")
    -- after those errors the graph walk state is clean: an ordinary backward works
    x.grad = nil
    ;(x * 3):sum():backward()
    assert.are.same({3, 3, 3}, x.grad:totable())
  end)

  it("is refused by the C kiln_backward, which cannot run Lua", function()
    local F = Function("LuaOnly")
    function F.forward(ctx, x) return x * 2 end
    function F.backward(ctx, g) return g * 2 end
    local x = kiln.randn(2):requires_grad_()
    local s = F(x):sum()
    assert.are_not.equal(0, C.kiln_backward(s.p, nil, 0))
    assert.matches("LuaOnly, a function whose derivative runs in Lua", kiln.ffi.string(C.kiln_error_message()))
  end)

  it("lets C free its nodes, and forgets their contexts", function()
    collectgarbage() collectgarbage()
    local before = tonumber(C.kiln_function_nodes_live())
    local F = Function("Tmp")
    function F.forward(ctx, x) return x + 1 end
    function F.backward(ctx, g) return g end
    do
      local x = kiln.randn(2):requires_grad_()
      local y = F(F(x))
      assert.equal(before + 2, tonumber(C.kiln_function_nodes_live()))
      y:sum():backward()
      assert.are.same({1, 1}, x.grad:totable())
    end
    collectgarbage() collectgarbage()
    assert.equal(before, tonumber(C.kiln_function_nodes_live()))
  end)

  it("returns an input given back as a fresh tensor, so the input stays a leaf", function()
    local Id = Function("Same")
    function Id.forward(ctx, x) return x end
    function Id.backward(ctx, g) return g * 5 end
    local x = kiln.randn(3):requires_grad_()
    local y = Id(x)
    assert.is_true(x.is_leaf)
    y:sum():backward()
    assert.are.same({5, 5, 5}, x.grad:totable())
  end)
end)
