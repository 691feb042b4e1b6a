-- models/mlp.lua: a multi-layer perceptron for 28x28 images: 784-512-256-10 with ReLU.
local kiln = kiln or require "kiln"
local nn = kiln.nn
local core = require "kiln.core"

return function(opts)
  opts = core.options(opts, core.set("classes", "dropout", "hidden", "inputs"), "MLP")
  local hidden = opts.hidden or {512, 256}
  local layers = {nn.Flatten()}
  local n_in = opts.inputs or 784
  for _, h in ipairs(hidden) do
    layers[#layers + 1] = nn.Linear(n_in, h)
    layers[#layers + 1] = nn.ReLU()
    if opts.dropout then layers[#layers + 1] = nn.Dropout(opts.dropout) end
    n_in = h
  end
  layers[#layers + 1] = nn.Linear(n_in, opts.classes or 10)
  return nn.Sequential(layers)
end
