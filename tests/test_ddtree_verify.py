"""Tree-verify attention (MLA absorbed): reference, CPU path, peers, errors, floor; GPU parity of every kept
kernel against the float64 reference (marker gpu, tolerances from tests/tolerances.py)."""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

from tolerances import assert_close
from workbench.bench import ddtree as bench
from workbench.ddtree import verify as V
from workbench.bench import verify_peers as VP
from workbench.kernels import KERNEL_DIR


def _loop_reference(q_latent, q_rope, kv, slots, tail, parents, scale):
    """Independent row-by-row float64 implementation (explicit ancestor walk per row)."""
    ql, qr = np.asarray(q_latent, np.float64), np.asarray(q_rope, np.float64)
    kv, tail = np.asarray(kv, np.float64), np.asarray(tail, np.float64)
    T, H = ql.shape[:2]
    out = np.zeros((T, H, 512))
    lse = np.zeros((T, H))
    for i in range(T):
        anc, j = [], i
        while j >= 0:
            anc.append(j)
            j = int(parents[j])
        keys = np.concatenate([kv[np.asarray(slots, np.int64)], tail[sorted(anc)]], 0)
        for h in range(H):
            s = (keys[:, :512] @ ql[i, h] + keys[:, 512:] @ qr[i, h]) * scale
            m = s.max()
            w = np.exp(s - m)
            lse[i, h] = m + np.log(w.sum())
            out[i, h] = (w / w.sum()) @ keys[:, :512]
    return out, lse


def _np_inputs(T=6, H=3, P=11, S=40, seed=0):
    rng = np.random.default_rng(seed)
    par = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, T)])
    return dict(q_latent=rng.standard_normal((T, H, 512)), q_rope=rng.standard_normal((T, H, 64)),
                kv_cache=rng.standard_normal((S, 576)), prefix_slots=rng.permutation(S)[:P],
                tail_kv=rng.standard_normal((T, 576)), parents=par, scale=0.07)


def test_reference_hand_case_uniform_softmax():
    # zero queries -> uniform weights over the visible keys: out = mean of visible c_kv, lse = log(count)
    T, H, P = 3, 2, 2
    kv = np.arange(5 * 576, dtype=np.float64).reshape(5, 576) / 100.0
    tail = -np.arange(T * 576, dtype=np.float64).reshape(T, 576) / 50.0
    slots = np.array([4, 1])
    parents = np.array([-1, 0, 0])  # node 2 sees tail 0 and 2, not 1
    out, lse = V.verify_attention_reference(np.zeros((T, H, 512)), np.zeros((T, H, 64)), kv, slots, tail,
                                            parents, 1.0)
    visible = {0: [0], 1: [0, 1], 2: [0, 2]}
    for i in range(T):
        rows = np.concatenate([kv[slots], tail[visible[i]]], 0)[:, :512]
        for h in range(H):
            np.testing.assert_allclose(out[i, h], rows.mean(0), rtol=1e-12, atol=1e-12)
            assert lse[i, h] == pytest.approx(np.log(P + len(visible[i])), abs=1e-12)


def test_reference_matches_loop_and_torch_input():
    inp = _np_inputs()
    out, lse = V.verify_attention_reference(**inp)
    lo, ll = _loop_reference(inp["q_latent"], inp["q_rope"], inp["kv_cache"], inp["prefix_slots"],
                             inp["tail_kv"], inp["parents"], inp["scale"])
    np.testing.assert_allclose(out, lo, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(lse, ll, rtol=1e-12, atol=1e-10)
    tin = {k: torch.as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in inp.items()}
    to, tl = V.verify_attention_reference(**tin)
    assert torch.is_tensor(to) and to.dtype == torch.float64
    np.testing.assert_allclose(to.numpy(), out, rtol=0, atol=1e-12)


def test_reference_prefix_zero_and_invisible_tail_rows():
    inp = _np_inputs(T=5, H=2, P=0)
    inp["parents"] = np.array([-1, 0, 1, 0, 3])
    out, _ = V.verify_attention_reference(**inp)
    # changing tail row 2 (not an ancestor of 0, 1, 3, 4) leaves those rows unchanged
    inp2 = dict(inp, tail_kv=inp["tail_kv"].copy())
    inp2["tail_kv"][2] += 5.0
    out2, _ = V.verify_attention_reference(**inp2)
    np.testing.assert_array_equal(out[[0, 1, 3, 4]], out2[[0, 1, 3, 4]])
    assert not np.allclose(out[2], out2[2])
    # root row with no prefix sees only itself: output is its own c_kv
    np.testing.assert_allclose(out[0, 0], inp["tail_kv"][0, :512], rtol=1e-12)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_cpu_path_and_peers_match_reference(dtype, tol):
    inp = V.random_verify_inputs(7, 3, 29, dtype, "cpu", seed=5)
    ro, rl = V.verify_attention_reference(**inp)
    for fn in (V.verify_attention, VP.verify_attention_naive, VP.verify_attention_sdpa):
        o, l = fn(**inp)
        assert o.shape == (7, 3, 512) and o.dtype == dtype
        rel = float(torch.linalg.vector_norm(o.double() - ro) / torch.linalg.vector_norm(ro))
        assert rel < tol, (fn.__name__, rel)
        if l is not None:  # the naive bf16 peer rounds its scores to bf16: looser lse
            assert l.dtype == torch.float32 and l.shape == (7, 3)
            lse_tol = 1e-4 if dtype == torch.float32 or fn is V.verify_attention else 0.1
            assert float((l.double() - rl).abs().max()) < lse_tol, fn.__name__


def test_batched_cpu_matches_per_request_reference():
    inp = V.random_verify_inputs(4, 2, [0, 13, 6], torch.float32, "cpu", seed=2)
    o, l = V.verify_attention_batched(**inp)
    assert o.shape == (3, 4, 2, 512) and l.shape == (3, 4, 2)
    offs = inp["prefix_offsets"].tolist()
    for b in range(3):
        ro, rl = V.verify_attention_reference(inp["q_latent"][b], inp["q_rope"][b], inp["kv_cache"],
                                              inp["prefix_slots"][offs[b]:offs[b + 1]], inp["tail_kv"][b],
                                              inp["parents"][b], inp["scale"])
        assert float((o[b].double() - ro).abs().max()) < 1e-5
        assert float((l[b].double() - rl).abs().max()) < 1e-5


def test_bad_inputs_raise_clear_errors():
    inp = V.random_verify_inputs(4, 2, 5, torch.float32, "cpu", seed=1)
    with pytest.raises(ValueError, match="q_latent must be"):
        V.verify_attention(**dict(inp, q_latent=inp["q_latent"][..., :500]))
    with pytest.raises(ValueError, match="q_rope must be"):
        V.verify_attention(**dict(inp, q_rope=inp["q_rope"][:3]))
    with pytest.raises(ValueError, match="kv_cache must be"):
        V.verify_attention(**dict(inp, kv_cache=inp["kv_cache"][:, :512]))
    with pytest.raises(ValueError, match="tail_kv must be"):
        V.verify_attention(**dict(inp, tail_kv=inp["tail_kv"][:2]))
    with pytest.raises(ValueError, match="parents"):
        V.verify_attention(**dict(inp, parents=torch.tensor([-1, 0, 2, 1])))
    with pytest.raises(ValueError, match="parents"):
        V.verify_attention_reference(**dict(inp, parents=torch.tensor([-1, 0, 5, 1])))
    with pytest.raises(ValueError, match="prefix_slots must lie"):
        V.verify_attention(**dict(inp, prefix_slots=inp["prefix_slots"] + 10_000))
    with pytest.raises(ValueError, match="prefix_slots must lie"):
        V.verify_attention_reference(**dict(inp, prefix_slots=inp["prefix_slots"] - 100))
    with pytest.raises(ValueError, match="scale"):
        V.verify_attention(**dict(inp, scale=0.0))
    with pytest.raises(ValueError, match="one dtype"):
        V.verify_attention(**dict(inp, tail_kv=inp["tail_kv"].double()))
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        V.verify_attention(**{k: (v.half() if torch.is_tensor(v) and v.is_floating_point() else v)
                              for k, v in inp.items()})
    with pytest.raises(ValueError, match="impl"):
        V.verify_attention(**inp, impl="tma")
    b = V.random_verify_inputs(3, 2, [4, 2], torch.float32, "cpu", seed=3)
    with pytest.raises(ValueError, match="prefix_offsets"):
        V.verify_attention_batched(**dict(b, prefix_offsets=torch.tensor([0, 5, 4])))
    with pytest.raises(ValueError, match="prefix_offsets must be"):
        V.verify_attention_batched(**dict(b, prefix_offsets=torch.tensor([0, 6])))


def test_floor_and_plan():
    fl = bench.verify_floor(33, 8, 131072, 2, 4300.0, 700.0)
    assert fl["bound"] == "compute"
    assert fl["floor_ms"] == pytest.approx(2 * 264 * (131072 + 33) * 1088 / 700e12 * 1e3)
    assert 0.09 < fl["floor_ms"] < 0.12
    assert bench.verify_floor(1, 1, 131072, 2, 4300.0, 700.0)["bound"] == "memory"
    rng = np.random.default_rng(0)
    for _ in range(200):
        B = int(rng.integers(1, 70))
        T = int(rng.integers(1, 300))
        H = int(rng.choice([1, 8, 64]))
        pre = rng.integers(0, 50_000, size=B)
        rb, clen, n = V._plan(int(pre.sum()), B, T, T * H, 64, 132, None)
        assert clen >= 64 and clen % 64 == 0 and rb == -(-T * H // 64)
        assert sum(-(-(p + T) // clen) for p in pre) <= n  # grid covers every chunk
    rb, clen, n = V._plan(131072, 1, 33, 264, 64, 132, None)
    assert rb * n <= 132
    rb, clen, n = V._plan(131072, 1, 33, 264, 64, 132, None, key_align=128)
    assert clen % 128 == 0 and rb * n <= 132
    with pytest.raises(ValueError, match="chunk_len"):
        V._plan(100, 1, 33, 264, 64, 132, 0)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_kernel_compiles_without_spills():
    src = KERNEL_DIR / "ddtree_verify.cu"
    res = subprocess.run(["nvcc", "-arch=sm_90", "-c", str(src), "-o", "/dev/null", "-Xptxas", "-v"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    report = res.stderr.split("Compiling entry function 'ddtree_verify_mma_bf16'")[1]
    report = report.split("Compiling entry function")[0]
    assert re.search(r"0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", report), report


def _sm90a_report() -> str:
    """ptxas -v report of the sm_90a build of ddtree_verify.cu (the target the wgmma kernel is loaded with)."""
    src = KERNEL_DIR / "ddtree_verify.cu"
    res = subprocess.run(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-cubin", str(src),
                          "-o", "/dev/null", "-Xptxas", "-v"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    # ptxas must keep the wgmma pipeline: no C7514/C7515 ("wgmma serialization") warning anywhere
    assert "C7514" not in res.stderr and "C7515" not in res.stderr and "warning" not in res.stderr.lower(), res.stderr
    return res.stderr


def _entry_report(stderr: str, name: str) -> str:
    return stderr.split(f"Compiling entry function '{name}'")[1].split("Compiling entry function")[0]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_wgmma_kernel_builds_for_sm90a_without_spills_or_serialisation():
    report = _entry_report(_sm90a_report(), "ddtree_verify_wgmma_bf16")
    assert re.search(r"0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", report), report


def test_dispatch_tables_name_verify_kernels():
    """Every dispatch table names kernels this module has, for each dtype the kernel accepts."""
    import json

    from workbench.dispatch import DISPATCH_DIR

    for path in sorted(DISPATCH_DIR.glob("*.json")):
        raw = json.loads(path.read_text())
        assert raw["verify_bf16"] in ("wgmma", "mma"), path.name
        assert raw["verify_fp32"] == "simple", path.name


# ----------------------------------------------------------------------------- GPU

def _check(inp, impl="auto", **kw):
    """One call on fresh random inputs, outputs and workspace poisoned first, against the float64 reference."""
    name = "verify_bf16" if inp["q_latent"].dtype == torch.bfloat16 else "verify_fp32"
    batched = "prefix_offsets" in inp
    out = torch.full(inp["q_latent"].shape, float("nan"), dtype=inp["q_latent"].dtype, device="cuda")
    lse = torch.full(inp["q_latent"].shape[:-1], float("nan"), dtype=torch.float32, device="cuda")
    fn = V.verify_attention_batched if batched else V.verify_attention
    o, l = fn(**inp, impl=impl, out=out, lse=lse, _poison_workspace=True, **kw)
    if batched:
        offs = inp["prefix_offsets"].tolist()
        refs = [V.verify_attention_reference(inp["q_latent"][b], inp["q_rope"][b], inp["kv_cache"],
                                             inp["prefix_slots"][offs[b]:offs[b + 1]], inp["tail_kv"][b],
                                             inp["parents"][b], inp["scale"]) for b in range(len(offs) - 1)]
        ro, rl = torch.stack([r[0] for r in refs]), torch.stack([r[1] for r in refs])
    else:
        ro, rl = V.verify_attention_reference(**inp)
    assert_close(name, o, ro)
    assert_close(name.replace("verify", "verify_lse"), l, rl)


def _kernels():
    kinds = ["mma"]
    if V.dispatched_impl("bfloat16") == "wgmma":
        kinds.append("wgmma")
    return kinds


@pytest.mark.gpu
@pytest.mark.parametrize("heads,prefix", [(8, 0), (8, 1), (8, 333), (64, 1000), (8, 9000)])
def test_gpu_dispatched_kernels_match_reference(heads, prefix):
    for dtype in ("bfloat16", "float32"):
        _check(V.random_verify_inputs(33, heads, prefix, dtype, "cuda", seed=prefix + heads))


@pytest.mark.gpu
def test_gpu_every_kernel_single_and_batched():
    """mma and (where dispatched) wgmma explicitly, simple for float32; batched requests of different prefixes."""
    for kind in _kernels():
        for h, p in ((8, 0), (8, 777), (64, 3000)):
            _check(V.random_verify_inputs(33, h, p, "bfloat16", "cuda", seed=p + h), kind)
        _check(V.random_verify_inputs(17, 8, [0, 300, 65], "bfloat16", "cuda", seed=2), kind)
    _check(V.random_verify_inputs(33, 8, 2000, "float32", "cuda", seed=3), "simple")
    _check(V.random_verify_inputs(17, 8, [0, 3000, 65, 700], "float32", "cuda", seed=4), "simple")
    with pytest.raises(ValueError, match="impl='simple' needs float32"):
        V.verify_attention(**V.random_verify_inputs(5, 2, 10, "bfloat16", "cuda"), impl="simple")


@pytest.mark.gpu
def test_gpu_wgmma_single_request_form_without_prepare():
    """The wgmma single-request form (T <= 128: no prepare launch, masks built in shared memory): many nodes per
    block, nodes split across blocks, the tail split across chunks, T = 128 and T = 129 (prepare again)."""
    if "wgmma" not in _kernels():
        pytest.skip(f"the dispatch here is {V.dispatched_impl('bfloat16')!r}, not wgmma")
    for n, h, p, c in ((100, 1, 500, None), (70, 3, 1000, 64), (33, 8, 1000, 64), (128, 2, 300, None),
                       (129, 2, 300, 128), (17, 64, 0, None)):
        _check(V.random_verify_inputs(n, h, p, "bfloat16", "cuda", seed=n + p), "wgmma", chunk_len=c)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["auto", "mma"])
def test_gpu_no_host_sync_and_cuda_graph(impl):
    inp = V.random_verify_inputs(33, 8, 5000, "bfloat16", "cuda", seed=11)
    ref, _ = V.verify_attention(**inp, impl=impl)  # warm-up (compiles the kernels)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        o, _ = V.verify_attention(**inp, check=False, impl=impl)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.equal(o, ref)
    out = torch.empty_like(ref)
    lse = torch.empty(33, 8, dtype=torch.float32, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        V.verify_attention(**inp, check=False, out=out, lse=lse, impl=impl)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        V.verify_attention(**inp, check=False, out=out, lse=lse, impl=impl)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref)


@pytest.mark.gpu
def test_gpu_kernel_that_cannot_build_raises_with_its_name(monkeypatch):
    """No fallback: a kernel that fails to build raises RuntimeError naming it."""
    import workbench.kernels as K

    real = K.get_kernel

    def broken(family, name, *a, **k):
        if name == "ddtree_verify_mma_bf16":
            raise K.KernelUnavailable("nvcc is not on the PATH")
        return real(family, name, *a, **k)

    V._kernel.cache_clear()
    monkeypatch.setattr(K, "get_kernel", broken)
    try:
        with pytest.raises(RuntimeError, match="kernel ddtree_verify_mma_bf16 .* failed to build"):
            V.verify_attention(**V.random_verify_inputs(5, 2, 10, "bfloat16", "cuda"), impl="mma")
    finally:
        V._kernel.cache_clear()


@pytest.mark.gpu
def test_gpu_bench_check_verify_passes():
    row = bench.check_verify(V.random_verify_inputs(33, 8, 700, "bfloat16", "cuda", seed=5))
    assert row["pass"] and row["kernel"] == "verify_attention[auto]", row
