-- bench/scaling.lua: the scaling model (kiln.dist.simulate) for data-parallel training on 8 to 256
-- GPUs, 8 to a node (NVLink inside, one InfiniBand NDR port per GPU across; kiln.dist.links), with
-- 25 MB buckets and a 1 MB first one, for:
--   ResNet-50 (25.6 M parameters, their sizes from the architecture below), batch 256 per GPU, at an
--     assumed 85 ms per single-GPU step (about 3000 images/s, the order of an H100/H200 with mixed
--     precision: a lead, to be replaced by a measured step on a lent GPU) and an assumed step-time
--     variation of 2%;
--   the char-LM of examples/char_lm.lua, its parameters from kiln's model, its step and the step's
--     variation measured here (this CPU, 1 thread): the model as if each device ran at this speed.
-- JSON lines: one per model and GPU count, and the published points beside them.
local kiln = kiln or require "kiln"
local common = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "bench/") .. "common.lua")
local dist, nn = kiln.dist, kiln.nn

-- ResNet-50's parameters in order: convolutions (no bias) each followed by a batch norm (2 x C)
local function resnet50_bytes()
  local sizes = {}
  local function conv(cin, cout, k) sizes[#sizes + 1] = cin * cout * k * k sizes[#sizes + 1] = 2 * cout end
  conv(3, 64, 7)
  local cin = 64
  for stage, blocks in ipairs{3, 4, 6, 3} do
    local width = 64 * 2 ^ (stage - 1)
    for b = 1, blocks do
      conv(cin, width, 1) conv(width, width, 3) conv(width, width * 4, 1)
      if b == 1 then conv(cin, width * 4, 1) end
      cin = width * 4
    end
  end
  sizes[#sizes + 1] = 2048 * 1000
  sizes[#sizes + 1] = 1000
  local bytes, total = {}, 0
  for i, n in ipairs(sizes) do bytes[i] = 4 * n total = total + n end
  return bytes, total
end

-- the char-LM: its parameters, and its training step measured here
local function char_lm()
  kiln.set_num_threads(1)
  kiln.manual_seed(1)
  local V, E, H, T, B = 96, 64, 256, 64, 32
  local embed, lstm, head = nn.Embedding(V, E), nn.LSTM(E, H), nn.Linear(H, V)
  local params = {}
  for _, m in ipairs{embed, lstm, head} do for _, p in ipairs(m:parameters()) do params[#params + 1] = p end end
  local opt = kiln.optim.Adam(params, {lr = 3e-3})
  local x, y = kiln.randint(1, V + 1, {T, B}), kiln.randint(1, V + 1, {T * B})
  local times = {}
  for i = 1, common.quick and 12 or 32 do
    local t0 = common.now()
    opt:zero_grad()
    local out = lstm(embed(x))
    local loss = kiln.nn.functional.cross_entropy(head(out:reshape(T * B, H)), y)
    loss:backward()
    opt:step()
    if i > 2 then times[#times + 1] = common.now() - t0 end
  end
  local mean, var = 0, 0
  for _, t in ipairs(times) do mean = mean + t / #times end
  for _, t in ipairs(times) do var = var + (t - mean) ^ 2 / (#times - 1) end
  local bytes, total = {}, 0
  for i, p in ipairs(params) do bytes[i] = 4 * p:numel() total = total + p:numel() end
  return bytes, total, common.median(times), math.sqrt(var) / mean
end

local gpus = {8, 16, 32, 64, 128, 256}
local rn_bytes, rn_params = resnet50_bytes()
local lm_bytes, lm_params, lm_step, lm_jitter = char_lm()
for _, m in ipairs{{"resnet50", rn_bytes, rn_params, 0.085, 0.02, "assumed (H100/H200-class, mixed precision)"},
                   {"char_lm", lm_bytes, lm_params, lm_step, lm_jitter, "measured here, 1 CPU thread"}} do
  local buckets = dist.buckets_of(m[2])
  for _, row in ipairs(dist.simulate{step_s = m[4], jitter = m[5], buckets = buckets, gpus = gpus}) do
    kiln.ui.json{bench = "scaling_model", model = m[1], params = m[3], buckets = #buckets, single_step_ms = m[4] * 1e3,
                 jitter = m[5], step_source = m[6], gpus = row.gpus, step_ms = row.step_s * 1e3, efficiency = row.efficiency,
                 exposed_comm_ms = row.exposed_comm_s * 1e3, straggler_ms = row.straggler_s * 1e3, algorithm = row.algorithm}
  end
end
-- published points, for comparison
for _, p in ipairs{{"PyTorch DDP", "about 0.90"}, {"Horovod", "about 0.90"},
                   {"image models, multi-ring all-reduce, 256 GPUs", 0.95}} do
  kiln.ui.json{bench = "scaling_published", system = p[1], efficiency = p[2]}
end
