"""Capacity arithmetic against hand-computed values (Kimi K2.6)."""
import pytest

from workbench import capacity as cap
from workbench.cli import main
from workbench.config import load_config
from workbench.validation import parse_text

K26 = load_config("kimi-k2.6")


def test_kv_bytes_per_token_k26():
    # (512 + 64) values x 61 layers x 2 bytes
    assert K26.kv_bytes_per_token("bf16") == 576 * 61 * 2 == 70_272
    assert K26.kv_bytes_per_token("fp8") == 35_136


def test_yarn_limit_and_mscale():
    assert K26.yarn_limit == min(64 * 4096, 262_144) == 262_144
    assert K26.mscale == pytest.approx(0.1 * 1 * __import__("math").log(64) + 1)
    assert K26.softmax_scale == pytest.approx(K26.mscale**2 / 192**0.5)


def test_routed_expert_bytes_hand_computed():
    # 60 MoE layers x 384 experts x 3 x 7168 x 2048 weights, 0.5 B + 2 B per 32 weights, TP 8
    w = cap.weight_bytes_per_gpu(K26, tp=8)
    routed = 60 * 384 * 3 * 7168 * 2048 * (0.5 + 2 / 32) / 8
    assert w.routed_experts == pytest.approx(routed)
    assert routed == pytest.approx(71.35e9, rel=1e-3)
    # embedding + lm_head: 2 x 163840 x 7168 bf16, vocab-parallel
    assert w.embedding_and_head == pytest.approx(2 * 163840 * 7168 * 2 / 8)
    # dense MLP in layer 0 only: 3 x 7168 x 18432 bf16 / 8
    assert w.dense_mlp == pytest.approx(3 * 7168 * 18432 * 2 / 8)


def test_attention_bytes_tp_vs_dp():
    tp = cap.weight_bytes_per_gpu(K26, tp=8, attention="tp").attention
    dp = cap.weight_bytes_per_gpu(K26, tp=8, attention="dp").attention
    rep = 7168 * 576 + 512 + 7168 * 1536 + 1536
    shard = 1536 * 64 * 192 + 512 * 64 * 256 + 64 * 128 * 7168
    assert tp == pytest.approx(61 * 2 * (rep + shard / 8))
    assert dp == pytest.approx(61 * 2 * (rep + shard))


def test_200k_on_rtx_pro_6000_bf16_does_not_fit_fp8_does():
    a = cap.capacity("kimi-k2.6", "rtx-pro-6000", tp=8, mem_fraction=0.85, context=200_000)
    mem = 96 * 2**30
    pool = 0.85 * mem - a.weights.total - 2 * 2**30
    assert a.kv_pool_bytes == pytest.approx(pool)
    assert a.pool_tokens == int(pool // 70_272)
    assert a.request_kv_bytes == 200_000 * 70_272
    assert not a.fits and a.concurrent_requests == 0
    f8 = cap.capacity("kimi-k2.6", "rtx-pro-6000", tp=8, mem_fraction=0.85, context=200_000, kv_dtype="fp8")
    assert f8.fits and f8.concurrent_requests == f8.pool_tokens // 200_000
    assert "replicated" in " ".join(a.notes)


def test_b300_concurrency_and_max_context_capped_by_yarn():
    a = cap.capacity("kimi-k2.6", "b300", tp=8, mem_fraction=0.85, context=200_000)
    assert a.fits and a.max_context == 262_144
    assert a.concurrent_requests == a.pool_tokens // 200_000 >= 2
    d = cap.capacity("kimi-k2.6", "b300", tp=8, mem_fraction=0.85, context=200_000, attention="dp")
    assert d.concurrent_requests == 8 * (d.pool_tokens // 200_000)


@pytest.mark.parametrize("kw, msg", [
    (dict(context=300_000), r"context=300000 is not allowed: an integer in \[1, 262144\] tokens \(kimi-k2.6's YaRN limit"),
    (dict(context=0), r"context=0 is not allowed"),
    (dict(context=1e6), r"context=1000000.0 is not allowed: an integer"),
    (dict(mem_fraction=0.0), r"mem_fraction=0.0 is not allowed: a finite number in \(0, 1\]"),
    (dict(mem_fraction=1.5), "mem_fraction=1.5 is not allowed"),
    (dict(gpu="tpu"), "gpu='tpu' is not allowed: one of 'rtx-pro-6000'"),
    (dict(model="llama"), r"model='llama' is not allowed: a shipped model \(one of 'deepseek-v3', 'kimi-k2.6'\)"),
    (dict(kv_dtype="int2"), "kv_dtype='int2' is not allowed: one of 'bf16'"),
    (dict(reserved_gib=-1), "reserved_gib=-1 is not allowed"),
    (dict(attention="sp"), "attention='sp' is not allowed: one of 'tp', 'dp'"),
    (dict(tp=3), "tp=3 is not allowed: an integer that divides the 64 attention heads of kimi-k2.6: "
                 "one of 1, 2, 4, 8, 16, 32, 64"),
    (dict(tp=1000), "tp=1000 is not allowed"),
    (dict(tp=0), "tp=0 is not allowed"),
])
def test_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        cap.capacity(**kw)


def test_cli_capacity(capsys):
    assert main(["capacity", "--model", "kimi-k2.6", "--gpu", "rtx-pro-6000", "--tp", "8",
                 "--mem-fraction", "0.85", "--context", "200000"]) == 0
    out = capsys.readouterr().out
    assert "70,272 B" in out and "fits: NO" in out
    assert main(["capacity", "--context", "300000"]) != 0
    assert "YaRN limit" in capsys.readouterr().err
    assert main(["capacity", "--gpu", "nope"]) != 0
    assert main(["capacity", "--mem-fraction", "0"]) != 0
    capsys.readouterr()
    for argv, msg in ((["--tp", "3"], "tp=3 is not allowed: an integer that divides the 64 attention heads"),
                      (["--tp", "1000"], "tp=1000 is not allowed"),
                      (["--context", "1e6"], "context=1000000 is not allowed: an integer in [1, 262144] tokens"),
                      (["--context", "abc"], "context='abc' is not allowed: an integer in [1, 262144] tokens")):
        assert main(["capacity", *argv]) == 2
        err = capsys.readouterr().err
        assert msg in err, err
        with pytest.raises(ValueError) as lib:  # the library says the same
            cap.capacity(**{argv[0][2:]: parse_text(argv[1])})
        assert str(lib.value) in err
    assert main(["capacity", "--json", "--gpu", "h200"]) == 0
    import json
    doc = json.loads(capsys.readouterr().out)
    assert doc["kv_bytes_per_token"] == 70_272 and doc["fits"] is True


def test_source_check_explains_8_6_kb():
    rows = cap.source_check()
    assert rows[0]["holds"] is False and "8,784" in rows[0]["why"]
    assert "does not hold" in cap.verdict()
