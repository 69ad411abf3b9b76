"""Load Hugging Face DeepSeek-V3 / Kimi K2.x checkpoints; write INT4 expert checkpoints.

:func:`load_model` reads ``config.json`` (model_type ``deepseek_v3`` or
``kimi_k2``, or a K2.5/K2.6 wrapper with a nested ``text_config``) and every
``*.safetensors`` of the directory (through ``model.safetensors.index.json``
when present). Tensor names are Hugging Face's::

    model.embed_tokens.weight, model.norm.weight, lm_head.weight
    model.layers.{i}.{input,post_attention}_layernorm.weight
    model.layers.{i}.self_attn.{q_a_proj,q_a_layernorm,q_b_proj | q_proj,kv_a_proj_with_mqa,
                                kv_a_layernorm,kv_b_proj,o_proj}.weight
    model.layers.{i}.mlp.{gate,up,down}_proj.weight                  (dense layers)
    model.layers.{i}.mlp.gate.weight, .mlp.gate.e_score_correction_bias
    model.layers.{i}.mlp.shared_experts.{gate,up,down}_proj.weight
    model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight       (bf16 / fp32 experts)
    model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight_{packed,scale,shape}   (INT4)

and, as transformers >= 5 holds them in memory, fused
``model.layers.{i}.mlp.experts.gate_up_proj`` [E, 2I, D] and
``...experts.down_proj`` [E, D, I]. A ``language_model.`` prefix (K2.5/K2.6
wrappers) is stripped; vision-tower / projector tensors and the multi-token
prediction layers (``model.layers.{n}`` for n >= num_hidden_layers, up to
``num_nextn_predict_layers``) are skipped. Any other extra tensor, a missing
one, or a shape that disagrees with the config raises ``ValueError`` naming it.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from workbench.config import ModelConfig, config_from_dict
from workbench.engine.model import DeepseekV3
from workbench.engine.moe import PROJS
from workbench.int4 import quantize_int4

SKIP_PREFIXES = ("vision_tower.", "vision_model.", "mm_projector.", "multi_modal_projector.")
_EXPERT = re.compile(r"^layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\."
                     r"(weight|weight_packed|weight_scale|weight_shape)$")
_FUSED = re.compile(r"^layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")
_LAYER = re.compile(r"^layers\.(\d+)\.")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [path / n for n in names]
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise ValueError(f"checkpoint index names shards that do not exist: {', '.join(missing)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {path}")
    return files


def _read_config(path: Path) -> tuple[ModelConfig, dict]:
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise ValueError(f"{path} has no config.json")
    raw = json.loads(cfg_path.read_text())
    text = raw.get("text_config", raw) if raw.get("model_type") not in ("deepseek_v3", "kimi_k2") else raw
    return config_from_dict(raw, name=path.name), text


def _default_dtype(text: dict) -> torch.dtype:
    name = str(text.get("dtype") or text.get("torch_dtype") or "bfloat16").replace("torch.", "")
    return _DTYPES.get(name, torch.bfloat16)


def build_empty(config: ModelConfig, dtype: torch.dtype, device, int4_experts: bool) -> DeepseekV3:
    """A :class:`DeepseekV3` with uninitialised storage on ``device`` (router kept in float32)."""
    with torch.device("meta"):
        model = DeepseekV3(config, dtype=dtype, int4_experts=int4_experts)
        for name, p in model.named_parameters():  # final dtypes first: storage is allocated once, below
            if p.is_floating_point() and not _is_router(name):
                p.data = torch.empty_like(p, dtype=dtype)
    model.to_empty(device=device)
    return model.eval()


def _is_router(name: str) -> bool:
    return ".mlp.gate.weight" in name or name.endswith("e_score_correction_bias")


def _normalise_name(name: str) -> str | None:
    """Hugging Face name -> internal name (None: skip this tensor)."""
    if name.startswith("language_model."):
        name = name[len("language_model."):]
    if name.startswith(SKIP_PREFIXES):
        return None
    if name.startswith("model."):
        return name[len("model."):]
    return name  # lm_head.weight, or an unknown name that the caller reports


def load_model(path: str | Path, device: str | torch.device | None = None,
               dtype: torch.dtype | None = None) -> DeepseekV3:
    """Load a checkpoint directory into a :class:`DeepseekV3` (eval mode, no grad).

    device: default CPU. dtype: float32 / bfloat16 / float16 for everything but the router
    (float32) and INT4 experts (int32 packed + bf16 scales, dequantised per use); default the
    checkpoint's ``dtype``/``torch_dtype`` (bf16 when absent).
    """
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"checkpoint path {path} is not a directory")
    config, text = _read_config(path)
    dtype = dtype or _default_dtype(text)
    if dtype not in _DTYPES.values():
        raise ValueError(f"dtype must be one of float32, bfloat16, float16; got {dtype}")
    device = torch.device(device or "cpu")
    files = _checkpoint_files(path)
    names: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                names[k] = f
    int4 = any(k.endswith(".weight_packed") for k in names)
    if int4 and config.expert_quant is None:
        raise ValueError("checkpoint holds weight_packed tensors but config.json has no compressed-tensors "
                         "pack-quantized quantization_config")
    model = build_empty(config, dtype, device, int4)
    n_mtp = int(text.get("num_nextn_predict_layers") or 0)
    L = config.num_hidden_layers
    targets = dict(model.named_parameters())
    targets.update({k: v for k, v in model.named_buffers()})
    filled: set[str] = set()

    def put(internal: str, tensor: torch.Tensor, hf_name: str) -> None:
        dst = targets[internal]
        view = dst
        if tuple(tensor.shape) != tuple(view.shape):
            raise ValueError(f"tensor {hf_name} has shape {tuple(tensor.shape)}, the config implies "
                             f"{tuple(view.shape)}")
        view.copy_(tensor.to(device=device, dtype=dst.dtype))
        filled.add(internal)

    by_file: dict[Path, list[str]] = {}
    for k, f in names.items():
        by_file.setdefault(f, []).append(k)
    with torch.no_grad():
        for f, keys in by_file.items():
            with safe_open(str(f), framework="pt") as sf:
                for hf in keys:
                    name = _normalise_name(hf)
                    if name is None:
                        continue
                    m = _LAYER.match(name)
                    if m and L <= int(m.group(1)) < L + n_mtp:
                        continue  # multi-token prediction layer
                    if name.endswith("weight_scale_inv"):
                        raise ValueError(f"tensor {hf}: FP8 block-quantized weights are not supported; "
                                         "convert the checkpoint to bf16 first")
                    em = _EXPERT.match(name)
                    if em:
                        i, e, proj, kind = int(em.group(1)), int(em.group(2)), em.group(3), em.group(4)
                        if not (0 <= i < L and model.layers[i].is_moe):
                            raise ValueError(f"unexpected tensor {hf}: layer {i} has no routed experts")
                        if e >= config.n_routed_experts:
                            raise ValueError(f"unexpected tensor {hf}: expert {e} >= n_routed_experts "
                                             f"{config.n_routed_experts}")
                        exp = model.layers[i].mlp.experts
                        key = f"model.layers.{i}.mlp.experts.{e}.{proj}.{kind}"
                        if kind == "weight_shape":
                            want = exp.shapes[proj]
                            got = tuple(int(x) for x in sf.get_tensor(hf).tolist())
                            if got != want:
                                raise ValueError(f"tensor {hf} = {got}, the config implies {want}")
                            filled.add(key)
                            continue
                        if (kind == "weight") == int4:
                            raise ValueError(f"tensor {hf}: checkpoint mixes INT4 and unquantised routed experts")
                        t = sf.get_tensor(hf)
                        view = (getattr(exp, proj)[e] if kind == "weight"
                                else exp.int4_slot(proj, kind[len("weight_"):], e))
                        if tuple(t.shape) != tuple(view.shape):
                            raise ValueError(f"tensor {hf} has shape {tuple(t.shape)}, the config implies "
                                             f"{tuple(view.shape)}")
                        view.copy_(t.to(device=device, dtype=view.dtype))
                        filled.add(key)
                        continue
                    fm = _FUSED.match(name)
                    if fm:
                        i, which = int(fm.group(1)), fm.group(2)
                        if not (0 <= i < L and model.layers[i].is_moe) or int4:
                            raise ValueError(f"unexpected tensor {hf}")
                        t = sf.get_tensor(hf)
                        E = config.n_routed_experts
                        if which == "gate_up_proj":
                            I = config.moe_intermediate_size
                            if t.dim() != 3 or t.shape[1] != 2 * I:
                                raise ValueError(f"tensor {hf} has shape {tuple(t.shape)}, the config implies "
                                                 f"({E}, {2 * I}, {config.hidden_size})")
                            put(f"layers.{i}.mlp.experts.gate_proj", t[:, :I], hf)
                            put(f"layers.{i}.mlp.experts.up_proj", t[:, I:], hf)
                            projs = ("gate_proj", "up_proj")
                        else:
                            put(f"layers.{i}.mlp.experts.down_proj", t, hf)
                            projs = ("down_proj",)
                        filled.update(f"model.layers.{i}.mlp.experts.{e}.{p}.weight" for e in range(E) for p in projs)
                        continue
                    if name == "lm_head.weight" or name in targets:
                        if name not in targets:
                            raise ValueError(f"unexpected tensor {hf}")
                        put(name, sf.get_tensor(hf), hf)
                        continue
                    raise ValueError(f"unexpected tensor {hf} (no such weight in a {config.model_type} model "
                                     f"with this config)")
    if "lm_head.weight" not in filled and config.tie_word_embeddings and "embed_tokens.weight" in filled:
        model.lm_head.weight = model.embed_tokens.weight
        filled.add("lm_head.weight")
    missing = []
    kinds = ("weight_packed", "weight_scale", "weight_shape") if int4 else ("weight",)
    for i, layer in enumerate(model.layers):
        if layer.is_moe:
            missing += [f"model.layers.{i}.mlp.experts.{e}.{p}.{k}" for e in range(config.n_routed_experts)
                        for p in PROJS for k in kinds
                        if f"model.layers.{i}.mlp.experts.{e}.{p}.{k}" not in filled]
    for name in targets:
        if ".mlp.experts." not in name and name not in filled:
            missing.append(("" if name.startswith("lm_head") else "model.") + name)
    if missing:
        more = f" (and {len(missing) - 10} more)" if len(missing) > 10 else ""
        raise ValueError(f"checkpoint {path} lacks tensors: {', '.join(missing[:10])}{more}")
    for layer in model.layers:  # the fused MoE's view (and any layout it keeps) is made now: device_bytes() is final
        if layer.is_moe:
            layer.mlp.experts.prepare(model.dtype)
    return model


def quantize_experts_int4(src: str | Path, dst: str | Path, group_size: int = 32) -> Path:
    """Write a copy of checkpoint ``src`` with every routed expert's gate/up/down weight in
    compressed-tensors pack-quantized INT4 (``weight_packed`` int32 [out, in/8], ``weight_scale``
    bf16 [out, in/group], ``weight_shape`` int32 [2]), symmetric, ``group_size``; other tensors
    unchanged. config.json gains the matching ``quantization_config``. Returns ``dst``.
    """
    src, dst = Path(src), Path(dst)
    config, _ = _read_config(src)
    raw = json.loads((src / "config.json").read_text())
    dst.mkdir(parents=True, exist_ok=True)
    expert = re.compile(r"(?:^|\.)layers\.\d+\.mlp\.experts\.\d+\.(?:gate|up|down)_proj\.weight$")
    fused = re.compile(r"^(.*layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")
    I = config.moe_intermediate_size
    weight_map = {}
    for f in _checkpoint_files(src):
        out = {}
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                t = sf.get_tensor(k)
                fm = fused.match(k)
                items = []
                if expert.search(k):
                    items = [(k[:-len(".weight")], t)]
                elif fm:
                    for e in range(t.shape[0]):
                        if fm.group(2) == "gate_up_proj":
                            items += [(f"{fm.group(1)}.{e}.gate_proj", t[e, :I]),
                                      (f"{fm.group(1)}.{e}.up_proj", t[e, I:])]
                        else:
                            items.append((f"{fm.group(1)}.{e}.down_proj", t[e]))
                else:
                    out[k] = t.contiguous()
                for base, w in items:
                    packed, scale = quantize_int4(w, group_size)
                    out[base + ".weight_packed"] = packed
                    out[base + ".weight_scale"] = scale
                    out[base + ".weight_shape"] = torch.tensor(list(w.shape), dtype=torch.int32)
        save_file(out, str(dst / f.name), metadata={"format": "pt"})
        weight_map.update({k: f.name for k in out})
    if (src / "model.safetensors.index.json").exists():
        (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map},
                                                                     indent=1))
    qc = {"quant_method": "compressed-tensors", "format": "pack-quantized",
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
              "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
              "group_size": group_size, "dynamic": False}, "input_activations": None, "output_activations": None}},
          "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                     "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]}
    if "text_config" in raw and raw.get("model_type") not in ("deepseek_v3", "kimi_k2"):
        raw["text_config"]["quantization_config"] = qc
    else:
        raw["quantization_config"] = qc
    (dst / "config.json").write_text(json.dumps(raw, indent=1))
    return dst
