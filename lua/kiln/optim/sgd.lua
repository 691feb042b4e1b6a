-- kiln.optim.sgd: stochastic gradient descent with momentum, dampening, Nesterov momentum and
-- weight decay, as PyTorch's torch.optim.SGD (the momentum buffer starts as the first grad).
local Tensor = require "kiln.tensor"
local function zeros_like(p) return Tensor.zeros_like(p) end

return {
  name = "SGD",
  defaults = {lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false},
  check = function(g, fail)
    if type(g.lr) ~= "number" or not (g.lr >= 0) then fail("invalid learning rate: " .. tostring(g.lr)) end
    if type(g.momentum) ~= "number" or not (g.momentum >= 0) then fail("invalid momentum value: " .. tostring(g.momentum)) end
    if type(g.weight_decay) ~= "number" or not (g.weight_decay >= 0) then fail("invalid weight_decay value: " .. tostring(g.weight_decay)) end
    if type(g.dampening) ~= "number" then fail("invalid dampening value: " .. tostring(g.dampening)) end
    if g.nesterov and (g.momentum <= 0 or g.dampening ~= 0) then
      fail("nesterov momentum requires a momentum and zero dampening")
    end
  end,
  state_names = {"momentum_buffer"},
  needs = function(g, k) return g.momentum ~= 0 end,
  init_state = function(g, name, p) return zeros_like(p) end,
  -- 1 when the buffer is new: this step sets it to the grad instead of updating it.
  key = function(g, st, created) return (g.momentum ~= 0 and created) and 1 or 0 end,
  call = function(C, n, c, g, first)
    return C.kiln_sgd_step(n, c.params, c.grads, c.state[1], g.lr, g.momentum, g.dampening, g.weight_decay,
                           g.nesterov and 1 or 0, first)
  end,
}
