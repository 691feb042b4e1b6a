-- models/resnet18.lua: the ImageNet ResNet-18 (He et al. 2015, as torchvision builds it): a 7x7/2
-- conv stem without bias, batch norm, ReLU, a 3x3/2 max pool, four stages of two basic blocks (64,
-- 128, 256, 512 channels; the first block of stages 2-4 halves the resolution and has a 1x1/2 conv +
-- batch norm shortcut), global average pooling and a linear head. Parameter names and shapes are
-- torchvision's resnet18 state dict (conv1.weight, bn1.running_mean, layer1.0.conv1.weight,
-- layer2.0.downsample.0.weight, fc.weight, ...), so weights move between the two unchanged;
-- 11,689,512 parameters for 1000 classes.
--   local model = require("models.resnet18"){classes = 1000}   -- input [N,3,H,W], H and W >= 32
local kiln = kiln or require "kiln"
local nn = kiln.nn

local Block = nn.define("ResNet18Block")
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

local ResNet18 = nn.define("ResNet18")
function ResNet18:init(opts)
  opts = opts or {}
  local widths = opts.widths or {64, 128, 256, 512}
  self.conv1 = nn.Conv2d(opts.channels or 3, widths[1], 7, {stride = 2, padding = 3, bias = false})
  self.bn1 = nn.BatchNorm2d(widths[1])
  self.relu = nn.ReLU()
  self.maxpool = nn.MaxPool2d(3, {stride = 2, padding = 1})
  local cin = widths[1]
  for s, w in ipairs(widths) do
    local stride = s > 1 and 2 or 1
    self["layer" .. s] = nn.Sequential{nn.ResNet18Block(cin, w, stride), nn.ResNet18Block(w, w, 1)}
    cin = w
  end
  self.avgpool = nn.AdaptiveAvgPool2d(1)
  self.fc = nn.Linear(cin, opts.classes or 1000)
  self.stages = #widths
end
function ResNet18:forward(x)                               -- x [N,3,H,W]
  local y = self.maxpool(self.relu(self.bn1(self.conv1(x))))   -- [N,64,H/4,W/4]
  for s = 1, self.stages do y = self["layer" .. s](y) end      -- [N,512,H/32,W/32]
  return self.fc(self.avgpool(y):flatten(2))                   -- [N,classes]
end
function ResNet18:extra_repr() return string.format("%d classes", self.fc.out_features or 0) end

return function(opts) return nn.ResNet18(opts) end
