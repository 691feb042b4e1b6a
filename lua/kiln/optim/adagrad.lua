-- kiln.optim.adagrad: Adagrad (Duchi et al.) with learning-rate decay and weight decay, as
-- PyTorch's torch.optim.Adagrad (whose state is made for every parameter at construction).
local Tensor = require "kiln.tensor"
local function full_like(p, v) return Tensor.full_like(p, v) end

return {
  name = "Adagrad",
  defaults = {lr = 1e-2, lr_decay = 0, weight_decay = 0, initial_accumulator_value = 0, eps = 1e-10},
  check = function(g, fail)
    if type(g.lr) ~= "number" or not (g.lr >= 0) then fail("invalid learning rate: " .. tostring(g.lr)) end
    if type(g.lr_decay) ~= "number" or not (g.lr_decay >= 0) then fail("invalid lr_decay value: " .. tostring(g.lr_decay)) end
    if type(g.weight_decay) ~= "number" or not (g.weight_decay >= 0) then fail("invalid weight_decay value: " .. tostring(g.weight_decay)) end
    if type(g.initial_accumulator_value) ~= "number" or not (g.initial_accumulator_value >= 0) then
      fail("invalid initial_accumulator_value value: " .. tostring(g.initial_accumulator_value))
    end
    if type(g.eps) ~= "number" or not (g.eps >= 0) then fail("invalid epsilon value: " .. tostring(g.eps)) end
  end,
  state_names = {"sum"},
  eager_state = function(g, p) return {step = 0, sum = full_like(p, g.initial_accumulator_value)} end,
  needs = function(g, k) return true end,
  init_state = function(g, name, p) return full_like(p, g.initial_accumulator_value) end,
  key = function(g, st, created) return (st.step or 0) + 1 end,
  commit = function(st, step) st.step = step end,
  call = function(C, n, c, g, step)
    return C.kiln_adagrad_step(n, c.params, c.grads, c.state[1], step, g.lr, g.lr_decay, g.weight_decay, g.eps)
  end,
}
