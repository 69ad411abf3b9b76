"""``workbench serve``: an OpenAI-compatible server over the engine (greedy or DDTree, continuous batching).

    workbench serve --synthetic tiny [--layers N] [--tokenizer PATH] | --model PATH
                    [--host 127.0.0.1] [--port 8000] [--method greedy|ddtree] [--drafter PATH|random]
                    [--block 16] [--budget 32] [--kv-slots N] [--max-requests 8] [--capacity N]
                    [--max-tokens-limit 1024] [--prefill-chunk N] [--max-queue 256] [--max-queue-wait 60]
                    [--api-key KEY] [--served-model-name NAME]

A checkpoint (``--model``) brings its tokenizer.json (and chat template). ``--synthetic NAME`` builds a random
model of that shipped config (``tiny``: :func:`workbench.engine.tiny_config`) whose vocabulary is set to the
tokenizer's: ``--tokenizer`` (a tokenizer.json or a directory holding one) or, without it, the byte-level
fallback of 256 ids (:func:`workbench.serve.tokenizer.byte_tokenizer`). ``--method ddtree`` needs ``--drafter``:
a DFlash drafter (file or directory, :meth:`DFlashDrafter.load`) or ``random`` (random weights: lossless, accepts
little; for exercising the path). Requests beyond the free rows or KV slots wait in an admission queue of
``--max-queue`` sequences for at most ``--max-queue-wait`` seconds (then 429 with Retry-After). Binds 127.0.0.1
unless told otherwise and warns when it is not loopback.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

from workbench.capacity import check_fits_memory, host_memory_bytes, model_config
from workbench.config import available_models, load_config
from workbench.decode import DEFAULT, DecodeConfig
from workbench.engine.drafters import DFlashConfig, DFlashDrafter
from workbench.engine.synthetic import synthetic_model, tiny_config
from workbench.validation import (
    InvalidParameter, check_bindable, check_choice, check_dir, check_float, check_host, check_int, check_str,
    load_json_file, parse_text,
)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
CHECKPOINT = "a checkpoint folder (config.json, tokenizer.json, *.safetensors)"
BYTE_VOCAB = 256  # the byte-level fallback tokenizer's ids: the smallest vocabulary a synthetic model is given


@dataclasses.dataclass
class ServeOptions:
    synthetic: str | None = None
    model: str | None = None
    layers: int | None = None
    tokenizer: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    method: str = "greedy"
    drafter: str | None = None
    block: int = DEFAULT.block
    budget: int = DEFAULT.budget
    kv_slots: int | None = None
    max_requests: int = 8
    capacity: int | None = None
    max_tokens_limit: int = 1024
    prefill_chunk: int | None = None
    max_queue: int = 256
    max_queue_wait: float = 60.0
    api_key: str | None = None
    served_model_name: str | None = None
    seed: int = 0

    def check(self) -> "ServeOptions":
        """Every option against its rule, and the files it names read, before any model is built."""
        self._check_source()
        check_host("host", self.host)
        check_int("port", self.port, lo=0, hi=65535)
        check_choice("method", self.method, ("greedy", "ddtree"))
        DecodeConfig(method=self.method, block=self.block, budget=self.budget)  # checks block, budget
        self._check_drafter()
        if self.kv_slots is not None:
            check_int("kv_slots", self.kv_slots, lo=1)
        check_int("max_requests", self.max_requests, lo=1, hi=128)
        if self.capacity is not None:
            check_int("capacity", self.capacity, lo=2)
        if self.capacity is None:
            check_int("max_tokens_limit", self.max_tokens_limit, lo=1)
        elif check_int("max_tokens_limit", self.max_tokens_limit, lo=1) >= self.capacity:
            raise InvalidParameter("max_tokens_limit", self.max_tokens_limit,
                                   f"an integer in [1, {self.capacity - 1}]: a request's prompt (at least one token) "
                                   f"and output share --capacity {self.capacity}")
        if self.prefill_chunk is not None:
            check_int("prefill_chunk", self.prefill_chunk, lo=1)
        check_int("max_queue", self.max_queue, lo=1)
        check_float("max_queue_wait", self.max_queue_wait, lo=0.0, lo_open=True)
        if self.api_key is not None:
            check_str("api_key", self.api_key)
        if self.served_model_name is not None:
            check_str("served_model_name", self.served_model_name)
        return self

    def _check_source(self) -> None:
        """One model source: a synthetic config (``tiny`` or a shipped name) or a checkpoint folder with a
        supported config.json; the tokenizer it will use read as JSON."""
        if (self.synthetic is None) == (self.model is None):
            raise ValueError("give exactly one of --synthetic NAME and --model PATH")
        if self.layers is not None and self.model is not None:
            raise ValueError("--layers is for --synthetic models")
        if self.synthetic is not None:
            check_choice("synthetic", self.synthetic, ("tiny", *available_models()))
            cfg = tiny_config() if self.synthetic == "tiny" else load_config(self.synthetic)
            if self.layers is not None:
                check_int("layers", self.layers, lo=1, hi=cfg.num_hidden_layers)
            memory, where, float32 = device_memory()
            check_fits_memory(cfg.replace(num_hidden_layers=self.layers or cfg.num_hidden_layers,
                                          vocab_size=BYTE_VOCAB), memory, where, float32)
        if self.model is not None:
            folder = check_dir("model", self.model, CHECKPOINT)
            if not (folder / "config.json").is_file():
                raise InvalidParameter("model", self.model, f"the path of {CHECKPOINT}; it holds no config.json")
            model_config(folder)  # a supported model's config
            if self.tokenizer is None and not (folder / "tokenizer.json").is_file():
                raise InvalidParameter("model", self.model, f"the path of {CHECKPOINT}; it holds no tokenizer.json "
                                                            f"(or give --tokenizer PATH)")
        if self.tokenizer is not None or self.model is not None:
            check_tokenizer("tokenizer" if self.tokenizer is not None else "model", self.tokenizer or self.model)

    def _check_drafter(self) -> None:
        """``--drafter``: needed by ddtree only; ``random`` or an existing file or folder."""
        if self.method == "ddtree" and not self.drafter:
            raise ValueError("--method ddtree needs --drafter PATH (a DFlash drafter) or --drafter random")
        if self.drafter is not None and self.method != "ddtree":
            raise InvalidParameter("drafter", self.drafter, "given only with --method ddtree (greedy drafts nothing)")
        if self.drafter in (None, "random"):
            return
        p = Path(self.drafter).expanduser()
        allowed = ("'random' or the path of a DFlash drafter: a .safetensors file, or a folder with config.json and "
                   "model.safetensors")
        if not p.exists():
            raise InvalidParameter("drafter", self.drafter, f"{allowed}; it does not exist")
        missing = [f for f in ("config.json", "model.safetensors") if p.is_dir() and not (p / f).is_file()]
        if missing:
            raise InvalidParameter("drafter", self.drafter, f"{allowed}; the folder has no {' or '.join(missing)}")


def device_memory() -> tuple[int, str, bool]:
    """(bytes, whose, float32) of the device a model is built on: the GPU's (bf16) or, without one, RAM (float32)."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory, "the GPU's memory", False
    return host_memory_bytes(), "this machine's RAM", True


def check_tokenizer(name: str, path: str) -> Path:
    """A tokenizer.json, or a folder holding one, that reads as a tokenizer (a JSON object with a ``model``);
    returns the file."""
    what = "a tokenizer.json (or a folder holding one)"
    p = Path(path).expanduser()
    file = p / "tokenizer.json" if p.is_dir() else p
    if p.is_dir() and not file.exists():
        raise InvalidParameter(name, path, f"the path of {what}; the folder {p} holds no tokenizer.json")
    doc = load_json_file(name, file, what)
    if not isinstance(doc, dict) or "model" not in doc:
        raise InvalidParameter(name, path, f"the path of {what}; {file} is JSON but not a tokenizer (no 'model')")
    return file


def build(opts: ServeOptions):
    """(scheduler, codec, model name) for ``opts``: the model, tokenizer, engine and batch."""
    import torch

    from workbench.decode import DecodeConfig
    from workbench.engine.batch import Batch
    from workbench.engine.runner import ModelRunner
    from workbench.serve.scheduler import Scheduler
    from workbench.serve.tokenizer import TextCodec

    opts.check()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if opts.model is not None:
        from workbench.engine.loader import load_model

        codec = TextCodec.from_dir(opts.tokenizer or opts.model)
        model = load_model(opts.model, device=dev)
        name = opts.served_model_name or opts.model.rstrip("/").split("/")[-1]
    else:
        codec = TextCodec.from_dir(opts.tokenizer) if opts.tokenizer else TextCodec.bytes()
        model = synthetic_for(opts.synthetic, codec.vocab_size, opts.layers, dev, opts.seed)
        name = opts.served_model_name or f"synthetic-{opts.synthetic}"
    if codec.vocab_size > model.config.vocab_size:
        raise ValueError(f"the tokenizer has {codec.vocab_size} ids, the model's vocabulary {model.config.vocab_size}")
    cfg = DecodeConfig(method=opts.method, block=opts.block, budget=opts.budget)
    engine = ModelRunner(model, max_requests=opts.max_requests, capacity=opts.capacity, kv_slots=opts.kv_slots,
                          max_generated=opts.max_tokens_limit)
    drafter = load_drafter(opts, model) if opts.method == "ddtree" else None
    batch = Batch(engine, cfg, drafter, eos_token_id=codec.eos_token_id, prefill_chunk=opts.prefill_chunk)
    return Scheduler(batch, max_queue=opts.max_queue, max_queue_wait=opts.max_queue_wait), codec, name


def synthetic_for(name: str, vocab: int, layers: int | None, device, seed: int = 0):
    """A synthetic model of config ``name`` (``tiny`` or a shipped config) with ``vocab`` ids, float32 on the
    CPU (bf16 on CUDA)."""
    cfg = tiny_config(vocab_size=vocab) if name == "tiny" else dataclasses.replace(load_config(name),
                                                                                     vocab_size=vocab)
    dtype = torch.float32 if str(device) == "cpu" else torch.bfloat16
    return synthetic_model(cfg, layers=layers, dtype=dtype, seed=seed, device=device)


def load_drafter(opts: ServeOptions, model):
    """The drafter of ``--drafter``: random weights (``random``) or a saved DFlash drafter, on the model's device."""
    if opts.drafter == "random":
        c = model.config
        cfg = DFlashConfig(hidden_size=c.hidden_size, num_layers=1, num_heads=2, head_dim=16, intermediate_size=64,
                           block=opts.block, target_layers=(0,), mask_token_id=c.vocab_size - 1, context_window=8)
        return DFlashDrafter.random(cfg, model, seed=opts.seed).to(model.device)
    return DFlashDrafter.load(opts.drafter, model).to(model.device)


def serve(opts: ServeOptions, log_level: str = "info") -> int:
    """Check everything (the options, the address), build the model and serve until stopped."""
    import uvicorn  # these two imported where used: fastapi and the app add a second to every verb's start

    from workbench.serve.app import create_app

    opts.check()
    check_bindable(opts.host, opts.port)
    if opts.host not in LOOPBACK:
        print(f"workbench serve: warning: binding {opts.host}, not loopback: the server is reachable from other "
              f"machines{'' if opts.api_key else ' and has no --api-key'}", file=sys.stderr)
    scheduler, codec, name = build(opts)
    app = create_app(scheduler, codec, name, opts.api_key)
    uvicorn.run(app, host=opts.host, port=opts.port, log_level=log_level)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """The ``serve`` verb; numbers are parsed by :func:`~workbench.validation.parse_text` and checked by name."""
    d = ServeOptions()
    p = sub.add_parser("serve", help="OpenAI-compatible server over the engine (continuous batching)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--synthetic", metavar="NAME", help="a random model of this config (tiny or a shipped name)")
    src.add_argument("--model", metavar="PATH", help="checkpoint directory (with tokenizer.json)")
    p.add_argument("--layers", type=parse_text, metavar="N",
                   help="decoder layers of the synthetic model (default: all)")
    p.add_argument("--tokenizer", metavar="PATH", help="tokenizer.json or a directory holding one")
    p.add_argument("--host", default=d.host, help="bind address (default loopback)")
    p.add_argument("--port", type=parse_text, default=d.port, metavar="PORT")
    p.add_argument("--method", default=d.method, metavar="greedy|ddtree", help="greedy or ddtree")
    p.add_argument("--drafter", metavar="PATH|random", help="DFlash drafter file/dir for ddtree, or 'random'")
    p.add_argument("--block", type=parse_text, default=d.block, metavar="N")
    p.add_argument("--budget", type=parse_text, default=d.budget, metavar="N")
    p.add_argument("--kv-slots", type=parse_text, metavar="N", help="KV pool slots (default max-requests x capacity)")
    p.add_argument("--max-requests", type=parse_text, default=d.max_requests, metavar="N",
                   help="engine rows (concurrent requests)")
    p.add_argument("--capacity", type=parse_text, metavar="N",
                   help="tokens per request, prompt + output (default the rope limit)")
    p.add_argument("--max-tokens-limit", type=parse_text, default=d.max_tokens_limit, metavar="N",
                   help="largest max_tokens a request may ask for")
    p.add_argument("--prefill-chunk", type=parse_text, metavar="N",
                   help="prompt tokens per prefill forward (default whole prompts: a long one delays the others)")
    p.add_argument("--max-queue", type=parse_text, default=d.max_queue, metavar="N",
                   help="sequences that may wait for admission (beyond: 429 with Retry-After)")
    p.add_argument("--max-queue-wait", type=parse_text, default=d.max_queue_wait, metavar="S",
                   help="seconds a sequence may wait for admission before a 429")
    p.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY'")
    p.add_argument("--served-model-name", metavar="NAME", help="the model id clients use")
    p.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    """``workbench serve``: the options as :class:`ServeOptions`."""
    opts = ServeOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServeOptions)
                           if hasattr(args, f.name)})
    return serve(opts)
