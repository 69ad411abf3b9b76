"""Tensor parallelism (workbench.parallel) on the CPU: TP = 2 over gloo (two torchrun ranks) against TP = 1 on a
tiny config (logits within float32 tolerance, the same greedy and DDTree tokens, every rank the same), the
8-GPU benchmark's CPU dry run, and in one process: TP = 1 is the single-device model exactly, shards put back
together are the whole, the vocabulary-parallel argmax keys order as torch.argmax does, expert-parallel pair
remapping, bad tp values and the launch environment."""
from __future__ import annotations

import json
import os

import pytest
import torch

from workbench.config import load_config
from workbench.engine import synthetic_model, tiny_config
from workbench.parallel import ENV, TPGroup, check_tp_config, shard_dim, shard_model, shard_tensor, synthetic_tp_model
from workbench.parallel.groups import pack_argmax, unpack_argmax, value_keys
from workbench.parallel.launch import launch_env, torchrun, torchrun_command
from workbench.parallel.layers import ExpertParallelExperts
from workbench.parallel.parity import RTOL, passed, run, tie_rows
from workbench.validation import InvalidParameter

TIMEOUT_S = 420  # a loaded 2-core machine: two ranks each import torch, then seconds of work


def _torchrun(module: str, args: list[str]):
    res = torchrun(2, module, args, timeout_s=TIMEOUT_S, capture=True)
    assert res.returncode == 0, f"{module} failed (exit {res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    return res


@pytest.fixture(scope="module")
def parity(tmp_path_factory):
    """One torchrun of workbench.parallel.parity on 2 gloo ranks, dense and INT4 experts: its parity.json."""
    out = tmp_path_factory.mktemp("tp2")
    _torchrun("workbench.parallel.parity", ["--out", str(out)])
    return json.loads((out / "parity.json").read_text())


def test_tp2_logits_equal_tp1_within_float32(parity):
    assert [v["int4"] for v in parity["variants"]] == [False, True]
    for v in parity["variants"]:
        assert len(v["ranks"]) == 2 and [r["rank"] for r in v["ranks"]] == [0, 1]
        for r in v["ranks"]:
            assert r["tp"] == 2 and r["backend"] == "gloo"
            assert 0 < r["naive_err"] <= RTOL and 0 < r["batch_err"] <= RTOL  # not bit-equal: summed in another order
            assert r["batch_top2_err"] <= RTOL and r["batch_argmax_equal"]
            assert r["local_bytes"] < 0.75 * r["full_bytes"]  # each rank holds its shard, not the model


def test_tp2_greedy_and_ddtree_tokens_equal_tp1(parity):
    for v in parity["variants"]:
        for r, checks in zip(v["ranks"], v["checks"]):
            assert all(checks.values()), checks
            assert r["greedy_tp"] == r["greedy_full"] and all(len(t) == 10 for t in r["greedy_tp"])
            assert r["ddtree_tp"] == r["greedy_full"] and r["engine_ddtree_tp"] == r["greedy_full"]
            assert r["engine_greedy_tp"] == r["greedy_full"]
            assert max(r["ddtree_tp_accepted"]) > 1.0  # the drafter's tokens were accepted: trees, not chains
        assert v["ranks_agree"]
    assert parity["ok"]


def test_vocab_parallel_argmax_breaks_ties_toward_lower_id(parity):
    for v in parity["variants"]:
        for r in v["ranks"]:
            assert r["argmax_ties"] == r["argmax_ties_ref"] == [1, 46, 95, 2, 0, 0]


def test_benchmark_dry_run_on_two_gloo_ranks(tmp_path):
    """workbench.bench.engine_tp --dry-run: the 8-GPU benchmark's code on 2 CPU ranks writes its measurement file."""
    _torchrun("workbench.bench.engine_tp", ["--dry-run", "--out", str(tmp_path), "--steps", "3",
                                            "--concurrency", "1,2", "--p-top", "0.8"])
    doc = json.loads((tmp_path / "engine_tp2.json").read_text())
    p, res = doc["parameters"], doc["results"]
    assert p["tp"] == 2 and p["dry_run"] and p["experts_per_rank"] * 2 == p["experts"]
    assert doc["world_size"] == 2 and len(doc["ranks"]) == 2
    assert all(r["env"] == ENV for r in doc["ranks"])  # NVLink multicast off in every rank
    assert doc["provenance"]["git_commit"] and res["error"] is None
    rows = {(r["method"], r["C"]): r for r in res["rows"]}
    assert set(rows) == {("greedy", 1), ("ddtree", 1), ("greedy", 2), ("ddtree", 2)}
    layers = p["layers"]
    for (method, C), r in rows.items():
        assert r["wall_ms"] > 0 and r["tokens_per_s"] > 0 and len(r["wall_ms_by_rank"]) == 2
        # two all-reduces per layer, the argmax's, and greedy's top-2 gather
        assert r["allreduces_per_step"] == 2 * layers + 1 + (method == "greedy")
        assert r["allreduce_ms"] > 0 and r["floor_ms"] is None  # no floors on the CPU
        assert r["bytes_floor"] > 0 and r["bytes_by_part"]["kv_read"] > 0
    assert rows[("ddtree", 1)]["mean_accepted"] > 1.0 and rows[("greedy", 1)]["mean_accepted"] == 1.0
    assert res["lossless"] and all(x["first_divergence"] is None and x["ranks_agree"] for x in res["lossless"])
    goal = next(g for g in res["goals"] if g["goal"] == "ddtree_tokens_per_s_c1")
    assert goal["target"] == 280.0 and goal["measured"] == rows[("ddtree", 1)]["tokens_per_s"]


# ----------------------------------------------------------------------------- one process

def test_tp1_is_the_single_device_model_exactly():
    """At one rank every collective is the identity: logits bit-equal, the same tokens through generate and the
    engine step."""
    torch.set_num_threads(1)
    r = run(group=TPGroup.single(), new_tokens=8)
    assert r["naive_err"] == 0.0 and r["batch_err"] == 0.0
    assert all(passed(r).values()), passed(r)


@pytest.mark.parametrize("int4", [False, True])
def test_shards_put_together_are_the_whole(int4):
    cfg = tiny_config()
    full = synthetic_model(cfg, layers=None, dtype=torch.float32, seed=3, int4=int4)
    whole = dict(list(full.named_parameters()) + list(full.named_buffers()))
    shards = [shard_model(full, TPGroup.layout(r, 2)).weights() for r in range(2)]
    assert set(shards[0]) == set(whole)
    split = 0
    for name, t in whole.items():
        dim = shard_dim(name)
        if dim is None:
            assert all(torch.equal(s[name], t) for s in shards), name
        else:
            split += 1
            assert torch.equal(torch.cat([s[name] for s in shards], dim), t), name
    assert split == 6 + 2 * (6 + (4 if int4 else 3)) + 1  # dense layer, two MoE layers (attention, shared, routed), head
    # the synthetic builder draws each rank's shard of the same whole model for any tp
    one = synthetic_tp_model(cfg, TPGroup.single(), dtype=torch.float32, int4=int4).weights()
    for r in range(2):
        for name, t in synthetic_tp_model(cfg, TPGroup.layout(r, 2), dtype=torch.float32, int4=int4).weights().items():
            assert torch.equal(t, shard_tensor(name, one[name], r, 2)), name


def test_shard_of_fragment_layout_experts():
    """Experts converted to the fragment layout at load shard by expert in that layout and compute the same."""
    torch.set_num_threads(1)
    cfg = tiny_config(hidden_size=256, moe_intermediate_size=256, num_hidden_layers=2)
    full = synthetic_model(cfg, layers=None, dtype=torch.float32, seed=1, int4=True)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    ref = full(ids)
    full.layers[1].mlp.experts.to_fragment_layout()
    assert torch.equal(shard_model(full, TPGroup.single())(ids), ref)
    whole = full.layers[1].mlp.experts
    for r in range(2):
        e = shard_model(full, TPGroup.layout(r, 2)).layers[1].mlp.experts
        assert e.layout == "fragments" and e.num_experts == 4
        assert torch.equal(e.down_frag, whole.down_frag[4 * r:4 * r + 4])


def test_argmax_keys_order_as_torch_argmax():
    g = torch.Generator().manual_seed(0)
    V, tp = 96, 4
    rows = torch.randint(-3, 4, (200, V), generator=g).float() * 0.5  # many ties
    rows[0] = -0.0
    rows[0, 50] = 0.0
    rows[1] = float("-inf")
    rows[2, 7] = 1e30
    rows[3, 90] = -1e-30
    rows[3, :90] = -1.0
    rows[3, 91:] = -1.0
    n = V // tp
    keys = torch.stack([pack_argmax(rows[:, r * n:(r + 1) * n], r * n, V) for r in range(tp)]).amax(0)
    ids, vals = unpack_argmax(keys, V)
    assert torch.equal(ids, rows.argmax(-1))
    assert torch.equal(vals, rows.gather(1, ids[:, None])[:, 0] + 0.0)
    assert torch.equal(TPGroup.single().argmax(rows, 0, V), rows.argmax(-1))
    with pytest.raises(ValueError, match="float32"):
        value_keys(rows.double(), ids, V)
    rows = tie_rows(V, 2)
    keys = torch.stack([pack_argmax(rows[:, r * 48:(r + 1) * 48], r * 48, V) for r in range(2)]).amax(0)
    assert unpack_argmax(keys, V)[0].tolist() == rows.argmax(-1).tolist() == [1, 46, 95, 2, 0, 0]


def test_expert_parallel_keeps_local_pairs_only():
    cfg = tiny_config()  # 8 experts
    e = ExpertParallelExperts(cfg, TPGroup.layout(1, 2), dtype=torch.float32)  # experts 4..7
    ids = torch.tensor([[0, 5], [7, 1], [2, 3]])
    w = torch.tensor([[0.5, 0.25], [1.0, 2.0], [3.0, 4.0]])
    lid, lw = e.local_pairs(ids, w)
    # other ranks' pairs: weight 0 on the smallest local expert the step touches (5 -> local 1)
    assert lid.tolist() == [[1, 1], [3, 1], [1, 1]]
    assert lw.tolist() == [[0.0, 0.25], [1.0, 0.0], [0.0, 0.0]]
    lid, lw = e.local_pairs(torch.tensor([[0, 1]]), torch.ones(1, 2))  # none local: expert 0, weight 0
    assert lid.tolist() == [[0, 0]] and lw.tolist() == [[0.0, 0.0]]


def test_bad_tp_is_refused_naming_what_it_must_divide():
    with pytest.raises(InvalidParameter) as e:
        check_tp_config(tiny_config(), 3)
    msg = str(e.value)
    assert msg.startswith("tp=3 is not allowed") and "4 attention heads" in msg and "vocabulary of 96" in msg
    assert "8 routed experts" in msg and "one of 1, 2, 4" in msg
    with pytest.raises(InvalidParameter, match="tp=4 is not allowed.*one of 1, 2"):
        check_tp_config(tiny_config(vocab_size=98), 4)
    with pytest.raises(InvalidParameter, match="tp=4 is not allowed: .*the 6 routed experts"):
        synthetic_tp_model(tiny_config(n_routed_experts=6, n_group=1, topk_group=1), TPGroup.layout(0, 4))
    with pytest.raises(InvalidParameter):
        check_tp_config(tiny_config(), True)
    k26 = load_config("kimi-k2.6")
    assert [check_tp_config(k26, t) for t in (1, 2, 4, 8, 16)] == [1, 2, 4, 8, 16]
    with pytest.raises(InvalidParameter, match="64 attention heads"):
        check_tp_config(k26, 128)
    with pytest.raises(InvalidParameter, match="rank=2 is not allowed"):
        TPGroup(2, 2)


def test_layout_only_group_has_no_collectives():
    g = TPGroup.layout(0, 2)
    with pytest.raises(RuntimeError, match="layout-only"):
        g.all_reduce(torch.ones(3))
    t = torch.ones(3)
    assert TPGroup.single().all_reduce(t) is t


def test_launch_environment_turns_nvlink_multicast_off(monkeypatch):
    assert ENV == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    env = launch_env()
    assert all(env[k] == v for k, v in ENV.items()) and os.environ["NCCL_NVLS_ENABLE"] == "1"
    cmd = torchrun_command(8, "workbench.bench.engine_tp", ["--out", "x"])
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=8"]
    assert cmd[-4:] == ["-m", "workbench.bench.engine_tp", "--out", "x"]
    with pytest.raises(InvalidParameter, match="nproc=0"):
        torchrun_command(0, "m")


def test_cli_tp_verb_takes_the_module_and_its_arguments():
    from workbench.cli import build_parser

    a = build_parser().parse_args(["tp", "--nproc", "2", "-m", "workbench.parallel.parity", "--out", "/tmp/x"])
    assert a.nproc == 2 and a.module == ["workbench.parallel.parity", "--out", "/tmp/x"]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (NCCL ranks)")
def test_tp2_parity_over_nccl(tmp_path):
    """The same parity check over NCCL, one GPU per rank."""
    _torchrun("workbench.parallel.parity", ["--out", str(tmp_path), "--backend", "nccl"])
    assert json.loads((tmp_path / "parity.json").read_text())["ok"]
