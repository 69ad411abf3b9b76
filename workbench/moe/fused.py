"""Fused INT4 (W4A16) routed-expert MoE: :func:`fused_moe_int4`, and :func:`moe_plan`, what it runs.

Which kernel runs is data and the experts' layout (:attr:`Int4Experts.layout`, one per expert set):
:func:`workbench.dispatch.dispatch_for` (``data/dispatch/<gpu>.json``) names a small-M kernel for M tokens of
``topk`` experts each (``moe_small``, while M * topk <= 128) and otherwise the four-launch path's variant, by M:
``moe_large_frag`` for experts in the fragment layout, ``moe_large`` for packed ones. All live in
``workbench/kernels/moe_int4.cu``:

- small-M (:data:`SMALL_KERNELS`, fragment layout only): two launches, gate/up with SiLU(gate) * up into h, then
  down with the sum over k, the second under programmatic dependent launch.
- four launches: ``moe_align`` groups the (token, k) pairs by expert on the GPU (no host synchronisation),
  gate/up (SiLU fused), down, ``moe_combine`` (a fixed-order sum over k). Each touched expert is streamed once for
  every chunk of up to 8 NT of its tokens. Fragment layout: :data:`FRAG_VARIANTS` (``frag_nt<NT>``, the small-M
  kernels' inner loop over align's items); packed layout: :data:`LARGE_VARIANTS`.

A test or benchmark that needs a particular kernel passes ``kernel=``; nothing here is mutable. A kernel that
fails to build or launch raises :class:`MoEKernelError` naming it; the torch reference runs only when asked for
(``impl="torch"``) or on CPU tensors.
"""
from __future__ import annotations

import functools
from types import MappingProxyType
from typing import Any

import torch

from workbench.dispatch import MOE_SMALL_MAX_PAIRS as SMALL_MAX_PAIRS
from workbench.dispatch import Dispatch, dispatch_for_device
from workbench.kernels import KernelUnavailable, cuda_errors, gpu_available, launch, launch_dependent, load_module
from workbench.moe.packing import LAYOUTS, Int4Experts, default_layout
from workbench.moe.reference import check_ids_range, check_moe_inputs, moe_reference

FAMILY = "moe_int4"
MAX_EXPERTS = 1024
MAX_TOKENS = 65535          # grid.y of the four-launch kernels
THREADS = 128
FOUR_LAUNCH = "four_launch"
IMPLS = ("auto", "cuda", "torch")

# small-M kernel -> (gate/up kernel, down kernel, gate/up tasks per CTA: 4 = one whole-K task per warp,
# 1 = the K-split form, whose four warps share a task)
SMALL_KERNELS = MappingProxyType({
    "phased_r2_pdl": ("moe_small_phased_gu_r2p", "moe_small_phased_dn_r2p", 4),
    "phased_r3_pdl_k4": ("moe_small_phased_gu_r3p_k4", "moe_small_phased_dn_r3p_k4", 1),
    "phased_r3_pdl_gu2": ("moe_small_phased_gu_r3p_gu2", "moe_small_phased_dn_r3p_gu2", 4),
})

Variant = tuple[int, int, int, int, int]
# Compiled four-launch variants (NT, RT, D, S, LINE): NT token tiles of 8 per work item, RT row tiles of 16 per
# warp, D weight steps prefetched in registers (S = 0) or an S-stage ring of whole 128-byte lines (LINE = 1, K a
# multiple of 1024; otherwise (NT, 2, 2, 0, 0) runs instead, see :func:`large_variant`).
LARGE_VARIANTS: tuple[Variant, ...] = ((1, 2, 2, 0, 0), (2, 2, 2, 0, 0), (4, 2, 2, 0, 0), (1, 2, 0, 2, 1))
# Four-launch variants on the fragment layout, by name: NT token tiles of 8 per work item.
FRAG_VARIANTS = MappingProxyType({"frag_nt1": 1, "frag_nt4": 4})


class MoEKernelError(RuntimeError):
    """A MoE kernel failed to build or launch; the message names it."""


def variant_name(var: Variant) -> str:
    """Kernel-name suffix of a four-launch variant: ``nt1_rt2_d2`` or ``nt1_rt2_l2``."""
    nt, rt, d, s, line = var
    return f"nt{nt}_rt{rt}_" + (f"l{s}" if line else f"s{s}" if s else f"d{d}")


def large_variant(var: Variant, hidden: int, intermediate: int) -> Variant:
    """The variant that runs for ``var`` at these shapes: a whole-line variant needs H and I multiples of 1024
    (an even number of K steps per warp); otherwise its register-prefetch form (NT, 2, 2, 0, 0) runs."""
    var = tuple(int(x) for x in var)
    if var not in LARGE_VARIANTS:
        raise ValueError(f"four-launch variant must be one of {LARGE_VARIANTS}, got {var}")
    if var[4] and (hidden % 1024 or intermediate % 1024):
        return (var[0], 2, 2, 0, 0)
    return var


def kernel_names() -> tuple[str, ...]:
    """Every value ``kernel=`` takes by name (the small-M kernels, the fragment four-launch variants and
    ``"four_launch"``)."""
    return (*SMALL_KERNELS, *FRAG_VARIANTS, FOUR_LAUNCH)


def moe_plan(m: int, topk: int, device: torch.device | str = "cuda", *, hidden: int = 7168,
             intermediate: int = 2048, kernel: str | Variant | None = None, impl: str = "auto",
             dispatch: Dispatch | None = None, layout: str | None = None) -> dict[str, Any]:
    """What :func:`fused_moe_int4` runs for M tokens of ``topk`` experts on ``device`` (no launch).

    Returns ``{"impl": "cuda" | "torch", "path": "small" | "four_launch" | "reference", "kernel": name,
    "launches": [kernel function names in launch order], "variant": (NT, RT, D, S, LINE) or None, "nt": a four-launch
    path's token tiles of 8 per work item (absent elsewhere), "layout":
    the experts' layout, "dispatch": the dispatch table's gpu, "generic": whether it was the generic table,
    "forced": bool}``. ``kernel`` / ``impl`` as :func:`fused_moe_int4`'s; raises ValueError for a kernel that cannot
    run there or cannot read ``layout`` (the experts' :attr:`Int4Experts.layout`; None: the layout experts of these
    shapes get on ``device``, :func:`workbench.moe.packing.default_layout`). ``dispatch``: the table to read
    (default: the device's, :func:`workbench.dispatch.dispatch_for`).
    """
    if m < 0 or topk < 1:
        raise ValueError(f"need M >= 0 and topk >= 1, got M={m}, topk={topk}")
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    device = torch.device(device)
    disp = dispatch if dispatch is not None else dispatch_for_device(device)
    if layout is None:
        layout = default_layout(device, hidden, intermediate, disp)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    base = {"dispatch": disp.gpu, "generic": disp.generic, "forced": kernel is not None, "layout": layout}
    if impl == "torch" or (impl == "auto" and device.type != "cuda"):
        if kernel is not None:
            raise ValueError(f"kernel={kernel!r} names a CUDA kernel; the torch reference takes none")
        return {**base, "impl": "torch", "path": "reference", "kernel": "moe_reference", "launches": [],
                "variant": None}
    if device.type != "cuda":
        raise ValueError(f"impl='cuda' needs CUDA tensors, got device {device}")
    frag = layout == "fragments"
    if kernel is None and frag:
        kernel = disp.moe_small_kernel(m, topk)
    if kernel is None or (isinstance(kernel, str) and kernel == FOUR_LAUNCH):
        kernel = f"frag_nt{disp.moe_large_frag_nt(m)}" if frag else disp.moe_large_variant(m)
    if isinstance(kernel, str):
        if kernel not in SMALL_KERNELS and kernel not in FRAG_VARIANTS:
            raise ValueError(f"unknown MoE kernel {kernel!r}; kernel= takes one of {list(kernel_names())} "
                             f"or a four-launch variant in {list(LARGE_VARIANTS)}")
        if not frag:
            raise ValueError(f"MoE kernel {kernel!r} reads the fragment layout; these experts hold the {layout} "
                             "layout (Int4Experts(..., layout='fragments'))")
        if kernel in FRAG_VARIANTS:
            return {**base, "impl": "cuda", "path": FOUR_LAUNCH, "kernel": f"{FOUR_LAUNCH}:{kernel}",
                    "launches": ["moe_align", f"moe_gate_up_{kernel}", f"moe_down_{kernel}", "moe_combine"],
                    "variant": None, "nt": FRAG_VARIANTS[kernel]}
        if m * topk > SMALL_MAX_PAIRS:
            raise ValueError(f"small-M kernel {kernel!r} takes at most {SMALL_MAX_PAIRS} (token, expert) pairs, "
                             f"got M * topk = {m * topk}")
        gu, dn, _ = SMALL_KERNELS[kernel]
        return {**base, "impl": "cuda", "path": "small", "kernel": kernel, "launches": [gu, dn], "variant": None}
    var = large_variant(kernel, hidden, intermediate)
    if frag:
        raise ValueError(f"four-launch variant {tuple(kernel)} reads the packed layout; these experts hold the "
                         f"fragment layout (their variants: {list(FRAG_VARIANTS)})")
    name = variant_name(var)
    return {**base, "impl": "cuda", "path": FOUR_LAUNCH, "kernel": f"{FOUR_LAUNCH}:{name}",
            "launches": ["moe_align", f"moe_gate_up_{name}", f"moe_down_{name}", "moe_combine"], "variant": var,
            "nt": var[0]}


def gpu_supported(experts: Int4Experts) -> str | None:
    """None when the CUDA kernels handle these shapes, else the reason they do not."""
    if experts.hidden % 512 or experts.intermediate % 512:
        return f"hidden {experts.hidden} and intermediate {experts.intermediate} must be multiples of 512"
    if experts.num_experts > MAX_EXPERTS:
        return f"at most {MAX_EXPERTS} experts, got {experts.num_experts}"
    return None


def max_work_items(pairs: int, num_experts: int, chunk: int) -> int:
    """Upper bound on sum_e ceil(c_e / chunk) over experts, given sum_e c_e = pairs."""
    active = min(num_experts, pairs)
    return max(1, (pairs + active * (chunk - 1)) // chunk)


def fused_moe_int4(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                   experts: Int4Experts, *, validate: bool = True, kernel: str | Variant | None = None,
                   impl: str = "auto") -> torch.Tensor:
    """Routed-expert MoE output, bf16 [M, H].

    hidden bf16 [M, H]; topk_ids int32/int64 [M, k] in [0, E); topk_weights float [M, k] (multiplies each
    expert's output; apply routed_scaling_factor before or after, as the model does). ``experts``: an
    :class:`Int4Experts` on hidden's device. ``validate`` checks the id range on the host (one synchronisation
    on a GPU); without it an out-of-range id makes its token's output row NaN on the GPU path.

    ``impl``: ``"auto"`` (CUDA kernels on CUDA tensors, the reference on CPU tensors), ``"cuda"`` or
    ``"torch"`` (:func:`workbench.moe.reference.moe_reference`, rounded to bf16). ``kernel``: None (the
    dispatch's choice for the experts' layout, :func:`moe_plan`), a small-M kernel name (:data:`SMALL_KERNELS`)
    or a fragment four-launch variant (:data:`FRAG_VARIANTS`) for experts in the fragment layout, ``"four_launch"``
    (the dispatch's variant for M and the layout) or a variant in :data:`LARGE_VARIANTS` for packed experts.
    """
    check_moe_inputs(hidden, topk_ids, topk_weights, experts)
    if hidden.dtype != torch.bfloat16:
        raise ValueError(f"hidden must be bf16, got {hidden.dtype}")
    if experts.device != hidden.device:
        raise ValueError(f"experts are on {experts.device}, hidden on {hidden.device}")
    m, k = topk_ids.shape
    plan = moe_plan(m, k, hidden.device, hidden=experts.hidden, intermediate=experts.intermediate,
                    kernel=kernel, impl=impl, layout=experts.layout)
    if plan["impl"] == "torch":
        return moe_reference(hidden, topk_ids, topk_weights, experts).to(torch.bfloat16)
    if not gpu_available():
        raise KernelUnavailable(f"MoE kernel {plan['kernel']} needs CuPy and a CUDA GPU; pass impl='torch' "
                                "for the reference")
    why = gpu_supported(experts)
    if why is not None:
        raise ValueError(f"fused_moe_int4 on the GPU: {why}")
    if m > MAX_TOKENS:
        raise ValueError(f"at most {MAX_TOKENS} tokens per call on the GPU, got {m}")
    if validate:
        check_ids_range(topk_ids, experts.num_experts)
    out = torch.empty(m, experts.hidden, dtype=torch.bfloat16, device=hidden.device)
    if m == 0:
        return out
    hidden = hidden.contiguous()
    if hidden.data_ptr() % 16:
        hidden = hidden.clone()
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()
    wts = topk_weights.reshape(-1).to(torch.float32).contiguous()
    try:
        if plan["path"] == "small":
            _run_small(plan["kernel"], hidden, ids, wts, m, k, experts, out)
        else:
            _run_four_launch(plan, hidden, ids, wts, m, k, experts, out)
    except (ValueError, KernelUnavailable):
        raise
    except cuda_errors() as e:  # re-raised with the kernel's name
        raise MoEKernelError(f"MoE kernel {plan['kernel']} ({', '.join(plan['launches'])}) failed: {e}") from e
    return out


def _kernel(name: str) -> Any:
    return load_module(FAMILY).get_function(name)


@functools.cache
def resident_ctas(device_index: int, name: str) -> int:
    """CTAs of kernel ``name`` (128 threads) that fit on device ``device_index`` at once (occupancy x SMs; where the
    driver's occupancy call is missing, from the kernel's registers: 64K per SM, allocated per warp in 256s)."""
    kern = _kernel(name)
    try:
        from cupy.cuda import driver

        fptr = getattr(kern, "ptr", None) or kern.kernel.ptr
        per_sm = int(driver.occupancyMaxActiveBlocksPerMultiprocessor(fptr, THREADS, 0))
    except (ImportError, AttributeError):
        per_warp = ((int(kern.num_regs) * 32 + 255) // 256) * 256
        per_sm = min(65536 // (per_warp * (THREADS // 32)), 2048 // THREADS)
    if per_sm < 1:
        raise MoEKernelError(f"MoE kernel {name}: no CTA of {THREADS} threads fits on an SM")
    return per_sm * torch.cuda.get_device_properties(device_index).multi_processor_count


def small_grids(pairs: int, num_experts: int, hidden: int, intermediate: int, resident_gu: int,
                resident_dn: int, tasks_per_cta: int = THREADS // 32) -> tuple[int, int]:
    """(gate/up CTAs, down CTAs) of a small-M kernel pair: enough CTAs for the gate/up tasks at the most work items
    ``pairs`` can make (:func:`max_work_items`, chunks of 8) x I/8 tiles, ``tasks_per_cta`` at a time, and one CTA
    per 16-row tile of the output, each capped at the CTAs resident at once (both kernels stride over the rest)."""
    if min(pairs, num_experts, hidden, intermediate, resident_gu, resident_dn, tasks_per_cta) < 1:
        raise ValueError(f"need positive pairs, experts, shapes, resident CTAs and tasks per CTA, got {pairs}, "
                         f"{num_experts}, {hidden}, {intermediate}, {resident_gu}, {resident_dn}, {tasks_per_cta}")
    tasks = max_work_items(pairs, num_experts, 8) * (intermediate // 8)
    return (min(resident_gu, -(-tasks // tasks_per_cta)), min(resident_dn, hidden // 16))


def _run_small(kernel: str, hidden: torch.Tensor, ids: torch.Tensor, wts: torch.Tensor, m: int, k: int,
               experts: Int4Experts, out: torch.Tensor) -> None:
    """The small-M pair ``kernel`` on the current stream: gate/up writes h bf16 [M k, I], down (PDL) sums into out."""
    gu_name, dn_name, per_cta = SMALL_KERNELS[kernel]
    e, h, i = experts.num_experts, experts.hidden, experts.intermediate
    gu_frag, dn_frag = experts.fragments()
    dev = hidden.device
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    grid_gu, grid_dn = small_grids(m * k, e, h, i, resident_ctas(idx, gu_name), resident_ctas(idx, dn_name),
                                   per_cta)
    hbuf = torch.empty(m * k, i, dtype=torch.bfloat16, device=dev)
    launch(_kernel(gu_name), (grid_gu,), (THREADS,), (gu_frag, hidden, ids, m, k, e, h, i, hbuf, out))
    launch_dependent(_kernel(dn_name), grid_dn, THREADS, (dn_frag, hbuf, ids, wts, m, k, e, h, i, out))


def _run_four_launch(plan: dict[str, Any], hidden: torch.Tensor, ids: torch.Tensor, wts: torch.Tensor, m: int,
                     k: int, experts: Int4Experts, out: torch.Tensor) -> None:
    """align, gate/up, down and combine of the plan's four-launch variant on the current stream: a packed variant
    (``plan["variant"]``) or a fragment one (``plan["launches"]`` names it; grid: tiles / 4 x items)."""
    h, i, e = experts.hidden, experts.intermediate, experts.num_experts
    dev = hidden.device
    _, gu_name, dn_name, _ = plan["launches"]
    var = plan["variant"]
    p, chunk = m * k, 8 * plan["nt"]
    nitems = max_work_items(p, e, chunk)
    sorted_pair = torch.empty(p, dtype=torch.int32, device=dev)
    items = torch.empty(nitems, 3, dtype=torch.int32, device=dev)
    num_items = torch.empty(1, dtype=torch.int32, device=dev)
    hbuf = torch.empty(p, i, dtype=torch.bfloat16, device=dev)
    ybuf = torch.empty(p, h, dtype=torch.float32, device=dev)
    launch(_kernel("moe_align"), (1,), (1024,), (ids, p, e, chunk, sorted_pair, items, num_items, nitems))
    if var is None:
        gu_frag, dn_frag = experts.fragments()
        warps = THREADS // 32   # one 16-row tile per warp
        launch(_kernel(gu_name), (-(-(i // 8) // warps), nitems), (THREADS,),
               (gu_frag, hidden, sorted_pair, items, num_items, k, h, i, hbuf))
        launch(_kernel(dn_name), (-(-(h // 16) // warps), nitems), (THREADS,),
               (dn_frag, hbuf, sorted_pair, items, num_items, wts, k, h, i, ybuf))
    else:
        rt = var[1]
        gu_packed, gu_scale, dn_packed, dn_scale = experts.packed()
        launch(_kernel(gu_name), (i // 8 // rt, nitems), (THREADS,),
               (gu_packed, gu_scale, hidden, sorted_pair, items, num_items, k, h, i, hbuf))
        launch(_kernel(dn_name), (h // 16 // rt, nitems), (THREADS,),
               (dn_packed, dn_scale, hbuf, sorted_pair, items, num_items, wts, k, h, i, ybuf))
    launch(_kernel("moe_combine"), ((h // 4 + 255) // 256, m), (256,), (ybuf, ids, k, e, h, out))
