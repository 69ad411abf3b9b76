"""Engine parity with transformers' DeepseekV3ForCausalLM, checkpoint loading and its errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from workbench.engine import PagedKVCache, Segment, load_model, quantize_experts_int4  # noqa: E402
from workbench.int4 import dequantize_int4  # noqa: E402

YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}


def make_hf(tmp: Path, seed: int = 0, interleave: bool = True, q_lora: int | None = 24, **kw):
    """A tiny random DeepseekV3ForCausalLM (dense layer 0, MoE layers 1-2, 4 groups), saved to ``tmp``."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    args = dict(vocab_size=80, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
                n_routed_experts=8, kv_lora_rank=16, q_lora_rank=q_lora, qk_rope_head_dim=8, v_head_dim=12,
                qk_nope_head_dim=12, n_group=4, topk_group=2, num_experts_per_tok=3, first_k_dense_replace=1,
                max_position_embeddings=256, routed_scaling_factor=2.5, rope_interleave=interleave,
                rope_parameters=dict(YARN))
    args.update(kw)
    cfg = DeepseekV3Config(**args)
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(cfg).eval()
    with torch.no_grad():  # HF inits norms to 1 and the bias to 0: randomise so every weight matters
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * 0.3)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn_like(b))
    model.save_pretrained(tmp)
    return model


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def decode_logits(model, ids: torch.Tensor, prefill: int) -> torch.Tensor:
    """Prefill ``prefill`` tokens through the cache, then one token at a time; logits [T, V]."""
    cache = PagedKVCache.for_model(model, ids.shape[0] + 4)
    cache.add_request(0)
    outs = []
    for a, b in [(0, prefill)] + [(t, t + 1) for t in range(prefill, ids.shape[0])]:
        s = cache.allocate(0, b - a)
        lg, _ = model.forward_batch(ids[a:b], torch.arange(a, b), [Segment(cache.slots(0), s)], cache)
        cache.append(0, s)
        outs.append(lg)
    return torch.cat(outs)


def _loaded_matches_reference(path, ref, tokens: int, seed: int):
    """Load ``path`` in float32 and compare its logits on ``tokens`` random ids [T] with ``ref``'s (<= 1e-4)."""
    model = load_model(path, dtype=torch.float32)
    ids = torch.randint(0, 80, (tokens,), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
    assert rel_err(model(ids), want) <= 1e-4


@pytest.fixture(scope="module")
def hf_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    ref = make_hf(d)
    return d, ref


def test_prefill_and_decode_match_transformers(hf_ckpt):
    d, ref = hf_ckpt
    model = load_model(d, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 80, (2, 24), generator=g)
    with torch.no_grad():
        want = ref(ids).logits
    got = model(ids)
    assert got.shape == want.shape == (2, 24, 80)
    assert rel_err(got, want) <= 1e-4
    assert rel_err(model(ids[0]), want[0]) <= 1e-4  # [T] input
    for b in range(2):
        assert rel_err(decode_logits(model, ids[b], prefill=5), want[b]) <= 1e-4


@pytest.mark.parametrize("interleave,q_lora,kw", [
    (False, 24, {}),
    (True, None, {}),
    (True, 24, dict(n_group=1, topk_group=1, norm_topk_prob=False, first_k_dense_replace=2,
                    rope_parameters={"rope_type": "default", "rope_theta": 50000.0})),
])
def test_variants_match_transformers(tmp_path, interleave, q_lora, kw):
    ref = make_hf(tmp_path, seed=3, interleave=interleave, q_lora=q_lora, **kw)
    model = load_model(tmp_path, dtype=torch.float32)
    ids = torch.randint(0, 80, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = ref(ids).logits
    assert rel_err(model(ids), want) <= 1e-4
    assert rel_err(decode_logits(model, ids[0], prefill=3), want[0]) <= 1e-4


def test_rope_scaling_form_and_kimi_wrapper(hf_ckpt, tmp_path):
    """The published config form (rope_scaling + rope_theta) inside a K2.6-style text_config wrapper,
    tensors renamed with the language_model. prefix, gives the same logits."""
    d, ref = hf_ckpt
    raw = json.loads((d / "config.json").read_text())
    rp = raw.pop("rope_parameters")
    raw["rope_theta"] = rp.pop("rope_theta")
    rp["type"] = rp.pop("rope_type")
    raw["rope_scaling"] = rp
    raw["model_type"] = "kimi_k2"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "kimi_k25", "text_config": raw}))
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        tensors = {"language_model." + k: f.get_tensor(k) for k in f.keys()}
    tensors["vision_tower.patch.weight"] = torch.zeros(2, 2)
    half = len(tensors) // 2
    keys = sorted(tensors)
    save_file({k: tensors[k] for k in keys[:half]}, str(tmp_path / "a.safetensors"))
    save_file({k: tensors[k] for k in keys[half:]}, str(tmp_path / "b.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {**{k: "a.safetensors" for k in keys[:half]}, **{k: "b.safetensors" for k in keys[half:]}}}))
    _loaded_matches_reference(tmp_path, ref, tokens=12, seed=5)


def test_fused_experts_form(hf_ckpt, tmp_path):
    """transformers-5 in-memory form: experts.gate_up_proj [E, 2I, D] and experts.down_proj [E, D, I]."""
    d, ref = hf_ckpt
    (tmp_path / "config.json").write_text((d / "config.json").read_text())
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
    out = {k: v for k, v in t.items() if ".experts." not in k}
    for i in (1, 2):
        p = f"model.layers.{i}.mlp.experts"
        out[f"{p}.gate_up_proj"] = torch.stack([torch.cat([t[f"{p}.{e}.gate_proj.weight"],
                                                           t[f"{p}.{e}.up_proj.weight"]]) for e in range(8)])
        out[f"{p}.down_proj"] = torch.stack([t[f"{p}.{e}.down_proj.weight"] for e in range(8)])
    save_file(out, str(tmp_path / "model.safetensors"))
    _loaded_matches_reference(tmp_path, ref, tokens=10, seed=6)


def test_int4_experts_load_and_match_dequantized_reference(hf_ckpt, tmp_path):
    d, _ = hf_ckpt
    q = quantize_experts_int4(d, tmp_path / "q", group_size=8)  # tiny dims: I = 16
    cfg = json.loads((q / "config.json").read_text())
    assert cfg["quantization_config"]["format"] == "pack-quantized"
    with safe_open(str(q / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        packed = f.get_tensor("model.layers.1.mlp.experts.3.up_proj.weight_packed")
        scale = f.get_tensor("model.layers.1.mlp.experts.3.up_proj.weight_scale")
        shape = f.get_tensor("model.layers.1.mlp.experts.3.up_proj.weight_shape")
    assert "model.layers.1.mlp.experts.3.up_proj.weight" not in names
    assert packed.dtype == torch.int32 and packed.shape == (16, 4)
    assert scale.dtype == torch.bfloat16 and scale.shape == (16, 4) and shape.tolist() == [16, 32]
    mq = load_model(q, dtype=torch.float32)
    assert mq.layers[1].mlp.experts.int4
    # reference: the bf16/fp32 model with every routed expert replaced by its dequantised weights
    mr = load_model(d, dtype=torch.float32)
    with safe_open(str(q / "model.safetensors"), "pt") as f:
        for i in (1, 2):
            ex = mr.layers[i].mlp.experts
            for e in range(8):
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    b = f"model.layers.{i}.mlp.experts.{e}.{proj}"
                    w = dequantize_int4(f.get_tensor(b + ".weight_packed"), f.get_tensor(b + ".weight_scale"),
                                        f.get_tensor(b + ".weight_shape"))
                    getattr(ex, proj).data[e] = w
    ids = torch.randint(0, 80, (2, 14), generator=torch.Generator().manual_seed(7))
    assert rel_err(mq(ids), mr(ids)) <= 1e-5
    assert rel_err(decode_logits(mq, ids[0], prefill=4), mr(ids[0])) <= 1e-4
    # and quantisation really changed something (the test would be vacuous otherwise)
    assert rel_err(mq(ids), load_model(d, dtype=torch.float32)(ids)) > 1e-6


def test_bf16_no_worse_than_transformers_bf16(hf_ckpt):
    """bf16 drifts from float32 (random weights, routing flips); the engine's bf16 must drift no more
    than transformers' own bf16 model does."""
    import copy

    d, ref = hf_ckpt
    m16 = load_model(d, dtype=torch.bfloat16)
    assert m16.layers[1].mlp.gate.weight.dtype == torch.float32  # router stays float32
    assert m16.layers[1].self_attn.q_a_proj.weight.dtype == torch.bfloat16
    ids = torch.randint(0, 80, (1, 12), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        want = ref(ids).logits
        ref16 = copy.deepcopy(ref).to(torch.bfloat16)
        theirs = ref16(ids).logits.float()
    ours = m16(ids).float()

    def cos(a, b):
        return float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))

    assert cos(ours, want) >= cos(theirs, want) - 0.01 and cos(ours, want) > 0.9


def _copy_ckpt(d: Path, dst: Path, edit) -> Path:
    dst.mkdir()
    (dst / "config.json").write_text((d / "config.json").read_text())
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
    edit(t)
    save_file(t, str(dst / "model.safetensors"))
    return dst


def test_checkpoint_errors_name_the_tensor(hf_ckpt, tmp_path):
    d, _ = hf_ckpt
    gone = "model.layers.2.self_attn.kv_b_proj.weight"
    p = _copy_ckpt(d, tmp_path / "missing", lambda t: t.pop(gone))
    with pytest.raises(ValueError, match=gone.replace(".", r"\.")):
        load_model(p)
    p = _copy_ckpt(d, tmp_path / "extra", lambda t: t.__setitem__("model.layers.0.self_attn.bogus", torch.ones(2)))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.bogus"):
        load_model(p)
    exp = "model.layers.1.mlp.experts.7.down_proj.weight"
    p = _copy_ckpt(d, tmp_path / "shape", lambda t: t.__setitem__(exp, torch.ones(32, 17)))
    with pytest.raises(ValueError, match=exp.replace(".", r"\.") + r".*\(32, 17\).*\(32, 16\)"):
        load_model(p)
    p = _copy_ckpt(d, tmp_path / "noexp", lambda t: t.pop(exp))
    with pytest.raises(ValueError, match=exp.replace(".", r"\.")):
        load_model(p)
    with pytest.raises(ValueError, match="not a directory"):
        load_model(tmp_path / "nowhere")


def test_context_and_token_errors(hf_ckpt):
    d, _ = hf_ckpt
    model = load_model(d, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 80\)"):
        model(torch.tensor([1, 80]))
    with pytest.raises(ValueError, match="beyond the rope limit of 256"):
        model(torch.zeros(257, dtype=torch.int64))


@pytest.mark.gpu
def test_parity_on_gpu(hf_ckpt):
    d, ref = hf_ckpt
    model = load_model(d, device="cuda", dtype=torch.float32)
    ids = torch.randint(0, 80, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids).logits
    assert rel_err(model(ids).cpu(), want) <= 1e-4
    for b in range(2):
        assert rel_err(decode_logits(model, ids[b].cuda(), prefill=5).cpu(), want[b]) <= 1e-4
