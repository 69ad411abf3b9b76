"""DDTree core: tree build, tree-verify attention, greedy accept, commit.

CPU references (NumPy, the ground truth): :func:`topk_logprobs`,
:func:`build_tree` -> :class:`DraftTree`, :func:`accept_greedy` ->
:class:`Accepted`. GPU kernels (torch CUDA tensors, CuPy/NVRTC):
:func:`build_trees`, :func:`accept_greedy_batched`, :func:`commit_scattered`,
:func:`commit_compact`, :func:`tree_visibility`. Composition without host
syncs: :mod:`workbench.ddtree.compose`. Verify attention
(``verify_attention_reference``, ``verify_attention``...) lives in
:mod:`workbench.ddtree.verify` and is re-exported here when present.
"""
from workbench.ddtree.reference import (  # noqa: F401
    Accepted,
    DraftTree,
    accept_greedy,
    build_tree,
    grid_node_count,
    topk_logprobs,
    tree_size,
)
from workbench.ddtree.tree_gpu import (  # noqa: F401
    MAX_BUDGET,
    MAX_L,
    GpuAccepted,
    GpuTrees,
    accept_greedy_batched,
    build_trees,
    commit_compact,
    commit_scattered,
    tree_visibility,
)

__all__ = [n for n in ("Accepted", "DraftTree", "accept_greedy", "build_tree",
                        "grid_node_count", "topk_logprobs", "tree_size", "MAX_BUDGET", "MAX_L",
                        "GpuAccepted", "GpuTrees", "accept_greedy_batched", "build_trees", "commit_compact",
                        "commit_scattered", "tree_visibility") if n in globals()]

# Verify attention is written in parallel (workbench/ddtree/verify.py): re-export
# whatever of its public names exist, skip silently when the module is absent.
_VERIFY_NAMES = ("verify_attention_reference", "verify_attention", "verify_attention_batched",
                 "verify_parity_rows", "benchmark_verify")
try:
    from workbench.ddtree import verify as _verify
except Exception:  # not written yet, or its own import failed
    _verify = None
if _verify is not None:
    for _name in tuple(getattr(_verify, "__all__", ())) + _VERIFY_NAMES:
        if hasattr(_verify, _name) and _name not in globals():
            globals()[_name] = getattr(_verify, _name)
            __all__.append(_name)
    del _name
