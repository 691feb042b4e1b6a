-- examples/speech_digits.lua: speech recognition in miniature, waveform in, characters out. Spoken
-- digit strings ("seven three one") synthesised with espeak-ng in 16 training voices, log-mel
-- features computed in C (kiln.audio), a conv front end and a bidirectional GRU trained with CTC,
-- and the character error rate (CER) on held-out utterances spoken by 8 voices training never hears.
-- usage: kiln examples/speech_digits.lua [--epochs N] [--batch-size N] [--lr X] [--threads N] [--seed N]
--        [--train-utterances N] [--test-utterances N] [--data DIR] [--data-seed N] [--hidden N]
--        [--layers N] [--channels N] [--beam N] [--metrics FILE] [--save FILE] [--pause-after STEPS] [--amp bf16]
-- The WAVs are cached under --data (default build/data/speech_digits); a second run synthesises
-- nothing. The alphabet is the space and the 15 letters of "zero" .. "nine" (16 characters; class 1
-- is the CTC blank). --beam 0 decodes greedily (the default), N > 0 with a prefix beam of N.
-- --metrics appends one JSON line per step and per epoch; --save writes the weights (safetensors).
-- The run ends with one JSON line of results. SIGTERM (a scheduler's stop) ends the current step,
-- writes the weights to --save (default speech_digits.safetensors then) and exits with status 143;
-- --pause-after stops after that step and waits for it (for the test).
local kiln = kiln or require "kiln"
local nn, optim, ui = kiln.nn, kiln.optim, kiln.ui
local F = require "kiln.functional"
local digits = require "datasets.speech_digits"

local flags = {}   -- options without a value
local defaults = {epochs = 12, batch_size = 32, lr = 2e-3, seed = 1, data_seed = 1, train_utterances = 2400,
                  test_utterances = 400, data = "build/data/speech_digits", hidden = 128, layers = 2, channels = 128,
                  beam = 0}

local opt = ui.parse_args(arg, {name = "speech_digits", flags = flags, defaults = defaults,
                                strict = {"threads", "metrics", "save", "pause_after", "amp"}, numbers = {"threads", "pause_after"}})
if opt.amp ~= nil and opt.amp ~= "bf16" then ui.usage_error("speech_digits", "--amp takes bf16, got " .. tostring(opt.amp)) end
if opt.threads then kiln.set_num_threads(opt.threads) end
kiln.manual_seed(opt.seed)

-- ---- data ----

local t_data = ui.clock()
local train = digits.load{split = "train", count = opt.train_utterances, seed = opt.data_seed, dir = opt.data}
local test = digits.load{split = "test", count = opt.test_utterances, seed = opt.data_seed, dir = opt.data}
local frames = 0
for _, f in ipairs(train.features) do frames = frames + f:size(1) end
ui.log("data: %d training utterances (%d voices), %d held-out (%d other voices), %d synthesised now, %.1f s of audio "
       .. "per utterance on average, features in %.1f s", #train.texts, #digits.voices.train, #test.texts,
       #digits.voices.test, train.synthesised + test.synthesised, frames / #train.texts / 100, ui.clock() - t_data)

-- ---- the model ----
-- x [T,B,40] -> conv1d (stride 2: 20 ms per step) -> conv1d -> bidirectional GRU -> linear -> log-probs [T',B,17].

local SpeechCTC = nn.define("SpeechCTC")
function SpeechCTC:init(o)
  self.conv1 = nn.Conv1d(digits.n_mels, o.channels, 5, {stride = 2, padding = 2})
  self.conv2 = nn.Conv1d(o.channels, o.channels, 3, {padding = 1})
  self.gru = nn.GRU(o.channels, o.hidden, {num_layers = o.layers, bidirectional = true})
  self.head = nn.Linear(2 * o.hidden, digits.num_classes)
end

-- The number of output steps of an utterance of n frames (conv1: kernel 5, stride 2, padding 2).
function SpeechCTC.out_length(n) return math.floor((n - 1) / 2) + 1 end

-- forward(x [T,B,n_mels], lengths {B}) -> log-probs [T',B,classes], output lengths {B}. The frames
-- past each utterance's end are zeros, which is also what the convolutions pad with, so a padded
-- batch gives each utterance the same outputs as alone; the GRU is told the lengths.
function SpeechCTC:forward(x, lengths)
  local out_lengths = {}
  for b, n in ipairs(lengths) do out_lengths[b] = SpeechCTC.out_length(n) end
  local h = x:permute(2, 3, 1):contiguous()                 -- [B,n_mels,T]
  h = self.conv1(h):relu()                                  -- [B,C,T']
  h = self.conv2(h):relu()
  h = h:permute(3, 1, 2):contiguous()                       -- [T',B,C]
  h = self.gru(h, nil, out_lengths)                         -- [T',B,2H]
  return F.log_softmax(self.head(h), 3), out_lengths
end

local model = nn.SpeechCTC(opt)
local params = model:parameters()
local adam = optim.Adam(params, {lr = opt.lr})
local steps_per_epoch = math.ceil(#train.texts / opt.batch_size)
local schedule = optim.lr_scheduler.OneCycleLR(adam, {max_lr = opt.lr, total_steps = opt.epochs * steps_per_epoch,
                                                       pct_start = 0.15})

ui.log("kiln %s: conv + %d-layer bidirectional GRU (%d hidden), %d parameters, %d classes, %d threads, seed %d",
       kiln.version, opt.layers, opt.hidden, model:num_parameters(), digits.num_classes, kiln.get_num_threads(), opt.seed)
if opt.amp == "bf16" then ui.log("autocast bf16; bf16 products on this CPU: %s", kiln.info().blas.bf16_products) end

-- ---- batches ----
-- Each epoch shuffles the utterances, sorts runs of 16 batches by length (less padding) and
-- shuffles the batches; the order depends only on (seed, epoch).

local function shuffled(n, random)
  local p = {}
  for i = 1, n do p[i] = i end
  for i = n, 2, -1 do
    local j = random(1, i)
    p[i], p[j] = p[j], p[i]
  end
  return p
end

local function epoch_batches(set, epoch, batch_size)
  local seed = opt.seed * 100003 + epoch
  local s = seed % 2147483646 + 1
  local function random(lo, hi)
    s = (s * 16807) % 2147483647
    return lo + math.floor((s - 1) / 2147483646 * (hi - lo + 1))
  end
  local order = shuffled(#set.features, random)
  local batches, run = {}, batch_size * 16
  for first = 1, #order, run do
    local chunk = {}
    for i = first, math.min(first + run - 1, #order) do chunk[#chunk + 1] = order[i] end
    table.sort(chunk, function(a, b)
      local la, lb = set.features[a]:size(1), set.features[b]:size(1)
      if la ~= lb then return la < lb end
      return a < b
    end)
    for i = 1, #chunk, batch_size do
      local b = {}
      for k = i, math.min(i + batch_size - 1, #chunk) do b[#b + 1] = chunk[k] end
      batches[#batches + 1] = b
    end
  end
  local p = shuffled(#batches, random)
  local out = {}
  for i, k in ipairs(p) do out[i] = batches[k] end
  return out
end

-- ---- evaluation ----

local function decode(lp, lengths)
  if opt.beam > 0 then return (F.ctc_beam_decode(lp, lengths, {beam = opt.beam, blank = digits.blank})) end
  return F.ctc_greedy_decode(lp, lengths, digits.blank)
end

-- The CER over the held-out set, and the decoded strings.
local function evaluate(set)
  model:eval()
  local hyps = {}
  kiln.no_grad(function()
    local all = {}
    for i = 1, #set.features do all[i] = i end
    table.sort(all, function(a, b) return set.features[a]:size(1) < set.features[b]:size(1) end)
    for first = 1, #all, 64 do
      local idx = {}
      for i = first, math.min(first + 63, #all) do idx[#idx + 1] = all[i] end
      local x, lengths = digits.batch(set, idx)
      local lp, out_lengths = model(x, lengths)
      for b, seq in ipairs(decode(lp, out_lengths)) do hyps[idx[b]] = digits.decode(seq) end
    end
  end)
  model:train()
  return digits.cer(hyps, set.texts), hyps
end

-- ---- training ----

local metrics = opt.metrics and ui.metrics(opt.metrics)
local train_seconds, step, cer, last_loss, hyps = 0, 0, 1, nil, nil
local ffi = require "ffi"
pcall(ffi.cdef, "int kiln_example_pause(void) __asm__(\"pause\");")
kiln.catch_terminate()
local losses = {}
for epoch = 1, opt.epochs do
  local bar = ui.progress{total = #train.texts, desc = string.format("epoch %d/%d", epoch, opt.epochs)}
  local t0 = ui.clock()
  local sum, count = 0, 0
  for _, idx in ipairs(epoch_batches(train, epoch, opt.batch_size)) do
    local x, lengths, targets = digits.batch(train, idx)
    local loss = kiln.amp.autocast(opt.amp, function()
      local lp, out_lengths = model(x, lengths)
      return F.ctc_loss(lp, targets, out_lengths, {blank = digits.blank, reduction = "mean", zero_infinity = true})
    end)
    adam:zero_grad()
    loss:backward()
    optim.clip_grad_norm(params, 5)
    local lr = adam.param_groups[1].lr
    adam:step()
    schedule:step()
    local l = loss:item()
    if l ~= l then error(string.format("speech_digits: the loss became NaN at epoch %d, step %d", epoch, step + 1), 0) end
    step, sum, count = step + 1, sum + l, count + 1
    losses[#losses + 1] = l
    bar:update(#idx, {loss = string.format("%.3f", sum / count)})
    if metrics then metrics:log{step = step, epoch = epoch, loss = l, lr = lr} end
    if opt.pause_after == step then
      ui.log("paused after step %d; waiting to be stopped", step)
      while not kiln.terminate_requested() do ffi.C.kiln_example_pause() end
    end
    if kiln.terminate_requested() then   -- SIGTERM: the step is done; keep the weights, and stop
      bar:close()
      local path = opt.save or "speech_digits.safetensors"
      kiln.save(path, model:state_dict(), {step = step, epoch = epoch})
      ui.log("terminated after step %d: the weights written to %s", step, path)
      os.exit(143)
    end
  end
  bar:close()
  local epoch_seconds = ui.clock() - t0
  train_seconds = train_seconds + epoch_seconds
  last_loss = sum / count
  local t1 = ui.clock()
  cer, hyps = evaluate(test)
  ui.log("epoch %d: train loss %.4f, held-out CER %.4f, %.1f s (+ %.1f s evaluation)", epoch, last_loss, cer,
         epoch_seconds, ui.clock() - t1)
  if metrics then metrics:log{step = step, epoch = epoch, train_loss = last_loss, cer = cer} end
end

-- a few held-out utterances, and the first few that came out wrong
local shown, wrong = 0, 0
for i = 1, #test.texts do
  local ok = hyps[i] == test.texts[i]
  if not ok then wrong = wrong + 1 end
  if i <= 4 or (not ok and shown < 8) then
    local u = test.utterances[i]
    ui.log("  %-26s ref %-38s got %s%s", string.format("%s s%d p%d", u.voice, u.speed, u.pitch), '"' .. test.texts[i] .. '"',
           '"' .. hyps[i] .. '"', ok and "" or string.format("  (edit distance %d)", digits.edit_distance(hyps[i], test.texts[i])))
    shown = shown + 1
  end
end
local utterance_accuracy = 1 - wrong / math.max(1, #test.texts)
ui.log("held-out: CER %.4f, %d of %d utterances exactly right (%.1f%%), training %.1f s on %d threads", cer,
       #test.texts - wrong, #test.texts, 100 * utterance_accuracy, train_seconds, kiln.get_num_threads())
if opt.save then
  kiln.save(opt.save, model:state_dict())
  ui.log("saved the weights to %s", opt.save)
end

ui.json{example = "speech_digits", epochs = opt.epochs, batch_size = opt.batch_size, lr = opt.lr, threads = kiln.get_num_threads(),
        seed = opt.seed, train_utterances = #train.texts, test_utterances = #test.texts, train_loss = last_loss,
        test_cer = cer, test_utterance_accuracy = utterance_accuracy, amp = opt.amp,
        train_seconds = train_seconds, decoder = opt.beam > 0 and "beam" or "greedy"}
return {cer = cer, losses = losses, hypotheses = hyps}
