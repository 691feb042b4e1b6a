-- Optimizers, schedulers and gradient clipping: every optimizer's parameters after three steps
-- against PyTorch's algorithm written out below in plain Lua arithmetic (f32 and f64), the
-- options and variants, parameter groups, zero_grad, state dicts that resume bit for bit, every
-- scheduler's lr sequence against hand-computed values, and misuse.
local kiln = kiln or require "kiln"
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "?.lua;" .. package.path
local H = require "helpers"
local ffi = require "ffi"
local optim = kiln.optim

local SRC = debug.getinfo(1, "S").short_src
local err = H.error_of
local TOL = {f32 = 1e-6, f64 = 1e-12}

local P0 = {1, -2, 3}
-- The grads of steps 1, 2, 3 (they change sign and size, so that max and momentum matter).
local G = {{0.5, -1, 2}, {-0.3, 0.2, 1}, {1.5, -0.5, -2}}

local function param(dtype, values) return kiln.tensor(values or P0, {dtype = dtype}):requires_grad_() end
local function grad(dtype, values) return kiln.tensor(values, {dtype = dtype}) end

-- Run opt for #G steps on a fresh param; the param's values.
local function run(make, dtype, steps)
  local p = param(dtype)
  local opt = make({p})
  for s = 1, steps or #G do
    p.grad = grad(dtype, G[s])
    opt:step()
  end
  return p:totable(), opt, p
end

local function assert_near(actual, expected, tol)
  local ok, msg = H.compare(actual, expected, tol)
  assert(ok, msg)
end

-- ---- the references: PyTorch's single-tensor algorithms, element by element ----

local function ref_sgd(o, steps)
  local lr, mom, damp, wd = o.lr, o.momentum or 0, o.dampening or 0, o.weight_decay or 0
  local p, buf = {P0[1], P0[2], P0[3]}, {}
  for s = 1, steps or #G do
    for i = 1, 3 do
      local d = G[s][i]
      if wd ~= 0 then d = d + wd * p[i] end
      if mom ~= 0 then
        if buf[i] == nil then buf[i] = d else buf[i] = mom * buf[i] + (1 - damp) * d end
        if o.nesterov then d = d + mom * buf[i] else d = buf[i] end
      end
      p[i] = p[i] - lr * d
    end
  end
  return p
end

local function ref_adam(o, steps, grads, p0)
  grads, p0 = grads or G, p0 or P0
  local lr, b1, b2 = o.lr or 1e-3, (o.betas or {0.9, 0.999})[1], (o.betas or {0.9, 0.999})[2]
  local eps, wd = o.eps or 1e-8, o.weight_decay or (o.decoupled and 1e-2 or 0)
  local p, m, v, vmax = {}, {}, {}, {}
  for i = 1, #p0 do p[i], m[i], v[i], vmax[i] = p0[i], 0, 0, 0 end
  for s = 1, steps or #grads do
    local bc1, bc2 = 1 - b1 ^ s, 1 - b2 ^ s
    for i = 1, #p0 do
      local g, x = grads[s][i], p[i]
      if wd ~= 0 then
        if o.decoupled then x = x * (1 - lr * wd) else g = g + wd * x end
      end
      m[i] = b1 * m[i] + (1 - b1) * g
      v[i] = b2 * v[i] + (1 - b2) * g * g
      local vh = v[i]
      if o.amsgrad then vmax[i] = math.max(vmax[i], v[i]) vh = vmax[i] end
      p[i] = x - lr / bc1 * m[i] / (math.sqrt(vh) / math.sqrt(bc2) + eps)
    end
  end
  return p
end

local function ref_rmsprop(o)
  local lr, alpha, eps, wd, mom = o.lr or 1e-2, o.alpha or 0.99, o.eps or 1e-8, o.weight_decay or 0, o.momentum or 0
  local p, sq, buf, ga = {P0[1], P0[2], P0[3]}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}
  for s = 1, #G do
    for i = 1, 3 do
      local g = G[s][i]
      if wd ~= 0 then g = g + wd * p[i] end
      sq[i] = alpha * sq[i] + (1 - alpha) * g * g
      local avg
      if o.centered then
        ga[i] = alpha * ga[i] + (1 - alpha) * g
        avg = math.sqrt(sq[i] - ga[i] * ga[i]) + eps
      else
        avg = math.sqrt(sq[i]) + eps
      end
      if mom > 0 then
        buf[i] = mom * buf[i] + g / avg
        p[i] = p[i] - lr * buf[i]
      else
        p[i] = p[i] - lr * g / avg
      end
    end
  end
  return p
end

local function ref_adagrad(o)
  local lr, decay, wd, eps = o.lr or 1e-2, o.lr_decay or 0, o.weight_decay or 0, o.eps or 1e-10
  local init = o.initial_accumulator_value or 0
  local p, sum = {P0[1], P0[2], P0[3]}, {init, init, init}
  for s = 1, #G do
    local clr = lr / (1 + (s - 1) * decay)
    for i = 1, 3 do
      local g = G[s][i]
      if wd ~= 0 then g = g + wd * p[i] end
      sum[i] = sum[i] + g * g
      p[i] = p[i] - clr * g / (math.sqrt(sum[i]) + eps)
    end
  end
  return p
end

-- ---- three steps against the references ----

local cases = {
  {"SGD", optim.SGD, ref_sgd, {lr = 0.1}},
  {"SGD with momentum", optim.SGD, ref_sgd, {lr = 0.1, momentum = 0.9}},
  {"SGD with momentum and dampening", optim.SGD, ref_sgd, {lr = 0.1, momentum = 0.9, dampening = 0.3}},
  {"SGD with Nesterov momentum", optim.SGD, ref_sgd, {lr = 0.1, momentum = 0.9, nesterov = true}},
  {"SGD with weight decay and momentum", optim.SGD, ref_sgd, {lr = 0.05, momentum = 0.5, weight_decay = 0.1}},
  {"Adam", optim.Adam, ref_adam, {lr = 0.1}},
  {"Adam with its defaults", optim.Adam, ref_adam, {}},
  {"Adam with betas and eps", optim.Adam, ref_adam, {lr = 0.05, betas = {0.8, 0.9}, eps = 1e-3}},
  {"Adam with L2 weight decay", optim.Adam, ref_adam, {lr = 0.1, weight_decay = 0.1}},
  {"Adam with AMSGrad", optim.Adam, ref_adam, {lr = 0.1, amsgrad = true, betas = {0.9, 0.5}}},
  {"AdamW", optim.AdamW, function(o) return ref_adam(setmetatable({decoupled = true}, {__index = o})) end, {lr = 0.1, weight_decay = 0.1}},
  {"AdamW with its defaults", optim.AdamW, function(o) return ref_adam(setmetatable({decoupled = true}, {__index = o})) end, {lr = 0.01}},
  {"AdamW with AMSGrad", optim.AdamW, function(o) return ref_adam(setmetatable({decoupled = true}, {__index = o})) end,
   {lr = 0.1, weight_decay = 0.2, amsgrad = true, betas = {0.9, 0.5}}},
  {"RMSprop", optim.RMSprop, ref_rmsprop, {}},
  {"RMSprop with momentum", optim.RMSprop, ref_rmsprop, {lr = 0.05, momentum = 0.9}},
  {"RMSprop centered", optim.RMSprop, ref_rmsprop, {lr = 0.05, centered = true, alpha = 0.9}},
  {"RMSprop centered with momentum and weight decay", optim.RMSprop, ref_rmsprop,
   {lr = 0.05, centered = true, momentum = 0.5, weight_decay = 0.1, eps = 1e-4}},
  {"Adagrad", optim.Adagrad, ref_adagrad, {lr = 0.1}},
  {"Adagrad with lr decay, weight decay and an initial accumulator", optim.Adagrad, ref_adagrad,
   {lr = 0.1, lr_decay = 0.5, weight_decay = 0.1, initial_accumulator_value = 0.2}},
}

describe("optimizers after three steps match PyTorch's algorithm", function()
  for _, c in ipairs(cases) do
    local name, make, ref, opts = c[1], c[2], c[3], c[4]
    for _, dtype in ipairs{"f32", "f64"} do
      it(name .. " (" .. dtype .. ")", function()
        local got = run(function(ps) return make(ps, opts) end, dtype)
        assert_near(got, ref(opts), TOL[dtype])
      end)
    end
  end

  it("AdamW's decoupled decay differs from Adam's L2 decay", function()
    local o = {lr = 0.1, weight_decay = 0.5}
    local adam = run(function(ps) return optim.Adam(ps, o) end, "f64")
    local adamw = run(function(ps) return optim.AdamW(ps, o) end, "f64")
    assert_near(adam, ref_adam(o), 1e-12)
    assert_near(adamw, ref_adam({lr = 0.1, weight_decay = 0.5, decoupled = true}), 1e-12)
    for i = 1, 3 do assert.is_true(math.abs(adam[i] - adamw[i]) > 1e-3) end
    -- Adam{decoupled_weight_decay = true} is AdamW, as in PyTorch.
    local same = run(function(ps) return optim.Adam(ps, {lr = 0.1, weight_decay = 0.5, decoupled_weight_decay = true}) end, "f64")
    assert.are.same(adamw, same)
  end)

  it("uses PyTorch's defaults", function()
    local p = param("f32")
    assert.are.same({lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false}, optim.SGD({p}).defaults)
    local a = optim.Adam({p}).defaults
    assert.are.same({1e-3, {0.9, 0.999}, 1e-8, 0, false}, {a.lr, a.betas, a.eps, a.weight_decay, a.amsgrad})
    assert.are.equal(1e-2, optim.AdamW({p}).defaults.weight_decay)
    local r = optim.RMSprop({p}).defaults
    assert.are.same({1e-2, 0.99, 1e-8, 0, 0, false}, {r.lr, r.alpha, r.eps, r.weight_decay, r.momentum, r.centered})
    local g = optim.Adagrad({p}).defaults
    assert.are.same({1e-2, 0, 0, 0, 1e-10}, {g.lr, g.lr_decay, g.weight_decay, g.initial_accumulator_value, g.eps})
  end)

  it("updates in place, records no history and bumps the version", function()
    local p = param("f32")
    local opt = optim.SGD({p}, {lr = 0.1, momentum = 0.9})
    local view = p:detach()                       -- shares storage: sees the update
    local version = p.p.storage.version
    p.grad = grad("f32", G[1])
    opt:step()
    assert.is_true(p.is_leaf)
    assert.is_nil(p.grad_fn)
    assert.is_true(p.requires_grad)
    assert.is_true(p.p.storage.version > version)
    assert_near(view, ref_sgd({lr = 0.1, momentum = 0.9}, 1), 1e-6)
  end)

  it("updates non-contiguous parameters and grads", function()
    local p = kiln.tensor({{1, 4}, {-2, 5}, {3, 6}}, {dtype = "f64"}):t()   -- [2,3], transposed storage
    p:requires_grad_()
    assert.is_false(p:is_contiguous())
    local opt = optim.SGD({p}, {lr = 0.1, momentum = 0.9})
    local expected = {{1, -2, 3}, {4, 5, 6}}
    local buf = {{}, {}}
    for s = 1, 3 do
      local g = kiln.tensor({{G[s][1], 1}, {G[s][2], 2}, {G[s][3], 3}}, {dtype = "f64"}):t()   -- non-contiguous too
      p.grad = g
      opt:step()
      for r = 1, 2 do
        for c = 1, 3 do
          local gv = r == 1 and G[s][c] or c
          buf[r][c] = s == 1 and gv or 0.9 * buf[r][c] + gv
          expected[r][c] = expected[r][c] - 0.1 * buf[r][c]
        end
      end
    end
    assert_near(p, expected, 1e-12)
    assert.is_true(opt.state[p].momentum_buffer:is_contiguous())
  end)

  it("steps a group with f32 and f64 parameters, and large ones that the thread pool splits", function()
    local a, b = param("f32"), param("f64")
    local n1, n2 = 70001, 50000
    local rnd = H.lcg(7)
    local v1, v2, g1, g2 = {}, {}, {}, {}
    for i = 1, n1 do v1[i] = rnd() - 0.5 g1[i] = rnd() - 0.5 end
    for i = 1, n2 do v2[i] = rnd() - 0.5 g2[i] = rnd() - 0.5 end
    local big1, big2 = param("f64", v1), param("f64", v2)
    local opt = optim.Adam({a, big1, b, big2}, {lr = 0.01, weight_decay = 0.1})
    for _ = 1, 2 do
      a.grad, b.grad = grad("f32", G[1]), grad("f64", G[1])
      big1.grad, big2.grad = grad("f64", g1), grad("f64", g2)
      opt:step()
    end
    local o = {lr = 0.01, weight_decay = 0.1}
    assert_near(a, ref_adam(o, 2, {G[1], G[1]}), 1e-6)
    assert_near(b, ref_adam(o, 2, {G[1], G[1]}), 1e-12)
    assert_near(big1, ref_adam(o, 2, {g1, g1}, v1), 1e-12)
    assert_near(big2, ref_adam(o, 2, {g2, g2}, v2), 1e-12)
  end)
end)

describe("many parameters", function()
  it("steps 100 parameters in one call, and follows state tensors replaced by hand", function()
    local ps = {}
    for i = 1, 100 do ps[i] = param("f64", {i, -i, 0.5 * i}) end
    local opt = optim.SGD(ps, {lr = 0.1, momentum = 0.9})
    for s = 1, 3 do
      for i = 1, 100 do ps[i].grad = grad("f64", G[s]) end
      opt:step()
    end
    local r = ref_sgd({lr = 0.1, momentum = 0.9})
    for _, i in ipairs{1, 64, 65, 100} do
      assert_near(ps[i], {i + r[1] - P0[1], -i + r[2] - P0[2], 0.5 * i + r[3] - P0[3]}, 1e-12)
    end
    -- A buffer swapped in by hand is the one the next step reads (and writes).
    local mine = kiln.zeros(3, {dtype = "f64"})
    opt.state[ps[7]].momentum_buffer = mine
    collectgarbage()
    local before = ps[7]:totable()
    opt:step()
    assert_near(mine, G[3], 1e-12)
    assert_near(ps[7], {before[1] - 0.1 * G[3][1], before[2] - 0.1 * G[3][2], before[3] - 0.1 * G[3][3]}, 1e-12)
  end)
end)

describe("parameter groups", function()
  it("give each group its own options, and lr can be changed between steps", function()
    local a, b = param("f64"), param("f64")
    local opt = optim.SGD({{params = {a}}, {params = {b}, lr = 0.01}}, {lr = 0.1, momentum = 0.9})
    assert.are.equal(2, #opt.param_groups)
    assert.are.equal(0.1, opt.param_groups[1].lr)
    assert.are.equal(0.01, opt.param_groups[2].lr)
    assert.are.equal(0.9, opt.param_groups[2].momentum)
    for s = 1, 3 do
      a.grad, b.grad = grad("f64", G[s]), grad("f64", G[s])
      opt:step()
    end
    assert_near(a, ref_sgd({lr = 0.1, momentum = 0.9}), 1e-12)
    assert_near(b, ref_sgd({lr = 0.01, momentum = 0.9}), 1e-12)
    -- lr is read at every step.
    local p = param("f64")
    local opt2 = optim.SGD({p}, {lr = 0.1})
    p.grad = grad("f64", {1, 1, 1})
    opt2:step()
    opt2.param_groups[1].lr = 0.5
    opt2:step()
    assert_near(p, {1 - 0.6, -2 - 0.6, 3 - 0.6}, 1e-12)
  end)

  it("take added groups, and refuse a parameter in two groups", function()
    local a, b = param("f64"), param("f64")
    local opt = optim.Adam({a}, {lr = 0.1})
    opt:add_param_group({params = {b}, lr = 0.2})
    assert.are.equal(0.2, opt.param_groups[2].lr)
    assert.are.same({0.9, 0.999}, opt.param_groups[2].betas)
    assert.truthy(H.contains(err(function() opt:add_param_group({params = {a}}) end), "more than one parameter group"))
  end)
end)

describe("zero_grad", function()
  it("drops the grads by default and zeroes them with set_to_none = false", function()
    local a, b = param("f32"), param("f32")
    local opt = optim.SGD({a, b}, {lr = 0.1})
    a.grad, b.grad = grad("f32", G[1]), grad("f32", G[2])
    opt:zero_grad()
    assert.is_nil(a.grad)
    assert.is_nil(b.grad)
    a.grad = grad("f32", G[1])
    opt:zero_grad{set_to_none = false}
    assert.are.same({0, 0, 0}, a.grad:totable())
    assert.is_nil(b.grad)
    opt:step()                            -- zero grads: nothing moves
    assert.are.same(P0, a:totable())
  end)

  it("works with backward", function()
    local w = param("f64")
    local opt = optim.SGD({w}, {lr = 0.1})
    for _ = 1, 2 do
      opt:zero_grad()
      local loss = (w * w):sum()
      loss:backward()
      opt:step()
    end
    assert_near(w, {1 * 0.8 * 0.8, -2 * 0.8 * 0.8, 3 * 0.8 * 0.8}, 1e-12)
  end)
end)

describe("parameters without a grad", function()
  it("are skipped and get no state", function()
    local a, b = param("f32"), param("f32")
    local opt = optim.Adam({a, b}, {lr = 0.1})
    a.grad = grad("f32", G[1])
    opt:step()
    assert.are.same(P0, b:totable())
    assert.is_nil(opt.state[b])
    assert.are.equal(1, opt.state[a].step)
  end)

  it("count their own steps when their grads start later (Adam), and start their own momentum (SGD)", function()
    local a, b = param("f64"), param("f64")
    local opt = optim.Adam({a, b}, {lr = 0.1})
    for s = 1, 3 do
      a.grad = grad("f64", G[s])
      if s == 3 then b.grad = grad("f64", G[1]) end
      opt:step()
    end
    assert.are.equal(3, opt.state[a].step)
    assert.are.equal(1, opt.state[b].step)
    assert_near(a, ref_adam({lr = 0.1}), 1e-12)
    assert_near(b, ref_adam({lr = 0.1}, 1), 1e-12)

    local c, d = param("f64"), param("f64")
    local sgd = optim.SGD({c, d}, {lr = 0.1, momentum = 0.9, dampening = 0.5})
    for s = 1, 3 do
      c.grad = grad("f64", G[s])
      if s == 2 then d.grad = grad("f64", G[1]) end
      sgd:step()
    end
    assert_near(c, ref_sgd({lr = 0.1, momentum = 0.9, dampening = 0.5}), 1e-12)
    -- d saw G[1] at steps 2 and 3: buf = g, then 0.9 g + 0.5 g.
    assert_near(d, {P0[1] - 0.1 * 2.4 * G[1][1], P0[2] - 0.1 * 2.4 * G[1][2], P0[3] - 0.1 * 2.4 * G[1][3]}, 1e-12)
  end)
end)

describe("state_dict", function()
  local function continue_run(make, dtype, steps, split)
    -- Uninterrupted.
    local p = param(dtype)
    local opt = make({p})
    local grads = {G[1], G[2], G[3], G[2], G[1], G[3]}
    for s = 1, steps do p.grad = grad(dtype, grads[s]) opt:step() end
    -- Interrupted after `split` steps: a new parameter and optimizer resume from the state dict.
    local q = param(dtype)
    local o1 = make({q})
    for s = 1, split do q.grad = grad(dtype, grads[s]) o1:step() end
    local sd = o1:state_dict()
    local q2 = kiln.tensor(q:detach()):requires_grad_()
    local o2 = make({q2})
    o2:load_state_dict(sd)
    for s = split + 1, steps do q2.grad = grad(dtype, grads[s]) o2:step() end
    return p:totable(), q2:totable(), sd
  end

  local makers = {
    {"SGD with momentum", function(ps) return optim.SGD(ps, {lr = 0.1, momentum = 0.9, dampening = 0.2}) end},
    {"Adam with AMSGrad", function(ps) return optim.Adam(ps, {lr = 0.1, amsgrad = true, weight_decay = 0.1}) end},
    {"AdamW", function(ps) return optim.AdamW(ps, {lr = 0.1}) end},
    {"RMSprop centered with momentum", function(ps) return optim.RMSprop(ps, {momentum = 0.5, centered = true}) end},
    {"Adagrad", function(ps) return optim.Adagrad(ps, {lr = 0.1, lr_decay = 0.1}) end},
  }
  for _, m in ipairs(makers) do
    it("resumes " .. m[1] .. " bit for bit", function()
      for _, dtype in ipairs{"f32", "f64"} do
        local straight, resumed = continue_run(m[2], dtype, 6, 3)
        assert.are.same(straight, resumed)
      end
    end)
  end

  it("numbers parameters from 0 in group order, as PyTorch does, and clones the tensors", function()
    local a, b, c = param("f32"), param("f32"), param("f32")
    local opt = optim.Adam({{params = {a, b}}, {params = {c}, lr = 0.5}}, {lr = 0.1})
    a.grad, c.grad = grad("f32", G[1]), grad("f32", G[2])
    opt:step()
    local sd = opt:state_dict()
    assert.are.same({0, 1}, sd.param_groups[1].params)
    assert.are.same({2}, sd.param_groups[2].params)
    assert.are.equal(0.5, sd.param_groups[2].lr)
    assert.are.same({0.9, 0.999}, sd.param_groups[1].betas)
    assert.are.equal(1, sd.state[0].step)
    assert.is_nil(sd.state[1])
    assert.are.equal(1, sd.state[2].step)
    assert.is_true(kiln.is_tensor(sd.state[0].exp_avg))
    sd.state[0].exp_avg:fill_(42)                    -- a clone: the optimizer's state is untouched
    assert.are_not.equal(42, opt.state[a].exp_avg[1])
    -- Loading restores group options too.
    local opt2 = optim.Adam({{params = {a, b}}, {params = {c}}}, {lr = 0.3})
    opt2:load_state_dict(opt:state_dict())
    assert.are.equal(0.1, opt2.param_groups[1].lr)
    assert.are.equal(0.5, opt2.param_groups[2].lr)
    assert.are.equal(1, opt2.state[c].step)
  end)

  it("refuses a state dict that does not fit, and names what differs", function()
    local a, b = param("f32"), param("f32")
    local opt = optim.SGD({a, b}, {lr = 0.1, momentum = 0.9})
    a.grad, b.grad = grad("f32", G[1]), grad("f32", G[1])
    opt:step()
    local sd = opt:state_dict()
    local other = optim.SGD({a}, {lr = 0.1, momentum = 0.9})
    local msg = err(function() other:load_state_dict(sd) end)
    assert.truthy(H.contains(msg, "group 1 has 2 parameters in the state dict, 1 in the optimizer"), msg)
    local two = optim.SGD({{params = {a}}, {params = {b}}}, {lr = 0.1})
    msg = err(function() two:load_state_dict(sd) end)
    assert.truthy(H.contains(msg, "the state dict has 1 parameter groups, the optimizer 2"), msg)
    sd.state[1].momentum_buffer = kiln.zeros(2)
    msg = err(function() opt:load_state_dict(sd) end)
    assert.truthy(H.contains(msg, "parameter 1: state momentum_buffer has shape [2], the parameter [3]"), msg)
    assert.truthy(H.contains(msg, SRC), msg)
    -- The failed loads changed nothing.
    a.grad, b.grad = grad("f32", G[2]), grad("f32", G[2])
    opt:step()
    assert_near(a, ref_sgd({lr = 0.1, momentum = 0.9}, 2), 1e-6)
  end)

  it("refuses bad options and steps in a state dict as the constructor does, taking nothing of it", function()
    local a = param("f32")
    local opt = optim.Adam({a}, {lr = 0.1})
    a.grad = grad("f32", G[1])
    opt:step()
    local function with(edit)
      local sd = opt:state_dict()
      sd.param_groups[1].eps = 1e-6             -- a good change beside the bad one is not taken either
      sd.state[0].exp_avg:fill_(7)
      edit(sd)
      return sd
    end
    local cases = {
      {function(sd) sd.param_groups[1].lr = "fast" end, "Adam.load_state_dict: group 1: invalid learning rate: fast"},
      {function(sd) sd.param_groups[1].lr = 0 / 0 end, "group 1: invalid learning rate: nan"},
      {function(sd) sd.param_groups[1].betas = {2, 0.999} end, "group 1: invalid beta parameter at index 1: 2"},
      {function(sd) sd.param_groups[1].lrr = 0.1 end, "group 1: unknown option \"lrr\""},
      {function(sd) sd.state[0].step = -3 end, "Adam.load_state_dict: parameter 0: step must be >= 0, got -3"},
      {function(sd) sd.state[0].step = 0 / 0 end, "parameter 0: step must be an integer, got nan"},
      {function(sd) sd.state[0].step = 1.5 end, "parameter 0: step must be an integer, got 1.5"},
    }
    for _, c in ipairs(cases) do
      local msg = err(function() opt:load_state_dict(with(c[1])) end)
      assert.truthy(H.contains(msg, c[2]), msg)
      assert.truthy(H.contains(msg, SRC), msg)
      assert.are.equal(1e-8, opt.param_groups[1].eps)
      assert.are.equal(1, opt.state[a].step)
      assert.are_not.equal(7, opt.state[a].exp_avg[1])
    end
    local w = optim.AdamW({param("f32")}, {lr = 0.1})
    local sd = w:state_dict()
    sd.param_groups[1].decoupled_weight_decay = false
    local msg = err(function() w:load_state_dict(sd) end)
    assert.truthy(H.contains(msg, "decoupled_weight_decay is false in the state dict; AdamW's is always true"), msg)
    -- and the next step runs from the state it had
    a.grad = grad("f32", G[2])
    opt:step()
    assert_near(a, ref_adam({lr = 0.1}, 2), 1e-6)
  end)
end)

describe("misuse", function()
  it("a grad of the wrong shape (through the C API) names the parameter and both shapes; the next step works", function()
    local C = kiln.C
    local p1, p2 = param("f32"), param("f32", {{1, 2}, {3, 4}})
    local good, bad = grad("f32", G[1]), kiln.zeros(4, 1)
    local params = ffi.new("struct kiln_tensor *[2]", p1.p, p2.p)
    local grads = ffi.new("struct kiln_tensor *[2]", good.p, bad.p)
    assert.are_not.equal(0, C.kiln_sgd_step(2, params, grads, nil, 0.1, 0, 0, 0, 0, 0))
    local msg = ffi.string(C.kiln_error_message())
    assert.truthy(H.contains(msg, "sgd_step: parameter 1: grad [4,1] does not match the parameter's shape [2,2]"), msg)
    assert.are.same(P0, p1:totable())                -- nothing was written
    local g2 = kiln.ones(2, 2)
    grads[1] = g2.p
    assert.are.equal(0, C.kiln_sgd_step(2, params, grads, nil, 0.1, 0, 0, 0, 0, 0))
    assert_near(p1, ref_sgd({lr = 0.1}, 1), 1e-6)
    assert_near(p2, {{0.9, 1.9}, {2.9, 3.9}}, 1e-6)
    -- Missing state and non-contiguous state are refused too.
    assert.are_not.equal(0, C.kiln_sgd_step(2, params, grads, nil, 0.1, 0.9, 0, 0, 0, 0))
    assert.truthy(H.contains(ffi.string(C.kiln_error_message()), "parameter 0 [3] has a grad but no momentum buffer"))
    local b1, b2 = kiln.zeros(3), kiln.zeros(2, 4):narrow(2, 1, 2)
    local bufs = ffi.new("struct kiln_tensor *[2]", b1.p, b2.p)
    assert.are_not.equal(0, C.kiln_sgd_step(2, params, grads, bufs, 0.1, 0.9, 0, 0, 0, 1))
    assert.truthy(H.contains(ffi.string(C.kiln_error_message()), "parameter 1: momentum buffer [2,2] is not contiguous"))
  end)

  it("a grad of the wrong dtype is an error at the caller's line naming the parameter; then the step works", function()
    local a, b = param("f32"), param("f32")
    local opt = optim.Adam({a, b}, {lr = 0.1})
    a.grad, b.grad = grad("f32", G[1]), grad("f64", G[1])
    local msg = err(function() opt:step() end)
    assert.truthy(H.contains(msg, "Adam.step: parameter 2: grad [3] is f64, the parameter is f32"), msg)
    assert.truthy(H.contains(msg, SRC), msg)
    assert.are.same(P0, a:totable())                 -- nothing moved, no state was kept
    assert.is_nil(opt.state[a])
    b.grad = grad("f32", G[1])
    opt:step()
    assert_near(a, ref_adam({lr = 0.1}, 1), 1e-6)
    assert_near(b, ref_adam({lr = 0.1}, 1), 1e-6)
    assert.are.equal(1, opt.state[b].step)
  end)

  it("bad options and parameters are refused when the optimizer is made", function()
    local p = param("f32")
    local cases = {
      {function() optim.SGD({p}, {lr = -1}) end, "SGD: invalid learning rate: -1"},
      {function() optim.SGD({p}, {momentum = 0, nesterov = true}) end, "nesterov momentum requires a momentum"},
      {function() optim.SGD({p}, {lr = 0.1, momemtum = 0.9}) end, "SGD: unknown option \"momemtum\""},
      {function() optim.Adam({p}, {betas = {0.9, 1}}) end, "invalid beta parameter at index 2: 1"},
      {function() optim.Adam({}) end, "empty parameter list"},
      {function() optim.Adam({p * 2}) end, "is not a leaf"},
      {function() optim.Adam({kiln.tensor({1, 2}, {dtype = "i64"})}) end, "is i64"},
      {function() optim.RMSprop({p}, {alpha = -1}) end, "invalid alpha value"},
      {function() optim.Adagrad({p}, {lr_decay = -1}) end, "invalid lr_decay value"},
      -- NaN is refused as PyTorch refuses it (not 0 <= nan), not left to the first step
      {function() optim.SGD({p}, {lr = 0 / 0}) end, "SGD: invalid learning rate: nan"},
      {function() optim.Adam({p}, {eps = 0 / 0}) end, "Adam: invalid epsilon value: nan"},
      {function() optim.Adam({p}, {betas = {0 / 0, 0.999}}) end, "invalid beta parameter at index 1: nan"},
      {function() optim.RMSprop({p}, {momentum = 0 / 0}) end, "RMSprop: invalid momentum value: nan"},
      {function() optim.Adagrad({p}, {initial_accumulator_value = 0 / 0}) end, "invalid initial_accumulator_value"},
    }
    for _, c in ipairs(cases) do
      local msg = err(c[1])
      assert.truthy(H.contains(msg, c[2]), msg)
      assert.truthy(H.contains(msg, SRC), msg)
    end
  end)
end)

describe("steady-state steps", function()
  local function allocs() return kiln.memory_stats().allocs end

  it("allocate no tensors after the first (SGD with momentum, Adam)", function()
    for _, make in ipairs{
      function(ps) return optim.SGD(ps, {lr = 0.01, momentum = 0.9, nesterov = true, weight_decay = 1e-4}) end,
      function(ps) return optim.Adam(ps, {lr = 0.01, amsgrad = true}) end,
    } do
      local ps = {}
      for i = 1, 5 do ps[i] = kiln.randn(i, 7):requires_grad_() ps[i].grad = kiln.randn(i, 7) end
      local opt = make(ps)
      opt:step()
      local before = allocs()
      for _ = 1, 10 do opt:step() end
      assert.are.equal(before, allocs())
    end
  end)
end)

-- ---- schedulers ----

local function lrs(sched, opt, steps, metrics)
  local seen = {sched:get_last_lr()[1]}
  for s = 1, steps do
    opt:step()
    if metrics then sched:step(metrics[s]) else sched:step() end
    seen[#seen + 1] = sched:get_last_lr()[1]
    assert.are.equal(seen[#seen], opt.param_groups[1].lr)
  end
  return seen
end

local function sgd(lr) return optim.SGD({param("f32")}, {lr = lr or 0.1, momentum = 0.9}) end

describe("schedulers", function()
  it("StepLR", function()
    local opt = sgd()
    local got = lrs(optim.StepLR(opt, {step_size = 3, gamma = 0.5}), opt, 10)
    assert_near(got, {0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.0125, 0.0125}, 1e-15)
  end)

  it("MultiStepLR (a milestone listed twice counts twice)", function()
    local opt = sgd()
    local got = lrs(optim.lr_scheduler.MultiStepLR(opt, {milestones = {2, 5, 5}, gamma = 0.1}), opt, 8)
    assert_near(got, {0.1, 0.1, 0.01, 0.01, 0.01, 1e-4, 1e-4, 1e-4, 1e-4}, 1e-15)
  end)

  it("ExponentialLR", function()
    local opt = sgd()
    local got = lrs(optim.ExponentialLR(opt, {gamma = 0.9}), opt, 10)
    local want = {}
    for t = 0, 10 do want[t + 1] = 0.1 * 0.9 ^ t end
    assert_near(got, want, 1e-15)
  end)

  it("CosineAnnealingLR over and past T_max", function()
    local opt = sgd()
    local got = lrs(optim.CosineAnnealingLR(opt, {T_max = 10, eta_min = 0.001}), opt, 14)
    local want = {}
    for t = 0, 14 do want[t + 1] = 0.001 + (0.1 - 0.001) * (1 + math.cos(math.pi * t / 10)) / 2 end
    assert_near(got, want, 1e-13)
  end)

  it("CosineAnnealingLR with a linear warm-up", function()
    local opt = sgd()
    local got = lrs(optim.CosineAnnealingLR(opt, {T_max = 5, eta_min = 0.01, warmup_steps = 3}), opt, 9)
    assert_near(got, {0.1 / 4, 0.2 / 4, 0.3 / 4,
                      0.1, 0.01 + 0.09 * (1 + math.cos(math.pi / 5)) / 2, 0.01 + 0.09 * (1 + math.cos(2 * math.pi / 5)) / 2,
                      0.01 + 0.09 * (1 + math.cos(3 * math.pi / 5)) / 2, 0.01 + 0.09 * (1 + math.cos(4 * math.pi / 5)) / 2,
                      0.01, 0.01 + 0.09 * (1 + math.cos(6 * math.pi / 5)) / 2}, 1e-15)
  end)

  it("OneCycleLR with PyTorch's defaults, cycling SGD's momentum", function()
    local opt = sgd()
    local sched = optim.OneCycleLR(opt, {max_lr = 1, total_steps = 10})
    local moms = {opt.param_groups[1].momentum}
    local got = {sched:get_last_lr()[1]}
    for _ = 1, 9 do
      opt:step()
      sched:step()
      got[#got + 1] = sched:get_last_lr()[1]
      moms[#moms + 1] = opt.param_groups[1].momentum
    end
    -- Phase 1 (steps 0..2): 1/25 up to 1; phase 2 (steps 2..9): 1 down to 1/25/1e4, both cosine.
    local function cos_anneal(a, b, pct) return b + (a - b) / 2 * (math.cos(math.pi * pct) + 1) end
    local want_lr, want_m = {}, {}
    for t = 0, 9 do
      if t <= 2 then
        want_lr[t + 1], want_m[t + 1] = cos_anneal(0.04, 1, t / 2), cos_anneal(0.95, 0.85, t / 2)
      else
        want_lr[t + 1], want_m[t + 1] = cos_anneal(1, 4e-6, (t - 2) / 7), cos_anneal(0.85, 0.95, (t - 2) / 7)
      end
    end
    assert_near(got, want_lr, 1e-14)
    assert_near(moms, want_m, 1e-14)
    assert_near({got[#got]}, {4e-6}, 1e-14)
    sched:step()                                       -- step 10 = total_steps is allowed, 11 is not
    assert.truthy(H.contains(err(function() sched:step() end), "tried to step 11 times; total_steps is 10"))
  end)

  it("OneCycleLR cycles Adam's beta1", function()
    local p = param("f32")
    local opt = optim.Adam({p}, {lr = 0.1, betas = {0.9, 0.99}})
    local sched = optim.OneCycleLR(opt, {max_lr = 0.5, epochs = 2, steps_per_epoch = 5, pct_start = 0.5})
    assert.are.same({0.95, 0.99}, opt.param_groups[1].betas)
    assert_near({opt.param_groups[1].lr}, {0.5 / 25}, 1e-15)
    for _ = 1, 4 do sched:step() end                  -- the peak: step 4 = 0.5 * 10 - 1
    assert_near({opt.param_groups[1].lr, opt.param_groups[1].betas[1]}, {0.5, 0.85}, 1e-15)
    assert.are.equal(0.99, opt.param_groups[1].betas[2])
  end)

  it("ReduceLROnPlateau (min): patience, threshold, cooldown and min_lr", function()
    local opt = sgd()
    local sched = optim.ReduceLROnPlateau(opt, {factor = 0.5, patience = 2, cooldown = 1, threshold = 0.01, min_lr = 0.02})
    local metrics = {1.0, 0.9, 0.95, 0.9, 0.895, 0.85, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9}
    local got = lrs(sched, opt, #metrics, metrics)
    -- 0.9 -> best; 0.95, 0.9, 0.895 are 3 bad epochs (0.895 is not below 0.9 * 0.99) -> halve, cool down
    -- one epoch; 0.85 is a new best; then 3 bad epochs -> halve; ...; the last cut stops at min_lr.
    assert.are.same({0.1, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.025, 0.02, 0.02, 0.02,
                     0.02, 0.02}, got)
  end)

  it("ReduceLROnPlateau (max, abs threshold)", function()
    local opt = sgd()
    local sched = optim.ReduceLROnPlateau(opt, {mode = "max", factor = 0.1, patience = 1, threshold = 0.1,
                                                threshold_mode = "abs"})
    local got = lrs(sched, opt, 6, {0.5, 0.7, 0.75, 0.78, 0.9, 0.95})
    -- 0.75 and 0.78 are not above 0.7 + 0.1: 2 bad epochs > patience 1 -> 0.01; 0.9 is better; 0.95 is bad.
    assert_near(got, {0.1, 0.1, 0.1, 0.1, 0.01, 0.01, 0.01}, 1e-15)
  end)

  it("schedulers set each group's lr from its own initial lr", function()
    local a, b = param("f32"), param("f32")
    local opt = optim.SGD({{params = {a}, lr = 0.1}, {params = {b}, lr = 1}}, {lr = 0.5})
    local sched = optim.StepLR(opt, {step_size = 1, gamma = 0.5})
    sched:step()
    assert.are.same({0.05, 0.5}, sched:get_last_lr())
    assert.are.equal(0.1, opt.param_groups[1].initial_lr)
  end)

  it("a state dict carries OneCycleLR's anneal strategy, and one of another kind is refused whole", function()
    -- a linear schedule resumed into a scheduler made with the default (cosine) goes on linearly
    local o1, o2 = sgd(), sgd()
    local linear = optim.OneCycleLR(o1, {max_lr = 1, total_steps = 10, anneal_strategy = "linear"})
    for _ = 1, 4 do linear:step() end
    local resumed = optim.OneCycleLR(o2, {max_lr = 1, total_steps = 10})
    resumed:load_state_dict(linear:state_dict())
    linear:step()
    resumed:step()
    -- step 5 of the second phase (steps 2..9), linear: 1 + (4e-6 - 1) * 3 / 7
    assert_near({o1.param_groups[1].lr, o2.param_groups[1].lr}, {1 + (4e-6 - 1) * 3 / 7, 1 + (4e-6 - 1) * 3 / 7}, 1e-14)
    local cubic = linear:state_dict()
    cubic._anneal_func_type = "cubic"
    local msg = err(function() resumed:load_state_dict(cubic) end)
    assert.truthy(H.contains(msg, "OneCycleLR.load_state_dict: _anneal_func_type \"cubic\" is unknown (cos or linear)"), msg)
    assert.are.same(linear:state_dict(), resumed:state_dict())
    local o3 = sgd()
    local step_lr = optim.StepLR(o3, {step_size = 2, gamma = 0.5})
    step_lr:step()
    local before = step_lr:state_dict()
    local cases = {
      {linear:state_dict(), "StepLR.load_state_dict: the state dict has a field \"", "that this scheduler does not have"},
      {{step = 3}, "field \"step\" that this scheduler does not have"},
      {{step_size = "2"}, "field \"step_size\" is a string in the state dict, a number here"},
      {"x", "StepLR.load_state_dict: expected a table from state_dict(), got a string"},
    }
    for _, c in ipairs(cases) do
      local with_good = type(c[1]) == "table" and c[1] or nil
      if with_good then with_good.last_epoch = 7 end   -- a good field beside the bad one is not taken
      local msg = err(function() step_lr:load_state_dict(c[1]) end)
      assert.truthy(H.contains(msg, c[2]), msg)
      if c[3] then assert.truthy(H.contains(msg, c[3]), msg) end
      assert.truthy(H.contains(msg, SRC), msg)
      assert.are.same(before, step_lr:state_dict())
    end
    step_lr:step()                                     -- and it steps on as before: 0.1 * 0.5 at step 2
    assert.are.same({0.05}, step_lr:get_last_lr())
  end)
end)

-- ---- clipping ----

describe("gradient clipping", function()
  local function naive_norm(lists, p)
    if p == math.huge then
      local m = 0
      for _, l in ipairs(lists) do for _, v in ipairs(l) do m = math.max(m, math.abs(v)) end end
      return m
    end
    local s = 0
    for _, l in ipairs(lists) do for _, v in ipairs(l) do s = s + math.abs(v) ^ p end end
    return s ^ (1 / p)
  end

  it("clip_grad_norm returns the total norm and scales the grads when it is above max_norm", function()
    for _, dtype in ipairs{"f32", "f64"} do
      local a, b = param(dtype), param(dtype, {{1, 2}, {3, 4}})
      local ga, gb = {3, -4, 12}, {{0.5, -1.5}, {2.5, 0}}
      a.grad, b.grad = grad(dtype, ga), grad(dtype, gb)
      local flat = {ga, {0.5, -1.5, 2.5, 0}}
      local total = optim.clip_grad_norm({a, b}, 5)
      local want = naive_norm(flat, 2)
      assert.is_true(math.abs(total - want) <= 1e-12 * want, total .. " vs " .. want)
      local coef = 5 / (want + 1e-6)
      assert_near(a.grad, {3 * coef, -4 * coef, 12 * coef}, TOL[dtype])
      assert_near(b.grad, {{0.5 * coef, -1.5 * coef}, {2.5 * coef, 0}}, TOL[dtype])
      -- Below max_norm nothing changes; other orders.
      a.grad, b.grad = grad(dtype, ga), grad(dtype, gb)
      assert.are.equal(23.5, optim.clip_grad_norm({a, b}, 100, 1))
      assert.are.equal(12, optim.clip_grad_norm({a, b}, 100, math.huge))
      local t3 = optim.clip_grad_norm({a, b}, 100, 3)
      assert.is_true(math.abs(t3 - naive_norm(flat, 3)) < 1e-12 * t3)
      assert.are.same(ga, a.grad:totable())
    end
  end)

  it("clip_grad_norm matches a naive sum over many random grads, for any thread count", function()
    local rnd = H.lcg(3)
    local ps, lists = {}, {}
    for i = 1, 4 do
      local n = ({100000, 3, 40000, 1})[i]
      local v = {}
      for j = 1, n do v[j] = rnd() - 0.5 end
      ps[i] = kiln.zeros(n):requires_grad_()
      ps[i].grad = kiln.tensor(v)
      lists[i] = ps[i].grad:totable()                 -- the f32 values
    end
    local want = naive_norm(lists, 2)
    local threads = kiln.get_num_threads()
    local t1 = optim.clip_grad_norm(ps, 1e9)
    kiln.set_num_threads(1)
    local t2 = optim.clip_grad_norm(ps, 1e9)
    kiln.set_num_threads(threads)
    assert.are.equal(t1, t2)
    assert.is_true(math.abs(t1 - want) <= 1e-12 * want, t1 .. " vs " .. want)
  end)

  it("clip_grad_norm skips params without grads; clip_grad_value clamps", function()
    local a, b = param("f32"), param("f32")
    a.grad = grad("f32", {3, -4, 0})
    assert.are.equal(5, optim.clip_grad_norm({a, b}, 10))
    optim.clip_grad_value({a, b}, 2.5)
    assert.are.same({2.5, -2.5, 0}, a.grad:totable())
    assert.is_nil(b.grad)
    assert.truthy(H.contains(err(function() optim.clip_grad_norm({a}, 1, -1) end), "norm_type = -1"))
    assert.truthy(H.contains(err(function() optim.clip_grad_value({a}, -1) end), "clip = -1"))
  end)
end)
