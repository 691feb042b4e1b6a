-- models/lenet.lua: a LeNet-style CNN for 28x28 images: two 5x5 convolutions with max pooling,
-- then two linear layers (the shape of the CNN in bench/train_step.lua).
local kiln = kiln or require "kiln"
local nn = kiln.nn
local core = require "kiln.core"

return function(opts)
  opts = core.options(opts, core.set("channels", "classes", "dropout", "hidden"), "LeNet")
  return nn.Sequential{
    nn.Conv2d(opts.channels or 1, 32, 5), nn.ReLU(), nn.MaxPool2d(2),   -- [N,32,12,12]
    nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),                  -- [N,64,4,4]
    nn.Flatten(),
    nn.Linear(1024, opts.hidden or 1024), nn.ReLU(),
    nn.Dropout(opts.dropout or 0),
    nn.Linear(opts.hidden or 1024, opts.classes or 10),
  }
end
