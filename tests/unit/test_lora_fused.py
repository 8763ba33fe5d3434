"""The fatter LoRA kernels: the split-K shrink, the expand alone, and the two-sweep residual +
norm pass that also runs the next layer's shrink -- each against a plain PyTorch reference
(Triton compiled on CUDA; on a CPU under ``TRITON_INTERPRET=1``, in a child process). And the
store's CUDA-graph-safe state: one plan buffer per shape, widened weights rewritten in place."""
from __future__ import annotations

import pytest
import torch

from fastvideo3.kernels.fused import add_norm, triton_available
from fastvideo3.kernels.lora_grouped import lora_group_delta_, lora_widen
from fastvideo3.kernels.lora_norm import lora_add_norm, lora_add_norm_next
from fastvideo3.kernels.lora_shrink import choose_split, lora_shrink_split
from tests.helpers_lora import INTERPRET, kernel_device, norm_operands, run_under_interpreter, triton_mark

TRITON = triton_mark("needs a GPU, or the Triton interpreter (the last test runs it in a child process)")
pytestmark = pytest.mark.timeout(120)
SLOTS = [2, -1, 0, 2, 1]
SCALES = [0.7, 0.0, 1.0, -0.5, 2.0]


def _plan(rows, device):
    return (torch.tensor(SLOTS[:rows], dtype=torch.int32, device=device),
            torch.tensor(SCALES[:rows], dtype=torch.float32, device=device))


def _shrink_reference(x, a, sl, sc):
    out = torch.zeros(*x.shape[:2], a.shape[1], dtype=torch.float64)
    for r in range(x.shape[0]):
        if sl[r] >= 0:
            out[r] = float(sc[r]) * x[r].double() @ a[int(sl[r])].double().t()
    return out


def test_split_shrink_torch_path_sums_to_the_reference():
    g = torch.Generator().manual_seed(0)
    x, a = torch.randn(5, 23, 100, generator=g), torch.randn(3, 48, 100, generator=g) * 0.2
    sl, sc = _plan(5, "cpu")
    want = _shrink_reference(x, a, sl, sc)
    one = lora_shrink_split(x, a, sl, sc, groups=3, split=1, impl="torch")
    assert torch.allclose(one.double(), want, atol=1e-4)
    parts = lora_shrink_split(x, a, sl, sc, groups=3, split=3, impl="torch")
    assert parts.shape == (3, 5, 23, 48) and parts.dtype == torch.float32
    assert torch.allclose((parts.sum(0) * sc.view(-1, 1, 1)).double(), want, atol=1e-4)
    with pytest.raises(ValueError, match="split"):
        lora_shrink_split(x, a, sl, sc, split=9, impl="torch")
    with pytest.raises(ValueError, match="G=5"):
        lora_shrink_split(x, a, sl, sc, groups=5, impl="torch")


def test_choose_split_only_where_tokens_are_few_and_the_input_long():
    assert choose_split(1280, 8, 1, 8960) == 4  # FFN out at 17x256x256: 160 tiles of 64 tokens
    assert choose_split(32760, 8, 1, 8960) == 1  # 81x480x832: the tokens fill the GPU
    assert choose_split(1280, 8, 1, 1536) == 1  # a short input: chunks of 1024 at least


@TRITON
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_split_shrink_matches_torch_path(dtype):
    dev = kernel_device()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for seed, n, k, groups, split in ((0, 37, 200, 1, 3), (1, 20, 64, 3, 1), (2, 9, 130, 2, 2)):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(5, n, k, generator=g).to(dev, dtype)
        a = (torch.randn(3, groups * 16, k, generator=g) * 0.2).to(dev, dtype)
        sl, sc = _plan(5, dev)
        want = lora_shrink_split(x, a, sl, sc, groups=groups, split=split, impl="torch")
        got = lora_shrink_split(x, a, sl, sc, groups=groups, split=split, impl="triton")
        keep = sl >= 0  # rows without an adapter are left unwritten
        if split > 1:  # where K is cut depends on the K tile: the partials' sums are the result
            assert got.shape == want.shape and got.dtype == torch.float32
            want, got = want[:, keep].sum(0), got[:, keep].sum(0)
        else:
            want, got = want[keep], got[keep]
        assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol), (got.float() - want.float()).abs().max()


@TRITON
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_expand_alone_matches_the_group_delta(dtype):
    from fastvideo3.kernels.lora_grouped import lora_expand_
    dev = kernel_device()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 37, 48, generator=g).to(dev, dtype)
    y = torch.randn(5, 37, 96, generator=g).to(dev, dtype)
    a = (torch.randn(3, 48, 48, generator=g) * 0.2).to(dev, dtype)
    b = (torch.randn(3, 96, 16, generator=g) * 0.2).to(dev, dtype)
    sl, sc = _plan(5, dev)
    want = lora_group_delta_(x, y.clone(), a, b, sl, sc, groups=3, impl="torch")
    xa = lora_shrink_split(x, a, sl, sc, groups=3, impl="triton")
    got = lora_expand_(xa, y.clone(), b, sl, groups=3)
    assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol), (got.float() - want.float()).abs().max()
    assert torch.equal(got[1], y[1])


def _norm_case(dtype, n=37, d=160, rank=16, slots=3, rows=5, seed=0, device="cpu", next_c=48):
    g = torch.Generator().manual_seed(seed)
    x_in = torch.randn(rows, n, 96, generator=g).to(device, dtype)
    down = (torch.randn(slots, rank, 96, generator=g) * 0.2).to(device, dtype)
    up, x, y, gate, a, b, w, bias = norm_operands(g, dtype, n, d, rank, slots, rows, device)
    nd = (torch.randn(slots, next_c, d, generator=g) * 0.1).to(device, dtype)
    return x_in, down, up, x, y, gate, a, b, w, bias, nd


def test_add_norm_next_torch_path_is_expand_norm_then_the_next_shrink():
    x_in, down, up, x, y, gate, a, b, _, _, nd = _norm_case(torch.float32)
    sl, sc = _plan(5, "cpu")
    xa = lora_shrink_split(x_in, down, sl, sc, impl="torch")
    x1, x2 = x.clone(), x.clone()
    want_h = lora_add_norm(xa, up, sl, x1, y.clone(), gate, a, b, modulate=True, eps=1e-6, impl="torch")
    h, e = lora_add_norm_next(xa, sc, up, sl, x2, y.clone(), gate, a, b, modulate=True, eps=1e-6, next_down=nd)
    assert torch.allclose(h, want_h, atol=1e-5) and torch.allclose(x2, x1, atol=1e-6)
    assert torch.allclose(e.double(), _shrink_reference(h, nd, sl, sc), atol=1e-4)
    # the widened layout: [h | E] is what lora_widen builds from h
    nd16 = nd[:, :16]
    h3, xw = lora_add_norm_next(xa, sc, up, sl, x.clone(), y.clone(), gate, a, b, modulate=True, eps=1e-6,
                                next_down=nd16, wide=3)
    assert xw.shape == (5, 37, 160 + 48) and torch.equal(xw[..., :160], h3)
    assert torch.allclose(xw, lora_widen(h3, nd16, sl, sc, blocks=3, impl="torch"), atol=1e-5)
    # split-K partials in place of xa: the same activations
    parts = lora_shrink_split(x_in, down, sl, sc, split=2, impl="torch")
    h4 = lora_add_norm_next(None, sc, up, sl, x.clone(), y.clone(), gate, a, b, modulate=True, eps=1e-6,
                            xa_parts=parts)
    assert torch.allclose(h4, want_h, atol=1e-5)
    with pytest.raises(ValueError, match="wide"):
        lora_add_norm_next(xa, sc, up, sl, x.clone(), y.clone(), gate, a, b, modulate=True, eps=1e-6,
                           next_down=nd16, wide=4)


@TRITON
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_add_norm_next_matches_torch_path(dtype):
    """Gated + modulated, ungated + affine; xa or split-K partials; no next, a group's next shrink
    (48 = 3 x 16 columns, padded in the kernel) and a widened next input; a row without an adapter."""
    dev = kernel_device()
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    cases = ((0, 37, True, True, 0, 0), (1, 20, False, True, 2, 48), (2, 9, True, False, 0, -3),
             (3, 70, True, True, 3, -3))  # wide: as many blocks as the highest slot needs
    for seed, n, gated, modulate, split, nxt in cases:
        x_in, down, up, x, y, gate, a, b, w, bias, nd = _norm_case(dtype, n=n, seed=seed, device=dev)
        sl, sc = _plan(5, dev)
        g = gate if gated else None
        na, nb = (a, b) if modulate else (w, bias)
        kw = dict(modulate=modulate, eps=1e-6)
        if nxt > 0:
            kw.update(next_down=nd)
        elif nxt < 0:
            kw.update(next_down=nd[:, :16], wide=-nxt)
        outs = []
        for impl in ("torch", "triton"):
            src = lora_shrink_split(x_in, down, sl, sc, split=max(split, 1), impl=impl)
            src = {"xa": src} if split == 0 else {"xa": None, "xa_parts": src}
            xk = x.clone()
            outs.append((xk, lora_add_norm_next(scales=sc, up=up, slots=sl, x=xk, y=y.clone(), gate=g, a=na, b=nb,
                                                impl=impl, **src, **kw)))
        (xt, want), (xk, got) = outs
        assert torch.allclose(xk.float(), xt.float(), atol=tol, rtol=tol), (xk.float() - xt.float()).abs().max()
        want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
        for wt, gt in zip(want, got):
            err = (gt.float() - wt.float()).abs().max()
            assert gt.shape == wt.shape and torch.allclose(gt.float(), wt.float(), atol=tol, rtol=tol), err
        if dtype == torch.float32:
            assert torch.allclose(xk[1], x[1] + y[1] * (gate[1] if gated else 1), atol=1e-5)  # no adapter


def test_store_plan_buffers_and_static_widened_weights():
    from fastvideo3.models.wan.lora import layer_shapes
    from fastvideo3.runtime.pool.adapters import AdapterStore
    from tests.unit.test_lora import CFG, _adapter
    store = AdapterStore(layer_shapes(CFG), "cpu", torch.float32, slots=3, max_rank=16)
    store.static = True
    a, b = _adapter(1, "a"), _adapter(2, "b")
    store.load(a)
    store.load(b)
    store.acquire("r1", [("a", a.version, 1.0)])
    layer = "blocks.0.ffn.net.0.proj"
    w = torch.randn(CFG.ffn_dim, CFG.inner_dim)
    first = store._widened_weight(layer, w, 2)
    store.acquire("r2", [("b", b.version, 1.0)])  # places b in slot 1: rewritten in place, kept
    assert store._widened_weight(layer, w, 2) is first
    assert torch.equal(first[:, CFG.inner_dim + 16:], store.up[layer][1]) and store.up[layer][1].abs().max() > 0
    rows_ab = [[("a", a.version, 1.0)], [("b", b.version, 0.5)]]
    with store.batch(rows_ab):
        plan = store._plan
        assert plan[0].tolist() == [[0, 1]] and store.blocks == 2
    with store.batch(rows_ab[::-1]):  # another assignment: the same buffers, new contents
        assert store._plan[0] is plan[0] and plan[0].tolist() == [[1, 0]] and plan[1].tolist() == [[0.5, 1.0]]
    store.fixed_blocks = 3
    with store.batch(rows_ab):
        assert store.blocks == 3
    store.fixed_blocks = 1
    with pytest.raises(Exception, match="fixed_blocks"):
        with store.batch(rows_ab):
            pass
    assert not store.active  # a refused batch leaves no plan behind


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
@pytest.mark.skipif(INTERPRET, reason="already under the interpreter")
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here: the compiled kernels are tested directly (the "
                    "older Triton on GPU images cannot interpret these kernels)")
@pytest.mark.timeout(330)
def test_fused_kernels_under_the_interpreter():
    run_under_interpreter("triton_", ["tests/unit/test_lora_fused.py"], passed=6)


def test_add_norm_next_without_lora_rows_is_add_norm():
    """Every row without an adapter: the plain residual + norm, and zeros for the next shrink."""
    x_in, down, up, x, y, gate, a, b, _, _, nd = _norm_case(torch.float32, rows=2)
    sl, sc = torch.tensor([-1, -1], dtype=torch.int32), torch.zeros(2)
    xa = torch.zeros(2, 37, 16)
    x1, x2 = x.clone(), x.clone()
    want = add_norm(x1, y.clone(), gate, a, b, modulate=True, eps=1e-6)
    h, e = lora_add_norm_next(xa, sc, up, sl, x2, y.clone(), gate, a, b, modulate=True, eps=1e-6, next_down=nd)
    assert torch.allclose(h, want, atol=1e-6) and torch.equal(x1, x2) and e.abs().max() == 0
