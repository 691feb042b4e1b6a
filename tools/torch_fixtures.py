"""Writes tests/fixtures/torch_recurrent.safetensors: what PyTorch's recurrent layers, cells and
CTC loss compute on small f64 inputs, for tests/lua/torch_fixture_spec.lua to compare kiln with.

    /usr/bin/python3 tools/torch_fixtures.py [out.safetensors]     (Debian 12's python3-torch)

Every tensor is stored under "<case>.<name>": the case's state dict under its PyTorch names
("lstm.weight_ih_l0_reverse"), its inputs, its outputs, the weights R of the scalar
sum(output * R) + ... whose gradients are stored as "<case>.grad.<name>". Integers (lengths,
targets) are i64 and, like PyTorch's, count labels from 0. The file is written by this script
(safetensors is a JSON header and raw little-endian data), so only torch is needed.
"""
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

torch.manual_seed(20261201)
torch.set_default_dtype(torch.float64)
out = {}


def put(case, name, t):
    out[case + "." + name] = t.detach().clone().contiguous()


def grads(case, loss, named):
    loss.backward()
    for name, t in named:
        put(case, "grad." + name, t.grad)


# Layers: 2 layers, bidirectional, batch_first, unsorted lengths (a packed sequence), initial states.
B, T, I, H = 3, 5, 3, 4
LENGTHS = [5, 2, 4]
for case, make in [("rnn_tanh", lambda: torch.nn.RNN(I, H, 2, nonlinearity="tanh", batch_first=True, bidirectional=True)),
                   ("rnn_relu", lambda: torch.nn.RNN(I, H, 2, nonlinearity="relu", batch_first=True, bidirectional=True)),
                   ("gru", lambda: torch.nn.GRU(I, H, 2, batch_first=True, bidirectional=True)),
                   ("lstm", lambda: torch.nn.LSTM(I, H, 2, batch_first=True, bidirectional=True))]:
    m = make()
    for k, v in m.state_dict().items():
        put(case, k, v)
    x = torch.randn(B, T, I, requires_grad=True)
    h0 = torch.randn(4, B, H, requires_grad=True)
    c0 = torch.randn(4, B, H, requires_grad=True)
    lengths = torch.tensor(LENGTHS, dtype=torch.int64)
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    lstm = case == "lstm"
    y, state = m(packed, (h0, c0) if lstm else h0)
    y, _ = pad_packed_sequence(y, batch_first=True, total_length=T)
    h_n, c_n = state if lstm else (state, None)
    r_out, r_h, r_c = torch.randn(y.shape), torch.randn(h_n.shape), torch.randn(h_n.shape)
    loss = (y * r_out).sum() + (h_n * r_h).sum() + ((c_n * r_c).sum() if lstm else 0)
    for name, t in [("x", x), ("h0", h0), ("lengths", lengths), ("out", y), ("h_n", h_n), ("r_out", r_out), ("r_h", r_h)]:
        put(case, name, t)
    if lstm:
        for name, t in [("c0", c0), ("c_n", c_n), ("r_c", r_c)]:
            put(case, name, t)
    grads(case, loss, [("x", x), ("h0", h0)] + ([("c0", c0)] if lstm else []) + list(m.named_parameters()))

# One LSTM layer without biases, sequence first, no lengths and no initial state.
m = torch.nn.LSTM(I, H, bias=False)
for k, v in m.state_dict().items():
    put("lstm_nobias", k, v)
x = torch.randn(T, B, I, requires_grad=True)
y, (h_n, c_n) = m(x)
r_out = torch.randn(y.shape)
for name, t in [("x", x), ("out", y), ("h_n", h_n), ("c_n", c_n), ("r_out", r_out)]:
    put("lstm_nobias", name, t)
grads("lstm_nobias", (y * r_out).sum(), [("x", x)] + list(m.named_parameters()))

# Cells: one step of a batch of 2.
for case, cell in [("rnn_cell", torch.nn.RNNCell(I, H)), ("rnn_relu_cell", torch.nn.RNNCell(I, H, nonlinearity="relu")),
                   ("gru_cell", torch.nn.GRUCell(I, H)), ("lstm_cell", torch.nn.LSTMCell(I, H))]:
    for k, v in cell.state_dict().items():
        put(case, k, v)
    x = torch.randn(2, I, requires_grad=True)
    h = torch.randn(2, H, requires_grad=True)
    c = torch.randn(2, H, requires_grad=True)
    lstm = case == "lstm_cell"
    res = cell(x, (h, c)) if lstm else cell(x, h)
    h1, c1 = res if lstm else (res, None)
    r_h, r_c = torch.randn(h1.shape), torch.randn(h1.shape)
    loss = (h1 * r_h).sum() + ((c1 * r_c).sum() if lstm else 0)
    for name, t in [("x", x), ("h", h), ("h1", h1), ("r_h", r_h)]:
        put(case, name, t)
    if lstm:
        for name, t in [("c", c), ("c1", c1), ("r_c", r_c)]:
            put(case, name, t)
    grads(case, loss, [("x", x), ("h", h)] + ([("c", c)] if lstm else []) + list(cell.named_parameters()))

# CTC: blank 0 and blank C-1; the fourth sample's target cannot fit its input (two equal labels
# need three steps), so its loss is infinite and zero_infinity decides.
Tc, N, C = 6, 4, 5
for case, blank, targets in [("ctc", 0, [[1, 2, 3], [4, 4, 0], [2, 2, 3], [1, 1, 0]]),
                             ("ctc_blank_last", C - 1, [[0, 1, 2], [3, 3, 0], [1, 1, 2], [0, 0, 0]])]:
    logits = torch.randn(Tc, N, C)
    targets = torch.tensor(targets, dtype=torch.int64)
    il = torch.tensor([6, 5, 4, 2], dtype=torch.int64)
    tl = torch.tensor([3, 2, 3, 2], dtype=torch.int64)
    for name, t in [("logits", logits), ("targets", targets), ("input_lengths", il), ("target_lengths", tl)]:
        put(case, name, t)
    lp = F.log_softmax(logits, 2)
    put(case, "loss_none", F.ctc_loss(lp, targets, il, tl, blank=blank, reduction="none"))
    r = torch.randn(N)
    put(case, "r", r)
    for reduction in ["none", "sum", "mean"]:
        z = logits.clone().requires_grad_()
        loss = F.ctc_loss(F.log_softmax(z, 2), targets, il, tl, blank=blank, reduction=reduction, zero_infinity=True)
        put(case, "loss_" + reduction + "_zero_inf", loss)
        (loss * r).sum().backward() if reduction == "none" else loss.backward()
        put(case, "grad_" + reduction + "_zero_inf", z.grad)

# safetensors: an 8-byte header length, the JSON header, the data.
names = sorted(out)
header, blobs, offset = {"__metadata__": {"torch": torch.__version__}}, [], 0
for name in names:
    t = out[name]
    dtype = {torch.float64: "F64", torch.int64: "I64"}[t.dtype]
    data = t.numpy().astype("<f8" if dtype == "F64" else "<i8").tobytes() if t.numel() else b""
    header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
    blobs.append(data)
    offset += len(data)
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
path = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/torch_recurrent.safetensors"
with open(path + ".tmp", "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
os.replace(path + ".tmp", path)
print("%s: %d tensors, %d bytes of data, torch %s" % (path, len(names), offset, torch.__version__))
