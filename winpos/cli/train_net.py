r"""Train or evaluate a winpos LazyConfig (flags as detectron2's tools/lazyconfig_train_net.py).

    winpos-train --config-file shapes/mask_rcnn_hieradet_toy_abswin.py
    winpos-train --config-file CFG --resume                        # continue from output_dir/last_checkpoint
    winpos-train --config-file CFG --force                         # replace the run already in output_dir
    winpos-train --config-file CFG --eval-only train.init_checkpoint=out/model_final.pth
    winpos-train --config-file CFG --num-gpus 8 dataloader.train.total_batch_size=16
    winpos-train --config-file CFG --num-gpus 8 train.grad_accum_steps=4    # batch 64 = 8 GPUs x 4 x 2 images
    winpos-train --config-file CFG --dataset mine=ann.json:images dataloader.train.dataset.names=mine
    winpos-train --slurm --slurm-nodes 2 --slurm-gpus-per-node 8 --slurm-partition gpu --slurm-time 4:00:00 \
        --config-file CFG   # a SLURM job through submitit, requeued with --resume when preempted

Overrides are strict: a key that does not exist is an error (add one on purpose with +key=value), and a value must
have the type of the one it replaces. Flags go before the overrides. --eval-only needs train.init_checkpoint
(or --random-weights to evaluate the untrained model on purpose). Runs on the CPU when there is no GPU (--num-gpus
N then starts N CPU processes over gloo). A train.output_dir that holds another run (checkpoints, metrics.json,
config.yaml) is refused unless --resume or --force, and one that a running winpos-train holds is refused naming it
(winpos.d2.run_dir). --resume continues the run exactly (every process's RNG state is saved) and refuses a change of
seed, total batch, model, optimizer or schedule naming it (train.max_iter may change: said, and config.yaml
rewritten); on a run trained to the end but not evaluated it runs the final evaluation. --eval-only does not
replace the evaluation already in train.output_dir/inference without --force. Bad input: one "error:" line and exit
status 2, also with --num-gpus N. The logic is in winpos.d2.engine.

--slurm submits the same command line (flags and overrides) as a SLURM job through submitit (pip install
'winpos[slurm]'): --slurm-nodes x --slurm-gpus-per-node tasks, one process per GPU, each reading its rank from SLURM.
On a time-out or preemption signal the job is requeued and continues with --resume from the run's last checkpoint
(train.checkpointer.period bounds the work redone). --slurm-local runs the job on this machine through submitit's
local executor and waits for it. Under srun or torchrun without --slurm, each process reads its rank from their
environment (winpos.d2.launch).
"""
import argparse
import sys

from winpos.utils.cli import (ArgumentParser, late_flags, nonnegative_int, positive_int, quiet_third_party_warnings,
                              run_cli)
from winpos.utils.config_names import CONFIG_FILE_HELP


def build_parser():
    """detectron2's ``default_argument_parser`` flags plus winpos's, built without importing torch or detectron2 so
    that ``--help`` and argument errors come at once (tests/test_tools_cli.py keeps the flags equal to
    ``winpos.d2.engine.build_parser``'s)."""
    parser = ArgumentParser(epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-file", default="", metavar="FILE", help=CONFIG_FILE_HELP)
    parser.add_argument("--resume", action="store_true",
                        help="continue from train.output_dir/last_checkpoint (exact resume)")
    parser.add_argument("--eval-only", action="store_true", help="perform evaluation only")
    parser.add_argument("--num-gpus", type=positive_int, default=1, help="number of processes per machine")
    parser.add_argument("--num-machines", type=positive_int, default=1, help="total number of machines")
    parser.add_argument("--machine-rank", type=nonnegative_int, default=0,
                        help="the rank of this machine (unique per machine)")
    parser.add_argument("--dist-url", default="auto",
                        help="initialization URL for multi-process runs (auto: a free local port)")
    parser.add_argument("--random-weights", action="store_true",
                        help="with --eval-only: evaluate the untrained model on purpose (no train.init_checkpoint)")
    parser.add_argument("--dataset", action="append", default=[], metavar="NAME=JSON:IMAGE_ROOT",
                        help="register a COCO-format dataset under NAME before the config is used (repeatable); "
                             "bad annotations are skipped and counted; model.roi_heads.num_classes must match its "
                             "categories (checked at start)")
    parser.add_argument("--force", action="store_true",
                        help="replace the run already in train.output_dir (its checkpoints, metrics and config are "
                             "removed first), or with --eval-only the evaluation in train.output_dir/inference; "
                             "without it such a folder is refused unless --resume")
    slurm = parser.add_argument_group("SLURM (through submitit; pip install 'winpos[slurm]')")
    slurm.add_argument("--slurm", action="store_true",
                       help="submit this run as a SLURM job instead of running it here; requeued and resumed on "
                            "time-out or preemption")
    slurm.add_argument("--slurm-nodes", type=positive_int, default=None, metavar="N", help="nodes (default 1)")
    slurm.add_argument("--slurm-gpus-per-node", type=positive_int, default=None, metavar="G",
                       help="GPUs per node, one process each (default 1)")
    slurm.add_argument("--slurm-partition", default=None, metavar="NAME", help="the partition (sbatch --partition)")
    slurm.add_argument("--slurm-account", default=None, metavar="NAME", help="the account (sbatch --account)")
    slurm.add_argument("--slurm-time", default=None, metavar="TIME",
                       help="time limit of each attempt: minutes or [D-]HH:MM:SS (default 4:00:00)")
    slurm.add_argument("--slurm-folder", default=None, metavar="DIR",
                       help="submitit's logs and job files (default: train.output_dir/submitit)")
    slurm.add_argument("--slurm-local", action="store_true",
                       help="run the job on this machine through submitit's local executor and wait for it (a try "
                            "without a cluster; one node)")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides key=value (after every flag)")
    return parser


def run(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    quiet_third_party_warnings()
    from winpos.d2.launch import launch_main
    from winpos.d2.startup import check_before_launch

    late = late_flags(args.opts) or [o for o in args.opts if o.startswith("--")]
    if late:
        parser.error(f"{', '.join(late)} comes after the key=value overrides, which take the rest of the command "
                     "line; put every flag before the overrides")
    slurm = _slurm_request(args)
    if slurm is not None:
        return _submit(args, slurm)
    check_before_launch(args)  # a batch the processes and accumulation cannot make: one line, before launching
    launch_main(args)
    return 0


SLURM_FLAGS = ("slurm_nodes", "slurm_gpus_per_node", "slurm_partition", "slurm_account", "slurm_time", "slurm_folder",
               "slurm_local")


def _slurm_request(args) -> dict | None:
    """The --slurm-* flags as ``winpos.d2.slurm.submit``'s keywords (None without --slurm), refusing a --slurm-*
    flag without --slurm, the local launch flags beside it, and a missing submitit, before torch is imported."""
    import importlib.util

    from winpos.errors import WinposError

    given = [f"--{name.replace('_', '-')}" for name in SLURM_FLAGS if getattr(args, name) not in (None, False)]
    if not args.slurm:
        if given:
            raise WinposError(f"{', '.join(given)} without --slurm: add --slurm to submit the run to SLURM, or drop "
                              f"{'it' if len(given) == 1 else 'them'} to run here")
        return None
    defaults = (("--num-gpus", args.num_gpus, 1), ("--num-machines", args.num_machines, 1),
                ("--machine-rank", args.machine_rank, 0), ("--dist-url", args.dist_url, "auto"))
    local = [flag for flag, here, default in defaults if here != default]
    if local:
        raise WinposError(f"--slurm with {', '.join(local)}: a SLURM job's processes are --slurm-nodes N x "
                          "--slurm-gpus-per-node G, each placed by SLURM; drop " + ", ".join(local))
    if importlib.util.find_spec("submitit") is None:
        raise WinposError("--slurm needs submitit, which is not installed: pip install 'winpos[slurm]' (or pip "
                          "install submitit)")
    from winpos.d2.slurm import parse_slurm_time, require_sbatch

    minutes = parse_slurm_time(args.slurm_time or "4:00:00")
    if not args.slurm_local:
        require_sbatch()
    return dict(nodes=args.slurm_nodes or 1, gpus_per_node=args.slurm_gpus_per_node or 1,
                minutes=minutes, partition=args.slurm_partition,
                account=args.slurm_account, folder=args.slurm_folder, local=args.slurm_local)


def _submit(args, slurm: dict) -> int:
    """Submit the run; with --slurm-local wait for the job and end as it ends (its error as one line)."""
    import argparse as _argparse

    from winpos.d2.slurm import submit
    from winpos.errors import ProcessFailed

    run_args = _argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "slurm" and k not in SLURM_FLAGS})
    job = submit(run_args, **slurm)
    if not slurm["local"]:
        return 0
    try:
        job.results()  # every task's
    except Exception as e:  # noqa: BLE001 - submitit re-raises the job's error with its traceback as text
        last = [line for line in str(e).strip().splitlines() if line.strip()][-1:] or [type(e).__name__]
        raise ProcessFailed(f"the job ended with: {last[0].strip()} (its log: {job.paths.stderr})", 1) from None
    print(f"job {job.job_id} finished", flush=True)
    return 0


def main(argv=None) -> int:
    """The command: ``run`` with bad input turned into one ``error:`` line and exit status 2."""
    return run_cli(run, argv)


if __name__ == "__main__":
    sys.exit(main())
