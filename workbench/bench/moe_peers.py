"""The torch peers of the INT4 MoE benchmark (:mod:`workbench.bench.moe`), per expert on grouped tokens.

``bf16_cublas`` (experts dequantised to bf16 once, cuBLAS per expert), ``torch_int4pack`` (torch's int4 weight-only
kernel: :func:`to_tinygemm` repacks an expert), ``dequant_matmul`` (dequantise then matmul on every call):
:func:`checked_peers` builds them and checks each against the float32 reference; :func:`time_peer` times one.
Tensors: hidden bf16 [M, H]; packed INT4 int32 [N, K // 8] with bf16 group scales [N, K // 32].
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from workbench.bench.moe_counts import KIMI, REL_TOL, make_routing, rel_error
from workbench.bench.moe_timing import capture_graph, events_ms
from workbench.moe.packing import Int4Experts
from workbench.moe.reference import moe_reference


def dequantize_gpu(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Vectorised dequantisation [out, in//8] int32 + [out, in//32] -> [out, in] ``dtype`` (any device)."""
    out_f = packed.shape[0]
    shifts = torch.arange(0, 32, 4, device=packed.device, dtype=torch.int32)
    q = ((packed.unsqueeze(-1) >> shifts) & 15) - 8
    w = q.reshape(out_f, scale.shape[1], -1).to(dtype) * scale.to(dtype).unsqueeze(-1)
    return w.reshape(out_f, -1)


def to_tinygemm(packed: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Our [n, k//8] int32 + [n, k//32] bf16 -> torch._weight_int4pack_mm operands (symmetric: zero = 0).

    torch's format: uint8 [n, k//2] with element 2j in the high nibble, values q + 8,
    then _convert_weight_to_int4pack(., innerKTiles=8); scales_and_zeros [k//32, n, 2],
    dequantised as (u - 8) * scale + zero.
    """
    b = packed.contiguous().view(torch.uint8)
    b = ((b & 0xF) << 4) | (b >> 4)
    w = torch._convert_weight_to_int4pack(b.contiguous(), 8)
    sz = torch.stack([scale, torch.zeros_like(scale)], -1).transpose(0, 1).contiguous()
    return w, sz


def group_pairs(topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """Host-side grouping [(expert, token idx, weight)] on the ids' device (peers only; needs a sync)."""
    m, k = topk_ids.shape
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    fe = flat[order]
    experts, counts = torch.unique_consecutive(fe, return_counts=True)
    tokens = (order // k)
    w = topk_weights.reshape(-1)[order].float()
    out, start = [], 0
    for e, c in zip(experts.tolist(), counts.tolist()):
        out.append((e, tokens[start:start + c], w[start:start + c]))
        start += c
    return out


def peer_moe(x: torch.Tensor, groups, gate_up: Callable[[int, torch.Tensor], torch.Tensor],
             down: Callable[[int, torch.Tensor], torch.Tensor], inter: int) -> torch.Tensor:
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for e, tok, w in groups:
        gu = gate_up(e, x[tok])
        h = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        y = down(e, h)
        out.index_add_(0, tok, y.float() * w[:, None])
    return out.to(torch.bfloat16)


def checked_peers(experts: Int4Experts, gen: torch.Generator, checks: list[dict[str, Any]]) -> tuple[dict, dict]:
    """The torch peers' (gate_up, down) per-expert callables, each checked at M = 4 first; and their errors."""
    E, H, I, K = experts.num_experts, experts.hidden, experts.intermediate, KIMI["topk"]
    peers: dict[str, Any] = {}
    errors: dict[str, str] = {}
    try:
        gu_bf16 = torch.stack([dequantize_gpu(experts.gate_up_packed[e], experts.gate_up_scale[e]) for e in range(E)])
        dn_bf16 = torch.stack([dequantize_gpu(experts.down_packed[e], experts.down_scale[e]) for e in range(E)])
        peers["bf16_cublas"] = (lambda e, x: x @ gu_bf16[e].T, lambda e, h: h @ dn_bf16[e].T)
    except RuntimeError as err:  # a peer that cannot run (out of memory, ...) is recorded, the others stand
        errors["bf16_cublas"] = repr(err)
    try:
        tg = [to_tinygemm(experts.gate_up_packed[e], experts.gate_up_scale[e]) for e in range(E)]
        td = [to_tinygemm(experts.down_packed[e], experts.down_scale[e]) for e in range(E)]
        peers["torch_int4pack"] = (lambda e, x: torch._weight_int4pack_mm(x, tg[e][0], 32, tg[e][1]),
                                   lambda e, h: torch._weight_int4pack_mm(h.to(torch.bfloat16), td[e][0], 32,
                                                                          td[e][1]))
    except (RuntimeError, AttributeError, NotImplementedError) as err:   # this torch lacks the int4pack ops
        errors["torch_int4pack"] = repr(err)
    peers["dequant_matmul"] = (
        lambda e, x: x @ dequantize_gpu(experts.gate_up_packed[e], experts.gate_up_scale[e]).T,
        lambda e, h: h @ dequantize_gpu(experts.down_packed[e], experts.down_scale[e]).T)
    ids4, w4 = make_routing(4, E, K, "uniform", gen)
    x4 = torch.randn(4, H, generator=gen).to(torch.bfloat16).cuda()
    ref4 = moe_reference(x4, ids4.cuda(), w4.cuda(), experts).cpu()
    groups4 = group_pairs(ids4.cuda(), w4.cuda())
    for name, (fg, fd) in list(peers.items()):
        err = rel_error(peer_moe(x4, groups4, fg, fd, I).cpu(), ref4)
        checks.append({"m": 4, "routing": "uniform", "peer": name, "rel_err": err, "ok": err <= REL_TOL})
    return peers, errors


def time_peer(fg, fd, x: torch.Tensor, ids_all: torch.Tensor, w_all: torch.Tensor, inter: int, reps: int) -> list:
    """ms of a peer: fresh routing per repeat, host-side grouping outside the timed region, one graph per routing."""
    pms = []
    for r in range(reps):
        j = (r * 7 + 1) % ids_all.shape[0]
        groups = group_pairs(ids_all[j], w_all[j])
        gp = capture_graph(lambda: peer_moe(x, groups, fg, fd, inter))
        gp.replay()
        pms.append(events_ms(gp.replay))
        del gp
    return pms
