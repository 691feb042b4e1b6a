-- bench/train_step.lua: median training-step time (forward, backward, SGD momentum update) of
-- the MLP (784-512-256-10, batch 128) and the CNN (conv5x5 1->32, pool, conv5x5 32->64, pool,
-- 1024-1024-10, batch 64), at 1 and 2 threads, beside PyTorch CPU in the same run when python3
-- has torch (bench/train_step.py; PyTorch with OMP_WAIT_POLICY=passive), and each step's floor: its
-- GEMM FLOP at the rate of a 1024x1024 product in the same run. One JSON line per result; beside
-- each median the best rep (best_ms, and best_ratio / best_speedup from the best reps): on a shared
-- machine whose neighbours slow a rep, the best reps compare the code.
-- With --amp bf16 the steps run under kiln.amp.autocast("bf16") and the peer under
-- torch.autocast("cpu", dtype=torch.bfloat16), kiln's f32 step is measured too (train_step_amp_speedup);
-- the floor stays the f32 one. Both sides warm up untimed for a second first, kiln until its first
-- garbage collection too (see step_ms).
-- With --pairs N, kiln and the peer are measured alternately, N times per model and thread count
-- (the peer a process each time), and train_step_pairs gives the median of the N ratios: the
-- figure to quote on a shared machine whose load changes from minute to minute.
-- usage: kiln bench/train_step.lua [--quick] [--no-peer] [--amp bf16] [--pairs N]
local kiln = kiln or require "kiln"
local nn, optim = kiln.nn, kiln.optim
local common = require "bench.common"
local quick, now, median = common.quick, common.now, common.median
local amp_dtype, pairs_n
for i, a in ipairs(arg or {}) do
  if a == "--amp" then amp_dtype = arg[i + 1] elseif a == "--pairs" then pairs_n = tonumber(arg[i + 1]) end
end

-- GEMM FLOP of one step (forward, grad of the input where it is needed, grad of the weight): a
-- Linear of n_in -> n_out on a batch B is 2*B*n_in*n_out each; a convolution is its im2col product,
-- 2*B*C_out*OH*OW*C_in*k*k each. The first layer's input needs no grad.
local function linear_flop(B, n_in, n_out, first) return 2 * B * n_in * n_out * (first and 2 or 3) end
local function conv_flop(B, c_in, c_out, oh, k, first) return 2 * B * c_out * oh * oh * c_in * k * k * (first and 2 or 3) end

local models = {
  {name = "mlp", batch = 128, flop = linear_flop(128, 784, 512, true) + linear_flop(128, 512, 256) + linear_flop(128, 256, 10),
   make = function()
    return nn.Sequential{nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10)}
  end},
  {name = "cnn", batch = 64, flop = conv_flop(64, 1, 32, 24, 5, true) + conv_flop(64, 32, 64, 8, 5) +
                                    linear_flop(64, 1024, 1024) + linear_flop(64, 1024, 10),
   make = function()
    return nn.Sequential{nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)}
  end},
}

-- One model's step, its state kept between calls (for --pairs): median and best ms of reps of
-- steps after the warm-up; with --amp also kiln's f32 step (median, best).
local function session(m)
  kiln.manual_seed(0)
  local model = m.make()
  local opt = optim.SGD(model:parameters(), {lr = 0.01, momentum = 0.9})
  local loss_fn = nn.CrossEntropyLoss()
  local x = kiln.randn(m.batch, 1, 28, 28)
  local y = kiln.randint(1, 11, {m.batch})
  local steps, reps = quick and 10 or 40, quick and 3 or 7
  local function step_ms(dtype)
    local function step()
      opt:zero_grad()
      local loss = kiln.amp.autocast(dtype, function() return loss_fn(model(x), y) end)
      loss:backward()
      opt:step()
    end
    -- untimed: 5 steps, then on for a second (a quarter quick), and until kiln has collected its
    -- garbage once (at most 10 s): before its first collection each step's garbage lands in pages
    -- the process has not touched yet (docs/tensors.md, "Memory"), a cost of the run's first
    -- ~170 MLP steps that the steady state does not have. The peer warms up for the same second.
    for _ = 1, 5 do step() end
    local t0, collections = now(), kiln.memory_stats().collections
    while now() - t0 < (quick and 0.25 or 1) or (kiln.memory_stats().collections == collections and now() - t0 < 10) do
      step()
    end
    local times = {}
    for _ = 1, reps do
      local t0 = now()
      for _ = 1, steps do step() end
      times[#times + 1] = (now() - t0) / steps * 1000
    end
    return median(times), math.min(unpack(times)), reps, steps
  end
  return step_ms
end

-- The peer's median and best ms for one model at a thread count (a process of its own), or nil.
local function peer_once(name, threads)
  local ms, best
  common.peer_lines("bench/train_step.py --model " .. name .. (amp_dtype and " --amp " .. amp_dtype or ""), function(line)
    if line:match('"model": "(%w+)"') == name then
      ms, best = tonumber(line:match('"ms_per_step": ([%d%.e%-]+)')), tonumber(line:match('"best_ms": ([%d%.e%-]+)'))
    end
  end, {threads}, true)
  return ms, best
end

if pairs_n then
  -- kiln and the peer alternately, pairs_n times per model and thread count: each ratio compares two
  -- measurements taken seconds apart, so that a shared machine's slow minutes hit both sides
  for _, threads in ipairs{1, 2} do
    kiln.set_num_threads(threads)
    for _, m in ipairs(models) do
      local step_ms = session(m)
      local ratios, ks, ps = {}, {}, {}
      for _ = 1, pairs_n do
        local k = step_ms(amp_dtype)
        local p = peer_once(m.name, threads)
        if not p then break end
        ks[#ks + 1], ps[#ps + 1], ratios[#ratios + 1] = k, p, k / p
      end
      if #ratios > 0 then
        kiln.ui.json{bench = "train_step_pairs", model = m.name, threads = threads, amp = amp_dtype, pairs = #ratios,
                     ratio = median(ratios), ratios = ratios, kiln_ms = median(ks), pytorch_ms = median(ps)}
      end
    end
  end
  os.exit(0)
end

local ours = {}
for _, threads in ipairs{1, 2} do
  kiln.set_num_threads(threads)
  local peak = common.sgemm_gflops()
  kiln.ui.json{bench = "sgemm_peak", n = 1024, threads = threads, gflops = peak, f32_gemm = kiln.info().blas.f32_gemm}
  for _, m in ipairs(models) do
    local step_ms = session(m)
    local ms, best, reps, steps = step_ms(amp_dtype)
    if amp_dtype then   -- kiln's f32 step in the same run, for the speedup
      local f32, f32_best = step_ms(nil)
      kiln.ui.json{bench = "train_step_amp_speedup", model = m.name, amp = amp_dtype, threads = threads, f32_ms = f32,
                   amp_ms = ms, speedup = f32 / ms, best_speedup = f32_best / best}
    end
    ours[m.name .. threads], ours[m.name .. "_best" .. threads] = ms, best
    kiln.ui.json{bench = "train_step", impl = "kiln", model = m.name, batch = m.batch, threads = threads, amp = amp_dtype,
                 ms_per_step = ms, best_ms = best, reps = reps, steps_per_rep = steps}
    -- the floor: the step's GEMM FLOP at the rate of a large product, measured in this run
    local floor = m.flop / peak / 1e6
    kiln.ui.json{bench = "train_step_floor", model = m.name, threads = threads, gemm_gflop = m.flop / 1e9,
                 floor_ms = floor, ms_per_step = ms, ratio_to_floor = ms / floor}
  end
end

common.peer_lines("bench/train_step.py" .. (amp_dtype and " --amp " .. amp_dtype or ""), function(line, threads)
  local model = line:match('"model": "(%w+)"')
  local ms = tonumber(line:match('"ms_per_step": ([%d%.e%-]+)'))
  local best = tonumber(line:match('"best_ms": ([%d%.e%-]+)'))
  if model and ms and ours[model .. threads] then
    kiln.ui.json{bench = "train_step_ratio", model = model, threads = threads, amp = amp_dtype, kiln_ms = ours[model .. threads],
                 pytorch_ms = ms, ratio = ours[model .. threads] / ms,
                 best_ratio = best and ours[model .. "_best" .. threads] / best or nil}
  end
end)
