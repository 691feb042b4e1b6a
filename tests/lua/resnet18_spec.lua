-- models/resnet18.lua: torchvision's parameter count, state-dict names and shapes, the output shape,
-- a forward pass against the same network written out with functional calls, a backward pass giving
-- finite grads of the parameters' shapes, and the error for an input of the wrong channel count.
local kiln = kiln or require "kiln"
package.path = "./?.lua;" .. package.path
local F = kiln.functional
local resnet18 = require "models.resnet18"

local function sizes(t) return table.concat(t:size(), ",") end

-- The largest |a - b| / max(1, |b|) over all elements.
local function max_error(a, b)
  return ((a - b):abs() / b:abs():clamp(1, nil)):max():item()
end

describe("ResNet-18 (models/resnet18.lua)", function()
  it("has torchvision's parameter count: 11,689,512 for 1000 classes, 11,181,642 for 10", function()
    assert.are.equal(11689512, resnet18():num_parameters())
    assert.are.equal(11181642, resnet18{classes = 10}:num_parameters())
  end)

  it("names and shapes its state dict like torchvision's resnet18", function()
    local model = resnet18()
    local sd = model:state_dict()
    local keys = sd.keys()
    -- 62 parameters and 3 buffers of each of the 20 batch norms.
    assert.are.equal(122, #keys)
    assert.are.equal(62, #model:named_parameters())
    local first = {"conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.conv1.weight", "layer1.0.bn1.weight"}
    for i, name in ipairs(first) do assert.are.equal(name, model:named_parameters()[i][1]) end
    assert.are.equal("fc.bias", model:named_parameters()[62][1])
    local expected = {
      ["conv1.weight"] = "64,3,7,7", ["bn1.running_mean"] = "64", ["bn1.num_batches_tracked"] = "",
      ["layer1.0.conv1.weight"] = "64,64,3,3", ["layer1.1.bn2.bias"] = "64",
      ["layer2.0.conv1.weight"] = "128,64,3,3", ["layer2.0.downsample.0.weight"] = "128,64,1,1",
      ["layer2.0.downsample.1.running_var"] = "128", ["layer3.1.conv2.weight"] = "256,256,3,3",
      ["layer4.0.downsample.0.weight"] = "512,256,1,1", ["layer4.1.bn2.weight"] = "512",
      ["fc.weight"] = "1000,512", ["fc.bias"] = "1000",
    }
    for name, shape in pairs(expected) do
      assert.is_not_nil(sd[name], name)
      assert.are.equal(shape, sizes(sd[name]), name)
    end
    -- Only the first block of stages 2-4 has a shortcut conv.
    assert.is_nil(sd["layer1.0.downsample.0.weight"])
    assert.is_nil(sd["layer2.1.downsample.0.weight"])
  end)

  it("maps [2,3,64,64] to [2,1000] and [3,3,32,32] to [3,7], in train and eval modes", function()
    kiln.manual_seed(1)
    local model = resnet18()
    assert.are.equal("2,1000", sizes(model(kiln.randn(2, 3, 64, 64))))
    model:eval()
    assert.are.equal("2,1000", sizes(kiln.no_grad(function() return model(kiln.randn(2, 3, 64, 64)) end)))
    local small = resnet18{classes = 7}
    assert.are.equal("3,7", sizes(small(kiln.randn(3, 3, 32, 32))))
  end)

  it("computes the network written out with functional calls (eval mode, random batch-norm statistics)", function()
    kiln.manual_seed(2)
    local model = resnet18{classes = 10}
    kiln.no_grad(function()
      for _, nb in ipairs(model:named_buffers()) do
        if nb[1]:match("running_mean$") then nb[2]:normal_(0, 0.1)
        elseif nb[1]:match("running_var$") then nb[2]:uniform_(0.5, 1.5) end
      end
      for _, np in ipairs(model:named_parameters()) do
        if np[1]:match("bn%d%.weight$") or np[1]:match("downsample%.1%.weight$") then np[2]:uniform_(0.5, 1.5)
        elseif np[1]:match("bn%d%.bias$") or np[1]:match("downsample%.1%.bias$") then np[2]:normal_(0, 0.1) end
      end
    end)
    model:eval()
    local sd = model:state_dict()
    -- Batch norm in eval mode by hand: (x - mean) / sqrt(var + eps) * weight + bias.
    local function bn(x, p)
      local c = sd[p .. ".weight"]:numel()
      local scale = sd[p .. ".weight"] / (sd[p .. ".running_var"] + 1e-5):sqrt()
      return (x - sd[p .. ".running_mean"]:view(1, c, 1, 1)) * scale:view(1, c, 1, 1) + sd[p .. ".bias"]:view(1, c, 1, 1)
    end
    local function block(x, p, stride)
      local y = bn(F.conv2d(x, sd[p .. ".conv1.weight"], nil, {stride = stride, padding = 1}), p .. ".bn1"):relu()
      y = bn(F.conv2d(y, sd[p .. ".conv2.weight"], nil, {padding = 1}), p .. ".bn2")
      local s = x
      if sd[p .. ".downsample.0.weight"] then
        s = bn(F.conv2d(x, sd[p .. ".downsample.0.weight"], nil, {stride = stride}), p .. ".downsample.1")
      end
      return (y + s):relu()
    end
    local x = kiln.randn(2, 3, 48, 40)
    local want = kiln.no_grad(function()
      local y = bn(F.conv2d(x, sd["conv1.weight"], nil, {stride = 2, padding = 3}), "bn1"):relu()   -- [2,64,24,20]
      y = F.max_pool2d(y, 3, {stride = 2, padding = 1})                                               -- [2,64,12,10]
      for s = 1, 4 do
        y = block(y, "layer" .. s .. ".0", s > 1 and 2 or 1)
        y = block(y, "layer" .. s .. ".1", 1)
      end                                                                                             -- [2,512,2,2]
      return y:mean({3, 4}):matmul(sd["fc.weight"]:t()) + sd["fc.bias"]                               -- [2,10]
    end)
    local got = kiln.no_grad(function() return model(x) end)
    assert.are.equal("2,10", sizes(got))
    local err = max_error(got, want)
    assert.is_true(err < 1e-4, "largest normalised difference " .. err)
  end)

  it("gives finite grads of every parameter's shape after a backward pass", function()
    kiln.manual_seed(3)
    local model = resnet18{classes = 10}
    local x = kiln.randn(2, 3, 64, 64)
    local y = kiln.tensor({3, 10}, {dtype = "i64"})
    local loss = kiln.nn.CrossEntropyLoss()(model(x), y)
    loss:backward()
    for _, np in ipairs(model:named_parameters()) do
      local name, p = np[1], np[2]
      assert.is_not_nil(p.grad, name .. " has no grad")
      assert.are.equal(sizes(p), sizes(p.grad), name)
      local s = p.grad:abs():sum():item()
      assert.is_true(s == s and s < math.huge, name .. ": grad not finite")
    end
    assert.is_true(model.conv1.weight.grad:abs():sum():item() > 0)
    assert.is_true(model.layer4:get(1).downsample ~= nil)
  end)

  it("names the layer and the shape for an input with the wrong number of channels", function()
    local ok, err = pcall(function() return resnet18{classes = 10}(kiln.randn(2, 1, 64, 64)) end)
    assert.is_false(ok)
    assert.matches("ResNet18%.conv1 %(Conv2d 3→64, 7x7, stride 2,2, padding 3,3%): input %[2,1,64,64%]", err)
    assert.matches("weight %[64,3,7,7%]", err)
    assert.matches("resnet18_spec", err)
  end)
end)
