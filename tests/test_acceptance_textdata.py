"""Text data module (issue 28 item 2): seeded document-level splits are disjoint and deterministic; a missing
package is an error that names it."""
import importlib.util

import pytest
import torch

from workbench.acceptance import textdata
from workbench.acceptance.textdata import MissingTextPackage, build_splits, byte_tokenize, load_splits, save_splits
from workbench.validation import InvalidParameter

DOCS = [(f"doc{i}", f"document {i}: " + "abcdefgh"[i % 8] * (40 + 7 * i)) for i in range(30)]


def test_splits_disjoint_and_deterministic():
    a = build_splits("math", byte_tokenize, seed=3, heldout_fraction=0.2, chunk=16, docs=DOCS)
    b = build_splits("math", byte_tokenize, seed=3, heldout_fraction=0.2, chunk=16, docs=DOCS)
    assert torch.equal(a.train, b.train) and torch.equal(a.heldout, b.heldout)
    assert a.train_docs == b.train_docs and a.heldout_docs == b.heldout_docs
    assert not set(a.train_docs) & set(a.heldout_docs)
    assert len(a.heldout_docs) == 6 and len(a.train_docs) == 24
    assert a.train.dtype == torch.int64 and a.train.shape[1] == 16
    c = build_splits("math", byte_tokenize, seed=4, heldout_fraction=0.2, chunk=16, docs=DOCS)
    assert c.heldout_docs != a.heldout_docs  # the seed decides
    # the held-out text really is the held-out documents' text
    text = "".join(dict(DOCS)[d] for d in a.heldout_docs).encode()
    assert bytes(a.heldout.flatten().tolist()) == text[: a.heldout.numel()]


def test_split_bad_inputs_name_the_parameter():
    with pytest.raises(InvalidParameter, match="text_type"):
        build_splits("poetry", byte_tokenize, docs=DOCS)
    with pytest.raises(InvalidParameter, match="heldout_fraction"):
        build_splits("math", byte_tokenize, heldout_fraction=0.0, docs=DOCS)
    with pytest.raises(InvalidParameter, match="chunk"):
        build_splits("math", byte_tokenize, chunk=100000, docs=DOCS)


def test_missing_package_names_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(textdata.importlib.util, "find_spec",
                        lambda name, *a: None if name == "champ_dataset" else real(name, *a))
    with pytest.raises(MissingTextPackage, match="champ-dataset"):
        textdata.documents("math")


def test_save_load_roundtrip(tmp_path):
    s = build_splits("code", byte_tokenize, chunk=8, docs=DOCS, sep=[0])
    path = save_splits(tmp_path / "s.safetensors", [s], {"tokenizer": "bytes", "vocab_size": 256})
    got, meta = load_splits(path)
    assert meta["tokenizer"] == "bytes"
    assert torch.equal(got["code"].train, s.train) and got["code"].heldout_docs == s.heldout_docs
