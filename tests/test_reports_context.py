"""papers/context_diagnosis.md's generator (workbench.reports.context) over a CPU dry run of the context sweep
(``python -m workbench.bench.sweep``): every block filled from the file, computed sentences, deterministic figures,
``--check``; the committed paper is current; without the H200 file the blocks say so."""
from __future__ import annotations

import json

import pytest

from workbench.reports import context, papers


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    from workbench.bench.sweep import main

    out = tmp_path_factory.mktemp("sweep")
    assert main(["--out", str(out), "--contexts", "32", "64", "--concurrency", "1", "2", "--generate", "24",
                 "--two-point", "2", "24", "--repeats", "3", "--threads", "1", "--sustained-at", "32"]) == 0
    return out / "context_sweep.json"


def test_blocks_read_the_file(dry, tmp_path):
    doc = json.loads(dry.read_text())
    paper = tmp_path / "p.md"
    paper.write_text(context.PAPER.read_text())
    figs = tmp_path / "figs"
    kw = ["--data", str(dry), "--paper", str(paper), "--figures", str(figs)]
    assert context.main(kw + ["--check"]) == 1
    assert context.main(kw) == 0 and context.main(kw + ["--check"]) == 0  # figures byte-identical on regeneration
    text = paper.read_text()
    assert "Not measured yet" not in text
    assert "No `engine_step.json` of this model shape" in text   # the tiny CPU model has no H200 floor rows
    assert sorted(p.name for p in figs.iterdir()) == sorted(f"{n}.html" for n, _, _ in context.FIGURE_SPECS)
    rows = doc["results"]["contexts"]
    n_in = sum(r["check_sustained"]["within"] for r in rows)
    assert f"within 5% at {n_in} of {len(rows)} points" in text
    # two-point block: one row per method at the sustained context, overstatement = two-point / sustained - 1
    over = context.overstatement_rows(doc)
    assert [r["context"] for r in over] == [32] * len(doc["parameters"]["methods"])
    r0 = next(r for r in rows if r["context"] == 32 and r["method"] == over[0]["method"])
    assert over[0]["overstatement"] == f"{100 * (r0['two_point'] / r0['sustained'] - 1):+.1f}%"
    assert "Fragmentation's cost at 64" in text and "mean run from" in text
    assert "2.9 tokens per step / 0.144 s = 20.1 tokens/s" in text
    assert "no per-step terms in this file" in text  # a CPU file has none
    assert context.verify_rows(doc) == []


def test_verify_rows_follow_the_engine_capacity_split():
    """The committed H200 file: each DDTree point's longest thread block is min(context + nodes, capacity / 4)."""
    doc = context.load()
    if doc is None:
        pytest.skip("no committed context_sweep.json")
    rows = context.verify_rows(doc)
    assert [r["context"] for r in rows] == doc["parameters"]["contexts"]
    for r in rows:
        assert r["longest block (keys)"] == min(r["context"] + doc["parameters"]["budget"] + 1,
                                                r["keys per thread block"])
    floors = context.floor_rows(doc)
    assert len(floors) == len(doc["results"]["contexts"])


def test_dominant_names_the_largest_term(dry):
    doc = json.loads(dry.read_text())
    r = next(r for r in doc["results"]["contexts"] if r["context"] == 64)  # nearest to 5k and to 64k here
    r["terms"] = {"wall_ms": 10.0, "gpu_busy_ms": 9.0, "draft": 0.1, "tree_build": 0.2, "verify_attention": 6.0,
                  "moe": 2.0, "accept_commit": 0.1, "rest": 1.6}
    assert f"{r['method']}: verify_attention (60%)" in context.block_dominant(doc)


def test_committed_paper_is_current_and_says_when_data_is_missing(tmp_path):
    text = context.PAPER.read_text()
    assert sorted(papers.block_names(text)) == sorted(context.BLOCK_FUNCS)
    assert context.render(text) == text, "papers/context_diagnosis.md is stale: run python -m workbench.reports.context"
    assert context.block_rates(None) == context.MISSING and context.figure_files(None) == {}
    assert context.load(tmp_path / "absent.json") is None
