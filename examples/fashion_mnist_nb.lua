-- %% [markdown]
-- # Fashion-MNIST, as a notebook
--
-- A cell script: `kiln examples/fashion_mnist_nb.lua` runs it as a script, and
-- `kiln nb run examples/fashion_mnist_nb.lua -p epochs=3 -o runs/fmnist` runs it as a notebook
-- and writes `runs/fmnist/fashion_mnist_nb.ipynb` and a report, `fashion_mnist_nb.html`.
-- It trains a small model on part of Fashion-MNIST (Debian's `dataset-fashion-mnist`), then shows
-- the training curves, a confusion matrix and the test images it got wrong.

-- %% tags=["parameters"]
local model_name = "mlp"     -- "mlp" or "lenet" (models/)
local epochs = 2
local train_size = 6000      -- training images used (of 60000)
local test_size = 2000       -- test images used (of 10000)
local batch_size = 64
local lr = 0.05
local seed = 1
local threads = 2
local metrics_file = nil     -- a file to keep the metrics' JSON lines in (nil: a temporary one)

-- %%
-- Run as a script, the parameters also come from its command line
-- (kiln examples/fashion_mnist_nb.lua --epochs 3 --model-name lenet); `kiln nb run` sets them with -p.
if arg and type(arg[0]) == "string" and arg[0]:match("fashion_mnist_nb%.lua$") then
  local o = require("kiln.ui").parse_args(arg, {name = "fashion_mnist_nb", strict = {"metrics_file"},
    defaults = {model_name = model_name, epochs = epochs, train_size = train_size, test_size = test_size,
                batch_size = batch_size, lr = lr, seed = seed, threads = threads}})
  model_name, epochs, train_size, test_size = o.model_name, o.epochs, o.train_size, o.test_size
  batch_size, lr, seed, threads, metrics_file = o.batch_size, o.lr, o.seed, o.threads, o.metrics_file or metrics_file
end

-- %%
local kiln = kiln or require "kiln"
local fashion = require "datasets.fashion_mnist"
local nn, data, plot = kiln.nn, kiln.data, kiln.plot
kiln.set_num_threads(threads)
kiln.manual_seed(seed)

local train = fashion.load{split = "train"}
local test = fashion.load{split = "test"}
local train_x, train_y = train.images:narrow(1, 1, train_size), train.labels:narrow(1, 1, train_size)
local test_x, test_y = test.images:narrow(1, 1, test_size), test.labels:narrow(1, 1, test_size)

local model = require("models." .. model_name)()
local sgd = kiln.optim.SGD(model:parameters(), {lr = lr, momentum = 0.9, nesterov = true})
local criterion = nn.CrossEntropyLoss()
kiln.display(model)

-- %%
local log_path = metrics_file or os.tmpname()
local log = kiln.ui.metrics(log_path, {mode = "w"})

local function evaluate()
  model:eval()
  local predictions = {}
  local loss_sum = 0
  kiln.no_grad(function()
    for _, x, y in data.batches({test_x, test_y}, {batch_size = 500, shuffle = false}) do
      local out = model(x)
      loss_sum = loss_sum + criterion(out, y):item() * x:size(1)
      for _, p in ipairs(out:argmax(2):tolist()) do predictions[#predictions + 1] = p end
    end
  end)
  model:train()
  local correct = 0
  for i, y in ipairs(test_y:tolist()) do if predictions[i] == y then correct = correct + 1 end end
  return correct / test_size, loss_sum / test_size, predictions
end

local step, accuracy, predictions = 0, 0, nil
for epoch = 1, epochs do
  for _, x, y in data.batches({train_x, train_y}, {batch_size = batch_size, shuffle = true, seed = seed + epoch}) do
    local loss = criterion(model(x), y)
    sgd:zero_grad()
    loss:backward()
    sgd:step()
    step = step + 1
    log:log{step = step, epoch = epoch, loss = loss:item(), lr = lr}
  end
  local test_loss
  accuracy, test_loss, predictions = evaluate()
  log:log{step = step, epoch = epoch, accuracy = accuracy, test_loss = test_loss}
  print(string.format("epoch %d: test accuracy %.4f, test loss %.4f", epoch, accuracy, test_loss))
end
log:close()

-- %% [markdown]
-- ## Training curves
-- The loss of each step (faint) under its moving average, on a log scale, and the test accuracy
-- after each epoch.

-- %%
kiln.display(plot.metrics(log_path, {y = "loss", smooth = 0.9, log = true, title = "training loss"}))
kiln.display(plot.metrics(log_path, {y = {"accuracy"}, title = "test accuracy", x = "epoch", height = 240}))
if not metrics_file then os.remove(log_path) end

-- %% [markdown]
-- ## What the model confuses
-- Rows are the true classes, columns the predicted ones.

-- %%
local confusion = {}
for i = 1, 10 do confusion[i] = {} for j = 1, 10 do confusion[i][j] = 0 end end
local truth = test_y:tolist()
for i, p in ipairs(predictions) do confusion[truth[i]][p] = confusion[truth[i]][p] + 1 end
kiln.display(plot.confusion(confusion, {classes = fashion.classes, title = "confusion matrix"}))

-- %%
local wrong, captions = {}, {}
for i, p in ipairs(predictions) do
  if p ~= truth[i] and #wrong < 24 then
    wrong[#wrong + 1] = i
    captions[#captions + 1] = fashion.classes[p]:sub(1, 8)
  end
end
if #wrong > 0 then
  local images = test_x:index_select(1, kiln.tensor(wrong, {dtype = "i64"}))
  kiln.display(plot.images(images, {labels = captions, nrow = 8, scale = 2,
                                    title = "misclassified test images (captions: the model's guess)"}))
end

-- %%
print(kiln.ui.json_encode{model = model_name, epochs = epochs, train_size = train_size, lr = lr, seed = seed,
                          test_accuracy = accuracy, steps = step})
