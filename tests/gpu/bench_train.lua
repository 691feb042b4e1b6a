-- tests/gpu/bench_train.lua: median training-step time (forward, cross-entropy loss, backward, SGD
-- momentum step) on cuda:0, f32 exact (no TF32), of
--   cnn:      the main job's CNN (models/lenet.lua) at its batch size 64 on 28x28 images, 10 classes;
--   resnet18: models/resnet18.lua at 224x224, batch 64, 1000 classes.
-- Random inputs and labels made once on the device; each step as examples/fashion_mnist.lua does it
-- (model, loss, zero_grad, backward, SGD lr 0.01 momentum 0.9 Nesterov). After the warm-up steps
-- (which pay for cuDNN's algorithm search with KILN_CUDNN_BENCHMARK=1), reps runs of n steps, each
-- between two synchronizations; the median of the reps' per-step times. One JSON line per model, also
-- appended to $OUT/bench_train.jsonl when OUT is set; tests/gpu/torch_train.py times PyTorch on the
-- same models and adds the ratio lines.
--   KILN_CUDNN_BENCHMARK=1 build/bin/kiln tests/gpu/bench_train.lua [--device cuda|cpu] [--quick]
--                                                                    [--models cnn,resnet18]
--   --device cpu --quick: a few steps of each at small sizes (ResNet-18 at batch 2, 64x64) on the
--   CPU, to check this script where there is no GPU.
local kiln = kiln or require "kiln"
package.path = "./?.lua;" .. package.path
local nn, optim, ui = kiln.nn, kiln.optim, kiln.ui

local opt = ui.parse_args(arg or {}, {name = "bench_train", flags = {quick = true}, strict = true,
                                      defaults = {device = "cuda", models = "cnn,resnet18"}})
local device = opt.device
if device ~= "cpu" and not device:match("^cuda") then
  error("bench_train: --device must be cpu or cuda[:N], got " .. tostring(device), 0)
end
if device ~= "cpu" and not kiln.cuda.is_available() then
  print("skipped: no CUDA device (" .. tostring(kiln.cuda.unavailable_reason()) .. ")")
  os.exit(0)
end
local on_cuda = device ~= "cpu"
local function sync() if on_cuda then kiln.cuda.synchronize() end end
local mode = os.getenv("KILN_CUDNN_BENCHMARK") == "1" and "benchmark" or "heuristic"

-- {name, model, batch, channels, image, classes, warm-up steps, reps, steps per rep}; --quick: small
local configs = {
  cnn = {model = "lenet", batch = 64, channels = 1, image = 28, classes = 10, warmup = 20, reps = 7, steps = 20,
         quick = {warmup = 2, reps = 3, steps = 3}},
  resnet18 = {model = "resnet18", batch = 64, channels = 3, image = 224, classes = 1000, warmup = 5, reps = 5, steps = 6,
              quick = {batch = 2, image = 64, warmup = 1, reps = 3, steps = 2}},
}

local function median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) / 2] or (xs[n / 2] + xs[n / 2 + 1]) / 2
end

local dir = os.getenv("OUT")
local jsonl = dir and dir ~= "" and (dir .. "/bench_train.jsonl") or nil

local function write(line)
  print(line)
  if jsonl then
    local f = assert(io.open(jsonl, "a"))
    f:write(line, "\n")
    f:close()
  end
end

-- One model's steps; returns its JSON record.
local function bench(name, c, s)
  kiln.manual_seed(0)
  local model = require("models." .. c.model){classes = c.classes, channels = c.channels}
  model:to(device)
  local sgd = optim.SGD(model:parameters(), {lr = 0.01, momentum = 0.9, nesterov = true})
  local criterion = nn.CrossEntropyLoss()
  local x = kiln.randn(s.batch, c.channels, s.image, s.image, {device = device})
  local y = kiln.randint(1, c.classes + 1, {s.batch}):to(device)
  local loss
  local function step()
    loss = criterion(model(x), y)
    sgd:zero_grad()
    loss:backward()
    sgd:step()
  end

  local t0 = ui.clock()
  for _ = 1, s.warmup do step() end
  sync()
  local warmup_s = ui.clock() - t0
  local times = {}
  for r = 1, s.reps do
    sync()
    local t = ui.clock()
    for _ = 1, s.steps do step() end
    sync()
    times[r] = (ui.clock() - t) / s.steps * 1e3
  end
  local last = loss:item()
  if last ~= last then error("the loss became NaN", 0) end
  local lo, hi = math.min(unpack(times)), math.max(unpack(times))
  return {bench = "train_step", impl = "kiln", device = device, mode = mode, model = name, batch = s.batch,
          image = s.image, classes = c.classes, ms_per_step = median(times), min_ms = lo, max_ms = hi,
          images_per_s = s.batch / median(times) * 1e3, reps = s.reps, steps_per_rep = s.steps,
          warmup_s = warmup_s, loss = last, parameters = model:num_parameters()}
end

local names = {}
for name in opt.models:gmatch("[^,]+") do
  if not configs[name] then error("bench_train: unknown model " .. name .. " (cnn, resnet18)", 0) end
  names[#names + 1] = name
end
local failed = false
for _, name in ipairs(names) do
  local c = configs[name]
  local s = {}
  for k, v in pairs(c) do s[k] = v end
  if opt.quick then for k, v in pairs(c.quick) do s[k] = v end end
  -- An error (a kernel, out of memory) becomes this model's line, and the next model still runs.
  local ok, record = pcall(bench, name, c, s)
  if not ok then
    failed = true
    record = {bench = "train_step", impl = "kiln", device = device, model = name, batch = s.batch, image = s.image,
              error = tostring(record)}
  end
  write(ui.json_encode(record))
  collectgarbage()
  collectgarbage()
  if on_cuda then kiln.cuda.empty_cache() end
end
os.exit(failed and 1 or 0)
