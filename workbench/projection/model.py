"""Per-step cost model of DDTree speculative decoding at concurrency 1 under tensor parallelism.

One decode step (one verify round) on ``tp`` GPUs costs, per GPU, the sum of
the terms in :data:`TERMS` (milliseconds); tokens/s = accepted length / step.
Every term has a formula, a source (a measurement file of this workbench, an
anchor from the source articles in ``data/anchors/``, or an assumption with a
range in ``data/anchors/projection_assumptions.json`` / ``data/hardware.json``)
and a rule for moving it to another GPU. :func:`step_terms` evaluates the
terms for one choice of every ranged quantity (a ``params`` dict);
:mod:`workbench.projection.project` turns ranges into low / central / high.

Byte counts come from the model config (``workbench.config``): they are
computed, never typed. Sizes: ``M = budget + 1`` verify tokens (the tree's
nodes, root included).
"""
from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from typing import Any, Mapping

from workbench import DATA_DIR
from workbench.config import ModelConfig, load_config
from workbench.decode import DecodeConfig
from workbench.hardware import get_gpu, gpu_ids
from workbench.validation import check_choice

ANCHORS_DIR = DATA_DIR / "anchors"
BF16 = 2
TREE_BUILDERS = ("cpu", "gpu")


# ---------------------------------------------------------------------------
# Ranged quantities
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Range:
    """A quantity known to lie in [low, high], with a central value and where it comes from.

    ``kind`` is one of ``measured``, ``anchor``, ``assumption``, ``datasheet``.
    """

    low: float
    central: float
    high: float
    source: str
    kind: str = "assumption"
    unit: str = ""

    def __post_init__(self) -> None:
        if not (self.low <= self.central <= self.high):
            raise ValueError(f"range must satisfy low <= central <= high, got "
                             f"{self.low}, {self.central}, {self.high} ({self.source})")

    @classmethod
    def fixed(cls, value: float, source: str, kind: str = "measured", unit: str = "") -> "Range":
        return cls(value, value, value, source, kind, unit)

    @classmethod
    def from_json(cls, d: Mapping[str, Any], kind: str = "assumption", unit: str = "") -> "Range":
        if "value" in d and "low" not in d:
            v = float(d["value"])
            return cls(v, v, v, str(d.get("source", "")), kind, d.get("unit", unit))
        return cls(float(d["low"]), float(d["central"]), float(d["high"]), str(d.get("source", "")),
                   kind, d.get("unit", unit))

    @property
    def is_ranged(self) -> bool:
        return self.low != self.high


def load_assumptions() -> dict[str, Any]:
    """data/anchors/projection_assumptions.json as a dict."""
    return json.loads((ANCHORS_DIR / "projection_assumptions.json").read_text())


def load_anchors() -> dict[str, Any]:
    """data/anchors/source_b300.json (the source's anchor points and scenarios, with quotes)."""
    return json.loads((ANCHORS_DIR / "source_b300.json").read_text())


# ---------------------------------------------------------------------------
# GPUs
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """What the model needs of a GPU. Rates in bytes/s and flop/s (datasheet)."""

    id: str
    name: str
    bandwidth_bytes_per_s: float
    link_bytes_per_s: float
    matmul_flops: Range        # datasheet dense bf16, or an assumption where the datasheet row is empty
    copy_fraction: Range       # achieved copy bandwidth / datasheet bandwidth
    matmul_fraction: Range     # achieved dense bf16 / datasheet
    allreduce_latency_s: Range

    def with_bandwidth(self, bandwidth_bytes_per_s: float) -> "GpuSpec":
        """The same GPU with another datasheet bandwidth (a what-if)."""
        if not bandwidth_bytes_per_s > 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth_bytes_per_s}")
        return dataclasses.replace(self, bandwidth_bytes_per_s=float(bandwidth_bytes_per_s))


def available_gpus() -> list[str]:
    return sorted(gpu_ids())


def load_gpu(gpu: str) -> GpuSpec:
    """The :class:`GpuSpec` for a GPU id of data/hardware.json (``b300``, ``h200``, ``rtx-pro-6000``...)."""
    g = get_gpu(gpu).raw
    proj = g.get("projection") or {}
    if g.get("dense_bf16_flops"):
        mm = Range.fixed(float(g["dense_bf16_flops"]), f"data/hardware.json gpus.{gpu}.dense_bf16_flops "
                         f"({g.get('source', 'datasheet')})", kind="datasheet")
    elif "dense_bf16_flops" in proj:
        mm = Range.from_json(proj["dense_bf16_flops"])
    else:
        raise ValueError(f"GPU {gpu!r} has no dense bf16 rate in data/hardware.json (neither "
                         f"dense_bf16_flops nor projection.dense_bf16_flops)")
    for key in ("copy_fraction", "matmul_fraction", "allreduce_latency_s"):
        if key not in proj:
            raise ValueError(f"GPU {gpu!r} lacks projection.{key} in data/hardware.json")
    return GpuSpec(
        id=gpu, name=g["name"],
        bandwidth_bytes_per_s=float(g["bandwidth_bytes_per_s"]),
        link_bytes_per_s=float(g["link_bytes_per_s"]),
        matmul_flops=mm,
        copy_fraction=Range.from_json(proj["copy_fraction"]),
        matmul_fraction=Range.from_json(proj["matmul_fraction"]),
        allreduce_latency_s=Range.from_json(proj["allreduce_latency_s"]),
    )


# ---------------------------------------------------------------------------
# Byte and flop counts (from the model config)
# ---------------------------------------------------------------------------
@lru_cache(maxsize=8)
def default_model(name: str = "kimi-k2.6") -> ModelConfig:
    return load_config(name)


def expert_bytes(cfg: ModelConfig) -> int:
    """Bytes of one routed expert (gate, up, down): INT4 payload plus bf16 group scales when the
    config says the experts are INT4, bf16 otherwise."""
    params = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    q = cfg.expert_quant
    if q is None:
        return params * BF16
    return params * q.num_bits // 8 + (params // q.group_size) * BF16


def expert_payload_bytes(cfg: ModelConfig) -> int:
    """Bytes of one routed expert without the group scales (the INT4 payload only)."""
    params = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    q = cfg.expert_quant
    return params * BF16 if q is None else params * q.num_bits // 8


def expected_distinct_experts(cfg: ModelConfig, m: float) -> float:
    """Expected number of distinct routed experts touched by ``m`` tokens under uniform routing:
    E (1 - (1 - k/E)^m), E = n_routed_experts, k = num_experts_per_tok."""
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    if e == 0:
        return 0.0
    return e * (1.0 - (1.0 - k / e) ** m)


def moe_layer_bytes(cfg: ModelConfig, m: float, *, scales: bool = True) -> float:
    """Routed-expert weight bytes one MoE layer reads for ``m`` tokens (whole layer, one GPU)."""
    per = expert_bytes(cfg) if scales else expert_payload_bytes(cfg)
    return expected_distinct_experts(cfg, m) * per


def moe_layer_flops(cfg: ModelConfig, m: float) -> float:
    """Matrix flops of the routed experts of one layer for ``m`` tokens (2 per multiply-add)."""
    return 2.0 * m * cfg.num_experts_per_tok * 3 * cfg.hidden_size * cfg.moe_intermediate_size


def dense_bytes_per_gpu(cfg: ModelConfig, tp: int, *, replicated_down: bool = True) -> float:
    """bf16 weights every step reads on each GPU besides the routed experts: MLA projections
    (q_a, kv_a and the router replicated when ``replicated_down``; q_b, kv_b, o sharded), the
    dense MLP layers, the shared experts and lm_head (sharded)."""
    h, heads = cfg.hidden_size, cfg.num_attention_heads
    q_a = h * cfg.q_lora_rank if cfg.q_lora_rank else 0
    q_b = (cfg.q_lora_rank or h) * heads * cfg.qk_head_dim
    kv_a = h * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    kv_b = cfg.kv_lora_rank * heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    o = heads * cfg.v_head_dim * h
    rep = q_a + kv_a
    shard = q_b + kv_b + o
    n_moe = cfg.num_moe_layers
    n_dense = cfg.num_hidden_layers - n_moe
    router = h * cfg.n_routed_experts
    shared = cfg.n_shared_experts * 3 * h * cfg.moe_intermediate_size
    dense_mlp = 3 * h * cfg.intermediate_size
    lm_head = cfg.vocab_size * h
    per_gpu_params = cfg.num_hidden_layers * (shard / tp + (rep if replicated_down else rep / tp))
    per_gpu_params += n_moe * (shared / tp + (router if replicated_down else router / tp))
    per_gpu_params += n_dense * dense_mlp / tp + lm_head / tp
    return per_gpu_params * BF16


def drafter_bytes_per_gpu(cfg: ModelConfig, layers: float, tp: int) -> float:
    """bf16 bytes of a DFlash-style drafter per GPU: ``layers`` dense layers at the target's
    hidden size (attention 4 h^2, MLP 3 h x intermediate_size) plus its reading of the shared
    lm_head, all sharded over ``tp``."""
    h = cfg.hidden_size
    layer = 4 * h * h + 3 * h * cfg.intermediate_size
    return (layers * layer + cfg.vocab_size * h) * BF16 / tp


def attention_layer_costs(cfg: ModelConfig, context: int, m: int, tp: int) -> tuple[float, float]:
    """(bytes, flops) of tree-verify MLA attention for one layer on one GPU: every rank reads
    the whole latent KV (it is replicated, not head-sharded) for its heads/tp heads; flops
    = 2 m (heads/tp) (context + m) (kv_lora + rope + kv_lora)."""
    rows = context + m
    nbytes = rows * cfg.kv_row_width * BF16
    heads = cfg.num_attention_heads / tp
    flops = 2.0 * m * heads * rows * (cfg.kv_row_width + cfg.kv_lora_rank)
    return nbytes, flops


# ---------------------------------------------------------------------------
# The terms
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Term:
    """Documentation of one term of the step: formula, source, scaling rule."""

    name: str
    formula: str
    source: str
    scaling: str


TERMS: tuple[Term, ...] = (
    Term("moe",
         "moe_layers x max(E(M) x expert_bytes / tp / (BW x copy_fraction x moe_fraction(M)), "
         "moe_flops(M) / tp / (MM x matmul_fraction)); E(M) = E (1 - (1 - k/E)^M)",
         "moe_fraction(M): data/measurements/h200/moe_bandwidth.json (% of the copy bandwidth measured "
         "in the same run) when present, else the source's PRO 6000 anchors 1.18 ms/layer at M=9 and "
         "3.171 ms/layer at M=32 (data/anchors/source_b300.json); bytes from the model config",
         "bandwidth-bound: by the bandwidth ratio (BW x copy_fraction); compute-bound: by the matrix rate"),
    Term("dense",
         "dense_bytes_per_gpu / (BW x copy_fraction x dense_fraction) (or flops / matrix rate if larger)",
         "bytes from the model config; dense_fraction: assumption "
         "(data/anchors/projection_assumptions.json)",
         "by the bandwidth ratio"),
    Term("attention",
         "layers x (fixed + max(KV bytes / (BW x copy_fraction), flops / (MM x matmul_fraction)) / efficiency)",
         "fixed and efficiency: fitted to data/measurements/h200/ddtree_kernels.json or ddtree_verify.json "
         "(verify time vs its floor over prefix lengths, at heads/tp heads) when present, else assumptions; KV bytes = (context + M) x 576 x 2 per layer, replicated per rank",
         "floor part: by the bandwidth ratio or the matrix rate, whichever bounds it; fixed part: unchanged"),
    Term("allreduce",
         "2 x layers x (latency + 2 (tp-1)/tp x M x hidden x 2 / link_bandwidth)",
         "latency: assumption per interconnect (data/hardware.json gpus.<id>.projection); link bandwidth: "
         "datasheet",
         "by link bandwidth and latency"),
    Term("draft",
         "max(drafter_bytes_per_gpu / (BW x copy_fraction x dense_fraction), "
         "2 x block x drafter_params / tp / (MM x matmul_fraction))",
         "drafter size: assumption (data/anchors/projection_assumptions.json)",
         "by the bandwidth ratio (the matrix rate when compute-bound)"),
    Term("tree_build",
         "cpu: budget x us_per_node; gpu: the measured/assumed kernel time",
         "cpu: assumption consistent with the source's 6-21 ms at batch 64; gpu: "
         "data/measurements/h200/ddtree_kernels.json when present, else assumption",
         "host (cpu): unchanged; gpu kernel: unchanged (latency-bound)"),
    Term("overhead",
         "source-anchor (default): host overhead (Python dispatch, launches, sampling, accept/commit, syncs) = "
         "anchor step - sum of the other terms at the anchor (its MoE term with the source's Marlin curve, "
         "which the anchor ran); measured: the H200 engine step's wall - floor = host gaps (wall - GPU busy) "
         "+ kernels below their floors (GPU busy - floor), with MoE, dense and attention then at their floors",
         "source-anchor: the B300 anchor 303 tok/s at block 8, accepted ~4.4 (data/anchors/source_b300.json); "
         "measured: data/measurements/h200/engine_step.json, C=1 DDTree graph replay (--overhead measured); "
         "or given (--overhead MS / --overhead-ms)",
         "source-anchor: unchanged across GPUs; measured: host gaps unchanged, kernels-below-floor part x "
         "(projected floor / H200 floor) ** exponent (central 1, range 0..1)"),
)
TERM_NAMES = tuple(t.name for t in TERMS)


@dataclasses.dataclass(frozen=True)
class StepShape:
    """What one step processes. ``budget`` counts non-root tree nodes; M = budget + 1."""

    block: int
    budget: int
    context: int = 1024
    tp: int = 8
    tree_builder: str = "cpu"

    def __post_init__(self) -> None:
        # the rules every entry point shares: block and budget as DecodeConfig bounds them (the GPU tree
        # builder's limits), tp and context as the model allows (ModelConfig.check_tp / check_context)
        DecodeConfig(block=self.block, budget=self.budget)
        cfg = default_model()
        cfg.check_tp(self.tp)
        cfg.check_context(self.context)
        check_choice("tree_builder", self.tree_builder, TREE_BUILDERS)

    @property
    def m(self) -> int:
        return self.budget + 1


FLOOR_TERMS = ("moe", "dense", "attention")  # the device terms the engine step's floor counts


def step_terms(shape: StepShape, gpu: GpuSpec, params: Mapping[str, float], calib: Any,
               cfg: ModelConfig | None = None, overhead_ms: float = 0.0, *, at_floor: bool = False
               ) -> dict[str, float]:
    """Milliseconds per term for one step on ``gpu`` (one GPU of ``shape.tp``).

    ``params`` holds one value for every ranged quantity (keys of
    :func:`workbench.projection.project.param_ranges`); ``calib`` is a
    :class:`workbench.projection.calibration.Calibration` (MoE fraction curve,
    attention fraction, GPU tree-build time). ``overhead_ms`` is the host term.
    ``at_floor``: the terms of :data:`FLOOR_TERMS` at their floors (bytes over the achieved copy
    bandwidth, or FLOPs over the achieved matrix rate, whichever is larger; no kernel fraction, no
    fixed per-call time), as the engine step's measured floor counts them.
    """
    cfg = cfg or default_model()
    tp, m = shape.tp, shape.m
    bw = gpu.bandwidth_bytes_per_s * params[f"copy_fraction:{gpu.id}"]
    mm = params[f"matmul_flops:{gpu.id}"] * params[f"matmul_fraction:{gpu.id}"]
    dense_frac = params["dense_fraction_of_copy"]

    moe_frac = 1.0 if at_floor else calib.moe_fraction(m, params)
    t_moe_layer = max(moe_layer_bytes(cfg, m) / tp / (bw * moe_frac), moe_layer_flops(cfg, m) / tp / mm)
    moe = cfg.num_moe_layers * t_moe_layer

    dbytes = dense_bytes_per_gpu(cfg, tp)
    dense = max(dbytes / (bw * (1.0 if at_floor else dense_frac)), 2.0 * m * dbytes / BF16 / mm)

    abytes, aflops = attention_layer_costs(cfg, shape.context, m, tp)
    attn_floor_ms = max(abytes / bw, aflops / mm) * 1e3
    attention = cfg.num_hidden_layers * (attn_floor_ms if at_floor else calib.attention_layer_ms(attn_floor_ms, params)) * 1e-3

    if tp > 1:
        msg = m * cfg.hidden_size * BF16
        per = params[f"allreduce_latency_s:{gpu.id}"] + 2.0 * (tp - 1) / tp * msg / gpu.link_bytes_per_s
        allreduce = 2 * cfg.num_hidden_layers * per
    else:
        allreduce = 0.0

    layers = params["drafter_layers"]
    drb = drafter_bytes_per_gpu(cfg, layers, tp)
    draft = max(drb / (bw * dense_frac), 2.0 * shape.block * drb / BF16 / mm)

    if shape.tree_builder == "cpu":
        tree = shape.budget * params["cpu_tree_us_per_node"] * 1e-6
    else:
        tree = calib.gpu_tree_build_ms(params, shape.budget) * 1e-3

    out = {"moe": moe, "dense": dense, "attention": attention, "allreduce": allreduce,
           "draft": draft, "tree_build": tree}
    out = {k: v * 1e3 for k, v in out.items()}
    out["overhead"] = float(overhead_ms)
    return out


def tokens_per_s(accept: float, step_ms: float) -> float:
    """Accepted tokens per step over the step time (concurrency 1)."""
    if step_ms <= 0:
        raise ValueError(f"step time must be > 0 ms, got {step_ms}")
    return accept / step_ms * 1e3
