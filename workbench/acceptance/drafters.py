"""Shipped drafters under ``data/drafters/<name>/``, loadable by name.

A shipped drafter is a folder with ``model.safetensors`` (the drafter's own weights, bf16; the embedding and LM head
are the target's and are not stored), ``config.json`` (the :class:`workbench.engine.drafters.DFlashConfig` plus the
target it was trained for: ``target`` {name, gguf_sha256, hidden_size, num_hidden_layers, vocab_size}) and
``training.json`` (corpora and licences, tokens, steps, seconds, validation curve, git commit).

:func:`drafter_names` lists them; :func:`load_drafter` builds the drafter on a target and checks that it is the
target the drafter was trained for (hidden size, layer count, vocabulary) and, when asked for one, that the block
fits (``block`` at most the trained block). Bad input is an :class:`~workbench.validation.InvalidParameter`
naming what is allowed.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from workbench import REPO_ROOT
from workbench.engine.drafters import DFlashConfig, DFlashDrafter
from workbench.validation import InvalidParameter, check_choice, check_int

__all__ = ["DRAFTERS_DIR", "drafter_names", "drafter_info", "load_drafter", "save_drafter", "check_target"]

DRAFTERS_DIR = REPO_ROOT / "data" / "drafters"
MAX_BYTES = 30 * 2 ** 20


def drafter_names(root: str | Path | None = None) -> tuple[str, ...]:
    """Names of the shipped drafters (folders holding config.json and model.safetensors)."""
    d = Path(root) if root is not None else DRAFTERS_DIR
    if not d.exists():
        return ()
    return tuple(sorted(p.name for p in d.iterdir() if (p / "config.json").exists() and (p / "model.safetensors").exists()))


def drafter_info(name: str, root: str | Path | None = None) -> dict:
    """config.json of the shipped drafter ``name`` (an unknown name lists the shipped ones)."""
    check_choice("drafter", name, drafter_names(root))
    d = (Path(root) if root is not None else DRAFTERS_DIR) / name
    return json.loads((d / "config.json").read_text())


def check_target(info: dict, target) -> None:
    """``target`` must be the model the drafter was trained for: same hidden size, layer count and vocabulary."""
    want = info["target"]
    tc = target.config
    have = {"hidden_size": int(tc.hidden_size), "num_hidden_layers": int(tc.num_hidden_layers),
            "vocab_size": int(tc.vocab_size)}
    for k, v in have.items():
        if int(want[k]) != v:
            raise InvalidParameter("target", f"{k}={v}", f"the target this drafter was trained for: {want['name']} "
                                   f"({', '.join(f'{kk}={want[kk]}' for kk in have)})")


def load_drafter(name: str, target, block: int | None = None, root: str | Path | None = None,
                 dtype: torch.dtype | None = None) -> DFlashDrafter:
    """The shipped drafter ``name`` on ``target`` (an :class:`~workbench.acceptance.target.HFTarget`, a
    :class:`~workbench.acceptance.fastllama.StaticLlama` or anything with ``config``, ``embed_tokens``,
    ``lm_head``, ``device``, ``dtype``), in ``dtype`` (default the target's). ``block``: the block you will draft
    with, at most the trained one (a smaller block uses the first ``block - 1`` drafted positions)."""
    info = drafter_info(name, root)
    check_target(info, target)
    cfg = DFlashConfig.from_json(json.dumps(info["dflash_config"]))
    if block is not None:
        check_int("block", block, lo=2, hi=cfg.block)
    d = (Path(root) if root is not None else DRAFTERS_DIR) / name
    drafter = DFlashDrafter.load(d / "model.safetensors", target)
    return drafter.to(dtype or target.dtype).eval()


def save_drafter(directory: str | Path, drafter: DFlashDrafter, target_info: dict, training: dict) -> Path:
    """Write ``directory``/model.safetensors (bf16), config.json and training.json. ``target_info``: name,
    gguf_sha256, hidden_size, num_hidden_layers, vocab_size. Refuses weights over 30 MB."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in drafter.state_dict().items()}
    nbytes = sum(v.numel() * 2 for v in sd.values())
    if nbytes > MAX_BYTES:
        raise InvalidParameter("drafter size", nbytes, f"at most {MAX_BYTES} bytes of bf16 weights")
    save_file(sd, str(d / "model.safetensors"), metadata={"dflash_config": drafter.config.to_json()})
    (d / "config.json").write_text(json.dumps({"dflash_config": json.loads(drafter.config.to_json()),
                                               "target": target_info, "dtype": "bfloat16",
                                               "parameters": sum(v.numel() for v in sd.values())}, indent=1) + "\n")
    (d / "training.json").write_text(json.dumps(training, indent=1) + "\n")
    return d
