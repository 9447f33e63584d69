"""IPython magics: ``%%distributed`` and ``%distributed_shutdown``. They parse, then call plain functions."""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from . import dashboard
from .launch.api import UserInputError, format_summary, run_source
from .launch.config import LaunchRequest
from .launch.registry import RunRegistry
from .launch.run import PoolManager


@magics_class
class DistributedMagics(Magics):
    def __init__(self, shell):
        super().__init__(shell)
        self.pools = PoolManager()
        self._registry = None

    def observers(self) -> list:
        """Who follows each run: the run registry (read by the Jupyter server extension)."""
        if self._registry is None:
            try:
                self._registry = RunRegistry()
            except OSError as exc:  # an unwritable runtime dir must not stop training
                print(f"nbtrain: runs will not be listed in JupyterLab ({exc})")
                self._registry = False
        return [self._registry] if self._registry else []

    @magic_arguments(name="%distributed")  # a cell magic: the help's usage line reads %%distributed
    @argument("nprocs", nargs="?", type=int, help="number of ranks (default: one per visible GPU, else 2)")
    @argument("--cpu", action="store_true", help="run on CPU (gloo) even when GPUs are present")
    @argument("--gpus", metavar="IDS", help="GPUs to use, such as 0,2 (NVML/nvidia-smi numbering)")
    @argument("--backend", choices=["nccl", "gloo"], help="process-group backend (default: nccl on GPUs, gloo on CPU)")
    @argument("--timeout", type=float, metavar="SECONDS", help="collective timeout of the process group (default 600)")
    @argument("--out", metavar="NAMES", help="names to bring back from rank 0, comma-separated; '-' for none "
              "(default: every name the cell assigns)")
    @argument("--output", choices=["all", "rank0"], default="all",
              help="show every rank's output (others prefixed [rank k]) or rank 0's only")
    @argument("--keep-alive", type=float, metavar="SECONDS",
              help="keep the ranks warm this long after the cell for a fast re-run (default 900; 0 stops them)")
    @argument("--fresh", action="store_true", help="start new rank processes instead of reusing warm ones")
    @argument("--env", action="append", default=[], metavar="NAME=VALUE", help="environment variable for the ranks (repeatable)")
    @argument("--quiet", action="store_true", help="do not print the one-line summary after the run")
    @argument("--no-dashboard", action="store_true", help="do not show the live dashboard (GPU use, logged curves)")
    @argument("--amp", metavar="MODE", help="mixed precision for nbtrain.prepare()d models: bf16, fp16, off or auto "
              "(default: bf16 on GPUs that support it, fp16 on older GPUs, off on CPU)")
    @argument("--grad-accum", type=int, metavar="K", help="micro-steps per optimizer step (gradient accumulation)")
    @argument("--checkpoint", metavar="DIR", help="directory for nbtrain.save_checkpoint(); the cell resumes from "
              "the checkpoint there when one exists (relative to the notebook's current directory)")
    @argument("--no-resume", action="store_true", help="with --checkpoint: start from scratch even if DIR holds a checkpoint")
    @argument("--max-restarts", type=int, metavar="K", help="restart the ranks from the last checkpoint up to K "
              "times when a rank dies (needs --checkpoint)")
    @cell_magic
    def distributed(self, line, cell):
        """Run this cell's code as N PyTorch DDP ranks, each its own process.

        Every rank runs the whole cell with the default process group initialised and these names set:
        ``rank``, ``local_rank``, ``world_size`` and ``device`` (its GPU, or the CPU). RANK, LOCAL_RANK,
        WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set as torchrun sets them, so a pasted torchrun script
        (with its own ``dist.init_process_group()``) runs unchanged. Notebook variables the cell reads
        are sent to the ranks; names the cell assigns on rank 0 come back into the notebook.

        Examples::

            %%distributed 4
            model = DDP(Net().to(device))
            ...
            final_loss = loss.item()        # back in the notebook after the cell

            %%distributed 2 --cpu --out model,final_loss
            %%distributed --gpus 0,2 --timeout 120
            %%distributed 4 --output rank0 --keep-alive 0
            %%distributed 4 --amp bf16 --grad-accum 4 --checkpoint runs/exp1   # see nbtrain.prepare()
        """
        args = parse_argstring(self.distributed, line)
        request = LaunchRequest(
            nprocs=args.nprocs, cpu=args.cpu, gpus=args.gpus, backend=args.backend, timeout=args.timeout,
            out=args.out, output=args.output, keep_alive=args.keep_alive, fresh=args.fresh, env=tuple(args.env),
            amp=args.amp, grad_accum=args.grad_accum, checkpoint=args.checkpoint, resume=not args.no_resume,
            max_restarts=args.max_restarts,
        )
        try:
            observer = dashboard.observer_for(self.shell, enabled=not args.no_dashboard)
        except ValueError as exc:  # NBTRAIN_DASHBOARD set to something unknown
            raise UsageError(str(exc)) from None
        return run_in_shell(self.shell, cell, request, self.pools, quiet=args.quiet,
                            observers=self.observers() + ([observer] if observer is not None else []))

    @magic_arguments()
    @argument("--once", action="store_true", help="print a table of the GPUs (or CPU/RAM) now instead of a live view")
    @argument("--interval", type=float, metavar="SECONDS", help="seconds between samples, 0.25 to 5 (default 1)")
    @argument("--for", dest="duration", type=float, metavar="SECONDS",
              help="stop the live view after this long (default 600; 0: until stopped)")
    @argument("--stop", action="store_true", help="stop every live view started by %%gpus")
    @line_magic
    def gpus(self, line):
        """Show this machine's GPUs — utilisation, memory, temperature, power, processes — live, under the cell.

        Without an NVIDIA driver it shows CPU and RAM instead. In a terminal, or with ``--once``, it prints a
        table. Examples: ``%gpus``, ``%gpus --once``, ``%gpus --interval 0.5 --for 0``, ``%gpus --stop``.
        """
        args = parse_argstring(self.gpus, line)
        try:
            dashboard.show_gpus(self.shell, once=args.once, interval=args.interval, duration=args.duration,
                                stop=args.stop)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    @line_magic
    def distributed_shutdown(self, line):
        """Stop the warm ranks kept for fast re-runs (they also stop when idle and at kernel exit)."""
        print("nbtrain: stopped the warm ranks." if self.pools.shutdown() else "nbtrain: no warm ranks to stop.")


def run_in_shell(shell, cell: str, request: LaunchRequest, pools: PoolManager, quiet: bool = False,
                 observers=()) -> None:
    """Run a cell in ``shell``'s namespace; user mistakes become UsageError, before any process starts."""
    code_name = getattr(getattr(shell, "compile", None), "format_code_name", None)
    try:
        result = run_source(cell, request, shell.user_ns, manager=pools, code_name=code_name, observers=observers)
    except UserInputError as exc:
        raise UsageError(str(exc)) from None
    if len(result.history):
        shell.user_ns["history"] = result.history
    if not quiet:
        print("\n".join(format_summary(result)))
