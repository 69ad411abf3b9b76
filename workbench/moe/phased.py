"""Where the phased form's time goes (run 28): its gate/up and down launches timed alone and together.

The phased form (``fused.SMALL_VARIANTS`` "phased_*", moe_int4.cu "Phased form") is two launches. This probe times,
per M and routing, with fresh inputs per call and two weight sets alternating (as ``bench.time_ours_in_graph``):
the gate/up launch alone, the down launch alone (reading the h its call's gate/up left), and both; each as one graph
replay on an idle GPU and in-graph (``calls`` calls back to back in one graph, per call). "both - parts" is what the
boundary between the launches costs (negative: they overlap). Run on the H200:

    python -m workbench.moe.phased --m 1 2 --variants phased_r3 phased_r3_pdl --out DIR

``--hidden`` sets H (default Kimi's 7168; a multiple of 256). The down launch has one CTA per 16 output rows, so
H = 7168 gives 448 tiles, 3.4 per SM of the H200's 132 (52 SMs hold 4, 80 hold 3), and H = 8448 gives 528, 4 on every
SM: if the down launch is bound by its busiest SM, it takes about as long at both; if by the DRAM, 8448 / 7168 times
as long (the tile-balance probe of run 29).
"""
from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any, Callable

import torch

from workbench.measure import capture_graphs, median, time_cuda, time_in_graph, write_measurement
from workbench.moe.bench import make_routing, second_bank
from workbench.moe.diag import ALL_BUILDS
from workbench.moe.fused import phased_launcher, phased_spec
from workbench.moe.packing import Int4Experts, random_int4_experts

PARTS = ("gu", "dn", "gu+dn")
CALLS = 16   # calls per in-graph sample and distinct inputs per part


def breakdown(banks: list[Int4Experts], m: int, routing: str, variant: str, gen: torch.Generator, reps: int = 20,
              calls: int = CALLS, topk: int = 8, build: str = "default") -> dict[str, Any]:
    """Per part of ``PARTS``: median ms of one graph replay of one call (the calls in turn, so no replay finds its
    weights in L2 from the one before) and per call in-graph, with the samples. ``build``: a key of
    ``workbench.moe.diag.ALL_BUILDS`` (diagnostic builds of moe_int4.cu: "noact" replaces the stage loops' activation
    loads by values made from their addresses, "nomath_frag" frag_gemm's math by one add; their outputs are wrong by
    design and only their times mean something)."""
    phased_spec(variant)
    if build not in ALL_BUILDS:
        raise ValueError(f"build must be one of {sorted(ALL_BUILDS)}, got {build!r}")
    if not banks or m < 1 or calls < 1:
        raise ValueError(f"need weight banks, m >= 1 and calls >= 1; got {len(banks)} banks, m={m}, calls={calls}")
    e, h, i = banks[0].num_experts, banks[0].hidden, banks[0].intermediate
    runs = [phased_launcher(b, m, topk, variant, ALL_BUILDS[build]) for b in banks]
    x = torch.randn(m, h, generator=gen).to(torch.bfloat16).cuda()
    inputs = []
    for _ in range(calls):
        ids, w = make_routing(m, e, topk, routing, gen)
        inputs.append((ids.reshape(-1).to(torch.int32).cuda(), w.reshape(-1).to(torch.float32).cuda(),
                       torch.empty(m * topk, i, dtype=torch.bfloat16, device="cuda"),
                       torch.empty(m, h, dtype=torch.bfloat16, device="cuda")))

    def call(j: int, parts: str) -> Callable[[], None]:
        def fn() -> None:
            runs[j % len(runs)](x, *inputs[j], parts=parts)
        return fn

    for j in range(calls):   # every call's h exists before a "dn" alone reads it
        call(j, "gu")()
    torch.cuda.synchronize()
    out: dict[str, Any] = {"m": m, "routing": routing, "variant": variant, "calls": calls, "build": build}
    for parts in PARTS:
        graphs = capture_graphs([call(j, parts) for j in range(calls)])
        turn = iter(range(1 << 30))
        one = time_cuda(lambda: graphs[next(turn) % calls].replay(), warmup=5, reps=reps)   # a fresh call each time
        del graphs
        in_graph, _ = time_in_graph([call(j, parts) for j in range(calls)], reps=max(5, reps // 2), min_calls=calls)
        out[parts] = {"one_replay_ms": median(one), "in_graph_ms": median(in_graph),
                      "one_replay_samples": one, "in_graph_samples": in_graph}
    for kind in ("one_replay_ms", "in_graph_ms"):
        out[f"boundary_{kind}"] = out["gu+dn"][kind] - out["gu"][kind] - out["dn"][kind]
    return out


def table_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (variant, M, routing): each part in us, one replay / in-graph, and the boundary."""
    rows = []
    for r in results:
        row = {"variant": r["variant"] + ("" if r.get("build", "default") == "default" else f" ({r['build']} build)"),
               "H": r.get("hidden", 7168), "M": r["m"], "routing": r["routing"]}
        for parts in PARTS:
            row[f"{parts} us"] = f"{r[parts]['one_replay_ms'] * 1e3:.1f} / {r[parts]['in_graph_ms'] * 1e3:.1f}"
        row["both - parts us"] = f"{r['boundary_one_replay_ms'] * 1e3:+.1f} / {r['boundary_in_graph_ms'] * 1e3:+.1f}"
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    from workbench.papers import markdown_table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--variants", nargs="+", default=["phased_r3"])
    ap.add_argument("--routings", nargs="+", default=["uniform", "skewed"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--hidden", type=int, nargs="+", default=[7168], help="H values (multiples of 256)")
    ap.add_argument("--builds", nargs="+", default=["default"], choices=sorted(ALL_BUILDS),
                    help="builds of moe_int4.cu (workbench.moe.diag.ALL_BUILDS; e.g. noact: no activation loads)")
    ap.add_argument("--name", default="moe_phased_breakdown")
    ap.add_argument("--out", type=Path, default=None, help="folder for the measurement JSON (default: data/)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the phased breakdown needs a CUDA GPU")
    bad = [h for h in args.hidden if h < 256 or h % 256]
    if bad:
        raise SystemExit(f"--hidden values must be positive multiples of 256 (the gate/up K stage), got {bad}")
    gen = torch.Generator().manual_seed(0)
    results = []
    for hidden in args.hidden:
        bank = random_int4_experts(384, hidden, 2048, device="cuda", seed=0)
        banks = [bank, second_bank(bank, seed=1)]
        for v, m, routing, build in itertools.product(args.variants, args.m, args.routings, args.builds):
            results.append({"hidden": hidden, **breakdown(banks, m, routing, v, gen, reps=args.reps, build=build)})
        del bank, banks
        torch.cuda.empty_cache()
    path = write_measurement(args.name, parameters={"m_values": args.m, "variants": args.variants,
                                                    "routings": args.routings, "reps": args.reps, "calls": CALLS,
                                                    "hidden": args.hidden, "builds": args.builds,
                                                    "shape": "Kimi K2.6: 384 experts, H 7168 (or --hidden), I 2048, "
                                                             "top-8",
                                                    "timing": "one graph replay of one call on an idle GPU / per call "
                                                              f"of {CALLS} back to back in one graph, medians"},
                             results=results, out_dir=args.out)
    print(markdown_table(table_rows(results)))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
