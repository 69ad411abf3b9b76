"""StaticLlama equals the transformers model; the replayed measurement equals a live DDTree loop round for round;
prompt lookup, the chain and the bootstrap interval."""
import pytest
import torch

pytest.importorskip("transformers")

from workbench.acceptance.fastllama import StaticLlama
from workbench.acceptance.simulate import bootstrap_ci, draft_all, prompt_lookup, replay, summarize
from workbench.acceptance.target import HFTarget, ddtree_generate, greedy_generate, tiny_llama
from workbench.acceptance.train import SeqData
from workbench.engine.drafters import DFlashConfig, DFlashDrafter


@pytest.fixture(scope="module")
def model():
    return tiny_llama(vocab_size=64, hidden_size=64, layers=3, heads=4, kv_heads=2, intermediate=128, seed=3,
                      init_std=0.1)


def test_static_llama_equals_transformers(model):
    t = StaticLlama(model, capture_layers=(0, 1))
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    logits, feats = t.forward_features(ids)
    ref = model(input_ids=ids, output_hidden_states=True)
    torch.testing.assert_close(logits, ref.logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(feats[..., :64], ref.hidden_states[1], atol=1e-4, rtol=1e-4)
    hf = HFTarget(model)
    prompts = [[5, 9, 2], [7] * 6, [1, 2, 3, 4, 5, 6, 7, 8]]
    gens, stats = t.generate(prompts, 10, batch=2, max_prompt=8)
    assert stats["tokens"] == 30 and stats["prompts"] == 3 and not stats["graph"]
    for p, g in zip(prompts, gens):
        assert g == greedy_generate(hf, p, 10).tokens
    with pytest.raises(ValueError, match="max_prompt"):
        t.generate([[1] * 9], 4, max_prompt=8)


@pytest.mark.parametrize("budget", [1, 4, 16])
def test_replay_equals_the_live_loop(model, budget):
    t = StaticLlama(model, capture_layers=(0, 2))
    cfg = DFlashConfig(hidden_size=64, num_layers=1, num_heads=4, head_dim=16, intermediate_size=128, block=6,
                       target_layers=(0, 2), mask_token_id=1, context_window=8)
    d = DFlashDrafter.random(cfg, t, seed=0, std=0.3)
    prompts = [[3, 8, 1, 9, 4], [2] * 9, [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]]
    gens, _ = t.generate(prompts, 24, batch=4, max_prompt=12)
    data = SeqData.from_lists(prompts, gens, eos=None)
    _, feats = t.forward(data.tokens)
    glen = data.lengths - data.prompt_lens
    res = replay(draft_all(d, feats, data.tokens, data.prompt_lens, glen, k=16), data.tokens, data.prompt_lens, glen,
                 budget)
    hf = HFTarget(model, capture_layers=(0, 2))
    for i, p in enumerate(prompts):
        live = ddtree_generate(hf, d, p, 24, budget)
        assert live.tokens == gens[i]
        assert res["rounds"][i] == [s.accepted for s in live.steps]
    row = summarize(res)
    assert row["tokens"] == sum(len(g) - 1 for g in gens) and sum(row["histogram"]) == row["rounds"]
    assert row["ci95"][0] <= row["mean_accepted"] <= row["ci95"][1]
    assert row["reached_by_depth"][0] == row["rounds"]
    assert sum(row["hit_by_sibling_rank"][0]) == pytest.approx(row["hit_by_depth"][0])


def test_chain_is_one_child_per_node(model):
    t = StaticLlama(model, capture_layers=(0,))
    cfg = DFlashConfig(hidden_size=64, num_layers=1, num_heads=4, head_dim=16, intermediate_size=128, block=5,
                       target_layers=(0,), context_window=4)
    d = DFlashDrafter.random(cfg, t, seed=1, std=0.3)
    gens, _ = t.generate([[4, 4, 4]], 16, max_prompt=4)
    data = SeqData.from_lists([[4, 4, 4]], gens, eos=None)
    _, feats = t.forward(data.tokens)
    glen = data.lengths - data.prompt_lens
    res = replay(draft_all(d, feats, data.tokens, data.prompt_lens, glen, k=8), data.tokens, data.prompt_lens, glen,
                 4, k=1)
    assert res["nodes"] == 5 and all(r == 0 for row in res["by_rank"] for r in row[1:])


def test_prompt_lookup_copies_a_repeated_span():
    prompt = [1, 2, 3, 4, 5, 6]
    gen = [1, 2, 3, 4, 5, 6, 9]
    # at bonus 1 the last token matches prompt[0]: proposes 2, 3, 4 (depth 3) -> all right
    assert prompt_lookup(prompt, gen, 3) == [4, 2]
    assert prompt_lookup([7], [8, 9, 10], 2) == [1, 1]


def test_bootstrap_interval_brackets_the_mean():
    rounds = [[1, 2, 3], [4, 4], [1], [2, 2, 2, 2]]
    lo, hi = bootstrap_ci(rounds, reps=500)
    mean = sum(map(sum, rounds)) / sum(map(len, rounds))
    assert lo <= mean <= hi and lo < hi
