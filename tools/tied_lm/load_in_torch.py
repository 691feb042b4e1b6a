# tools/tied_lm/load_in_torch.py: the state dict tied_lm.lua wrote, loaded into the same model in
# PyTorch with its tie; prints whether the tie is kept and the loss on the saved batch.
import torch, torch.nn as nn, torch.nn.functional as F
from safetensors.torch import load_file
V, E, T, B = 50, 16, 8, 4
class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(V, E)
        self.rnn = nn.LSTM(E, E)
        self.decoder = nn.Linear(E, V)
        self.decoder.weight = self.encoder.weight
    def forward(self, x):
        out, _ = self.rnn(self.encoder(x))
        return self.decoder(out.reshape(T * B, E))
m = TiedLM()
sd = load_file("tied.safetensors")
print("keys:", sorted(sd))
missing = m.load_state_dict(sd, strict=True)
print("loaded strictly:", missing)
print("tie kept:", m.decoder.weight is m.encoder.weight, m.decoder.weight.data_ptr() == m.encoder.weight.data_ptr())
print("parameters listed once:", len(list(m.parameters())))
xy = load_file("xy.safetensors")
with torch.no_grad():
    print("final loss (PyTorch):", F.cross_entropy(m(xy["x"].long()), xy["y"].long()).item())
