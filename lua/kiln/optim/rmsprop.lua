-- kiln.optim.rmsprop: RMSprop (Hinton's lecture 6e) with momentum, the centered variant and
-- weight decay, as PyTorch's torch.optim.RMSprop.
local Tensor = require "kiln.tensor"
local function zeros_like(p) return Tensor.zeros_like(p) end

return {
  name = "RMSprop",
  defaults = {lr = 1e-2, alpha = 0.99, eps = 1e-8, weight_decay = 0, momentum = 0, centered = false},
  check = function(g, fail)
    if type(g.lr) ~= "number" or not (g.lr >= 0) then fail("invalid learning rate: " .. tostring(g.lr)) end
    if type(g.eps) ~= "number" or not (g.eps >= 0) then fail("invalid epsilon value: " .. tostring(g.eps)) end
    if type(g.momentum) ~= "number" or not (g.momentum >= 0) then fail("invalid momentum value: " .. tostring(g.momentum)) end
    if type(g.weight_decay) ~= "number" or not (g.weight_decay >= 0) then fail("invalid weight_decay value: " .. tostring(g.weight_decay)) end
    if type(g.alpha) ~= "number" or not (g.alpha >= 0) then fail("invalid alpha value: " .. tostring(g.alpha)) end
  end,
  state_names = {"square_avg", "momentum_buffer", "grad_avg"},
  needs = function(g, k) return k == 1 or (k == 2 and g.momentum > 0) or (k == 3 and g.centered) end,
  init_state = function(g, name, p) return zeros_like(p) end,
  key = function(g, st, created) return 0 end,    -- RMSprop's update does not depend on the step
  commit = function(st) st.step = (st.step or 0) + 1 end,
  call = function(C, n, c, g)
    return C.kiln_rmsprop_step(n, c.params, c.grads, c.state[1], c.state[2], c.state[3], g.lr, g.alpha, g.eps,
                               g.weight_decay, g.momentum, g.centered and 1 or 0)
  end,
}
