"""The serving benchmark's CPU dry run (``python -m workbench.bench.serve --tiny``): the same code as the H200 run
writes serving.json with provenance, the engine and server rows for greedy and DDTree at C = 1 and 8, goals with the
measured values, DDTree's served tokens equal greedy's, and the head-of-line rows whole and chunked."""
from __future__ import annotations

import json
import math

import pytest


def test_serving_bench_dry_run(tmp_path):
    from workbench.bench.serve import main

    assert main(["--tiny", "--out", str(tmp_path), "--repeats", "1", "--max-tokens", "8"]) == 0
    doc = json.loads((tmp_path / "serving.json").read_text())
    assert doc["provenance"]["git_commit"] and doc["parameters"]["model"] == "tiny"
    res = doc["results"]
    assert res["error"] is None
    assert sorted((e["method"], e["C"]) for e in res["engine"]) == [("ddtree", 1), ("ddtree", 8), ("greedy", 1),
                                                                   ("greedy", 8)]
    for s in res["server"]:
        assert s["itl_ms_median"] > 0 and math.isfinite(s["itl_ms_median"])
        assert s["output_tokens"] == 8 * s["C"]
    big = [s for s in res["server"] if s["C"] == 8]
    assert all(s["steady"]["tokens_per_s"] is None or s["steady"]["tokens_per_s"] > 0 for s in big)
    assert [g["goal"].split(":")[0] for g in res["goals"]] == ["greedy", "greedy", "ddtree", "ddtree"]
    assert all(g["engine"] > 0 for g in res["goals"])
    assert res["lossless"] and all(x["equal"] for x in res["lossless"])
    assert [h["chunk"] for h in res["head_of_line"]] == [None, 16]
    assert [h["boundaries"] for h in res["head_of_line"]] == [1, 3] and all(h["tokens_each_boundary"]
                                                                            for h in res["head_of_line"])
    assert "server/greedy/C1/0" in doc["samples"]


def test_numbered_codec_keeps_a_synthetic_models_whole_vocabulary():
    """The serving bench's codec: ids past the byte codec's 256 (the K2.6 shape has 163,840) round-trip through
    text, so prompts and outputs of the model's whole vocabulary pass the API's id check."""
    from workbench.serve.tokenizer import TextCodec

    c = TextCodec.numbered(1000)
    assert c.vocab_size == 1000
    ids = [0, 255, 256, 999]
    assert c.encode(c.decode(ids)) == ids
    with pytest.raises(ValueError, match="vocab_size"):
        TextCodec.numbered(0)
