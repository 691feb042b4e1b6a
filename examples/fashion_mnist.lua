-- examples/fashion_mnist.lua: train a model on Fashion-MNIST (Debian's dataset-fashion-mnist),
-- evaluate on the test set after every epoch, and end with one JSON line of results.
-- usage: kiln examples/fashion_mnist.lua [--model mlp|lenet|resnet] [--epochs N] [--batch-size N]
--        [--lr X] [--threads N] [--seed N] [--limit N] [--workers N] [--metrics FILE] [--amp bf16]
--        [--checkpoint DIR [--checkpoint-every STEPS] [--keep N] [--resume] [--pause-after STEPS]] [--dist]
-- --amp bf16 runs forward passes under kiln.amp.autocast("bf16") (products in bf16, f32 master weights).
-- --metrics appends one JSON line per step and per epoch. --checkpoint saves the whole training state
-- to DIR/ckpt-<step>.safetensors every STEPS steps (default: each epoch), keeping the last N (3);
-- --resume continues from the newest one at the exact batch; --pause-after stops after the
-- checkpoint of that step and waits to be killed (for the resume test). SIGTERM finishes the
-- step, writes its checkpoint (with --checkpoint) and exits with status 143.
-- --workers: the C loader's threads gathering batches ahead of the training loop (default 2; 0
-- gathers them in the loop); each epoch reports data_wait_fraction, the share of its time spent
-- waiting for them.
-- --dist: one rank of a data-parallel job (`kiln launch -n 2 examples/fashion_mnist.lua --dist`):
-- each global batch of --batch-size is shared out among the ranks (kiln.dist.sampler), gradients
-- are averaged (kiln.dist.DataParallel), the test set is split among them, and rank 0 logs, writes
-- checkpoints and the JSON line.
local kiln = kiln or require "kiln"
local nn, optim, data, ui = kiln.nn, kiln.optim, kiln.data, kiln.ui
local fashion = require "datasets.fashion_mnist"

local defaults = {
  mlp = {epochs = 5, batch_size = 128, lr = 0.05},
  lenet = {epochs = 3, batch_size = 64, lr = 0.05},
  resnet = {epochs = 5, batch_size = 128, lr = 0.1, weight_decay = 5e-4},
}

local flags = {resume = true, dist = true}   -- options without a value

local function parse(args)
  local o = ui.parse_args(args, {name = "fashion_mnist", flags = flags, defaults = {model = "lenet", seed = 1, workers = 2},
                                 strict = {"epochs", "batch_size", "lr", "weight_decay", "threads", "limit", "metrics", "amp",
                                           "checkpoint", "checkpoint_every", "keep", "pause_after"},
                                 numbers = {"epochs", "batch_size", "lr", "weight_decay", "threads", "limit",
                                            "checkpoint_every", "keep", "pause_after"}})
  local d = defaults[o.model]
  if not d then ui.usage_error("fashion_mnist", "unknown model " .. tostring(o.model) .. " (mlp, lenet, resnet)") end
  for k, v in pairs(d) do if o[k] == nil then o[k] = v end end
if o.amp ~= nil and o.amp ~= "bf16" then ui.usage_error("fashion_mnist", "--amp takes bf16, got " .. tostring(o.amp)) end
  return o
end

local opt = parse(arg or {})
local dist = opt.dist and kiln.dist
if dist then dist.init() end
local rank, ranks = dist and dist.rank() or 0, dist and dist.world_size() or 1
local lead = rank == 0
local function log(...) if lead then ui.log(...) end end
if opt.threads then kiln.set_num_threads(opt.threads) end
kiln.manual_seed(opt.seed)

local train = fashion.load{split = "train"}
local test = fashion.load{split = "test"}
local train_x, train_y = train.images, train.labels
if opt.limit then
  train_x, train_y = train_x:narrow(1, 1, opt.limit), train_y:narrow(1, 1, opt.limit)
end

local model = require("models." .. opt.model)()
local net = dist and dist.DataParallel(model) or model
local params = model:parameters()
local sgd = optim.SGD(params, {lr = opt.lr, momentum = 0.9, weight_decay = opt.weight_decay or 0, nesterov = true})
-- (a data-parallel job drops the last global batch when it is not full: every rank has as many)
local steps_per_epoch = dist and math.floor(train_x:size(1) / opt.batch_size) or math.ceil(train_x:size(1) / opt.batch_size)
local schedule = optim.lr_scheduler.CosineAnnealingLR(sgd, {T_max = opt.epochs * steps_per_epoch})
local criterion = nn.CrossEntropyLoss()

log("kiln %s: %s (%d parameters), %d training images, %d threads, seed %d%s", kiln.version, opt.model,
    model:num_parameters(), train_x:size(1), kiln.get_num_threads(), opt.seed,
    dist and string.format(", %d ranks (%s)", ranks, dist.engine()) or "")
if opt.amp == "bf16" then log("autocast bf16; bf16 products on this CPU: %s", kiln.info().blas.bf16_products) end

-- In a data-parallel job each rank takes its own block of the test set (every image once) and the
-- counts are summed over ranks.
local function evaluate()
  model:eval()
  local correct = 0
  local first, n = 1, test.images:size(1)
  if dist then first, n = dist.shard(n) end
  local images, labels = test.images:narrow(1, first, n), test.labels:narrow(1, first, n)
  kiln.no_grad(function()
    for _, x, y in data.batches({images, labels}, {batch_size = 1000, shuffle = false}) do
      correct = correct + kiln.amp.autocast(opt.amp, model, x):argmax(2):eq(y):sum():item()
    end
  end)
  model:train()
  if dist then correct = dist.all_reduce(kiln.tensor{correct}):item() end
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

-- ---- checkpoints and metrics ----
-- The batch order of an epoch depends only on (seed, epoch), so a run resumes at the exact batch
-- by skipping the batches its checkpoint had done.
local metrics = opt.metrics and ui.metrics(opt.metrics)
local step, start_epoch, done_batches, resumed = 0, 1, 0, nil
local config = {model = opt.model, batch_size = opt.batch_size, seed = opt.seed, limit = opt.limit or false,
                epochs = opt.epochs, lr = opt.lr}
if opt.resume then
  if not opt.checkpoint then error("fashion_mnist: --resume needs --checkpoint DIR", 0) end
  if kiln.checkpoint.latest(opt.checkpoint) then
    resumed = kiln.checkpoint.load(opt.checkpoint, {model = model, optimizer = sgd, scheduler = schedule})
    for k, v in pairs(config) do
      if resumed.extra.config[k] ~= v then
        error(string.format("fashion_mnist: %s has --%s %s; resume with the same options (got %s)", resumed.path,
                            k:gsub("_", "-"), tostring(resumed.extra.config[k]), tostring(v)), 0)
      end
    end
    step, start_epoch, done_batches = resumed.step, resumed.data.epoch, resumed.data.batch
    train_seconds = resumed.extra.train_seconds
    log("resumed from %s: step %d, epoch %d, batch %d", resumed.path, step, start_epoch, done_batches)
  else
    log("no checkpoint in %s: starting afresh", opt.checkpoint)
  end
end
local checkpoint_every = opt.checkpoint_every or steps_per_epoch

local function save_checkpoint(epoch, batch, sum, count, seconds)
  if not lead then return opt.checkpoint end   -- rank 0 writes for the job
  return kiln.checkpoint.save(opt.checkpoint, {model = model, optimizer = sgd, scheduler = schedule, step = step, epoch = epoch,
                                        data = {epoch = epoch, batch = batch},
                                        extra = {sum = sum, count = count, train_seconds = seconds, config = config}},
                       {keep = opt.keep or 3})
end

pcall(require("ffi").cdef, "int kiln_example_pause(void) __asm__(\"pause\");")
-- SIGTERM (a scheduler's stop) ends the current step, writes a checkpoint when --checkpoint is
-- given, and exits with status 143; Ctrl-C (SIGINT) stops at once, as everywhere in kiln.
kiln.catch_terminate()

-- The batches of epoch e come in the order of (seed, e), gathered by opt.workers C threads.
local loader = data.DataLoader{dataset = data.TensorDataset(train_x, train_y), batch_size = opt.batch_size / ranks,
                               shuffle = true, seed = opt.seed, workers = opt.workers,
                               sampler = dist and dist.sampler{batch_size = opt.batch_size, seed = opt.seed} or nil}
local silent = {update = function() end, close = function() end}
local loop_seconds, wait_seconds = 0, 0

for epoch = start_epoch, opt.epochs do
  local bar = lead and ui.progress{total = steps_per_epoch * opt.batch_size, desc = string.format("epoch %d/%d", epoch, opt.epochs)}
              or silent
  local t0 = now()
  local sum, count = 0, 0
  local skip = epoch == start_epoch and done_batches or 0
  if skip > 0 then sum, count = resumed.extra.sum, resumed.extra.count end
  if skip > 0 then bar:update(math.min(skip * opt.batch_size, train_x:size(1))) end
  local wait0, b = loader.wait_seconds, skip
  for x, y in loader:epoch(epoch, {skip = skip}) do
    b = b + 1
    local t_step = now()
    local lr = sgd.param_groups[1].lr
    local loss = kiln.amp.autocast(opt.amp, function() return criterion(net(x), y) end)
    sgd:zero_grad()
    loss:backward()
    sgd:step()
    schedule:step()
    local l = loss:item()
    if l ~= l then error(string.format("fashion_mnist: the loss became NaN at epoch %d, step %d", epoch, count + 1), 0) end
    losses[#losses + 1] = l
    sum, count = sum + l, count + 1
    step = step + 1
    bar:update(x:size(1) * ranks, {loss = string.format("%.4f", sum / count)})
    if metrics then
      metrics:log{step = step, epoch = epoch, batch = b, loss = l, lr = lr, samples_per_s = x:size(1) / (now() - t_step)}
    end
    if opt.checkpoint and step % checkpoint_every == 0 then
      save_checkpoint(epoch, b, sum, count, train_seconds + (now() - t0))
    end
    if opt.pause_after == step then
      log("paused after step %d; waiting to be killed", step)
      while not kiln.terminate_requested() do require("ffi").C.kiln_example_pause() end
    end
    -- SIGTERM: the step is done; save it where checkpoints go, and stop
    if kiln.terminate_requested() then
      bar:close()
      if opt.checkpoint then
        local path = save_checkpoint(epoch, b, sum, count, train_seconds + (now() - t0))
        log("terminated after step %d: checkpoint written to %s (--resume continues from it)", step, path)
      else
        log("terminated after step %d (no --checkpoint: nothing saved)", step)
      end
      os.exit(143)
    end
  end
  bar:close()
  local epoch_seconds, epoch_wait = now() - t0, loader.wait_seconds - wait0
  loop_seconds, wait_seconds = loop_seconds + epoch_seconds, wait_seconds + epoch_wait
  train_seconds = train_seconds + (now() - t0)
  accuracy = evaluate()
  last_loss = sum / count
  if dist then last_loss = dist.all_reduce(kiln.tensor({last_loss}, {dtype = "f64"}), "mean"):item() end
  log("epoch %d: train loss %.4f, test accuracy %.4f, %.1f s, data_wait_fraction %.4f", epoch, last_loss, accuracy,
         now() - t0, epoch_wait / epoch_seconds)
  if metrics then metrics:log{step = step, epoch = epoch, train_loss = last_loss, accuracy = accuracy} end
end

if lead then
  ui.json{model = opt.model, epochs = opt.epochs, batch_size = opt.batch_size, lr = opt.lr, threads = kiln.get_num_threads(),
          seed = opt.seed, train_loss = last_loss, test_accuracy = accuracy, train_seconds = train_seconds,
          workers = opt.workers, data_wait_fraction = loop_seconds > 0 and wait_seconds / loop_seconds or 0,
          ranks = dist and ranks or nil, amp = opt.amp}
end
return {accuracy = accuracy, losses = losses}
