"""Routed-expert weights in the layouts the fused INT4 MoE kernels read.

The per-matrix format is compressed-tensors ``pack-quantized`` exactly as
stored on disk (see :mod:`workbench.int4`): int32 words ``[out, in // 8]``
holding eight ``q + 8`` nibbles along the input dimension, bf16 scales
``[out, in // 32]``, symmetric, group size 32. The four-launch kernels
(any M) and the torch reference read it, stacked:

- ``gate_up_packed`` int32 ``[E, 2 * I, H // 8]``: rows ``0..I-1`` are
  ``experts.{e}.gate_proj``, rows ``I..2I-1`` are ``experts.{e}.up_proj``;
  ``gate_up_scale`` bf16 ``[E, 2 * I, H // 32]`` likewise.
- ``down_packed`` int32 ``[E, H, I // 8]`` (``experts.{e}.down_proj``),
  ``down_scale`` bf16 ``[E, H, I // 32]``.

(H = hidden size, 7168 for Kimi K2.6; I = moe_intermediate_size, 2048.)

The small-M kernels (at most 128 (token, expert) pairs per call) and the
fragment four-launch variants (any M) read the *fragment layout*
(:func:`fragment_pack`, stage-major :func:`fragment_stages`): per matrix int32
``[K/256, R/16, 4, 144]``, for each tile of 16 rows and 64-wide K step a
576-byte block holding the nibbles in mma.m16n8k16 A-fragment order (word
``4 * lane + kc``) and the tile's bf16 scales of those two groups (16 words);
the four blocks of one tile and 256-wide K stage are one contiguous 2304-byte
stretch. It holds the same bytes as the packed form.

:class:`Int4Experts` holds ONE of the two layouts (:attr:`Int4Experts.layout`):
the fragment layout where the dispatch runs a small-M kernel
(:func:`default_layout`; the compressed-tensors tensors are converted as they
are read and not kept), the packed layout elsewhere. The fused MoE picks its
kernel family from the layout it is given (:func:`workbench.moe.fused.moe_plan`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch

from workbench.dispatch import dispatch_for_device
from workbench.int4 import PACK, dequantize_int4, quantize_int4

GROUP_SIZE = 32


LAYOUTS = ("packed", "fragments")


def default_layout(device: torch.device | str, hidden: int, intermediate: int, dispatch=None) -> str:
    """The layout experts of these shapes are held in on ``device``: ``"fragments"`` on a CUDA device whose dispatch
    (``dispatch``, default :func:`workbench.dispatch.dispatch_for_device`) names a small-M kernel, with H and I
    multiples of 512 (the small-M kernels and the fragment four-launch variants both read it), else ``"packed"``."""
    device = torch.device(device)
    if device.type != "cuda" or hidden % 512 or intermediate % 512:
        return "packed"
    if dispatch is None:
        dispatch = dispatch_for_device(device)
    return "fragments" if dispatch.moe_small else "packed"


@dataclass(frozen=True, eq=False)
class Int4Experts:
    """Stacked INT4 routed experts, held in ONE layout (module docstring), immutable.

    ``Int4Experts(gate_up_packed, gate_up_scale, down_packed, down_scale)`` takes the compressed-tensors tensors
    (all on one device). ``layout``: ``"packed"`` keeps them; ``"fragments"`` converts them, one expert at a time,
    to the fragment layout (:attr:`gate_up_frag` / :attr:`down_frag`) and keeps only that (the packed fields are then
    None); None (the default) takes :func:`default_layout`. :meth:`from_fragments` wraps fragment tensors made
    earlier (the engine's storage) without a copy.
    """

    gate_up_packed: torch.Tensor | None  # int32 [E, 2I, H/8]    (layout "packed")
    gate_up_scale: torch.Tensor | None   # bf16  [E, 2I, H/32]
    down_packed: torch.Tensor | None     # int32 [E, H, I/8]
    down_scale: torch.Tensor | None      # bf16  [E, H, I/32]
    group_size: int = GROUP_SIZE
    layout: str | None = None
    gate_up_frag: torch.Tensor | None = field(default=None, repr=False)  # int32 [E, H/256, 2I/16, 4, 144] ("fragments")
    down_frag: torch.Tensor | None = field(default=None, repr=False)     # int32 [E, I/256, H/16, 4, 144]

    def __post_init__(self) -> None:
        if self.group_size != GROUP_SIZE:
            raise ValueError(f"only group_size {GROUP_SIZE} is supported, got {self.group_size}")
        if self.layout is not None and self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS} or None, got {self.layout!r}")
        if self.gate_up_frag is not None or self.down_frag is not None:
            self._init_from_fragments()
            return
        gu, gus, dn, dns = self.gate_up_packed, self.gate_up_scale, self.down_packed, self.down_scale
        for name, t, dt in (("gate_up_packed", gu, torch.int32), ("down_packed", dn, torch.int32),
                            ("gate_up_scale", gus, torch.bfloat16), ("down_scale", dns, torch.bfloat16)):
            if not isinstance(t, torch.Tensor) or t.dim() != 3:
                raise ValueError(f"{name} must be a 3-D tensor [E, out, ...], got "
                                 f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
            if t.dtype != dt:
                raise ValueError(f"{name} must be {dt}, got {t.dtype}")
        e, two_i, h8 = gu.shape
        if two_i % 2:
            raise ValueError(f"gate_up_packed has {two_i} rows; expected 2 * intermediate")
        i, h = two_i // 2, h8 * PACK
        want = {"gate_up_scale": (e, 2 * i, h // GROUP_SIZE), "down_packed": (e, h, i // PACK),
                "down_scale": (e, h, i // GROUP_SIZE)}
        for name, t in (("gate_up_scale", gus), ("down_packed", dn), ("down_scale", dns)):
            if tuple(t.shape) != want[name]:
                raise ValueError(f"{name} has shape {tuple(t.shape)}; with gate_up_packed {tuple(gu.shape)} "
                                 f"it must be {want[name]}")
        if h % GROUP_SIZE or i % GROUP_SIZE:
            raise ValueError(f"hidden {h} and intermediate {i} must be multiples of {GROUP_SIZE}")
        devs = {t.device for t in (gu, gus, dn, dns)}
        if len(devs) != 1:
            raise ValueError(f"expert tensors are on different devices: {devs}")
        layout = self.layout or default_layout(gu.device, h, i)
        object.__setattr__(self, "layout", layout)
        object.__setattr__(self, "_dims", (e, h, i))
        if layout == "packed":
            return
        check_fragment_shapes(h, i)
        object.__setattr__(self, "gate_up_frag", torch.stack(
            [fragment_stages(fragment_pack(gu[x], gus[x], gate_up=True)) for x in range(e)]).contiguous())
        object.__setattr__(self, "down_frag", torch.stack(
            [fragment_stages(fragment_pack(dn[x], dns[x])) for x in range(e)]).contiguous())
        for name in ("gate_up_packed", "gate_up_scale", "down_packed", "down_scale"):
            object.__setattr__(self, name, None)   # converted as read, not kept

    def _init_from_fragments(self) -> None:
        gu, dn = self.gate_up_frag, self.down_frag
        if any(t is not None for t in (self.gate_up_packed, self.gate_up_scale, self.down_packed, self.down_scale)):
            raise ValueError("give either the packed tensors or the fragments, not both")
        if self.layout not in (None, "fragments"):
            raise ValueError(f"fragment tensors make layout 'fragments', got layout={self.layout!r}")
        for name, t in (("gate_up_frag", gu), ("down_frag", dn)):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 5 \
                    or tuple(t.shape[3:]) != (FRAG_STAGE, FRAG_WORDS):
                raise ValueError(f"{name} must be int32 [E, K/256, R/16, {FRAG_STAGE}, {FRAG_WORDS}], got "
                                 f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
        e, h = gu.shape[0], gu.shape[1] * FRAG_STAGE * FRAG_K
        i = gu.shape[2] * FRAG_ROWS // 2
        want = (e, i // (FRAG_STAGE * FRAG_K), h // FRAG_ROWS, FRAG_STAGE, FRAG_WORDS)
        if tuple(dn.shape) != want:
            raise ValueError(f"down_frag has shape {tuple(dn.shape)}; with gate_up_frag {tuple(gu.shape)} "
                             f"it must be {want}")
        if gu.device != dn.device:
            raise ValueError(f"expert tensors are on different devices: {gu.device}, {dn.device}")
        object.__setattr__(self, "layout", "fragments")
        object.__setattr__(self, "_dims", (e, h, i))

    @classmethod
    def from_fragments(cls, gate_up_frag: torch.Tensor, down_frag: torch.Tensor) -> "Int4Experts":
        """Experts over fragment tensors made earlier (no copy): int32 [E, H/256, 2I/16, 4, 144] and
        [E, I/256, H/16, 4, 144]."""
        return cls(None, None, None, None, layout="fragments", gate_up_frag=gate_up_frag, down_frag=down_frag)

    @property
    def num_experts(self) -> int:
        return self._dims[0]

    @property
    def hidden(self) -> int:
        return self._dims[1]

    @property
    def intermediate(self) -> int:
        return self._dims[2]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The tensors held: the four packed ones, or the two fragment ones."""
        if self.layout == "packed":
            return self.gate_up_packed, self.gate_up_scale, self.down_packed, self.down_scale
        return self.gate_up_frag, self.down_frag

    @property
    def device(self) -> torch.device:
        return self.tensors()[0].device

    @property
    def nbytes(self) -> int:
        """Bytes of the expert tensors held, on :attr:`device` (one layout)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def to(self, device: str | torch.device) -> "Int4Experts":
        """A copy on ``device`` in the same layout."""
        if self.layout == "fragments":
            return Int4Experts.from_fragments(self.gate_up_frag.to(device), self.down_frag.to(device))
        return Int4Experts(*(t.to(device) for t in self.tensors()), self.group_size, layout="packed")

    def packed(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(gate_up_packed, gate_up_scale, down_packed, down_scale): the compressed-tensors layout. Raises when these
        experts hold the fragment layout."""
        if self.layout != "packed":
            raise ValueError(f"these experts hold the {self.layout} layout (on {self.device}); the compressed-tensors "
                             "tensors were converted when they were read. Build Int4Experts(..., layout='packed') "
                             "for the packed four-launch variants")
        return self.gate_up_packed, self.gate_up_scale, self.down_packed, self.down_scale

    def fragments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up, down) in the fragment layout, stage-major: int32 [E, H/256, 2I/16, 4, 144] and
        [E, I/256, H/16, 4, 144]; gate_up tiles interleave 8 gate rows and the same 8 up rows
        (:func:`fragment_pack`, ``gate_up=True``). Raises when these experts hold the packed layout."""
        if self.layout != "fragments":
            raise ValueError(f"these experts hold no fragment layout (layout {self.layout!r} on {self.device}); "
                             "the small-M kernels need Int4Experts(..., layout='fragments')")
        return self.gate_up_frag, self.down_frag

    def bytes_per_expert(self) -> int:
        """Packed weights + scales of one expert (what a kernel must stream for it; equal in both layouts)."""
        return self.nbytes // self.num_experts

    def dequantize(self, e: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert ``e`` as (W_gate_up [2I, H], W_down [H, I]) in ``dtype``, from whichever layout is held."""
        if not 0 <= e < self.num_experts:
            raise ValueError(f"expert {e} out of range [0, {self.num_experts})")
        if self.layout == "fragments":
            return (fragment_dequantize(fragment_unstage(self.gate_up_frag[e]), gate_up=True, dtype=dtype),
                    fragment_dequantize(fragment_unstage(self.down_frag[e]), dtype=dtype))
        gu = dequantize_int4(self.gate_up_packed[e], self.gate_up_scale[e], group_size=GROUP_SIZE, dtype=dtype)
        dn = dequantize_int4(self.down_packed[e], self.down_scale[e], group_size=GROUP_SIZE, dtype=dtype)
        return gu, dn


def stack_experts(gate: list[tuple[torch.Tensor, torch.Tensor]], up: list[tuple[torch.Tensor, torch.Tensor]],
                  down: list[tuple[torch.Tensor, torch.Tensor]]) -> Int4Experts:
    """Stack per-expert (weight_packed, weight_scale) pairs into :class:`Int4Experts`."""
    if not (len(gate) == len(up) == len(down)) or not gate:
        raise ValueError(f"need the same non-zero number of gate/up/down matrices, got "
                         f"{len(gate)}/{len(up)}/{len(down)}")
    for e, (g, u) in enumerate(zip(gate, up)):
        if g[0].shape != u[0].shape:
            raise ValueError(f"expert {e}: gate_proj {tuple(g[0].shape)} and up_proj {tuple(u[0].shape)} differ")
    gu_p = torch.stack([torch.cat([g[0], u[0]], 0) for g, u in zip(gate, up)])
    gu_s = torch.stack([torch.cat([g[1], u[1]], 0) for g, u in zip(gate, up)]).to(torch.bfloat16)
    dn_p = torch.stack([d[0] for d in down])
    dn_s = torch.stack([d[1] for d in down]).to(torch.bfloat16)
    return Int4Experts(gu_p.contiguous(), gu_s.contiguous(), dn_p.contiguous(), dn_s.contiguous())


def experts_from_state_dict(state: Mapping[str, torch.Tensor], prefix: str, num_experts: int) -> Int4Experts:
    """Build from checkpoint tensors ``{prefix}.{e}.{gate,up,down}_proj.weight_{packed,scale}``.

    ``prefix`` is e.g. ``"model.layers.3.mlp.experts"``. ``weight_shape``, when
    present, is checked against the packed tensor.
    """
    mats: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {"gate_proj": [], "up_proj": [], "down_proj": []}
    for e in range(num_experts):
        for name, lst in mats.items():
            base = f"{prefix}.{e}.{name}"
            try:
                packed, scale = state[f"{base}.weight_packed"], state[f"{base}.weight_scale"]
            except KeyError as err:
                raise ValueError(f"checkpoint lacks {err.args[0]!r} (expected compressed-tensors "
                                 "pack-quantized experts)") from None
            shape = state.get(f"{base}.weight_shape")
            if shape is not None:
                want = tuple(int(x) for x in shape.tolist())
                have = (packed.shape[0], packed.shape[1] * PACK)
                if want != have:
                    raise ValueError(f"{base}.weight_shape {want} disagrees with weight_packed, which holds {have}")
            lst.append((packed, scale))
    return stack_experts(mats["gate_proj"], mats["up_proj"], mats["down_proj"])


def quantize_experts(w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> Int4Experts:
    """Quantise float experts: w_gate, w_up [E, I, H]; w_down [E, H, I]."""
    if w_gate.dim() != 3 or w_gate.shape != w_up.shape:
        raise ValueError(f"w_gate and w_up must both be [E, I, H], got {tuple(w_gate.shape)}, {tuple(w_up.shape)}")
    e, i, h = w_gate.shape
    if tuple(w_down.shape) != (e, h, i):
        raise ValueError(f"w_down must be [E, H, I] = {(e, h, i)}, got {tuple(w_down.shape)}")
    q = [[quantize_int4(w[x], GROUP_SIZE) for x in range(e)] for w in (w_gate, w_up, w_down)]
    return stack_experts(*q)


def random_int4_experts(num_experts: int, hidden: int, intermediate: int, *, device: str | torch.device = "cpu",
                        scale: float = 0.02, seed: int = 0, layout: str | None = None) -> Int4Experts:
    """Random packed experts (uniform nibbles, positive random scales); for tests and benchmarks.

    Draws the packed words directly (no float weights), so 384 Kimi-sized
    experts take seconds on a GPU. Scales are ``scale * U(0.5, 1.5)`` in bf16. ``layout`` as :class:`Int4Experts`'s.
    """
    if min(num_experts, hidden, intermediate) < 1 or hidden % GROUP_SIZE or intermediate % GROUP_SIZE:
        raise ValueError(f"need positive sizes with hidden and intermediate multiples of {GROUP_SIZE}, "
                         f"got E={num_experts}, H={hidden}, I={intermediate}")
    gen = torch.Generator(device=device).manual_seed(seed)

    def words(*shape: int) -> torch.Tensor:
        return torch.randint(-2**31, 2**31 - 1, shape, generator=gen, device=device, dtype=torch.int32)

    def scales(*shape: int) -> torch.Tensor:
        return (scale * (0.5 + torch.rand(shape, generator=gen, device=device))).to(torch.bfloat16)

    e, h, i = num_experts, hidden, intermediate
    return Int4Experts(words(e, 2 * i, h // PACK), scales(e, 2 * i, h // GROUP_SIZE),
                       words(e, h, i // PACK), scales(e, h, i // GROUP_SIZE), layout=layout)


# ----------------------------------------------------------------------------- fragment layout

FRAG_ROWS = 16     # rows per tile (mma M)
FRAG_K = 64        # K per step (two quantisation groups, four mma k16 chunks)
FRAG_WORDS = 144   # int32 per (tile, step): 128 nibble words + 16 scale words
FRAG_STAGE = 4     # 64-wide steps per ring stage of the small-M kernels (one tile x 256 K per warp iteration)
# dims of the nibble view [tile, hi, g, s, gr, t, h, kk] (row = 16 tile + 8 hi + g,
# k = 64 s + 32 gr + 8 t + 4 h + kk) in the order the words are laid out
_FRAG_PERM = (0, 3, 2, 5, 4, 6, 1, 7)      # -> [tile, s, g, t, gr, h, hi, kk]
_FRAG_INV = (0, 6, 2, 1, 4, 3, 5, 7)
# bit position of nibble (hi, kk) in its word: nibble j = 4 (kk & 1) + 2 (kk >> 1) + hi
_FRAG_SHIFT = ((0, 16, 8, 24), (4, 20, 12, 28))


def _gate_up_order(rows: int, device) -> torch.Tensor:
    """Row order of gate_up tiles: gate rows 8j..8j+7 then up rows 8j..8j+7 (rows = 2I, gate first)."""
    i = rows // 2
    a = torch.arange(i, device=device).reshape(i // 8, 8)
    return torch.stack([a, a + i], 1).reshape(-1)


def _check_frag_dims(rows: int, k: int, gate_up: bool) -> None:
    if rows % FRAG_ROWS or k % FRAG_K or (gate_up and rows % 16):
        raise ValueError(f"fragment layout needs rows a multiple of {FRAG_ROWS} and K a multiple of {FRAG_K}, "
                         f"got rows {rows}, K {k}")


def fragment_pack(packed: torch.Tensor, scale: torch.Tensor, *, gate_up: bool = False) -> torch.Tensor:
    """Re-pack one matrix for the small-M kernels: int32 [R, K/8] + bf16 [R, K/32] -> int32 [R/16, K/64, 144].

    ``packed``/``scale`` are compressed-tensors pack-quantized (nibble j of word w
    is element 8w + j, value q + 8). Word ``4 * lane + kc`` of a (tile, step)
    block, lane = 4g + t, chunk kc = 2 gr + h, holds the nibbles of rows
    (g, g + 8) at K = 64 s + 32 gr + 8 t + 4 h + (0..3): nibble 4 (kk & 1) +
    2 (kk >> 1) + hi, so ``(word >> 4r) & 0x000F000F`` is mma A register r. Word
    ``128 + 2g + gr`` holds the scales of rows g (low half) and g + 8 (high) for
    group 2 s + gr. ``gate_up=True``: rows are [gate; up] (2I rows) and tile j
    holds gate rows 8j..8j+7 then up rows 8j..8j+7.
    """
    if packed.dtype != torch.int32 or packed.dim() != 2:
        raise ValueError(f"packed must be int32 [rows, K/8], got {packed.dtype} {tuple(packed.shape)}")
    rows, k = packed.shape[0], packed.shape[1] * PACK
    if scale.dtype != torch.bfloat16 or tuple(scale.shape) != (rows, k // GROUP_SIZE):
        raise ValueError(f"scale must be bf16 {(rows, k // GROUP_SIZE)}, got {scale.dtype} {tuple(scale.shape)}")
    _check_frag_dims(rows, k, gate_up)
    dev = packed.device
    shifts = torch.arange(0, 32, 4, device=dev, dtype=torch.int64)
    u = ((packed.to(torch.int64).unsqueeze(-1) >> shifts) & 15).reshape(rows, k)
    sc = scale
    if gate_up:
        order = _gate_up_order(rows, dev)
        u, sc = u[order], sc[order]
    nt, ns = rows // FRAG_ROWS, k // FRAG_K
    u = u.reshape(nt, 2, 8, ns, 2, 4, 2, 4).permute(*_FRAG_PERM)
    shift = torch.tensor(_FRAG_SHIFT, device=dev, dtype=torch.int64)      # [hi, kk]
    words = (u << shift).sum(dim=(-2, -1)).reshape(nt, ns, 128)
    s16 = sc.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF
    s16 = s16.reshape(nt, 2, 8, ns, 2).permute(0, 3, 2, 4, 1)           # [tile, s, g, gr, hi]
    sw = (s16[..., 0] | (s16[..., 1] << 16)).reshape(nt, ns, 16)
    out = torch.cat([words, sw], -1)
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32).contiguous()


def fragment_stages(frag: torch.Tensor) -> torch.Tensor:
    """Stage-major order of one matrix's fragment pack: int32 [R/16, K/64, 144] -> [K/256, R/16, 4, 144].

    Block (tile, 64-wide step s) goes to [s // 4, tile, s % 4]; this is the
    order the small-M kernels stream (:data:`FRAG_STAGE` steps per ring stage).
    """
    if frag.dtype != torch.int32 or frag.dim() != 3 or frag.shape[2] != FRAG_WORDS:
        raise ValueError(f"frag must be int32 [R/16, K/64, {FRAG_WORDS}], got {frag.dtype} {tuple(frag.shape)}")
    nt, ns = frag.shape[:2]
    if ns % FRAG_STAGE:
        raise ValueError(f"stage-major order needs K a multiple of {FRAG_STAGE * FRAG_K}, got K {ns * FRAG_K}")
    return frag.reshape(nt, ns // FRAG_STAGE, FRAG_STAGE, FRAG_WORDS).permute(1, 0, 2, 3).contiguous()


def fragment_unstage(frag: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`fragment_stages`: int32 [K/256, R/16, 4, 144] -> [R/16, K/64, 144]."""
    if frag.dtype != torch.int32 or frag.dim() != 4 or tuple(frag.shape[2:]) != (FRAG_STAGE, FRAG_WORDS):
        raise ValueError(f"frag must be int32 [K/256, R/16, {FRAG_STAGE}, {FRAG_WORDS}], got {frag.dtype} "
                         f"{tuple(frag.shape)}")
    ns, nt = frag.shape[:2]
    return frag.permute(1, 0, 2, 3).reshape(nt, ns * FRAG_STAGE, FRAG_WORDS)


def check_fragment_shapes(hidden: int, intermediate: int) -> None:
    """Raise unless experts of these shapes can be held in the fragment layout (H and I multiples of 256)."""
    step = FRAG_STAGE * FRAG_K
    if hidden % step or intermediate % step:
        raise ValueError(f"the fragment layout needs H and I multiples of {step}, got H {hidden}, I {intermediate}")


def fragment_dequantize(frag: torch.Tensor, *, gate_up: bool = False,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse view of :func:`fragment_pack`: int32 [R/16, K/64, 144] -> ``dtype`` [R, K] in the source row order."""
    if frag.dtype != torch.int32 or frag.dim() != 3 or frag.shape[2] != FRAG_WORDS:
        raise ValueError(f"frag must be int32 [R/16, K/64, {FRAG_WORDS}], got {frag.dtype} {tuple(frag.shape)}")
    nt, ns = frag.shape[:2]
    rows, k = nt * FRAG_ROWS, ns * FRAG_K
    w = (frag[..., :128].to(torch.int64) & 0xFFFFFFFF).reshape(nt, ns, 8, 4, 2, 2)
    shift = torch.tensor(_FRAG_SHIFT, device=frag.device, dtype=torch.int64)
    u = (w[..., None, None] >> shift) & 15                                   # [tile, s, g, t, gr, h, hi, kk]
    q = (u.permute(*_FRAG_INV).reshape(rows, k) - 8).to(torch.float32)
    sw = frag[..., 128:].to(torch.int64) & 0xFFFFFFFF                      # [tile, s, 16]
    s16 = torch.stack([sw & 0xFFFF, sw >> 16], -1).reshape(nt, ns, 8, 2, 2)  # [tile, s, g, gr, hi]
    s16 = s16.permute(0, 4, 2, 1, 3).reshape(rows, k // GROUP_SIZE)
    s16 = torch.where(s16 >= 2**15, s16 - 2**16, s16).to(torch.int16)
    scale = s16.view(torch.bfloat16).to(torch.float32)
    w_out = q * scale.repeat_interleave(GROUP_SIZE, dim=1)
    if gate_up:
        res = torch.empty_like(w_out)
        res[_gate_up_order(rows, frag.device)] = w_out
        w_out = res
    return w_out.to(dtype)
