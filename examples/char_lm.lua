-- examples/char_lm.lua: a character-level LSTM language model on the English text of Debian's
-- `fortunes` package (or, with --corpus kjv, the King James Bible of its `bible-kjv`): train with truncated backpropagation through time on B parallel streams of
-- the text, report bits per character on a held-out validation split, save the model, and
-- sample text from a saved model at a chosen temperature.
-- usage:
--   kiln examples/char_lm.lua [--minutes M] [--steps N] [--hidden 256] [--embedding 64] [--layers 1]
--        [--seq 64] [--batch-size 32] [--lr 0.003] [--dropout 0] [--threads N] [--seed N] [--corpus DIR|kjv]
--        [--save FILE] [--eval-every STEPS] [--metrics FILE] [--pause-after STEPS] [--model-parallel] [--amp bf16]
--   kiln examples/char_lm.lua --sample FILE [--length 400] [--temperature 0.8] [--prime "The "] [--seed N]
-- Training stops after --minutes of training (default 10) or --steps, whichever comes first; every
-- 20th block of 16 KiB of the corpus (5%) is the validation split. The model is saved with its
-- vocabulary to --save (default char_lm.safetensors) whenever the validation bits per character
-- improve. Adam's learning rate follows a cosine from --lr down to 0 over the budget; dropout
-- acts on the embeddings and on the LSTM's outputs (and between its layers).
-- SIGTERM (a scheduler's stop) ends the current step, saves the model to --save and exits with
-- status 143; --pause-after stops after that step and waits for it (for the test).
-- --model-parallel: one rank of a job (`kiln launch -n 2 examples/char_lm.lua --model-parallel`)
-- whose LSTM's hidden units are split across the ranks (kiln.dist.ParallelLSTM); every rank reads
-- the same batches, and rank 0 logs and saves (the whole model, loadable in one process).
local kiln = kiln or require "kiln"
local nn, optim, ui = kiln.nn, kiln.optim, kiln.ui
local F = require "kiln.functional"
local ffi = require "ffi"

local defaults = {minutes = 10, hidden = 256, embedding = 64, layers = 1, seq = 64, batch_size = 32, lr = 3e-3,
                  dropout = 0, seed = 1, corpus = "/usr/share/games/fortunes", save = "char_lm.safetensors", eval_every = 250,
                  length = 400, temperature = 0.8, prime = "The "}
local opt = ui.parse_args(arg, {name = "char_lm", defaults = defaults, flags = {["model-parallel"] = true},
                                strict = {"threads", "steps", "metrics", "sample", "pause_after", "amp"},
                                numbers = {"threads", "steps", "pause_after"}})
if opt.amp ~= nil and opt.amp ~= "bf16" then ui.usage_error("char_lm", "--amp takes bf16, got " .. tostring(opt.amp)) end
local dist = opt.model_parallel and kiln.dist
if dist then dist.init() end
local lead = not dist or dist.rank() == 0
local function log(...) if lead then ui.log(...) end end
if opt.threads then kiln.set_num_threads(opt.threads) end
kiln.manual_seed(opt.seed)

pcall(ffi.cdef, "typedef struct { long tv_sec; long tv_nsec; } kiln_example_ts; int clock_gettime(int, kiln_example_ts *);")
local ts = ffi.new("kiln_example_ts")
local function now() ffi.C.clock_gettime(1, ts) return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9 end

-- ---- the model ----

-- embedding, dropout, LSTM, dropout, linear (the dropouts act in training mode only)
local function make_model(vocab, o)
  local lstm
  if o.model_parallel then
    if o.layers > 1 and (o.dropout or 0) > 0 then error("char_lm: --model-parallel has no dropout between LSTM layers", 0) end
    lstm = kiln.dist.ParallelLSTM(o.embedding, o.hidden, {num_layers = o.layers})
  else
    lstm = nn.LSTM(o.embedding, o.hidden, {num_layers = o.layers, dropout = o.layers > 1 and o.dropout or 0})
  end
  return nn.Sequential{
    nn.Embedding(vocab, o.embedding),
    nn.Dropout(o.dropout or 0),
    lstm,
    nn.Dropout(o.dropout or 0),
    nn.Linear(o.hidden, vocab),
  }
end

-- logits [T*B, V] and the final states for inputs [T,B] (class indices) and states (or nil)
local function run(model, x, state)
  local emb, drop_in, lstm, drop_out, head = model:get(1), model:get(2), model:get(3), model:get(4), model:get(5)
  local out, s = lstm(drop_in(emb(x)), state)
  local T, B = x:size(1), x:size(2)
  return head(drop_out(out):reshape(T * B, lstm.hidden_size)), s
end

-- ---- sampling from a saved model ----

if opt.sample then
  local tensors, meta = kiln.load(opt.sample)
  if not meta.vocab then error("char_lm: " .. opt.sample .. " has no vocabulary in its metadata; was it saved by char_lm?", 0) end
  local bytes = {}
  for b in meta.vocab:gmatch("%d+") do bytes[#bytes + 1] = tonumber(b) end
  local index = {}
  for i, b in ipairs(bytes) do index[b] = i end
  local o = {embedding = tonumber(meta.embedding), hidden = tonumber(meta.hidden), layers = tonumber(meta.layers)}
  local model = make_model(#bytes, o)
  model:load_state_dict(tensors)
  model:eval()
  local out, state = {}, nil
  kiln.no_grad(function()
    local function feed(b)
      local i = index[b]
      if not i then error(string.format("char_lm: the prime has a character (byte %d) the model never saw", b), 0) end
      local logits
      logits, state = run(model, kiln.tensor({{i}}, {dtype = "i64"}), state)
      return logits
    end
    local logits
    for k = 1, #opt.prime do logits = feed(opt.prime:byte(k)) out[#out + 1] = opt.prime:sub(k, k) end
    for _ = 1, opt.length do
      local p = F.softmax(logits:reshape(-1) / opt.temperature, 1):totable()
      local u, acc, pick = kiln.rand(1):item(), 0, #p
      for i = 1, #p do acc = acc + p[i] if u <= acc then pick = i break end end
      out[#out + 1] = string.char(bytes[pick])
      logits = feed(bytes[pick])
    end
  end)
  io.write(table.concat(out), "\n")
  return
end

-- ---- the corpus ----

-- the King James Bible as the `bible` program of Debian's bible-kjv package prints it: chapter
-- headings, then one numbered verse per line
local function read_bible()
  local lfs = require "lfs"
  local exe
  for _, path in ipairs{"/usr/bin/bible", "/usr/games/bible"} do
    if lfs.attributes(path, "mode") == "file" then exe = path end
  end
  if not exe then
    error("char_lm: --corpus kjv needs the `bible` program (install Debian's bible-kjv package: sudo apt-get install bible-kjv)", 0)
  end
  local p = assert(io.popen(exe .. " -l4000 gen1:1-rev22:21 2>&1", "r"))
  local text = p:read("*a")
  p:close()
  if #text < 4000000 or not text:find("In the beginning God created the heaven and the earth.", 1, true) then
    error("char_lm: " .. exe .. " did not print the King James Bible (" .. #text .. " bytes: "
          .. text:sub(1, 200):gsub("%s+", " ") .. ")", 0)
  end
  return text, {"the King James Bible"}
end

local function read_corpus(dir)
  if dir == "kjv" then return read_bible() end
  local lfs = require "lfs"
  if not lfs.attributes(dir) then
    error("char_lm: no corpus at " .. dir .. " (install Debian's fortunes package: sudo apt-get install fortunes)", 0)
  end
  local names = {}
  for name in lfs.dir(dir) do
    local path = dir .. "/" .. name
    -- the plain text files: not the .dat indexes, not the .u8 links, not the ASCII-art collections
    if not name:match("%.") and not name:match("art") and lfs.attributes(path, "mode") == "file" then names[#names + 1] = name end
  end
  table.sort(names)
  if #names == 0 then error("char_lm: no text files in " .. dir, 0) end
  local parts = {}
  for _, name in ipairs(names) do
    local f = assert(io.open(dir .. "/" .. name, "rb"))
    parts[#parts + 1] = f:read("*a")
    f:close()
  end
  return table.concat(parts), names
end

local text, files = read_corpus(opt.corpus)
local seen, bytes, index = {}, {}, {}
for i = 1, #text do seen[text:byte(i)] = true end
for b = 0, 255 do if seen[b] then bytes[#bytes + 1] = b index[b] = #bytes end end
local V = #bytes

-- the text as class indices 1..V, split into training and validation: every 20th block of 16 KiB
-- (smaller for a small corpus)
-- (5% of the text, spread over every file) is validation
local function encode(parts, n)
  local t = kiln.empty(n, {dtype = "i64"})
  local p = ffi.cast("int64_t *", t.p.storage.data) + t.p.offset
  local k = 0
  for _, s in ipairs(parts) do
    for i = 1, #s do p[k] = index[s:byte(i)] k = k + 1 end
  end
  return t
end
local BLOCK = math.max(256, math.min(16384, math.floor(#text / 40)))   -- at least two validation blocks
local train_parts, valid_parts, n_train, n_valid = {}, {}, 0, 0
for b = 0, math.ceil(#text / BLOCK) - 1 do
  local piece = text:sub(b * BLOCK + 1, (b + 1) * BLOCK)
  if b % 20 == 10 then valid_parts[#valid_parts + 1] = piece n_valid = n_valid + #piece
  else train_parts[#train_parts + 1] = piece n_train = n_train + #piece end
end
local train_ids = encode(train_parts, n_train)
local valid_ids = encode(valid_parts, n_valid)

-- B streams: the split cut into B rows; step s reads columns s*T+1 .. s*T+T (inputs) and one
-- further (targets), so that each row's state carries on from its previous window.
local function streams(ids, B)
  local L = math.floor((ids:size(1) - 1) / B)
  return ids:narrow(1, 1, B * L):view(B, L), ids:narrow(1, 2, B * L):view(B, L), L
end

local T, B = opt.seq, opt.batch_size
local train_x, train_y, train_len = streams(train_ids, B)
local windows = math.floor(train_len / T)

local model = make_model(V, opt)
local adam = optim.Adam(model:parameters(), {lr = opt.lr})
local lstm = model:get(3)

log("kiln %s: char-LM on %s: %d training and %d validation characters, vocabulary %d", kiln.version,
       opt.corpus == "kjv" and files[1] or string.format("%d files of %s", #files, opt.corpus),
       train_ids:size(1), valid_ids:size(1), V)
log("model: embedding %d, LSTM %d x %d layer(s) (%s), %d parameters; seq %d, batch %d, Adam %.g, %d threads",
    opt.embedding, opt.hidden, opt.layers,
    dist and string.format("split across %d ranks", dist.world_size()) or (lstm:algorithm_for(B)),
    model:num_parameters(), T, B, opt.lr, kiln.get_num_threads())
if opt.amp == "bf16" then log("autocast bf16; bf16 products on this CPU: %s", kiln.info().blas.bf16_products) end

local function detach(s) return {s[1]:detach(), s[2]:detach()} end

-- bits per character over the validation split, in B streams of windows of T
local function validate()
  model:eval()
  local vx, vy, vlen = streams(valid_ids, B)
  local total, count, state = 0, 0, nil
  kiln.no_grad(function()
    for s = 0, math.floor(vlen / T) - 1 do
      local x = vx:narrow(2, s * T + 1, T):t():contiguous()
      local y = vy:narrow(2, s * T + 1, T):t():contiguous():reshape(-1)
      local logits
      logits, state = run(model, x, state)
      total = total + F.cross_entropy(logits, y, {reduction = "sum"}):item()
      count = count + T * B
    end
  end)
  model:train()
  return total / count / math.log(2)
end

local metrics = lead and opt.metrics and ui.metrics(opt.metrics)
local start, step, best = now(), 0, math.huge
local state, window, epoch = nil, 0, 1
local smooth
local deadline = start + opt.minutes * 60
-- (model parallel: every rank gathers the whole LSTM, rank 0 writes it)
local function save(bpc)
  local tensors = {}
  for k, v in pairs(dist and dist.full_state_dict(model) or model:state_dict()) do tensors[k] = v end
  if not lead then return end
  kiln.save(opt.save, tensors, {vocab = table.concat(bytes, ","), embedding = opt.embedding, hidden = opt.hidden,
                                layers = opt.layers, valid_bpc = bpc or "", step = step})
end

-- Gradient clipping by the norm of all the model's gradients: with the LSTM split across ranks,
-- its shares' squares are summed over ranks, the rest counted once, so every rank scales alike.
local function clip(max_norm)
  if not dist then return optim.clip_grad_norm(model:parameters(), max_norm) end
  local shared, split = 0, 0
  for _, p in ipairs(lstm:parameters()) do if p.grad then split = split + p.grad:double():pow(2):sum():item() end end
  local in_lstm = {}
  for _, p in ipairs(lstm:parameters()) do in_lstm[p] = true end
  for _, p in ipairs(model:parameters()) do
    if not in_lstm[p] and p.grad then shared = shared + p.grad:double():pow(2):sum():item() end
  end
  split = dist.all_reduce(kiln.tensor({split}, {dtype = "f64"}))[1]
  local norm = math.sqrt(shared + split)
  if norm > max_norm then
    local scale = max_norm / (norm + 1e-6)
    kiln.no_grad(function() for _, p in ipairs(model:parameters()) do if p.grad then p.grad:mul_(scale) end end end)
  end
  return norm
end

pcall(ffi.cdef, "int kiln_example_pause(void) __asm__(\"pause\");")
kiln.catch_terminate()

-- the learning rate falls along a cosine over the time budget (or the step budget when it is shorter)
local function progress()
  local p = (now() - start) / (deadline - start)
  if opt.steps then p = math.max(p, step / opt.steps) end
  return math.min(p, 1)
end

while now() < deadline and (not opt.steps or step < opt.steps) do
  adam.param_groups[1].lr = opt.lr * 0.5 * (1 + math.cos(math.pi * progress()))
  if window >= windows then window, state, epoch = 0, nil, epoch + 1 end
  local x = train_x:narrow(2, window * T + 1, T):t():contiguous()
  local y = train_y:narrow(2, window * T + 1, T):t():contiguous():reshape(-1)
  window = window + 1
  adam:zero_grad()
  local logits, loss
  logits, state, loss = kiln.amp.autocast(opt.amp, function()
    local lg, st = run(model, x, state)
    return lg, st, F.cross_entropy(lg, y)
  end)
  state = detach(state)
  loss:backward()
  clip(5)
  adam:step()
  step = step + 1
  if opt.pause_after == step then
    log("paused after step %d; waiting to be stopped", step)
    while not kiln.terminate_requested() do ffi.C.kiln_example_pause() end
  end
  if kiln.terminate_requested() then
    save(best < math.huge and best or nil)
    log("terminated after step %d: the model written to %s", step, opt.save)
    os.exit(143)
  end
  local l = loss:item()
  if l ~= l then error(string.format("char_lm: the loss is NaN at step %d; try a smaller --lr", step), 0) end
  smooth = smooth and 0.98 * smooth + 0.02 * l or l
  if step % opt.eval_every == 0 then
    local bpc = validate()
    local elapsed = now() - start
    log("step %d (epoch %d, %.0f s): train %.3f bpc, validation %.3f bpc, %.0f chars/s", step, epoch, elapsed,
        smooth / math.log(2), bpc, step * T * B / elapsed)
    if metrics then metrics:log{step = step, epoch = epoch, loss = smooth, valid_bpc = bpc, time = elapsed} end
    if bpc < best then best = bpc save(bpc) end
  end
end

local bpc = validate()
local elapsed = now() - start
if bpc < best then best = bpc save(bpc) end
if metrics then metrics:log{step = step, epoch = epoch, valid_bpc = bpc, time = elapsed} metrics:close() end
if lead then
  ui.json{example = "char_lm", steps = step, epochs = epoch, seconds = elapsed, threads = kiln.get_num_threads(),
          valid_bpc = bpc, best_valid_bpc = best, chars_per_second = step * T * B / elapsed, saved = opt.save,
          ranks = dist and dist.world_size() or nil, amp = opt.amp}
end
