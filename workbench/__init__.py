"""DDTree Workbench: tree speculative decoding on MLA + MoE models.

Subpackages: ``workbench.ddtree`` (tree build, verify attention, accept),
``workbench.engine`` (the DeepSeek-V3 / Kimi K2.6 model and generation),
``workbench.kernels`` (CUDA sources and their loader), analyses
(``workbench.capacity``, ``workbench.projection``) and the notebook pipeline
(``workbench.pipeline``).
"""
from pathlib import Path

__version__ = "0.1.0"

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
MEASUREMENTS_DIR = DATA_DIR / "measurements"
