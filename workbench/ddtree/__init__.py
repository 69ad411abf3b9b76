"""DDTree core: tree build, tree-verify attention, greedy accept, commit.

CPU references (NumPy, the ground truth): :func:`topk_logprobs`,
:func:`build_tree` -> :class:`DraftTree`, :func:`accept_greedy` ->
:class:`Accepted`. GPU kernels (torch CUDA tensors, CuPy/NVRTC):
:func:`build_trees`, :func:`accept_greedy_batched`, :func:`commit_scattered`,
:func:`commit_compact`, :func:`tree_visibility`. Composition without host
syncs: :mod:`workbench.ddtree.compose`. Verify attention
(``verify_attention_reference``, ``verify_attention``,
``verify_attention_batched``) lives in :mod:`workbench.ddtree.verify`, its
peers in :mod:`workbench.bench.verify_peers`. Which kernel runs is the GPU's
dispatch table (``data/dispatch``); measurement: :mod:`workbench.bench.ddtree`,
the paper's tables: :mod:`workbench.reports.ddtree`.
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

from workbench.ddtree.verify import (  # noqa: F401
    verify_attention,
    verify_attention_batched,
    verify_attention_reference,
)

__all__ = ["Accepted", "DraftTree", "accept_greedy", "build_tree", "grid_node_count", "topk_logprobs", "tree_size",
           "MAX_BUDGET", "MAX_L", "GpuAccepted", "GpuTrees", "accept_greedy_batched", "build_trees",
           "commit_compact", "commit_scattered", "tree_visibility",
           "verify_attention_reference", "verify_attention", "verify_attention_batched"]
