-- kiln.nn recurrent layers: RNN, GRU, LSTM (layers, directions, dropout between layers,
-- sequence lengths) and the cells RNNCell, GRUCell, LSTMCell. Each layer and direction is one
-- fused op (kiln.functional.rnn_layer): the input projection of all steps is one GEMM, each step
-- one fused kernel, and backward through time a C routine. Parameters carry PyTorch's names and
-- layouts (weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0, ..._reverse; gates i,f,g,o for
-- the LSTM and r,z,n for the GRU), so state dicts exchange with PyTorch.
local factory = require "kiln.factory"
local functional = require "kiln.functional"
local core = require "kiln.core"
local amp = require "kiln.amp"
local raise = core.raise

return function(nn)
  local init = nn.init
  local function F() return functional end
  local gates = {rnn_tanh = 1, rnn_relu = 1, gru = 3, lstm = 4}
  local titles = {rnn_tanh = "RNN", rnn_relu = "RNN", gru = "GRU", lstm = "LSTM"}

  local function shape(t) return "[" .. table.concat(t:size(), ",") .. "]" end

  -- Embedding outputs (nn.Embedding:forward records each: nn._embedded_rows): out -> the table, the flat indices and
  -- the three storages' versions then. A layer fed such an output directly, nothing written to
  -- the three since, takes its first input projection as rows of the table projected once,
  -- (weight w_ih^T)[index]: [V, G*H] multiply-adds for V rows instead of for T*B. Weak keys:
  -- nothing here keeps a tensor alive.
  local embedded = setmetatable({}, {__mode = "k"})
  local function version(t) return tonumber(t.p.storage.version) end
  function nn._embedded_rows(out, weight, flat)
    embedded[out] = {weight = weight, flat = flat, v = {version(out), version(weight), version(flat)}}
  end
  -- the table's rows where x is such an output and folding pays (fewer rows in the table than
  -- steps times sequences; the CPU, f32 or f64, autocast off or bf16; nn.fold_embedding ~= false,
  -- as nn.fusion), else nil
  local function embedded_table(x)
    local e = embedded[x]
    if not e or nn.fold_embedding == false or x:dim() ~= 3 then return nil end
    if version(x) ~= e.v[1] or version(e.weight) ~= e.v[2] or version(e.flat) ~= e.v[3] then return nil end
    local dt, lower = x:dtype(), amp.autocast_dtype()
    if x:device() ~= "cpu" or (dt ~= "f32" and dt ~= "f64") or (lower and (lower ~= "bf16" or dt ~= "f32")) then return nil end
    if e.weight:dtype() ~= dt or e.weight:size(1) >= x:size(1) * x:size(2) then return nil end
    return e
  end
  -- the projected table [V, G*H]: weight w_ih^T, or under bf16 autocast the f32 product of the two
  -- rounded to bf16 (what the bf16 layer makes of its rounded input and w_ih), which it reads in f32
  local function projected_table(weight, w_ih)
    if not amp.autocast_dtype() then return F().linear(weight, w_ih) end
    local saved = amp.set_autocast(nil)
    local ok, p = pcall(function() return F().linear(weight:to("bf16"):to("f32"), w_ih:to("bf16"):to("f32")) end)
    amp.set_autocast(saved)
    if not ok then error(p, 0) end
    return p
  end

  -- (input_size, hidden_size, opts) or ({input_size =, hidden_size =, ...})
  local function arguments(name, a, b, c)
    if type(a) == "table" then return a.input_size, a.hidden_size, a end
    return a, b, core.opts_arg(c, name)
  end

  -- the options a layer (cells: fewer) knows; a misspelt one is an error, not a default
  local layer_keys = core.set("input_size", "hidden_size", "num_layers", "nonlinearity", "bias", "batch_first", "dropout",
                              "bidirectional", "algorithm", "dtype")
  local cell_keys = core.set("input_size", "hidden_size", "nonlinearity", "bias", "dtype")
  local function flag(name, what, v, default) return core.flag(v, default, name, what) end

  local function size_check(name, v, what)
    if type(v) ~= "number" or v < 1 or v ~= math.floor(v) then
      core.raise(string.format("%s: %s must be a positive integer, got %s", name, what, core.describe(v)))
    end
  end

  -- ---- the layers ----

  local RNNBase = nn.define("RNNBase")
  -- the layers below are made from it; on its own it has no mode
  function RNNBase:init() core.raise("RNNBase: a base class; make an nn.RNN, nn.GRU or nn.LSTM") end
  function RNNBase:setup(mode, input_size, hidden_size, opts)
    local name = titles[mode]
    opts = core.options(opts, layer_keys, name)
    if mode ~= "rnn_tanh" and mode ~= "rnn_relu" and opts.nonlinearity ~= nil then
      core.raise(name .. ": nonlinearity is an option of nn.RNN only")
    end
    size_check(name, input_size, "input_size")
    size_check(name, hidden_size, "hidden_size")
    self.mode, self.input_size, self.hidden_size = mode, input_size, hidden_size
    self.num_layers = opts.num_layers or 1
    size_check(name, self.num_layers, "num_layers")
    self.bias = flag(name, "bias", opts.bias, true)
    self.batch_first = flag(name, "batch_first", opts.batch_first, false)
    self.dropout = opts.dropout or 0
    if type(self.dropout) ~= "number" or self.dropout < 0 or self.dropout >= 1 then
      error(string.format("%s: dropout %s must be in [0, 1)", name, tostring(self.dropout)), 4)
    end
    self.bidirectional = flag(name, "bidirectional", opts.bidirectional, false)
    self.algorithm = opts.algorithm or "auto"
    local G, D = gates[mode], self.bidirectional and 2 or 1
    for l = 0, self.num_layers - 1 do
      local in_size = l == 0 and input_size or hidden_size * D
      for d = 0, D - 1 do
        local sfx = "_l" .. l .. (d == 1 and "_reverse" or "")
        self["weight_ih" .. sfx] = self:parameter(factory.empty(G * hidden_size, in_size, {dtype = opts.dtype}))
        self["weight_hh" .. sfx] = self:parameter(factory.empty(G * hidden_size, hidden_size, {dtype = opts.dtype}))
        if self.bias then
          self["bias_ih" .. sfx] = self:parameter(factory.empty(G * hidden_size, {dtype = opts.dtype}))
          self["bias_hh" .. sfx] = self:parameter(factory.empty(G * hidden_size, {dtype = opts.dtype}))
        end
      end
    end
    self:reset_parameters()
  end

  -- PyTorch's default: every parameter U(-1/sqrt(hidden), 1/sqrt(hidden)).
  function RNNBase:reset_parameters()
    local bound = 1 / math.sqrt(self.hidden_size)
    for _, p in ipairs(self:parameters()) do init.uniform_(p, -bound, bound) end
  end

  -- The algorithm the layers run for a batch size, and why (see kiln/rnn.h).
  function RNNBase:algorithm_for(batch)
    local w = self.weight_hh_l0
    return F().rnn_algorithm(self.mode, batch, self.hidden_size,
                             {dtype = w:dtype(), device = w:device(), algorithm = self.algorithm})
  end

  -- The initial state of every layer and direction: nil, or [L*D,B,H] (2-d for an unbatched input).
  function RNNBase:initial(h, what, B, unbatched)
    if h == nil then return nil end
    if not factory.is_tensor(h) then raise(string.format("%s: %s must be a tensor, got %s", titles[self.mode], what, type(h))) end
    local LD = self.num_layers * (self.bidirectional and 2 or 1)
    if unbatched and h:dim() == 2 then h = h:unsqueeze(2) end
    if h:dim() ~= 3 or h:size(1) ~= LD or h:size(2) ~= B or h:size(3) ~= self.hidden_size then
      raise(string.format("%s: %s is %s, expected [%d,%d,%d] (layers*directions, batch, hidden_size)",
                          titles[self.mode], what, shape(h), LD, B, self.hidden_size))
    end
    return h
  end

  -- forward(input [T,B,I] ([B,T,I] with batch_first, or [T,I] unbatched), hx, lengths) ->
  -- output [T,B,D*H], h_n [L*D,B,H] (an LSTM returns {h_n, c_n}). hx is h0 (an LSTM: {h0, c0});
  -- lengths (a list or an i64 tensor, one per sequence) leave the steps past each end out.
  function RNNBase:forward(x, hx, lengths)
    local name = titles[self.mode]
    if not factory.is_tensor(x) then raise(string.format("%s: input must be a tensor, got %s", name, type(x))) end
    local unbatched = x:dim() == 2
    if unbatched then x = x:unsqueeze(self.batch_first and 1 or 2) end
    if x:dim() ~= 3 then
      raise(string.format("%s: input %s has %d dims (expected 3: %s, or 2 for one sequence)", name, shape(x), x:dim(),
                          self.batch_first and "[batch,T,input_size]" or "[T,batch,input_size]"))
    end
    local table_rows = embedded_table(x)
    if self.batch_first then x = x:transpose(1, 2) end
    if x:size(3) ~= self.input_size then
      raise(string.format("%s: input %s has %d features, expected input_size %d", name, shape(x), x:size(3), self.input_size))
    end
    local T, B, lstm = x:size(1), x:size(2), self.mode == "lstm"
    local h0, c0 = hx, nil
    if lstm and hx ~= nil then
      if type(hx) ~= "table" or factory.is_tensor(hx) then raise("LSTM: hx must be {h0, c0}") end
      h0, c0 = hx[1], hx[2]
    end
    h0 = self:initial(h0, "h0", B, unbatched)
    c0 = self:initial(c0, "c0", B, unbatched)
    if lengths ~= nil then lengths = F().rnn_lengths(lengths, name) end
    local D = self.bidirectional and 2 or 1
    local input, hn, cn = x, {}, {}
    for l = 0, self.num_layers - 1 do
      local outs = {}
      for d = 0, D - 1 do
        local sfx, k = "_l" .. l .. (d == 1 and "_reverse" or ""), l * D + d + 1
        local x_in, w_ih, index = input, self["weight_ih" .. sfx], nil
        if l == 0 and table_rows then   -- the projected table, and each step's row of it [T,B]
          x_in, w_ih = projected_table(table_rows.weight, w_ih), nil
          index = self.batch_first and table_rows.flat:view(B, T):transpose(1, 2) or table_rows.flat:view(T, B)
        end
        local z = F().rnn_layer(self.mode, x_in, h0 and h0:select(1, k), c0 and c0:select(1, k),
                                w_ih, self["weight_hh" .. sfx], self["bias_ih" .. sfx], self["bias_hh" .. sfx],
                                {lengths = lengths, reverse = d == 1, algorithm = self.algorithm, index = index})
        outs[d + 1] = z:narrow(1, 1, T)
        hn[k] = z:select(1, T + 1)
        if lstm then cn[k] = z:select(1, T + 2) end
      end
      input = D == 2 and factory.cat(outs, 3) or outs[1]
      if self.dropout > 0 and self.training and l < self.num_layers - 1 then input = F().dropout(input, self.dropout, true) end
    end
    local out, h_n = input, factory.stack(hn, 1)
    local c_n = lstm and factory.stack(cn, 1) or nil
    if self.batch_first then out = out:transpose(1, 2) end
    if unbatched then
      out = out:squeeze(self.batch_first and 1 or 2)
      h_n = h_n:squeeze(2)
      if c_n then c_n = c_n:squeeze(2) end
    end
    if lstm then return out, {h_n, c_n} end
    return out, h_n
  end

  function RNNBase:extra_repr()
    local s = string.format("%d, %d", self.input_size, self.hidden_size)
    if self.mode == "rnn_relu" then s = s .. ", nonlinearity=relu" end
    if self.num_layers > 1 then s = s .. ", num_layers=" .. self.num_layers end
    if not self.bias then s = s .. ", bias=false" end
    if self.batch_first then s = s .. ", batch_first" end
    if self.dropout > 0 then s = s .. ", dropout=" .. self.dropout end
    if self.bidirectional then s = s .. ", bidirectional" end
    if self.algorithm ~= "auto" then s = s .. ", algorithm=" .. self.algorithm end
    return s
  end

  local RNN = nn.define("RNN", RNNBase)
  function RNN:init(a, b, c)
    local i, h, opts = arguments("RNN", a, b, c)
    local nl = opts.nonlinearity or "tanh"
    if nl ~= "tanh" and nl ~= "relu" then error("RNN: nonlinearity " .. tostring(nl) .. " (expected tanh or relu)", 3) end
    self:setup("rnn_" .. nl, i, h, opts)
  end
  local GRU = nn.define("GRU", RNNBase)
  function GRU:init(a, b, c) local i, h, opts = arguments("GRU", a, b, c) self:setup("gru", i, h, opts) end
  local LSTM = nn.define("LSTM", RNNBase)
  function LSTM:init(a, b, c) local i, h, opts = arguments("LSTM", a, b, c) self:setup("lstm", i, h, opts) end

  -- ---- the cells: one step, for loops written by hand ----

  local CellBase = nn.define("RNNCellBase")
  function CellBase:init() core.raise("RNNCellBase: a base class; make an nn.RNNCell, nn.GRUCell or nn.LSTMCell") end
  function CellBase:setup(mode, input_size, hidden_size, opts)
    local name = titles[mode] .. "Cell"
    opts = core.options(opts, cell_keys, name)
    if mode ~= "rnn_tanh" and mode ~= "rnn_relu" and opts.nonlinearity ~= nil then
      core.raise(name .. ": nonlinearity is an option of nn.RNNCell only")
    end
    size_check(name, input_size, "input_size")
    size_check(name, hidden_size, "hidden_size")
    self.mode, self.input_size, self.hidden_size, self.bias = mode, input_size, hidden_size, flag(name, "bias", opts.bias, true)
    local G = gates[mode]
    self.weight_ih = self:parameter(factory.empty(G * hidden_size, input_size, {dtype = opts.dtype}))
    self.weight_hh = self:parameter(factory.empty(G * hidden_size, hidden_size, {dtype = opts.dtype}))
    if self.bias then
      self.bias_ih = self:parameter(factory.empty(G * hidden_size, {dtype = opts.dtype}))
      self.bias_hh = self:parameter(factory.empty(G * hidden_size, {dtype = opts.dtype}))
    end
    self:reset_parameters()
  end
  CellBase.reset_parameters = RNNBase.reset_parameters

  -- forward(input [B,I] or [I], hx) -> h' (an LSTMCell: {h', c'}); hx is h (LSTMCell: {h, c}) or nil.
  function CellBase:forward(x, hx)
    local name = titles[self.mode] .. "Cell"
    if not factory.is_tensor(x) then raise(string.format("%s: input must be a tensor, got %s", name, type(x))) end
    local unbatched = x:dim() == 1
    if unbatched then x = x:unsqueeze(1) end
    if x:dim() ~= 2 or x:size(2) ~= self.input_size then
      raise(string.format("%s: input %s, expected [batch,%d] or [%d]", name, shape(x), self.input_size, self.input_size))
    end
    local B, lstm = x:size(1), self.mode == "lstm"
    local h, c = hx, nil
    if lstm and hx ~= nil then
      if type(hx) ~= "table" or factory.is_tensor(hx) then raise("LSTMCell: hx must be {h, c}") end
      h, c = hx[1], hx[2]
    end
    local function state(s, what)
      if s == nil then return nil end
      if unbatched and factory.is_tensor(s) and s:dim() == 1 then s = s:unsqueeze(1) end
      if not factory.is_tensor(s) or s:dim() ~= 2 or s:size(1) ~= B or s:size(2) ~= self.hidden_size then
        raise(string.format("%s: %s is %s, expected [%d,%d] (batch, hidden_size)", name, what,
                            factory.is_tensor(s) and shape(s) or type(s), B, self.hidden_size))
      end
      return s
    end
    h, c = state(h, "h"), state(c, "c")
    local z = F().rnn_layer(self.mode, x:unsqueeze(1), h, c, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
    local h1 = z:select(1, 2)
    local c1 = lstm and z:select(1, 3) or nil
    if unbatched then h1 = h1:squeeze(1) if c1 then c1 = c1:squeeze(1) end end
    if lstm then return {h1, c1} end
    return h1
  end
  function CellBase:extra_repr()
    return string.format("%d, %d%s%s", self.input_size, self.hidden_size, self.mode == "rnn_relu" and ", nonlinearity=relu" or "",
                         self.bias and "" or ", bias=false")
  end

  local RNNCell = nn.define("RNNCell", CellBase)
  function RNNCell:init(a, b, c)
    local i, h, opts = arguments("RNNCell", a, b, c)
    local nl = opts.nonlinearity or "tanh"
    if nl ~= "tanh" and nl ~= "relu" then error("RNNCell: nonlinearity " .. tostring(nl) .. " (expected tanh or relu)", 3) end
    self:setup("rnn_" .. nl, i, h, opts)
  end
  local GRUCell = nn.define("GRUCell", CellBase)
  function GRUCell:init(a, b, c) local i, h, opts = arguments("GRUCell", a, b, c) self:setup("gru", i, h, opts) end
  local LSTMCell = nn.define("LSTMCell", CellBase)
  function LSTMCell:init(a, b, c) local i, h, opts = arguments("LSTMCell", a, b, c) self:setup("lstm", i, h, opts) end
end
