"""Start a module on N ranks with torchrun, :data:`workbench.parallel.groups.ENV` set (NVLink multicast off).

``workbench tp --nproc N -m MODULE [ARGS...]`` (or ``python -m workbench.parallel.launch ...``) runs
``python -m torch.distributed.run --standalone --nproc-per-node N -m MODULE ARGS`` with the
environment of :data:`~workbench.parallel.groups.ENV` and ``OMP_NUM_THREADS`` (default 1); on a
machine of GPUs each rank takes ``cuda:LOCAL_RANK``. Examples::

    workbench tp --nproc 2 -m workbench.parallel.parity --out /tmp/tp        # CPU (gloo) parity check
    workbench tp --nproc 8 -m workbench.bench.engine_tp --out data/measurements/h200x8
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Sequence

import torch

from workbench import REPO_ROOT
from workbench.environment import has_cuda
from workbench.parallel.groups import apply_env
from workbench.validation import InvalidParameter, check_int, check_module, parse_text


def torchrun_command(nproc: int, module: str, args: Sequence[str] = ()) -> list[str]:
    """The torchrun command line (this Python, ``--standalone``: a free rendezvous port on this host), its
    inputs checked first: :func:`check_ranks` and ``module`` one that ``python -m`` can run."""
    check_ranks(nproc)
    check_module("module", module)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", module, *args]


def check_ranks(nproc: object) -> int:
    """Ranks: an integer >= 1, and on a machine of CUDA GPUs at most one per GPU (rank r takes ``cuda:r``)."""
    check_int("nproc", nproc, lo=1)
    if has_cuda():
        gpus = torch.cuda.device_count()
        if nproc > gpus:
            raise InvalidParameter("nproc", nproc, f"an integer in [1, {gpus}]: one rank per GPU of this machine")
    return nproc


def launch_env(threads: int = 1) -> dict[str, str]:
    """This process's environment with :data:`~workbench.parallel.groups.ENV` applied, ``OMP_NUM_THREADS``
    (kept when set) and the repository on ``PYTHONPATH`` (so the ranks import this checkout's ``workbench``)."""
    env = dict(os.environ)
    apply_env(env)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def torchrun(nproc: int, module: str, args: Sequence[str] = (), timeout_s: float | None = None,
             capture: bool = False) -> subprocess.CompletedProcess:
    """Run ``module`` on ``nproc`` ranks (:func:`torchrun_command`, :func:`launch_env`) and wait; a run past
    ``timeout_s`` has its process group killed and raises ``subprocess.TimeoutExpired``. ``capture``: keep
    stdout and stderr (text) in the result instead of passing them through."""
    cmd = torchrun_command(nproc, module, args)
    kw = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True} if capture else {}
    proc = subprocess.Popen(cmd, env=launch_env(), start_new_session=True, **kw)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the launcher and its ranks: the session this call started
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def register(sub) -> None:
    """The ``tp`` verb."""
    p = sub.add_parser("tp", help="run a module on N tensor-parallel ranks (torchrun, NVLink multicast off)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=parse_text, required=True, metavar="N",
                   help="ranks (one per GPU; gloo processes on the CPU)")
    p.add_argument("-m", dest="module", nargs=argparse.REMAINDER, required=True, metavar="MODULE [ARGS...]",
                   help="the module to run on every rank and its arguments (last: everything after it is the "
                        "module's)")
    p.set_defaults(func=_cmd)


def _cmd(a) -> int:
    """``workbench tp``: the module and its arguments checked, then run on the ranks; the exit code is torchrun's."""
    if not a.module:
        raise ValueError("-m needs the module to run (workbench tp --nproc N -m MODULE [ARGS...])")
    return torchrun(a.nproc, a.module[0], a.module[1:]).returncode


def main(argv: list[str] | None = None) -> int:
    """``python -m workbench.parallel.launch``: the ``tp`` verb alone."""
    ap = argparse.ArgumentParser(prog="python -m workbench.parallel.launch")
    register(ap.add_subparsers(dest="command", required=True))
    a = ap.parse_args(["tp", *(sys.argv[1:] if argv is None else argv)])
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
