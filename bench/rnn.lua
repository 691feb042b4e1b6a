-- bench/rnn.lua: LSTM forward + backward step time (input 256, hidden 256/512/1024, batch
-- 1/4/16/64, sequence 64) on the GEMM path and the persistent path at 1 and 2 threads, and the
-- char-LM training step (embedding 64, LSTM 256, sequence 64, batch 32, vocabulary 96, Adam),
-- beside PyTorch's nn.LSTM in the same run when python3 has torch (bench/rnn.py, with
-- OMP_WAIT_POLICY=passive). Medians (the char-LM's lines also give the best rep: best_ms,
-- best_ratio, best_speedup); one JSON line per result. Each speedup line also gives
-- floor_ms, the layer's FLOP at the rate of a large f32 product (common.sgemm_gflops) at that thread count, and
-- speedup_bound = gemm_ms / floor_ms, what no recurrence could beat by much.
-- With --amp bf16 only the char-LM step runs, in f32 and under kiln.amp.autocast("bf16") (the
-- peer under torch.autocast("cpu", dtype=torch.bfloat16)), with the speedup of bf16 over f32.
-- With --pairs N only the char-LM step runs, kiln's and the peer's alternately N times per
-- thread count (the peer a process each time, bench/rnn.py --char-lm), and char_lm_step_pairs
-- gives the median of the N ratios (as bench/train_step.lua --pairs does).
-- usage: kiln bench/rnn.lua [--quick] [--no-peer] [--amp bf16] [--pairs N]
local kiln = kiln or require "kiln"
local nn, optim = kiln.nn, kiln.optim
local common = require "bench.common"
local quick = common.quick
local amp_dtype, pairs_n
for i, a in ipairs(arg or {}) do
  if a == "--amp" then amp_dtype = arg[i + 1] elseif a == "--pairs" then pairs_n = tonumber(arg[i + 1]) end
end
local function measure(fn) return common.measure(fn) * 1000 end   -- milliseconds

local hiddens = (amp_dtype or pairs_n) and {} or quick and {256} or {256, 512, 1024}
local batches = quick and {1, 16} or {1, 4, 16, 64}
local T, I = 64, 256
local ours = {}
-- The f32 multiply-add rate of a large square product (common.sgemm_gflops), GFLOP/s: every FLOP of a layer
-- at that rate is the time no algorithm of the recurrence beats by much (kiln's persistent
-- products reach about 1.1x of it), so gemm_ms / floor_ms bounds the persistent speedup.
local peak_gflops = common.sgemm_gflops
-- FLOP of one LSTM layer forward + backward: the input projection, the recurrent products, and
-- backward their transposes and the two weight grads.
local function lstm_flop(T, B, I, H) return 2 * T * B * 4 * H * 3 * (I + H) end

for _, threads in ipairs{1, 2} do
  kiln.set_num_threads(threads)
  local peak = peak_gflops()
  kiln.ui.json{bench = "sgemm_peak", n = 1024, threads = threads, gflops = peak, f32_gemm = kiln.info().blas.f32_gemm}
  for _, H in ipairs(hiddens) do
    for _, B in ipairs(batches) do
      for _, algo in ipairs{"gemm", "persistent"} do
        kiln.manual_seed(0)
        local lstm = nn.LSTM(I, H, {algorithm = algo})
        local x = kiln.randn(T, B, I)
        local ms = measure(function()
          lstm:zero_grad()
          local out = lstm(x)
          out:sum():backward()
        end)
        ours[table.concat({"lstm", H, B, threads, algo}, ":")] = ms
        kiln.ui.json{bench = "lstm_step", impl = "kiln", algorithm = algo, input = I, hidden = H, batch = B, seq = T,
                     threads = threads, ms = ms}
      end
      local g, p = ours[table.concat({"lstm", H, B, threads, "gemm"}, ":")], ours[table.concat({"lstm", H, B, threads, "persistent"}, ":")]
      local floor = lstm_flop(T, B, I, H) / peak / 1e6
      kiln.ui.json{bench = "lstm_persistent_speedup", hidden = H, batch = B, threads = threads, gemm_ms = g,
                   persistent_ms = p, speedup = g / p, floor_ms = floor, speedup_bound = g / floor}
    end
  end
  -- the char-LM training step
  kiln.manual_seed(0)
  local V, E, H, B = 96, 64, 256, 32
  local emb, lstm, head = nn.Embedding(V, E), nn.LSTM(E, H), nn.Linear(H, V)
  local params = {}
  for _, m in ipairs{emb, lstm, head} do for _, q in ipairs(m:parameters()) do params[#params + 1] = q end end
  local opt = optim.Adam(params, {lr = 2e-3})
  local x, y = kiln.randint(1, V + 1, {T, B}), kiln.randint(1, V + 1, {T * B})
  local function step_ms(dtype)   -- median and best ms
    local med, best = common.measure(function()
      opt:zero_grad()
      local loss = kiln.amp.autocast(dtype, function()
        local out = lstm(emb(x))
        return require("kiln.functional").cross_entropy(head(out:reshape(T * B, H)), y)
      end)
      loss:backward()
      opt:step()
    end)
    return med * 1000, best * 1000
  end
  if pairs_n then   -- kiln and the peer alternately, seconds apart
    local ratios, ks, ps = {}, {}, {}
    for _ = 1, pairs_n do
      local k, p = step_ms(amp_dtype), nil
      common.peer_lines("bench/rnn.py --char-lm" .. (amp_dtype and " --amp " .. amp_dtype or ""), function(line)
        if line:match('"bench": "char_lm_step"') then p = tonumber(line:match('"ms": ([%d%.e%-]+)')) end
      end, {threads}, true)
      if not p then break end
      ks[#ks + 1], ps[#ps + 1], ratios[#ratios + 1] = k, p, k / p
    end
    if #ratios > 0 then
      kiln.ui.json{bench = "char_lm_step_pairs", threads = threads, amp = amp_dtype, pairs = #ratios,
                   ratio = common.median(ratios), ratios = ratios, kiln_ms = common.median(ks), pytorch_ms = common.median(ps)}
    end
    goto next_threads
  end
  local ms, best = step_ms(amp_dtype)
  ours["charlm:" .. threads], ours["charlm_best:" .. threads] = ms, best
  kiln.ui.json{bench = "char_lm_step", impl = "kiln", algorithm = lstm:algorithm_for(B), vocab = V, embedding = E,
               hidden = H, batch = B, seq = T, threads = threads, amp = amp_dtype, ms = ms, best_ms = best}
  if amp_dtype then
    local f32, f32_best = step_ms(nil)
    kiln.ui.json{bench = "char_lm_amp_speedup", amp = amp_dtype, threads = threads, f32_ms = f32, amp_ms = ms, speedup = f32 / ms,
                 best_speedup = f32_best / best}
  end
  ::next_threads::
end
if pairs_n then os.exit(0) end

common.peer_lines("bench/rnn.py" .. (amp_dtype and " --amp " .. amp_dtype or ""), function(line, threads)
  local bench = line:match('"bench": "([%w_]+)"')
  local ms = tonumber(line:match('"ms": ([%d%.e%-]+)'))
  if bench == "lstm_step" then
    local H, B = tonumber(line:match('"hidden": (%d+)')), tonumber(line:match('"batch": (%d+)'))
    for _, algo in ipairs{"gemm", "persistent"} do
      local k = ours[table.concat({"lstm", H, B, threads, algo}, ":")]
      if k then
        kiln.ui.json{bench = "lstm_step_ratio", algorithm = algo, hidden = H, batch = B, threads = threads, kiln_ms = k,
                     pytorch_ms = ms, ratio = k / ms}
      end
    end
  elseif bench == "char_lm_step" and ours["charlm:" .. threads] then
    local best = tonumber(line:match('"best_ms": ([%d%.e%-]+)'))
    kiln.ui.json{bench = "char_lm_step_ratio", threads = threads, amp = amp_dtype, kiln_ms = ours["charlm:" .. threads], pytorch_ms = ms,
                 ratio = ours["charlm:" .. threads] / ms, best_ratio = best and ours["charlm_best:" .. threads] / best or nil}
  end
end)
