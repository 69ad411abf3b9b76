"""The decode configuration: one frozen object that holds the DDTree defaults.

Every entry point that decodes (``generate``, the engine benchmark, the
projection, notebooks, the CLI) takes a :class:`DecodeConfig` or builds one
from its arguments, so the defaults (block 16, budget 32, scattered commit,
the dispatched tree builder) are written here once.
"""
from __future__ import annotations

import dataclasses

METHODS = ("greedy", "ddtree")
COMMIT_MODES = ("scattered", "compacted")
TREE_IMPLS = ("auto", "reference", "batched")
# Limits of the GPU tree builder (workbench/kernels/ddtree_tree.cu): nodes per tree and draft depth L = block - 1.
MAX_BUDGET = 1024
MAX_L = 32


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
        from workbench.validation import check_choice, check_int

        check_choice("method", self.method, METHODS)
        check_int("block", self.block, lo=2, hi=MAX_L + 1)
        check_int("budget", self.budget, lo=1, hi=MAX_BUDGET)
        check_choice("commit", self.commit, COMMIT_MODES)
        check_choice("tree_impl", self.tree_impl, TREE_IMPLS)

    @property
    def depth(self) -> int:
        """Draft depth L = block - 1."""
        return self.block - 1

    @property
    def verify_width(self) -> int:
        """Tokens per request in a verify forward: 1 for greedy, budget + 1 for DDTree."""
        return 1 if self.method == "greedy" else self.budget + 1

    def replace(self, **changes) -> "DecodeConfig":
        return dataclasses.replace(self, **changes)


DEFAULT = DecodeConfig()
