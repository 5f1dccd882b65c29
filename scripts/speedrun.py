"""nanochat's speedrun (runs/speedrun.sh) on this project's scripts, one resumable command:

    python scripts/speedrun.py [--run_dir ~/.cache/nanochat/speedrun] [--gpus 8] [--rl]    # d24, one 8-GPU node
    python scripts/speedrun.py --demo [--run_dir outputs/speedrun-demo]                    # offline, CPU, minutes

Stages: shards, tok_train, tok_eval, base_train, base_eval (CORE), SFT (mid_train), chat_eval, and chat_rl with
--rl. Each writes its folder under --run_dir and a record when it finishes; run the same command again to resume
at the first unfinished stage. The end: report.md in --run_dir, a model card in each model folder.
Details: docs/speedrun.md.
"""

from __future__ import annotations

import argparse
import sys

from nanochat_hf.errors import OneLineArgumentParser, UserError, add_version, run_cli

PROG = "speedrun"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demo", action="store_true", help="the offline demo: synthetic shards, tiny model, CPU")
    p.add_argument("--run_dir", default=None, help="the run's folder (default: $NANOCHAT_BASE_DIR/speedrun, "
                   "outputs/speedrun-demo with --demo)")  # fmt: skip
    p.add_argument("--gpus", type=int, default=None, help="processes per stage (default: 8; 1 with --demo)")
    p.add_argument("--data_dir", default=None, help="the pretraining shards (default: <run_dir>/base_data_climbmix)")
    p.add_argument("--bundle_dir", default=None, help="CORE's eval bundle (default: base_eval's)")
    p.add_argument("--rl", action="store_true", help="also run chat_rl on GSM8K after the chat evaluation")
    p.add_argument("--fp8", action="store_true", help="pass --fp8 to base_train (HEAD's speedrun trains in fp8)")
    add_version(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)

    def go() -> None:
        from nanochat_hf.paths import nanochat_base_dir
        from nanochat_hf.speedrun import speedrun

        if args.gpus is not None and args.gpus < 1:
            raise UserError(f"--gpus {args.gpus}: expected a positive number of processes")
        gpus = args.gpus or (1 if args.demo else 8)
        run_dir = args.run_dir or ("outputs/speedrun-demo" if args.demo else nanochat_base_dir() / "speedrun")
        options = dict(demo=args.demo, rl=args.rl, gpus=gpus, data_dir=args.data_dir, bundle_dir=args.bundle_dir)
        speedrun(argv, run_dir=run_dir, fp8=args.fp8, **options)

    return run_cli(PROG, go)


if __name__ == "__main__":
    sys.exit(main())
