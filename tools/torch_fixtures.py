"""Writes what PyTorch computes on small f64 inputs, for kiln's specs to compare with:
tests/fixtures/torch_recurrent.safetensors (recurrent layers, cells, CTC loss; read by
tests/lua/torch_fixture_spec.lua) and tests/fixtures/torch_nn.safetensors (convolutions, pooling,
norms, losses, optimizers, schedulers, clipping; read by tests/lua/torch_nn_fixture_spec.lua) and
tests/fixtures/torch_promotion.json (the dtype of each op's result by its operands' dtypes; read
by tests/lua/torch_promotion_spec.lua), and tests/fixtures/torch_ops.safetensors (sort, topk,
scans, pad, interpolate (every mode), einsum, unfold/fold and the other tensor ops; read by
tests/lua/torch_ops_fixture_spec.lua).

    python3 tools/torch_fixtures.py [directory] [--only torch_ops]

Any Python 3 with torch and numpy runs it: Debian 12's python3-torch (1.13, which wrote the first
three files) or a venv with PyTorch 2.x from PyPI (2.15 wrote torch_ops.safetensors); each file
records the version that wrote it. --only torch_ops writes that file alone, leaving the others as
they are.

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
ARGS = [a for a in sys.argv[1:] if not a.startswith("--only")]
ONLY = ([a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--only=")] or
        [sys.argv[i + 2] for i, a in enumerate(sys.argv[1:]) if a == "--only" and i + 2 < len(sys.argv)] or [None])[0]
ARGS = [a for a in ARGS if a != ONLY]
OUT_DIR = ARGS[0] if ARGS else "tests/fixtures"


def write(name, tensors):
    """safetensors: an 8-byte header length, the JSON header, the data; written whole, then renamed."""
    names = sorted(tensors)
    header, blobs, offset = {"__metadata__": {"torch": torch.__version__}}, [], 0
    for key in names:
        t = tensors[key]
        dtype = {torch.float64: "F64", torch.int64: "I64"}[t.dtype]
        data = t.numpy().astype("<f8" if dtype == "F64" else "<i8").tobytes() if t.numel() else b""
        header[key] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path = os.path.join(OUT_DIR, name)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    os.replace(path + ".tmp", path)
    print("%s: %d tensors, %d bytes of data, torch %s" % (path, len(names), offset, torch.__version__))


def put(case, name, t):
    out[case + "." + name] = t.detach().clone().contiguous()


def grads(case, loss, named):
    loss.backward()
    for name, t in named:
        put(case, "grad." + name, t.grad)


def ops_fixtures():
    """torch_ops.safetensors: the tensor ops. Each case keeps its inputs, y (or several outputs), the
    weights r of sum(y * r) and the gradients grad_<input> of that sum; indices count from 0."""
    torch.manual_seed(20261203)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)   # a full run comes here after the promotion table's float32
    res = {}

    def keep(case, **tensors):
        for name, t in tensors.items():
            res[case + "." + name] = t.detach().clone().contiguous()

    def diff(case, fn, **inputs):
        leaves = {k: v.detach().clone().requires_grad_() for k, v in inputs.items()}
        y = fn(**leaves)
        r = torch.randn(y.shape)
        (y * r).sum().backward()
        keep(case, y=y, r=r, **inputs)
        for k, v in leaves.items():
            keep(case, **{"grad_" + k: v.grad if v.grad is not None else torch.zeros(v.shape)})

    # sort and argsort: ties (small integers) and NaN; stable, as kiln always is
    x = torch.randint(0, 4, (3, 6)).double()
    keep("sort", x=x)
    for name, dim, desc in [("last", -1, False), ("last_desc", -1, True), ("first", 0, False), ("first_desc", 0, True)]:
        v, i = torch.sort(x, dim=dim, descending=desc, stable=True)
        keep("sort", **{name + "_values": v, name + "_indices": i})
    xn = torch.tensor([[2.0, float("nan"), -1.0, 2.0, float("nan"), 0.5]])
    keep("sort_nan", x=xn)
    for name, desc in [("asc", False), ("desc", True)]:
        v, i = torch.sort(xn, dim=1, descending=desc, stable=True)
        keep("sort_nan", **{name + "_values": v, name + "_indices": i})
    diff("sort_grad", lambda x: torch.sort(x, dim=1, stable=True)[0], x=torch.randn(3, 5))
    # topk on distinct values (PyTorch's topk does not promise an order among ties)
    x = torch.randn(3, 7)
    keep("topk", x=x)
    for name, k, dim, largest in [("largest", 3, 1, True), ("smallest", 3, 1, False), ("dim0", 2, 0, True)]:
        v, i = torch.topk(x, k, dim=dim, largest=largest, sorted=True)
        keep("topk", **{name + "_values": v, name + "_indices": i})
    diff("topk_grad", lambda x: torch.topk(x, 2, dim=1)[0], x=torch.randn(4, 6))

    # scans and the elementwise additions
    diff("cumsum", lambda x: torch.cumsum(x, 1), x=torch.randn(3, 5))
    xz = torch.randn(4, 3)
    xz[1, 1] = 0
    diff("cumprod", lambda x: torch.cumprod(x, 0), x=xz)
    diff("erfinv", lambda x: torch.erfinv(x), x=torch.rand(3, 4) * 1.8 - 0.9)
    diff("atan2", lambda a, b: torch.atan2(a, b), a=torch.randn(3, 4), b=torch.randn(4))

    # pad: PyTorch's order, the last dim first
    x = torch.randn(2, 3, 4, 5)
    diff("pad_constant", lambda x: F.pad(x, (1, 2, 0, 1), value=0.5), x=x)
    diff("pad_negative", lambda x: F.pad(x, (-1, 2, 1, -2)), x=x)
    diff("pad_reflect", lambda x: F.pad(x, (2, 1, 1, 3), mode="reflect"), x=x)
    diff("pad_replicate", lambda x: F.pad(x, (2, 3, 1, 0), mode="replicate"), x=x)
    diff("pad_circular", lambda x: F.pad(x, (1, 2, 2, 1), mode="circular"), x=x)
    diff("pad_reflect1d", lambda x: F.pad(x, (2, 3), mode="reflect"), x=torch.randn(2, 3, 5))

    # interpolate
    x = torch.randn(1, 2, 4, 5)
    diff("interp_nearest_size", lambda x: F.interpolate(x, size=(7, 3), mode="nearest"), x=x)
    diff("interp_nearest_scale", lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), x=x)
    diff("interp_bilinear", lambda x: F.interpolate(x, size=(7, 8), mode="bilinear", align_corners=False), x=x)
    diff("interp_bilinear_ac", lambda x: F.interpolate(x, size=(7, 8), mode="bilinear", align_corners=True), x=x)
    diff("interp_bilinear_scale", lambda x: F.interpolate(x, scale_factor=1.5, mode="bilinear", align_corners=False), x=x)
    diff("interp_bilinear_down", lambda x: F.interpolate(x, size=(3, 2), mode="bilinear", align_corners=False), x=x)
    diff("interp_linear", lambda x: F.interpolate(x, size=8, mode="linear", align_corners=False), x=torch.randn(2, 3, 5))

    # repeat, repeat_interleave, roll
    diff("repeat", lambda x: x.repeat(2, 1, 3), x=torch.randn(2, 3))
    diff("tile", lambda x: torch.tile(x, (2,)), x=torch.randn(2, 3))
    x = torch.randn(3, 2)
    diff("repeat_interleave", lambda x: torch.repeat_interleave(x, 2, dim=0), x=x)
    diff("repeat_interleave_tensor", lambda x: torch.repeat_interleave(x, torch.tensor([1, 0, 3]), dim=0), x=x)
    diff("repeat_interleave_flat", lambda x: torch.repeat_interleave(x, 2), x=x)
    x = torch.randn(3, 4)
    diff("roll", lambda x: torch.roll(x, 1, 1), x=x)
    diff("roll_two", lambda x: torch.roll(x, (2, -1), (0, 1)), x=x)
    diff("roll_flat", lambda x: torch.roll(x, 5), x=x)

    # einsum
    diff("einsum_mm", lambda a, b: torch.einsum("ij,jk->ik", a, b), a=torch.randn(3, 4), b=torch.randn(4, 5))
    diff("einsum_bmm", lambda a, b: torch.einsum("bij,bjk->bik", a, b), a=torch.randn(2, 3, 4), b=torch.randn(2, 4, 5))
    diff("einsum_attn", lambda a, b: torch.einsum("bhqd,bhkd->bhqk", a, b), a=torch.randn(2, 2, 3, 4), b=torch.randn(2, 2, 5, 4))
    diff("einsum_outer", lambda a, b: torch.einsum("i,j->ij", a, b), a=torch.randn(3), b=torch.randn(4))
    diff("einsum_diag", lambda a: torch.einsum("ii->i", a), a=torch.randn(4, 4))
    diff("einsum_trace", lambda a: torch.einsum("ii", a).reshape(1), a=torch.randn(4, 4))
    diff("einsum_transpose", lambda a: torch.einsum("ij->ji", a), a=torch.randn(3, 4))
    diff("einsum_sum", lambda a, b: torch.einsum("ijk,ik->j", a, b), a=torch.randn(2, 3, 4), b=torch.randn(2, 4))
    diff("einsum_implicit", lambda a, b: torch.einsum("ij,jk", a, b), a=torch.randn(3, 4), b=torch.randn(4, 2))
    diff("einsum_three", lambda a, b, c: torch.einsum("ij,jk,kl->il", a, b, c), a=torch.randn(2, 3), b=torch.randn(3, 4),
         c=torch.randn(4, 2))

    # unfold and fold (im2col and col2im)
    opts = dict(kernel_size=(2, 3), dilation=(1, 2), padding=1, stride=(2, 1))
    x = torch.randn(2, 3, 5, 6)
    diff("unfold", lambda x: F.unfold(x, **opts), x=x)
    cols = F.unfold(x, **opts)
    diff("fold", lambda c: F.fold(c, output_size=(5, 6), **opts), c=torch.randn(cols.shape))

    # the small ones
    diff("diag_vector", lambda v: torch.diag(v, 1), v=torch.randn(4))
    diff("diag_vector_below", lambda v: torch.diag(v, -2), v=torch.randn(3))
    m = torch.randn(4, 5)
    diff("diag_matrix", lambda m: torch.diag(m), m=m)
    diff("diag_matrix_above", lambda m: torch.diag(m, 2), m=m)
    diff("diag_matrix_below", lambda m: torch.diag(m, -1), m=m)
    diff("trace", lambda m: torch.trace(m).reshape(1), m=m)
    diff("outer", lambda a, b: torch.outer(a, b), a=torch.randn(3), b=torch.randn(4))
    diff("baddbmm", lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2), c=torch.randn(3, 4), a=torch.randn(2, 3, 5),
         b=torch.randn(2, 5, 4))
    diff("addcmul", lambda a, b, c: torch.addcmul(a, b, c, value=0.3), a=torch.randn(3, 4), b=torch.randn(3, 4), c=torch.randn(4))
    diff("addcdiv", lambda a, b, c: torch.addcdiv(a, b, c, value=0.3), a=torch.randn(3, 4), b=torch.randn(3, 4),
         c=torch.rand(4) + 0.5)
    diff("lerp", lambda a, b, w: torch.lerp(a, b, w), a=torch.randn(3, 4), b=torch.randn(3, 4), w=torch.rand(3, 4))
    diff("lerp_scalar", lambda a, b: torch.lerp(a, b, 0.3), a=torch.randn(3, 4), b=torch.randn(3, 4))
    lo = torch.randn(4) - 0.5
    diff("clamp_tensor", lambda x, lo, hi: torch.clamp(x, lo, hi), x=torch.randn(3, 4), lo=lo, hi=lo + 1)

    # broadcasting (the cases above keep their draws: new ones come after them)
    diff("einsum_bc_elementwise", lambda a, b: torch.einsum("ij,ij->ij", a, b), a=torch.randn(3, 1), b=torch.randn(3, 4))
    diff("einsum_bc_contract", lambda a, b: torch.einsum("ij,jk->ik", a, b), a=torch.randn(3, 1), b=torch.randn(4, 5))
    diff("einsum_bc_batch", lambda a, b: torch.einsum("bij,bjk->bik", a, b), a=torch.randn(1, 3, 4), b=torch.randn(2, 4, 5))
    diff("einsum_bc_ellipsis", lambda a, b: torch.einsum("...ij,...jk->...ik", a, b), a=torch.randn(2, 1, 3, 4),
         b=torch.randn(5, 4, 2))
    diff("einsum_bc_implicit", lambda a, b: torch.einsum("ij,ij", a, b).reshape(1), a=torch.randn(3, 1), b=torch.randn(1, 4))
    diff("einsum_bc_diag", lambda a, b: torch.einsum("ii,i->i", a, b), a=torch.randn(1, 1), b=torch.randn(3))
    diff("einsum_bc_three", lambda a, b, c: torch.einsum("ij,jk,kl->il", a, b, c), a=torch.randn(2, 3), b=torch.randn(1, 4),
         c=torch.randn(4, 1))
    diff("addcmul_bc", lambda a, b, c: torch.addcmul(a, b, c, value=0.3), a=torch.randn(4), b=torch.randn(3, 1),
         c=torch.randn(2, 1, 4))
    diff("addcdiv_bc", lambda a, b, c: torch.addcdiv(a, b, c, value=0.3), a=torch.randn(4), b=torch.randn(3, 1),
         c=torch.rand(2, 1, 4) + 0.5)
    diff("lerp_bc", lambda a, b, w: torch.lerp(a, b, w), a=torch.randn(4), b=torch.randn(3, 1), w=torch.rand(2, 1, 1))
    diff("clamp_bc", lambda x, lo, hi: torch.clamp(x, lo, hi), x=torch.randn(4), lo=torch.randn(3, 1) - 0.5,
         hi=torch.randn(2, 1, 1) + 1)
    diff("atan2_bc", lambda a, b: torch.atan2(a, b), a=torch.randn(4), b=torch.randn(3, 1))
    diff("baddbmm_bc", lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2), c=torch.randn(2, 1, 4),
         a=torch.randn(2, 3, 5), b=torch.randn(2, 5, 4))

    # interpolate's other modes: bicubic, area, trilinear, nearest-exact; up and down, align_corners
    # both ways, size and scale_factor
    x = torch.randn(2, 3, 4, 5)
    for name, kw in [("up", dict(size=(7, 8))), ("down", dict(size=(3, 2))), ("mixed", dict(size=(2, 9))),
                     ("scale", dict(scale_factor=(1.7, 0.6))), ("recompute", dict(scale_factor=1.7, recompute_scale_factor=True))]:
        for ac in [False, True]:
            diff("interp_bicubic_%s%s" % (name, "_ac" if ac else ""),
                 lambda x: F.interpolate(x, mode="bicubic", align_corners=ac, **kw), x=x)
    for name, kw in [("up", dict(size=(7, 8))), ("down", dict(size=(3, 2))), ("mixed", dict(size=(3, 7))),
                     ("scale", dict(scale_factor=0.5))]:
        diff("interp_area_" + name, lambda x: F.interpolate(x, mode="area", **kw), x=x)
        diff("interp_nearest_exact_" + name, lambda x: F.interpolate(x, mode="nearest-exact", **kw), x=x)
    diff("interp_area_1d", lambda x: F.interpolate(x, size=3, mode="area"), x=torch.randn(2, 3, 7))
    diff("interp_area_1d_up", lambda x: F.interpolate(x, size=10, mode="area"), x=torch.randn(2, 3, 7))
    diff("interp_nearest_exact_1d", lambda x: F.interpolate(x, scale_factor=1.6, mode="nearest-exact"), x=torch.randn(2, 3, 7))
    x5 = torch.randn(1, 2, 3, 4, 5)
    diff("interp_area_3d", lambda x: F.interpolate(x, size=(2, 5, 3), mode="area"), x=x5)
    diff("interp_nearest_3d", lambda x: F.interpolate(x, size=(5, 3, 7), mode="nearest"), x=x5)
    diff("interp_nearest_exact_3d", lambda x: F.interpolate(x, size=(5, 3, 7), mode="nearest-exact"), x=x5)
    for name, kw in [("up", dict(size=(5, 6, 7))), ("down", dict(size=(2, 3, 2))), ("scale", dict(scale_factor=(1.5, 0.7, 2)))]:
        for ac in [False, True]:
            diff("interp_trilinear_%s%s" % (name, "_ac" if ac else ""),
                 lambda x: F.interpolate(x, mode="trilinear", align_corners=ac, **kw), x=x5)
    # a dim whose size a scale_factor keeps is copied by the linear modes (3 * 1.3 gives 3)
    diff("interp_bilinear_kept", lambda x: F.interpolate(x, scale_factor=(1.3, 1.5), mode="bilinear"), x=torch.randn(1, 2, 3, 5))
    # clamp with tensor bounds on ties: x equal to one bound shares the grad with it evenly (as
    # maximum and minimum do); a lower bound above the upper gives the upper bound and its grad
    diff("clamp_ties", lambda x, lo, hi: torch.clamp(x, lo, hi),
         x=torch.tensor([[0.0, 1.0, 2.0, -1.0], [3.0, 1.0, 0.5, 4.0]]),
         lo=torch.tensor([0.0, 1.0, 2.5, 0.0]), hi=torch.tensor([[2.0], [3.0]]))
    diff("clamp_ties_swapped", lambda x, lo, hi: torch.clamp(x, lo, hi), x=torch.tensor([1.0, 2.0, 3.0]),
         lo=torch.tensor([2.0, 2.0, 2.0]), hi=torch.tensor([1.0, 2.5, 1.5]))
    write("torch_ops.safetensors", res)
    torch.set_default_dtype(default)


if ONLY == "torch_ops":
    ops_fixtures()
    sys.exit(0)
elif ONLY is not None:
    sys.exit("--only: the files are torch_ops (or none: every file)")


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

write("torch_recurrent.safetensors", out)

# ---- torch_nn.safetensors ----
torch.manual_seed(20261202)
nn_out = {}


def keep(case, **tensors):
    for name, t in tensors.items():
        nn_out[case + "." + name] = t.detach().clone().contiguous()


def leaf(*shape):
    return torch.randn(*shape).requires_grad_()


def with_grads(case, y, **inputs):
    """Keeps y, the weights r of the scalar sum(y * r), and the gradient of that sum w.r.t. each input."""
    r = torch.randn(y.shape)
    (y * r).sum().backward()
    keep(case, y=y, r=r, **inputs)
    for name, t in inputs.items():
        keep(case, **{"grad_" + name: t.grad})


# Convolutions: strides, paddings, dilations and groups that differ per dim.
x, w, b = leaf(2, 4, 7, 9), leaf(6, 2, 3, 3), leaf(6)
with_grads("conv2d", F.conv2d(x, w, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2), x=x, w=w, b=b)
x, w, b = leaf(2, 3, 10), leaf(4, 3, 3), leaf(4)
with_grads("conv1d", F.conv1d(x, w, b, stride=2, padding=1, dilation=2), x=x, w=w, b=b)
x, w, b = leaf(2, 4, 5, 6), leaf(4, 3, 3, 3), leaf(6)
with_grads("conv_transpose2d", F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2), x=x, w=w, b=b)

# Pooling: windows past the edge (ceil_mode), padding, dilation, count_include_pad.
x = leaf(2, 3, 9, 10)
with_grads("max_pool2d_ceil", F.max_pool2d(x, 3, 2, padding=1, ceil_mode=True), x=x)
x = leaf(2, 3, 9, 10)
with_grads("max_pool2d_dilated", F.max_pool2d(x, 2, 1, padding=1, dilation=2), x=x)
x = leaf(2, 3, 9, 10)
with_grads("avg_pool2d_ceil_nopad", F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False), x=x)
x = leaf(2, 3, 9, 10)
with_grads("avg_pool2d_pad", F.avg_pool2d(x, 3, 2, padding=1), x=x)
x = leaf(2, 3, 7, 9)
with_grads("adaptive_avg_pool2d", F.adaptive_avg_pool2d(x, (3, 4)), x=x)

# Norms: batch norm in training moves the running stats (unbiased variance).
x, w, b = leaf(4, 3, 5, 5), leaf(3), leaf(3)
rm, rv = torch.randn(3), torch.rand(3) + 0.5
keep("batch_norm", running_mean0=rm, running_var0=rv)
y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.2, eps=1e-4)
keep("batch_norm", running_mean=rm, running_var=rv)
with_grads("batch_norm", y, x=x, w=w, b=b)
x, w, b = leaf(3, 4, 5), leaf(4, 5), leaf(4, 5)
with_grads("layer_norm", F.layer_norm(x, (4, 5), w, b, eps=1e-4), x=x, w=w, b=b)
x, w, b = leaf(2, 6, 3, 4), leaf(6), leaf(6)
with_grads("group_norm", F.group_norm(x, 3, w, b, eps=1e-4), x=x, w=w, b=b)

# Losses. Targets count from 0 here (kiln: from 1); class 2 is the ignored one.
target = torch.tensor([0, 2, 4, 1, 2, 3])
weight = torch.rand(5) + 0.5
keep("cross_entropy", target=target, weight=weight)
for reduction in ["none", "sum", "mean"]:
    z = leaf(6, 5)
    loss = F.cross_entropy(z, target, weight, ignore_index=2, label_smoothing=0.2, reduction=reduction)
    keep("cross_entropy", **{"z_" + reduction: z})
    with_grads("cross_entropy_" + reduction, loss, z=z)
z, t4 = leaf(2, 4, 3, 3), torch.randint(0, 4, (2, 3, 3))
keep("cross_entropy_4d", target=t4)
with_grads("cross_entropy_4d", F.cross_entropy(z, t4, label_smoothing=0.1), z=z)
z = leaf(6, 5)
with_grads("nll_loss", F.nll_loss(F.log_softmax(z, 1), target, weight, ignore_index=2), z=z)
a, t = leaf(3, 4), torch.randn(3, 4)
keep("elementwise_losses", target=t)
with_grads("mse", F.mse_loss(a, t), a=a)
a = a.detach().clone().requires_grad_()
with_grads("l1", F.l1_loss(a, t, reduction="sum"), a=a)
a = a.detach().clone().requires_grad_()
with_grads("smooth_l1", F.smooth_l1_loss(a, t, beta=0.5), a=a)
p, t01 = torch.rand(3, 4).requires_grad_(), torch.rand(3, 4)
keep("bce_target", t=t01)
with_grads("bce", F.binary_cross_entropy(p, t01), p=p)
z = leaf(3, 4)
with_grads("bce_with_logits", F.binary_cross_entropy_with_logits(z * 4, t01, reduction="none"), z=z)

# Optimizers: six steps from the same start with the same grads.
p0, grads = torch.randn(7), torch.randn(6, 7)
keep("optim", p0=p0, grads=grads)
configs = {
    "sgd_momentum": lambda q: torch.optim.SGD([q], lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "sgd_nesterov": lambda q: torch.optim.SGD([q], lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adam": lambda q: torch.optim.Adam([q], lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    "adam_amsgrad": lambda q: torch.optim.Adam([q], lr=0.01, amsgrad=True),
    "adamw": lambda q: torch.optim.AdamW([q], lr=0.01, weight_decay=0.1),
    "rmsprop": lambda q: torch.optim.RMSprop([q], lr=0.01, alpha=0.9, eps=1e-6, weight_decay=0.01, momentum=0.5,
                                             centered=True),
    "adagrad": lambda q: torch.optim.Adagrad([q], lr=0.1, lr_decay=0.01, weight_decay=0.01,
                                             initial_accumulator_value=0.1, eps=1e-8),
}
for name, make in configs.items():
    q = p0.clone().requires_grad_()
    opt = make(q)
    steps = []
    for g in grads:
        q.grad = g.clone()
        opt.step()
        steps.append(q.detach().clone())
    keep("optim", **{name: torch.stack(steps)})

# Schedulers: the lr (and OneCycleLR's momentum) at steps 0..15 of SGD with lr 0.1, momentum 0.9.
def lrs(make, metrics=None):
    q = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([q], lr=0.1, momentum=0.9)
    sched = make(opt)
    lr, mom = [], []
    for i in range(16):
        lr.append(opt.param_groups[0]["lr"])
        mom.append(opt.param_groups[0]["momentum"])
        opt.step()
        sched.step(metrics[i]) if metrics is not None else sched.step()
    return torch.tensor(lr), torch.tensor(mom)


S = torch.optim.lr_scheduler
keep("sched", step=lrs(lambda o: S.StepLR(o, 3, gamma=0.5))[0],
     multistep=lrs(lambda o: S.MultiStepLR(o, [2, 5, 9], gamma=0.3))[0],
     exponential=lrs(lambda o: S.ExponentialLR(o, 0.9))[0],
     cosine=lrs(lambda o: S.CosineAnnealingLR(o, 5, eta_min=0.01))[0])
lr, mom = lrs(lambda o: S.OneCycleLR(o, max_lr=1.0, total_steps=17))
keep("sched", onecycle_lr=lr, onecycle_momentum=mom)
lr, mom = lrs(lambda o: S.OneCycleLR(o, max_lr=1.0, total_steps=17, anneal_strategy="linear", three_phase=True,
                                     pct_start=0.25))
keep("sched", onecycle3_lr=lr)
metrics = torch.tensor([5.0, 4.0, 4.0, 4.0, 3.9999, 3.0, 3.0, 3.0, 3.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0])
keep("sched", plateau_metrics=metrics,
     plateau=lrs(lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=1, cooldown=1, min_lr=0.02), metrics.tolist())[0])

# Gradient clipping: the total norm (2 and inf) and the clipped grads.
ga, gb = torch.randn(3, 4), torch.randn(5)
keep("clip", ga=ga, gb=gb)
for name, norm_type in [("l2", 2.0), ("inf", float("inf"))]:
    a, b_ = torch.zeros(3, 4, requires_grad=True), torch.zeros(5, requires_grad=True)
    a.grad, b_.grad = ga.clone(), gb.clone()
    total = torch.nn.utils.clip_grad_norm_([a, b_], 1.5, norm_type=norm_type)
    keep("clip", **{name + "_total": total.reshape(1), name + "_ga": a.grad, name + "_gb": b_.grad})

write("torch_nn.safetensors", nn_out)

# ---- torch_promotion.json: the dtype of each op's result, by the operands' dtypes ----
torch.set_default_dtype(torch.float32)   # PyTorch's default, which integer-to-float promotion goes to
DTYPES = {"bool": torch.bool, "u8": torch.uint8, "i32": torch.int32, "i64": torch.int64, "f16": torch.float16,
          "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64}
NAME = {v: k for k, v in DTYPES.items()}
promotion = {}


def result_dtype(key, fn):
    try:
        promotion[key] = NAME[fn().dtype]
    except Exception:   # PyTorch refuses the pair (or lacks the CPU kernel): "error"
        promotion[key] = "error"


def ones(d):
    return torch.ones(2, dtype=DTYPES[d])


for a in DTYPES:
    for b in DTYPES:
        for op in ["add", "sub", "mul", "div", "maximum", "minimum", "eq", "lt", "remainder", "pow"]:
            result_dtype("%s %s %s" % (op, a, b), lambda: getattr(torch, op)(ones(a), ones(b)))
    for s, sname in [(2, "int"), (2.5, "float")]:
        for op in ["add", "sub", "mul", "div", "pow", "remainder", "maximum"]:
            if op == "maximum":
                result_dtype("%s %s %s" % (op, a, sname), lambda: torch.maximum(ones(a), torch.tensor(s)))
            else:
                result_dtype("%s %s %s" % (op, a, sname), lambda: getattr(torch, op)(ones(a), s))
    for op in ["sum", "prod", "mean", "abs", "neg", "sqrt", "exp", "sign", "floor", "round", "max", "argmax", "std",
               "norm"]:
        result_dtype("%s %s" % (op, a), lambda: getattr(ones(a), op)())
path = os.path.join(OUT_DIR, "torch_promotion.json")
with open(path + ".tmp", "w") as f:
    json.dump({"torch": torch.__version__, "dtypes": promotion}, f, indent=0, sort_keys=True)
    f.write("\n")
os.replace(path + ".tmp", path)
print("%s: %d results, torch %s" % (path, len(promotion), torch.__version__))

ops_fixtures()
