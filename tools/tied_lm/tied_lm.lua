-- tools/tied_lm/tied_lm.lua: a weight-tied word-level LM, its embedding and output layer sharing
-- one weight; writes tied.safetensors and xy.safetensors for load_in_torch.py (README.md).
local nn, F = kiln.nn, kiln.nn.functional
kiln.manual_seed(1)
local V, E, T, B = 50, 16, 8, 4
local LM = nn.define("TiedLM")
function LM:init()
  self.encoder = nn.Embedding(V, E)
  self.rnn = nn.LSTM(E, E)
  self.decoder = nn.Linear(E, V)
  self.decoder.weight = self.encoder.weight   -- tie
end
function LM:forward(x)
  local out = self.rnn(self.encoder(x))
  return self.decoder(out:reshape(T * B, E))
end
local m = nn.TiedLM()
print("parameters listed:", #m:parameters(), "num_parameters:", m:num_parameters())
local opt = kiln.optim.SGD(m:parameters(), {lr = 0.5})
local x, y = kiln.randint(1, V + 1, {T, B}), kiln.randint(1, V + 1, {T * B})
for step = 1, 20 do
  opt:zero_grad()
  local loss = F.cross_entropy(m(x), y)
  loss:backward()
  opt:step()
  if step == 1 or step == 20 then print("step", step, "loss", loss:item()) end
end
print("still tied:", m.decoder.weight == m.encoder.weight)
local ok, e = pcall(kiln.optim.SGD, {m.encoder.weight, m.decoder.weight}, {lr = 0.1})
print("duplicate:", e)
kiln.save("tied.safetensors", m:state_dict())
kiln.save("xy.safetensors", {x = x - 1, y = y - 1})   -- PyTorch counts from 0
kiln.no_grad(function() print("final loss", F.cross_entropy(m(x), y):item()) end)
