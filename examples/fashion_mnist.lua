-- examples/fashion_mnist.lua: train a model on Fashion-MNIST (Debian's dataset-fashion-mnist),
-- evaluate on the test set after every epoch, and end with one JSON line of results.
-- usage: kiln examples/fashion_mnist.lua [--model mlp|lenet|resnet] [--epochs N] [--batch-size N]
--        [--lr X] [--threads N] [--seed N] [--limit N]
local kiln = kiln or require "kiln"
local nn, optim, data, ui = kiln.nn, kiln.optim, kiln.data, kiln.ui
local fashion = require "datasets.fashion_mnist"

local defaults = {
  mlp = {epochs = 5, batch_size = 128, lr = 0.05},
  lenet = {epochs = 3, batch_size = 64, lr = 0.05},
  resnet = {epochs = 5, batch_size = 128, lr = 0.1, weight_decay = 5e-4},
}

local function parse(args)
  local o = {model = "lenet"}
  local i = 1
  while i <= #args do
    local k, v = args[i]:match("^%-%-([%w%-]+)=?(.*)$")
    if not k then error("fashion_mnist: unexpected argument " .. args[i], 0) end
    if v == "" then i = i + 1 v = args[i] end
    if v == nil then error("fashion_mnist: --" .. k .. " needs a value", 0) end
    o[k:gsub("%-", "_")] = tonumber(v) or v
    i = i + 1
  end
  local d = defaults[o.model]
  if not d then error("fashion_mnist: unknown model " .. tostring(o.model) .. " (mlp, lenet, resnet)", 0) end
  for k, v in pairs(d) do if o[k] == nil then o[k] = v end end
  o.seed = o.seed or 1
  return o
end

local opt = parse(arg or {})
if opt.threads then kiln.set_num_threads(opt.threads) end
kiln.manual_seed(opt.seed)

local train = fashion.load{split = "train"}
local test = fashion.load{split = "test"}
local train_x, train_y = train.images, train.labels
if opt.limit then
  train_x, train_y = train_x:narrow(1, 1, opt.limit), train_y:narrow(1, 1, opt.limit)
end

local model = require("models." .. opt.model)()
local params = model:parameters()
local sgd = optim.SGD(params, {lr = opt.lr, momentum = 0.9, weight_decay = opt.weight_decay or 0, nesterov = true})
local steps_per_epoch = math.ceil(train_x:size(1) / opt.batch_size)
local schedule = optim.lr_scheduler.CosineAnnealingLR(sgd, {T_max = opt.epochs * steps_per_epoch})
local criterion = nn.CrossEntropyLoss()

ui.log("kiln %s: %s (%d parameters), %d training images, %d threads, seed %d", kiln.version, opt.model,
       model:num_parameters(), train_x:size(1), kiln.get_num_threads(), opt.seed)

local function evaluate()
  model:eval()
  local correct = 0
  kiln.no_grad(function()
    for _, x, y in data.batches({test.images, test.labels}, {batch_size = 1000, shuffle = false}) do
      correct = correct + model(x):argmax(2):eq(y):sum():item()
    end
  end)
  model:train()
  return correct / test.images:size(1)
end

local function now()
  local ffi = require "ffi"
  pcall(ffi.cdef, "typedef struct { long tv_sec; long tv_nsec; } kiln_example_ts; int clock_gettime(int, kiln_example_ts *);")
  local ts = ffi.new("kiln_example_ts")
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local train_seconds, accuracy, last_loss = 0, 0, nil
local losses = {}
for epoch = 1, opt.epochs do
  local bar = ui.progress{total = train_x:size(1), desc = string.format("epoch %d/%d", epoch, opt.epochs)}
  local t0 = now()
  local sum, count = 0, 0
  for _, x, y in data.batches({train_x, train_y}, {batch_size = opt.batch_size, shuffle = true, seed = opt.seed + epoch}) do
    local loss = criterion(model(x), y)
    sgd:zero_grad()
    loss:backward()
    sgd:step()
    schedule:step()
    local l = loss:item()
    if l ~= l then error(string.format("fashion_mnist: the loss became NaN at epoch %d, step %d", epoch, count + 1), 0) end
    losses[#losses + 1] = l
    sum, count = sum + l, count + 1
    bar:update(x:size(1), {loss = string.format("%.4f", sum / count)})
  end
  bar:close()
  train_seconds = train_seconds + (now() - t0)
  accuracy = evaluate()
  last_loss = sum / count
  ui.log("epoch %d: train loss %.4f, test accuracy %.4f, %.1f s", epoch, last_loss, accuracy, now() - t0)
end

ui.json{model = opt.model, epochs = opt.epochs, batch_size = opt.batch_size, lr = opt.lr, threads = kiln.get_num_threads(),
        seed = opt.seed, train_loss = last_loss, test_accuracy = accuracy, train_seconds = train_seconds}
return {accuracy = accuracy, losses = losses}
