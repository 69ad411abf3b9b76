"""Tree-verify attention (MLA absorbed): reference, CPU path, peers, errors; GPU parity (marker gpu)."""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

from workbench.ddtree import verify as V
from workbench.ddtree import verify_bench as VB
from workbench.ddtree import verify_peers as VP
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


def test_parity_rows_cpu():
    rows = VB.verify_parity_rows(None, "cpu")
    assert rows and all(r["pass"] for r in rows), rows
    for r in rows:
        assert set(r) >= {"kernel", "shapes", "cases", "max_abs_err", "max_rel_err", "bit_exact", "pass"}
        assert r["bit_exact"] is None and r["cases"] >= 1


def test_floor_and_plan():
    fl = VB.verify_floor(33, 8, 131072, 2, 4300.0, 700.0)
    assert fl["bound"] == "compute"
    assert fl["floor_ms"] == pytest.approx(2 * 264 * (131072 + 33) * 1088 / 700e12 * 1e3)
    assert 0.09 < fl["floor_ms"] < 0.12
    assert VB.verify_floor(1, 1, 131072, 2, 4300.0, 700.0)["bound"] == "memory"
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


def _sm90a_reports(option_sets: list[tuple[str, ...]]) -> list[str]:
    """ptxas -v reports of sm_90a builds of ddtree_verify.cu, one per -D option set (run in parallel)."""
    src = KERNEL_DIR / "ddtree_verify.cu"
    procs = [subprocess.Popen(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-cubin", *o, str(src),
                               "-o", "/dev/null", "-Xptxas", "-v"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for o in option_sets]
    out = []
    for o, pr in zip(option_sets, procs):
        _, err = pr.communicate(timeout=300)
        assert pr.returncode == 0, (o, err)
        # ptxas must keep the wgmma pipeline: no C7514/C7515 ("wgmma serialization") warning anywhere
        assert "C7514" not in err and "C7515" not in err, (o, err)
        assert "warning" not in err.lower(), (o, err)
        out.append(err)
    return out


def _sm90a_report(options: tuple[str, ...] = ()) -> str:
    return _sm90a_reports([options])[0]


def _entry_report(stderr: str, name: str) -> str:
    return stderr.split(f"Compiling entry function '{name}'")[1].split("Compiling entry function")[0]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_wgmma_kernel_builds_for_sm90a_without_spills_or_serialisation():
    # the target workbench.kernels.load_module(..., target="sm_90a") builds; no spills in either
    # warpgroup-MMA kernel
    err = _sm90a_report()
    for name in ("ddtree_verify_wgmma_bf16",):
        report = _entry_report(err, name)
        assert re.search(r"0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", report), (name, report)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_wgmma_variants_build_without_spills():
    # every -D build that python -m workbench.ddtree.verify_bench times beside the default (WGMMA_VARIANTS, and
    # SLOTRING_VARIANTS for h200_slotring.sh)
    variants = {**VB.WGMMA_VARIANTS, **VB.SLOTRING_VARIANTS}
    opts = sorted({tuple(v.get("_options", ())) for v in variants.values()} - {()})
    assert opts and set(variants) <= set(VB._named_variants())
    for o, err in zip(opts, _sm90a_reports(opts)):
        report = _entry_report(err, "ddtree_verify_wgmma_bf16")
        assert re.search(r"0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", report), (o, report)


def test_variants_and_private_switches_on_cpu():
    # on a CPU every variant's keywords are accepted and give the torch path's result
    inp = V.random_verify_inputs(3, 2, 10, torch.float32, "cpu", seed=4)
    ref, _ = V.verify_attention(**inp)
    for name, kw in VB.WGMMA_VARIANTS.items():
        o, _ = V.verify_attention(**inp, **kw)
        assert torch.equal(o, ref), name
    rows = VB.verify_parity_rows([dict(kernel="verify_attention[wgmma]", nodes=4, heads=2, prefix=9,
                                      dtype="float32", variant="wgmma_5de266b")], "cpu")
    assert rows[0]["pass"] and "[wgmma_5de266b]" in rows[0]["shapes"]


def test_probe_helpers():
    from workbench.ddtree import verify_probe as VP

    assert VP._parse_variants(["default", "s1=-DA=1,-DB=0"]) == {"default": {}, "s1": {"_options": ("-DA=1", "-DB=0")}}
    with pytest.raises(SystemExit):
        VP._parse_variants(["=-DA=1"])
    res = {"breakdown": [{"heads": 8, "prefix": 4096, "points": {"default": dict(prepare=0.01, attention=0.02,
                                                                                 merge=0.01, sum=0.04, call=0.03),
                                                                 "noprep": dict(prepare=None, attention=0.02,
                                                                                merge=0.01, sum=0.03, call=0.025)}}],
           "minimal_nodes": {"nodes_1_ms": 0.0105, "nodes_3_ms": 0.0105},
           "chunk_sweep": [dict(heads=8, prefix=4096, chunk_len=192, planner=True, row_blocks=5, chunks=22,
                                tiles_per_block=3, median_ms=0.031)]}
    text = VP.probe_table(res)
    assert "0.0300" in text and "0.0250" in text and "(planner)" in text and "minimal node 0.0105" in text
    # a token impl:KIND picks the kernel; a bare name of the benchmark's named variants gives its keywords
    v = VP._parse_variants(["mma", "m=impl:mma,-DA=1", "wgmma_5de266b"])
    assert v["mma"] == {"impl": "mma"} and v["m"] == {"_options": ("-DA=1",), "impl": "mma"}
    assert v["wgmma_5de266b"] == VB.WGMMA_VARIANTS["wgmma_5de266b"]
    with pytest.raises(SystemExit):
        VP._parse_variants(["x=impl:mma,impl:wgmma"])


def test_tables_show_a_failed_variant():
    # a variant that fails on the device is recorded (status, reason) and shown, the run goes on
    from workbench.ddtree import verify_probe as VP

    pt = dict(heads=8, nodes=33, prefix=4096, median_ms=0.03, pipelined_ms=0.029, eager_median_ms=0.2, floor_ms=0.003,
              floor_bound="compute", percent_of_floor=10.0, achieved_tflops=80.0, peers={},
              speedup_vs_best_peer=None, faster_than_all_peers=True,
              variants={"mma": {"status": "failed", "reason": "CUDADriverError: launch failed"},
                        "wgmma_prefetch": {"median_ms": 0.028, "mode": "cuda_graph", "pipelined_ms": 0.027}})
    text = VB.verify_table({"points": [pt]})
    assert "failed" in text and "0.0280" in text
    rows = VB.verify_benchmark_rows({"points": [pt]})
    assert rows[0]["mma_ms"] is None and rows[0]["wgmma_prefetch_ms"] == 0.028
    res = {"breakdown": [{"heads": 64, "prefix": 16384, "nodes": 32, "points": {
        "default": dict(prepare=None, attention=0.1, merge=0.01, sum=0.11, call=0.1),
        "mma": dict(prepare=None, attention=None, merge=None, sum=None, call=None, failed="RuntimeError: x")}}]}
    text = VP.probe_table(res)
    assert "mma T=32" in text and "FAILED: RuntimeError: x" in text


def test_bench_and_probe_write_named_files_with_extra_notes(tmp_path, monkeypatch):
    import json

    from workbench.ddtree import verify_probe as VP

    res = dict(points=[], parameters={"heads": [8]}, samples={"kernels": {}}, complete=False)
    path = VB._write(res, tmp_path, "verify_x", "PRED")
    doc = json.loads(path.read_text())
    assert path.name == "verify_x.json" and doc["notes"] == VB.VERIFY_NOTES + " PRED"

    # the probe's CLI on a CPU with its GPU parts replaced: the file is rewritten after every point, and
    # points of the same H and P with different T keep their own samples
    calls = []
    monkeypatch.setattr("workbench.kernels.require_gpu", lambda what: None)
    monkeypatch.setattr(VP, "minimal_nodes", lambda reps=200: {"nodes_1_ms": 0.01, "nodes_3_ms": 0.01,
                                                               "nodes_1_samples": [0.01]})

    def fake_breakdown(H, P, nodes=33, variants=None, reps=40, seed=0, in_graph=False):
        calls.append((H, P, nodes, tuple(variants)))
        pts = {n: dict(prepare=None, attention=0.1, merge=0.01, sum=0.11, call=0.1) for n in variants}
        return {"heads": H, "prefix": P, "nodes": nodes, "kv_sets": 2, "points": pts,
                "samples": {f"{n}.call": [0.1] for n in variants}}

    monkeypatch.setattr(VP, "launch_breakdown", fake_breakdown)
    rc = VP.main(["--out", str(tmp_path), "--name", "probe_x", "--points", "64:16384", "64:16384:32", "--sweep",
                  "--variants", "default", "mma", "--extra-notes", "PRED"])
    assert rc == 0 and calls == [(64, 16384, 33, ("default", "mma")), (64, 16384, 32, ("default", "mma"))]
    doc = json.loads((tmp_path / "probe_x.json").read_text())
    assert doc["results"]["complete"] is True and doc["notes"].endswith("PRED")
    assert set(doc["samples"]["breakdown"]) == {"H64_P16384", "H64_P16384_T32"}
    assert all("samples" not in b for b in doc["results"]["breakdown"])
    with pytest.raises(SystemExit):
        VP.main(["--points", "64"])


# ----------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("kernel,dtype", [("verify_attention", "bfloat16"), ("verify_attention", "float32")])
@pytest.mark.parametrize("heads,prefix", [(8, 0), (8, 1), (8, 333), (64, 1000), (8, 9000)])
def test_gpu_parity(kernel, dtype, heads, prefix):
    rows = VB.verify_parity_rows([dict(kernel=kernel, nodes=33, heads=heads, prefix=prefix,
                                      dtype=dtype, repeats=2)], "cuda", seed=prefix + heads)
    assert rows[0]["pass"], rows


@pytest.mark.gpu
def test_gpu_parity_batched_and_simple():
    rows = VB.verify_parity_rows([
        dict(kernel=k, nodes=17, heads=8, prefix=[0, 3000, 65, 700], dtype=d, repeats=1)
        for k, d in (("verify_attention_batched", "bfloat16"), ("verify_attention_batched", "float32"))] + [
        dict(kernel="verify_attention[simple]", nodes=33, heads=8, prefix=2000, dtype="bfloat16", repeats=1),
        dict(kernel="verify_attention", nodes=70, heads=8, prefix=500, dtype="bfloat16", repeats=1)], "cuda")
    assert all(r["pass"] for r in rows), rows


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["wgmma", "mma"])
def test_gpu_parity_tensor_core_kernels(impl):
    if impl == "wgmma" and V.wgmma_unavailable_reason() is not None:
        pytest.skip(f"wgmma kernel unavailable: {V.wgmma_unavailable_reason()}")
    rows = VB.verify_parity_rows(
        [dict(kernel=f"verify_attention[{impl}]", nodes=33, heads=h, prefix=p, dtype="bfloat16", repeats=1)
         for h, p in ((8, 0), (8, 777), (64, 3000))]
        + [dict(kernel=f"verify_attention_batched[{impl}]", nodes=17, heads=8, prefix=[0, 300, 65],
                dtype="bfloat16", repeats=1)], "cuda")
    assert all(r["pass"] for r in rows), rows


@pytest.mark.gpu
def test_gpu_parity_single_request_without_prepare_and_variants():
    # the default's single-request form without the prepare launch (many nodes per block, nodes split
    # across blocks, tails split across chunks, T = 128 and 129) and every variant timed beside it
    if V.wgmma_unavailable_reason() is not None:
        pytest.skip(f"wgmma kernel unavailable: {V.wgmma_unavailable_reason()}")
    cases = [c for c in VB.default_parity_cases("cuda") if c["kernel"].endswith("[wgmma]")
             and (c.get("variant") or c["nodes"] != 33 or c.get("chunk_len"))]
    assert len(cases) >= 6 + 3 * len(VB.WGMMA_VARIANTS)
    rows = VB.verify_parity_rows(cases, "cuda", seed=3)
    assert all(r["pass"] for r in rows), [r for r in rows if not r["pass"]]


@pytest.mark.gpu
def test_gpu_slotring_variant_equals_the_default():
    # VERIFY_WG_SLOTRING only changes where the gather reads the slot indices: outputs bit-identical to the
    # default's on fresh random inputs (single request: short, tile-unaligned and tail-reaching chunks; batched),
    # and within the parity tolerance of the float64 reference
    if V.wgmma_unavailable_reason() is not None:
        pytest.skip(f"wgmma kernel unavailable: {V.wgmma_unavailable_reason()}")
    kw = VB.SLOTRING_VARIANTS["slotring"]
    for i, (h, p, cl) in enumerate(((8, 4096 + 37, None), (64, 777, None), (8, 1000, 64), (8, 20, None),
                                    (8, [0, 5000, 70, 20000], None))):
        st = V.random_verify_inputs(33, h, p, torch.bfloat16, "cuda", seed=100 + i)
        fn = V.verify_attention_batched if isinstance(p, list) else V.verify_attention
        o0, l0 = fn(**st, impl="wgmma", chunk_len=cl)
        o1, l1 = fn(**st, chunk_len=cl, **kw)
        assert torch.equal(o0, o1) and torch.equal(l0, l1), (h, p, cl)
    rows = VB.verify_parity_rows(
        [dict(kernel="verify_attention[wgmma]", nodes=33, heads=h, prefix=4096 + 37, dtype="bfloat16", repeats=1,
              variant="slotring") for h in (8, 64)], "cuda", seed=5)
    assert all(r["pass"] for r in rows), rows


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["auto", "mma"])
def test_gpu_no_host_sync_and_cuda_graph(impl):
    if impl != "auto" and V.wgmma_unavailable_reason() is not None:
        pytest.skip(f"wgmma kernels unavailable: {V.wgmma_unavailable_reason()}")
    inp = V.random_verify_inputs(33, 8, 5000, "bfloat16", "cuda", seed=11)
    ref, _ = V.verify_attention(**inp, impl=impl)  # warm-up (compiles the kernels)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        o, l = V.verify_attention(**inp, check=False, impl=impl)
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


def test_committed_measurement_tables():
    from workbench.measure import load_measurement

    doc = load_measurement("ddtree_verify")
    if doc is None:
        pytest.skip("no committed data/measurements/h200/ddtree_verify.json")
    rows = VB.verify_benchmark_rows(doc)
    assert {(r["heads"], r["prefix"]) for r in rows} >= {(8, 4096), (64, 131072)}
    for r in rows:
        assert r["kernel_ms"] > 0 and r["floor_ms"] > 0
        assert r["percent_of_floor"] == pytest.approx(100 * r["floor_ms"] / r["kernel_ms"])
    text = VB.verify_table(doc)
    assert text.count("\n") == len(rows)
    ours = [p for p in doc["results"].get("parity", []) if p["kernel"].startswith("verify_attention")
            and not p["kernel"].endswith(("naive", "sdpa"))]
    assert ours and all(p["pass"] for p in ours)
    assert doc["provenance"]["gpu"].startswith("NVIDIA")


def test_read_sanitizer_logs(tmp_path):
    (tmp_path / "memcheck.log").write_text("smoke rows\nSMOKE PASS\n========= ERROR SUMMARY: 0 errors\nexit=0\n")
    (tmp_path / "racecheck.log").write_text("SMOKE FAIL\n========= RACECHECK SUMMARY: 2 hazards displayed "
                                            "(2 errors, 0 warnings)\nexit=1\n")
    r = VB.read_sanitizer_logs(tmp_path)
    assert r["memcheck"]["errors"] == 0 and r["memcheck"]["smoke_verdict"] == "PASS"
    assert r["memcheck"]["returncode"] == 0 and "memcheck" in r["memcheck"]["command"]
    assert r["racecheck"]["errors"] == 2 and r["racecheck"]["smoke_verdict"] == "FAIL"
    assert r["racecheck"]["returncode"] == 1
    assert "missing" in VB.read_sanitizer_logs(tmp_path, ("initcheck",))["initcheck"]["error"]
    (tmp_path / "racecheck.log").write_text("# command: compute-sanitizer --tool racecheck x --smoke-only wgmma\n"
                                            "SMOKE PASS\n========= RACECHECK SUMMARY: 0 hazards displayed\nexit=0\n")
    r = VB.read_sanitizer_logs(tmp_path)["racecheck"]
    assert r["command"].endswith("--smoke-only wgmma") and r["errors"] == 0 and r["returncode"] == 0
