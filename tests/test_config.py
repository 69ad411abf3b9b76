import json

import pytest

from workbench.config import config_from_dict, load_config


def test_deepseek_v3_and_wrapped_kimi():
    d = load_config("deepseek-v3")
    assert (d.num_attention_heads, d.n_routed_experts, d.first_k_dense_replace, d.vocab_size) == (128, 256, 3, 129280)
    k = load_config("kimi-k2.6")
    assert (k.num_attention_heads, k.n_routed_experts, k.first_k_dense_replace, k.vocab_size) == (64, 384, 1, 163840)
    assert k.expert_quant is not None and k.expert_quant.group_size == 32
    assert k.num_moe_layers == 60


def test_rope_parameters_form_matches_rope_scaling_form():
    raw = json.loads(load_config.__globals__["MODELS_DIR"].joinpath("kimi-k2.6/config.json").read_text())["text_config"]
    new = dict(raw)
    rs = new.pop("rope_scaling")
    theta = new.pop("rope_theta")
    new["rope_parameters"] = {"rope_type": "yarn", "rope_theta": theta,
                              **{k: v for k, v in rs.items() if k != "type"}}
    a, b = config_from_dict(raw), config_from_dict(new)
    assert a.rope_scaling == b.rope_scaling and a.rope_theta == b.rope_theta == 50000.0


def test_bad_configs():
    with pytest.raises(ValueError, match="model_type"):
        config_from_dict({"model_type": "llama"})
    raw = {"model_type": "deepseek_v3"}
    with pytest.raises(ValueError, match="lacks required key"):
        config_from_dict(raw)
