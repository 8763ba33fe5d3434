"""The segmented low-rank delta: the PyTorch path against a plain per-row reference, and the
Triton kernel against the PyTorch path, alone and inside the fast DiT path (compiled on CUDA; on a
CPU under ``TRITON_INTERPRET=1``, in a child process, since Triton decides when the kernel is
first defined)."""
from __future__ import annotations

import pytest
import torch

from fastvideo3.kernels.fused import triton_available
from fastvideo3.kernels.lora import lora_delta_
from fastvideo3.kernels.lora_grouped import lora_group_delta_, lora_widen, widen_pays, widen_weight
from tests.helpers_lora import INTERPRET, kernel_device, norm_operands, run_under_interpreter, triton_mark

TRITON = triton_mark("needs a GPU, or the Triton interpreter: on a CPU the test below runs it in a child process")
pytestmark = pytest.mark.timeout(120)


def _case(dtype, n=37, k=48, out=80, rank=16, slots=3, rows=5, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, k, generator=g).to(device, dtype)
    y = torch.randn(rows, n, out, generator=g).to(device, dtype)
    a = (torch.randn(slots, rank, k, generator=g) * 0.2).to(device, dtype)
    b = (torch.randn(slots, out, rank, generator=g) * 0.2).to(device, dtype)
    sl = torch.tensor([2, -1, 0, 2, 1][:rows], dtype=torch.int32, device=device)
    sc = torch.tensor([0.7, 0.0, 1.0, -0.5, 2.0][:rows], dtype=torch.float32, device=device)
    return x, y, a, b, sl, sc


def _kernel_cases(dtype):
    """The one-layer cases of the Triton tests, on the kernel device: a short and a longer clip."""
    for seed, n in ((0, 37), (1, 130)):
        yield _case(dtype, n=n, seed=seed, device=kernel_device())


def _reference(x, y, a, b, sl, sc):
    want = y.clone().double()
    for r in range(x.shape[0]):
        s = int(sl[r])
        if s >= 0:
            want[r] += float(sc[r]) * (x[r].double() @ a[s].double().t()) @ b[s].double().t()
    return want


def test_torch_path_matches_per_row_reference():
    x, y, a, b, sl, sc = _case(torch.float32)
    want = _reference(x, y, a, b, sl, sc)
    y0 = y.clone()
    lora_delta_(x, y, a, b, sl, sc, impl="torch")
    assert torch.allclose(y.double(), want, atol=1e-4, rtol=1e-4)
    assert torch.equal(y[1], y0[1])  # a row without an adapter is untouched, bit for bit


def test_gelu_after_the_delta_reaches_every_row():
    x, y, a, b, sl, sc = _case(torch.float32)
    want = torch.nn.functional.gelu(_reference(x, y, a, b, sl, sc), approximate="tanh")
    lora_delta_(x, y, a, b, sl, sc, impl="torch", act="gelu_tanh")
    assert torch.allclose(y.double(), want, atol=1e-4, rtol=1e-4)  # row 1 (no adapter) included


def test_strided_output_view_is_written_in_place():
    x, y, a, b, sl, sc = _case(torch.float32, out=80)
    fused = torch.zeros(x.shape[0], x.shape[1], 3 * 80)
    fused[..., 80:160] = y
    view = fused[..., 80:160]
    lora_delta_(x, view, a, b, sl, sc, impl="torch")
    assert torch.allclose(fused[..., 80:160].double(), _reference(x, y, a, b, sl, sc), atol=1e-4)
    assert fused[..., :80].abs().max() == 0 and fused[..., 160:].abs().max() == 0


def test_shape_errors_name_the_operands():
    x, y, a, b, sl, sc = _case(torch.float32)
    with pytest.raises(ValueError, match="adapter dims"):
        lora_delta_(x, y, a[..., :10], b, sl, sc)
    with pytest.raises(ValueError, match="one entry per row"):
        lora_delta_(x, y, a, b, sl[:2], sc)


@TRITON
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernel_matches_torch_path(dtype):
    for x, y, a, b, sl, sc in _kernel_cases(dtype):
        want = lora_delta_(x, y.clone(), a, b, sl, sc, impl="torch")
        got = lora_delta_(x, y.clone(), a, b, sl, sc, impl="triton")
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol), (got.float() - want.float()).abs().max()
        assert torch.equal(got[1], y[1])
        want = lora_delta_(x, y.clone(), a, b, sl, sc, impl="torch", act="gelu_tanh")
        got = lora_delta_(x, y.clone(), a, b, sl, sc, impl="triton", act="gelu_tanh")
        assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol), (got.float() - want.float()).abs().max()


def _group_case(dtype, groups=3, n=37, k=48, og=32, rank=16, slots=3, rows=5, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, k, generator=g).to(device, dtype)
    y = torch.randn(rows, n, groups * og, generator=g).to(device, dtype)
    a = (torch.randn(slots, groups * rank, k, generator=g) * 0.2).to(device, dtype)
    b = (torch.randn(slots, groups * og, rank, generator=g) * 0.2).to(device, dtype)
    sl = torch.tensor([2, -1, 0, 2, 1][:rows], dtype=torch.int32, device=device)
    sc = torch.tensor([0.7, 0.0, 1.0, -0.5, 2.0][:rows], dtype=torch.float32, device=device)
    return x, y, a, b, sl, sc


def _group_reference(x, y, a, b, sl, sc, groups):
    r, og = a.shape[1] // groups, y.shape[2] // groups
    want = y.clone().double()
    for g in range(groups):
        want[..., g * og:(g + 1) * og] = _reference(x, y[..., g * og:(g + 1) * og], a[:, g * r:(g + 1) * r],
                                                    b[:, g * og:(g + 1) * og], sl, sc)
    return want


def test_group_torch_path_matches_per_member_reference():
    x, y, a, b, sl, sc = _group_case(torch.float32)
    want = _group_reference(x, y, a, b, sl, sc, 3)
    got = lora_group_delta_(x, y.clone(), a, b, sl, sc, groups=3, impl="torch")
    assert torch.allclose(got.double(), want, atol=1e-4, rtol=1e-4)
    assert torch.equal(got[1], y[1])


def test_group_shape_errors():
    x, y, a, b, sl, sc = _group_case(torch.float32)
    with pytest.raises(ValueError, match="member"):
        lora_group_delta_(x, y, a, b, sl, sc, groups=2)
    with pytest.raises(ValueError, match="single layer"):
        lora_group_delta_(x, y, a, b, sl, sc, groups=3, act="gelu_tanh")


@TRITON
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernel_grouped_matches_torch_path(dtype):
    """The two-pass kernels: a 3-member group (fused QKV), one layer with and without the GELU,
    mixed adapters and a row without one (left bit for bit), short and longer token counts."""
    device = kernel_device()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for seed, n, groups in ((0, 37, 3), (1, 130, 1), (2, 9, 2)):
        x, y, a, b, sl, sc = _group_case(dtype, groups=groups, n=n, seed=seed, device=device)
        for act in ((None, "gelu_tanh") if groups == 1 else (None,)):
            want = lora_group_delta_(x, y.clone(), a, b, sl, sc, groups=groups, impl="torch", act=act)
            got = lora_group_delta_(x, y.clone(), a, b, sl, sc, groups=groups, impl="triton", act=act)
            err = (got.float() - want.float()).abs().max()
            assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol), err
            if act is None:
                assert torch.equal(got[1], y[1])
            # the one-pass kernel, member by member, gives the same
            r, og = a.shape[1] // groups, y.shape[2] // groups
            one = y.clone()
            for g in range(groups):
                lora_delta_(x, one[..., g * og:(g + 1) * og], a[:, g * r:(g + 1) * r], b[:, g * og:(g + 1) * og],
                            sl, sc, impl="triton", act=act)
            assert torch.allclose(got.float(), one.float(), atol=tol, rtol=tol)


def test_widened_gemm_adds_the_delta():
    """[x | E] @ [W | up blocks].T == x @ W.T + each row's delta (rows mixing slots, and none)."""
    x, y, a, b, sl, sc = _case(torch.float32)
    g = torch.Generator().manual_seed(5)
    w = torch.randn(b.shape[1], x.shape[2], generator=g)
    base = x @ w.t()
    want = lora_delta_(x, base.clone(), a, b, sl, sc, impl="torch")
    xw = lora_widen(x, a, sl, sc, blocks=3, impl="torch")
    assert xw.shape == (*x.shape[:2], x.shape[2] + 3 * a.shape[1]) and torch.equal(xw[..., :x.shape[2]], x)
    assert xw[1, :, x.shape[2]:].abs().max() == 0  # no adapter: zeros
    got = xw @ widen_weight(w, b, 3).t()
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="blocks"):
        lora_widen(x, a, sl, sc, blocks=4)


def test_widen_pays_where_the_output_is_wide_and_the_extra_rank_small():
    assert widen_pays(1536, 8960, 128, 2)  # Wan 1.3B FFN in, 4 adapters of rank 32
    assert widen_pays(1536, 1536, 128, 2)
    assert not widen_pays(1536, 1536, 256, 2)  # 8 adapters of rank 32 (or 4 of rank 64)
    assert not widen_pays(8960, 1536, 128, 2)  # FFN out: the input copy outweighs the output


@TRITON
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernel_widen_matches_torch_path(dtype):
    for x, _, a, _, sl, sc in _kernel_cases(dtype):
        want = lora_widen(x, a, sl, sc, blocks=3, impl="torch")
        got = lora_widen(x, a, sl, sc, blocks=3, impl="triton")
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        assert torch.equal(got[..., :x.shape[2]], x)
        assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol), (got.float() - want.float()).abs().max()
        assert got[1, :, x.shape[2]:].abs().max() == 0


def _norm_case(dtype, n=37, d=160, rank=16, slots=3, rows=5, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    xa = (torch.randn(rows, n, rank, generator=g) * 0.5).to(device, dtype)
    up, x, y, gate, a, b, w, bias = norm_operands(g, dtype, n, d, rank, slots, rows, device)
    sl = torch.tensor([2, -1, 0, 2, 1][:rows], dtype=torch.int32, device=device)
    return xa, up, x, y, gate, a, b, w, bias, sl


def test_lora_add_norm_torch_path_is_the_expand_then_add_norm():
    from fastvideo3.kernels.fused import add_norm
    from fastvideo3.kernels.lora_norm import lora_add_norm
    xa, up, x, y, gate, a, b, _, _, sl = _norm_case(torch.float32)
    y2 = y.clone()
    for r in range(x.shape[0]):
        if sl[r] >= 0:
            y2[r] += xa[r] @ up[int(sl[r])].t()
    x2 = x.clone()
    want = add_norm(x2, y2, gate, a, b, modulate=True, eps=1e-6)
    x1 = x.clone()
    got = lora_add_norm(xa, up, sl, x1, y.clone(), gate, a, b, modulate=True, eps=1e-6)
    assert torch.allclose(got, want, atol=1e-5) and torch.allclose(x1, x2, atol=1e-6)


@TRITON
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernel_lora_add_norm_matches_torch_path(dtype):
    """The expand fused into the residual + LayerNorm: gated and modulated, ungated and affine,
    mixed adapters and a row without one, a token count that is not a tile multiple."""
    from fastvideo3.kernels.lora_norm import lora_add_norm
    device = kernel_device()
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    for seed, n, gated, modulate in ((0, 37, True, True), (1, 20, False, True), (2, 9, True, False)):
        xa, up, x, y, gate, a, b, w, bias, sl = _norm_case(dtype, n=n, seed=seed, device=device)
        g = gate if gated else None
        na, nb = (a, b) if modulate else (w, bias)
        xt, xk = x.clone(), x.clone()
        want = lora_add_norm(xa, up, sl, xt, y.clone(), g, na, nb, modulate=modulate, eps=1e-6, impl="torch")
        got = lora_add_norm(xa, up, sl, xk, y.clone(), g, na, nb, modulate=modulate, eps=1e-6, impl="triton")
        assert torch.allclose(xk.float(), xt.float(), atol=tol, rtol=tol), (xk.float() - xt.float()).abs().max()
        assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol), (got.float() - want.float()).abs().max()
        if dtype == torch.float32:
            assert torch.allclose(xk[1], xt[1], atol=1e-6)  # no adapter: the plain residual


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
@pytest.mark.skipif(INTERPRET, reason="already under the interpreter")
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here: the compiled kernels are tested directly (the "
                    "older Triton on GPU images cannot interpret these kernels)")
@pytest.mark.timeout(330)
def test_triton_kernel_under_the_interpreter():
    run_under_interpreter("triton_kernel_matches or triton_kernel_grouped or triton_kernel_widen"
                          " or triton_kernel_lora_add_norm or fast_path",
                          ["tests/unit/test_lora_kernel.py", "tests/unit/test_lora.py"], passed=24)
