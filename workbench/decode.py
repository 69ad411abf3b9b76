"""The decode configuration and the DDTree arithmetic derived from it, in one place.

Every entry point that decodes (``generate``, the engine, the server, the sweep,
the projection, notebooks, the CLI) takes a :class:`DecodeConfig` or builds one
from its arguments, so the defaults (block 16, budget 32, scattered commit, the
dispatched tree builder) are written here once. What follows from a config is
derived here too: tree nodes per request (:func:`tree_size`,
:meth:`DecodeConfig.verify_width`), the positions and slots a request must have room for
beyond its prompt and output (:meth:`DecodeConfig.extra_slots`), the KV
slots a request can hold at most (:meth:`DecodeConfig.worst_case_slots`) and
the batch buckets of the captured step (:data:`BUCKETS`, :func:`bucket_for`).
"""
from __future__ import annotations

import dataclasses

from workbench.validation import check_choice, check_int

METHODS = ("greedy", "ddtree")
COMMIT_MODES = ("scattered", "compacted")
TREE_IMPLS = ("auto", "reference", "batched")
# Limits of the GPU tree builder (workbench/kernels/ddtree_tree.cu): nodes per tree and draft depth L = block - 1.
MAX_BUDGET = 1024
MAX_L = 32
# Rows of one captured step: a batch of n requests runs in the smallest bucket that holds it.
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def bucket_for(n: int) -> int:
    """The smallest bucket size that holds ``n`` rows."""
    for b in BUCKETS:
        if n <= b:
            return b
    raise ValueError(f"{n} concurrent requests is not allowed: at most {BUCKETS[-1]}")


def grid_node_count(L: int, K: int, cap: int | None = None) -> int:
    """Number of non-root nodes an L x K grid allows (sum_d K^d), capped at ``cap``."""
    total, level = 0, 1
    for _ in range(L):
        level *= K
        total += level
        if cap is not None and total >= cap:
            return cap
    return total if cap is None else min(total, cap)


def tree_size(L: int, K: int, budget: int) -> int:
    """Nodes of a best-first tree, root included: 1 + min(budget, nodes the L x min(budget, K) grid allows)."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    return 1 + grid_node_count(L, min(budget, K), cap=budget)


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """How one decode runs.

    - ``method``: ``"greedy"`` (one token per request per step) or ``"ddtree"``.
    - ``block``: drafter block size; the tree is at most ``block - 1`` deep (2..MAX_L + 1).
    - ``budget``: tree nodes below the root (1..MAX_BUDGET); the verify width is ``budget + 1``.
    - ``commit``: ``"scattered"`` keeps the accepted nodes' KV slots, ``"compacted"`` moves their rows.
    - ``tree_impl``: ``"reference"`` (NumPy heap), ``"batched"`` (the GPU builder, or its torch form
      on the CPU) or ``"auto"`` (batched where the GPU builds it, else the reference).
    """

    method: str = "ddtree"
    block: int = 16
    budget: int = 32
    commit: str = "scattered"
    tree_impl: str = "auto"

    def __post_init__(self):
        check_choice("method", self.method, METHODS)
        check_int("block", self.block, lo=2, hi=MAX_L + 1)
        check_int("budget", self.budget, lo=1, hi=MAX_BUDGET)
        check_choice("commit", self.commit, COMMIT_MODES)
        check_choice("tree_impl", self.tree_impl, TREE_IMPLS)

    @property
    def depth(self) -> int:
        """Draft depth L = block - 1."""
        return self.block - 1

    def verify_width(self, vocab: int) -> int:
        """Tokens per request in one step's forward over a ``vocab``-token model: 1 for greedy, the tree's nodes
        for DDTree (``budget + 1`` unless the depth x min(budget, vocab) grid holds fewer)."""
        if self.method == "greedy":
            return 1
        return tree_size(self.depth, min(self.budget, vocab), self.budget)

    @property
    def extra_positions(self) -> int:
        """Positions a request must have room for beyond prompt + output: the deepest tree's (``block``) for
        DDTree, none for greedy."""
        return self.block if self.method == "ddtree" else 0

    def extra_slots(self, vocab: int) -> int:
        """Slots a request's table must hold beyond prompt + max_new_tokens, so that its last step can allocate its
        tree: a step starts with at most prompt + max_new_tokens - 2 committed rows (the last generated token's
        row is never written) and allocates :meth:`verify_width` more; at least :attr:`extra_positions`."""
        return max(self.extra_positions, self.verify_width(vocab) - 2)

    def worst_case_slots(self, prompt_len: int, max_new_tokens: int, vocab: int) -> int:
        """KV slots a request can hold at most: ``prompt_len + max_new_tokens`` committed plus one step's
        allocation (:meth:`verify_width`) before its accept frees the rest."""
        return prompt_len + max_new_tokens + self.verify_width(vocab)

    def replace(self, **changes) -> "DecodeConfig":
        return dataclasses.replace(self, **changes)


DEFAULT = DecodeConfig()
GREEDY = DEFAULT.replace(method="greedy")
"""What the engine decodes with when no config is given: greedy, the other fields at their defaults."""
