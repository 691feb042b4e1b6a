-- models/resnet.lua: a small ResNet for 28x28 images: a 3x3 stem, three stages of basic blocks
-- (16, 32, 64 channels; the last two halve the resolution), global average pooling, a linear head.
local kiln = kiln or require "kiln"
local nn = kiln.nn
local core = require "kiln.core"

-- The basic block (two 3x3 convs with batch norm, and a 1x1 conv + batch norm shortcut where the
-- shape changes), named as torchvision names it (conv1, bn1, conv2, bn2, downsample), which
-- models/resnet18.lua builds on too.
local Block = nn.define("BasicBlock")
function Block:init(cin, cout, stride)
  self.conv1 = nn.Conv2d(cin, cout, 3, {stride = stride, padding = 1, bias = false})
  self.bn1 = nn.BatchNorm2d(cout)
  self.conv2 = nn.Conv2d(cout, cout, 3, {padding = 1, bias = false})
  self.bn2 = nn.BatchNorm2d(cout)
  if stride ~= 1 or cin ~= cout then
    self.downsample = nn.Sequential{nn.Conv2d(cin, cout, 1, {stride = stride, bias = false}), nn.BatchNorm2d(cout)}
  end
end
function Block:forward(x)                                  -- x [N,cin,H,W]
  local y = self.bn1(self.conv1(x)):relu()                 -- [N,cout,H/s,W/s]
  y = self.bn2(self.conv2(y))
  local s = self.downsample and self.downsample(x) or x
  return (y + s):relu()
end
function Block:extra_repr() return "" end

local ResNet = nn.define("ResNet")
function ResNet:init(opts)
  opts = core.options(opts, core.set("blocks", "channels", "classes", "widths"), "ResNet")
  local widths, blocks = opts.widths or {16, 32, 64}, opts.blocks or {2, 2, 2}
  self.stem = nn.Sequential{nn.Conv2d(opts.channels or 1, widths[1], 3, {padding = 1, bias = false}), nn.BatchNorm2d(widths[1]), nn.ReLU()}
  local layers, cin = {}, widths[1]
  for s, w in ipairs(widths) do
    for b = 1, blocks[s] do
      layers[#layers + 1] = nn.BasicBlock(cin, w, (b == 1 and s > 1) and 2 or 1)
      cin = w
    end
  end
  self.layers = nn.Sequential(layers)
  self.pool = nn.AdaptiveAvgPool2d(1)
  self.fc = nn.Linear(cin, opts.classes or 10)
end
function ResNet:forward(x)
  local y = self.pool(self.layers(self.stem(x)))
  return self.fc(y:flatten(2))
end

return function(opts) return nn.ResNet(opts) end
