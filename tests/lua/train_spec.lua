-- Training end to end on Fashion-MNIST: bitwise-reproducible losses for a seed and thread count,
-- learning on a subset, and clear errors for a wrong input, bad labels and a NaN loss.
local kiln = kiln or require "kiln"
package.path = "./?.lua;" .. package.path
local nn, optim, data = kiln.nn, kiln.optim, kiln.data
local fashion = require "datasets.fashion_mnist"

local train
local function subset(n)
  train = train or fashion.load{split = "train"}
  return train.images:narrow(1, 1, n), train.labels:narrow(1, 1, n)
end

-- A few SGD steps; returns the list of losses.
local function run(model_name, threads, steps, batch)
  kiln.set_num_threads(threads)
  kiln.manual_seed(42)
  local model = require("models." .. model_name)()
  local opt = optim.SGD(model:parameters(), {lr = 0.05, momentum = 0.9})
  local loss_fn = nn.CrossEntropyLoss()
  local x, y = subset(steps * batch)
  local losses = {}
  for _, xb, yb in data.batches({x, y}, {batch_size = batch, shuffle = true, seed = 3}) do
    local loss = loss_fn(model(xb), yb)
    opt:zero_grad()
    loss:backward()
    opt:step()
    losses[#losses + 1] = loss:item()
  end
  return losses
end

describe("training", function()
  local threads
  setup(function() threads = kiln.get_num_threads() end)
  teardown(function() kiln.set_num_threads(threads) end)

  for _, t in ipairs{1, 2} do
    it("gives bitwise-identical losses for the same seed at " .. t .. " thread(s): MLP and LeNet", function()
      local a, b = run("mlp", t, 12, 64), run("mlp", t, 12, 64)
      assert.are.same(a, b)
      local c, d = run("lenet", t, 4, 16), run("lenet", t, 4, 16)
      assert.are.same(c, d)
    end)
  end

  it("learns: the MLP's loss on a subset falls well below chance (ln 10 = 2.30)", function()
    local losses = run("mlp", 2, 40, 64)
    local last = 0
    for i = #losses - 4, #losses do last = last + losses[i] / 5 end
    assert.is_true(losses[1] > 1.8, "first loss " .. losses[1])
    assert.is_true(last < 1.0, "mean of the last five losses " .. last)
  end)

  it("ResNet runs forward and backward, in train and eval modes", function()
    local model = require("models.resnet")()
    local x, y = subset(8)
    local loss = nn.CrossEntropyLoss()(model(x), y)
    loss:backward()
    assert.is_not_nil(model.fc.weight.grad)
    model:eval()
    local out = kiln.no_grad(function() return model(x) end)
    assert.are.same({8, 10}, {out:size(1), out:size(2)})
  end)
end)

describe("bad input to training", function()
  it("names the layer and the shape when the input does not fit the model", function()
    local model = require("models.lenet")()
    local ok, err = pcall(function() return model(kiln.randn(4, 3, 28, 28)) end)
    assert.is_false(ok)
    assert.matches("Sequential%.0 %(Conv2d 1→32, 5x5%): input %[4,3,28,28%]", err)
    assert.matches("train_spec", err)
    local ok2, err2 = pcall(function() return require("models.mlp")()(kiln.randn(4, 1, 20, 20)) end)
    assert.is_false(ok2)
    assert.matches("Linear 784→512", err2)
  end)

  it("names a label out of range and the class count", function()
    local logits = kiln.randn(3, 10)
    local ok, err = pcall(function() return nn.CrossEntropyLoss()(logits, kiln.tensor({1, 11, 2}, {dtype = "i64"})) end)
    assert.is_false(ok)
    assert.matches("11", err)
    assert.matches("10 classes", err)
    ok, err = pcall(function() return nn.CrossEntropyLoss()(logits, kiln.tensor({0, 1, 2}, {dtype = "i64"})) end)
    assert.is_false(ok)
    assert.matches("out of range", err)
  end)

  it("stops the example with a message naming the step when the loss becomes NaN", function()
    local exe = "build/bin/kiln"
    local f = io.open(exe)
    if not f then pending("no build/bin/kiln in the working directory") return end
    f:close()
    local p = io.popen(exe .. " examples/fashion_mnist.lua --model mlp --epochs 1 --limit 1024 --lr 1e30 2>&1; echo exit=$?")
    local out = p:read("*a")
    p:close()
    assert.matches("loss became NaN at epoch 1, step %d+", out)
    assert.matches("exit=1", out)
  end)

  it("names the Debian package when the dataset is missing", function()
    local ok, err = pcall(function() return fashion.load{split = "train", root = "/nonexistent/fashion"} end)
    assert.is_false(ok)
    assert.matches("dataset%-fashion%-mnist", err)
  end)
end)
