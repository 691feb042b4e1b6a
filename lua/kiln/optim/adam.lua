-- kiln.optim.adam: Adam (Kingma & Ba) with L2 weight decay, and AdamW (Loshchilov & Hutter) with
-- decoupled weight decay; AMSGrad for both. PyTorch's torch.optim.Adam / AdamW, defaults included.
local Tensor = require "kiln.tensor"
local function zeros_like(p) return Tensor.zeros_like(p) end

local function check(g, fail)
  if type(g.lr) ~= "number" or not (g.lr >= 0) then fail("invalid learning rate: " .. tostring(g.lr)) end
  if type(g.eps) ~= "number" or not (g.eps >= 0) then fail("invalid epsilon value: " .. tostring(g.eps)) end
  if type(g.betas) ~= "table" or #g.betas ~= 2 then fail("betas must be a table of two numbers, e.g. {0.9, 0.999}") end
  for i = 1, 2 do
    local b = g.betas[i]
    if type(b) ~= "number" or not (b >= 0 and b < 1) then fail(string.format("invalid beta parameter at index %d: %s", i, tostring(b))) end
  end
  if type(g.weight_decay) ~= "number" or not (g.weight_decay >= 0) then fail("invalid weight_decay value: " .. tostring(g.weight_decay)) end
end

local function spec(name, weight_decay, decoupled)
  local s = {
    name = name,
    -- AdamW's decay is always decoupled; Adam takes decoupled_weight_decay = true as PyTorch's does.
    defaults = {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = weight_decay, amsgrad = false},
    fixed = {decoupled_weight_decay = decoupled},
    check = check,
    state_names = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
    needs = function(g, k) return k < 3 or g.amsgrad end,
    init_state = function(g, name, p) return zeros_like(p) end,
    key = function(g, st, created) return (st.step or 0) + 1 end,     -- the step being taken
    commit = function(st, step) st.step = step end,
    call = function(C, n, c, g, step)
      return C.kiln_adam_step(n, c.params, c.grads, c.state[1], c.state[2], c.state[3], step, g.lr, g.betas[1],
                              g.betas[2], g.eps, g.weight_decay, g.decoupled_weight_decay and 1 or 0, g.amsgrad and 1 or 0)
    end,
  }
  if not decoupled then s.defaults.decoupled_weight_decay = false s.fixed = nil end
  return s
end

return {Adam = spec("Adam", 0, false), AdamW = spec("AdamW", 1e-2, true)}
