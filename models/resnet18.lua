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
local core = require "kiln.core"

require "models.resnet"   -- nn.BasicBlock, with torchvision's names

local ResNet18 = nn.define("ResNet18")
function ResNet18:init(opts)
  opts = core.options(opts, core.set("channels", "classes", "widths"), "ResNet18")
  local widths = opts.widths or {64, 128, 256, 512}
  self.conv1 = nn.Conv2d(opts.channels or 3, widths[1], 7, {stride = 2, padding = 3, bias = false})
  self.bn1 = nn.BatchNorm2d(widths[1])
  self.relu = nn.ReLU()
  self.maxpool = nn.MaxPool2d(3, {stride = 2, padding = 1})
  local cin = widths[1]
  for s, w in ipairs(widths) do
    local stride = s > 1 and 2 or 1
    self["layer" .. s] = nn.Sequential{nn.BasicBlock(cin, w, stride), nn.BasicBlock(w, w, 1)}
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
