-- kiln.nn.init: weight initialisers, as PyTorch's torch.nn.init (in place, without grad).
local autograd = require "kiln.autograd"

local init = {}

local function fans(t)
  local d = t:dim()
  if d < 2 then error("init: fan in and fan out need a tensor of at least 2 dims, got " .. tostring(t:size()), 3) end
  local receptive = 1
  for i = 3, d do receptive = receptive * t:size(i) end
  return t:size(2) * receptive, t:size(1) * receptive
end
init.fans = fans

function init.calculate_gain(nonlinearity, param)
  if nonlinearity == "relu" then return math.sqrt(2) end
  if nonlinearity == "leaky_relu" then local a = param or 0.01 return math.sqrt(2 / (1 + a * a)) end
  if nonlinearity == "tanh" then return 5 / 3 end
  if nonlinearity == "selu" then return 3 / 4 end
  return 1   -- linear, conv, sigmoid
end

local function no_grad(fn) return autograd.no_grad(fn) end

function init.uniform_(t, a, b) no_grad(function() t:uniform_(a or 0, b or 1) end) return t end
function init.normal_(t, mean, std) no_grad(function() t:normal_(mean or 0, std or 1) end) return t end
function init.constant_(t, v) no_grad(function() t:fill_(v) end) return t end
function init.zeros_(t) return init.constant_(t, 0) end
function init.ones_(t) return init.constant_(t, 1) end

-- kaiming_uniform_(t, {a=0, mode="fan_in", nonlinearity="leaky_relu"})
function init.kaiming_uniform_(t, opts)
  opts = opts or {}
  local fan_in, fan_out = fans(t)
  local fan = opts.mode == "fan_out" and fan_out or fan_in
  local gain = init.calculate_gain(opts.nonlinearity or "leaky_relu", opts.a or 0)
  local bound = math.sqrt(3) * gain / math.sqrt(fan)
  return init.uniform_(t, -bound, bound)
end

function init.kaiming_normal_(t, opts)
  opts = opts or {}
  local fan_in, fan_out = fans(t)
  local fan = opts.mode == "fan_out" and fan_out or fan_in
  local gain = init.calculate_gain(opts.nonlinearity or "leaky_relu", opts.a or 0)
  return init.normal_(t, 0, gain / math.sqrt(fan))
end

function init.xavier_uniform_(t, gain)
  local fan_in, fan_out = fans(t)
  local bound = (gain or 1) * math.sqrt(6 / (fan_in + fan_out))
  return init.uniform_(t, -bound, bound)
end

function init.xavier_normal_(t, gain)
  local fan_in, fan_out = fans(t)
  return init.normal_(t, 0, (gain or 1) * math.sqrt(2 / (fan_in + fan_out)))
end

return init
