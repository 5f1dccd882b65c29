"""Preview a mid-training mixture: rendered conversations, sizes per task, token statistics, steps per epoch.

    python scripts/preview_data.py [configs/mid_d20.yaml] [--mixture configs/mixtures/demo.yaml] [--split train]
        [-n 5] [--tokenizer DIR] [--max-seq-len N --device-batch-size N --total-batch-size N --world-size 1]

It reads the run config mid_train reads (the demo config when none is given): its train mixture (val_mixture with
--split val) and batch settings, which the flags override. Without --tokenizer it uses the demo tokenizer.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from nanochat_hf.errors import OneLineArgumentParser, UserError, add_version, one_line, run_cli

# datasets, tokenizers and the training arguments are imported inside the functions that use them, after the
# arguments are checked: --help and argument errors answer at once.
PROG = "preview_data"
GREEN, RESET = "\033[32m", "\033[0m"
OPEN, CLOSE = "[[", "]]"


def positive_int(value: str) -> int:
    if not value.isdigit() or int(value) == 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return int(value)


def non_negative_int(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value!r}")
    return int(value)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "config",
        nargs="?",
        default=None,
        help="mid_train's run config YAML (default: the demo config, configs/demo.yaml)",
    )
    p.add_argument(
        "--mixture", default=None, help="mixture YAML (default: the config's; the demo's is the offline demo mixture)"
    )
    p.add_argument("--split", default="train", help="split of a split-keyed mixture file (train, val, ...)")
    p.add_argument("-n", type=non_negative_int, default=5, help="conversations to print")
    p.add_argument("--tokenizer", default=None, help="HF tokenizer dir, or nanochat tokenizer dir (tokenizer.pkl)")
    p.add_argument("--trust-pickle", action="store_true", help="allow unpickling a nanochat tokenizer.pkl")
    p.add_argument("--max-seq-len", type=positive_int, default=None, help="tokens per row (default: the config's)")
    p.add_argument(
        "--device-batch-size",
        type=positive_int,
        default=None,
        help="rows per micro-batch per process (default: the config's)",
    )
    p.add_argument(
        "--total-batch-size", type=positive_int, default=None, help="tokens per optimizer step (default: the config's)"
    )
    p.add_argument("--world-size", type=positive_int, default=1)
    p.add_argument("--max-tokens", type=positive_int, default=2048, help="truncation of each rendered conversation")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    p.add_argument("--strict", action="store_true", help="fail on the first malformed row")
    add_version(p)
    return p.parse_args(argv)


def load_tokenizer(path: str | None, trust_pickle: bool):
    """The demo tokenizer, or the one in `path`; UserError / OSError in one line when it is not usable."""
    from nanochat_hf.data import demo_tokenizer
    from nanochat_hf.tokenizer.chat_format import ASSISTANT_END, ASSISTANT_START, BOS, USER_START

    if path is None:
        return demo_tokenizer()
    if not os.path.isdir(path):
        raise FileNotFoundError(f"--tokenizer {path}: no such directory (expected a tokenizer folder)")
    if os.path.isfile(os.path.join(path, "tokenizer.pkl")) and not os.path.isfile(os.path.join(path, "tokenizer.json")):
        from nanochat_hf.tokenizer import load_nanochat_tokenizer

        return load_nanochat_tokenizer(path, trust_pickle=trust_pickle)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 -- tokenizers raises plain Exception on a damaged tokenizer.json
        raise UserError(f"--tokenizer {path}: cannot be loaded ({one_line(e)})") from None
    missing = [t for t in (BOS, USER_START, ASSISTANT_START, ASSISTANT_END) if t not in tokenizer.get_vocab()]
    if missing:
        raise UserError(f"--tokenizer {path}: lacks nanochat's special token(s) {', '.join(missing)}")
    return tokenizer


def show(tokenizer, conversation: dict, max_tokens: int, color: bool) -> str:
    """The rendered conversation with assistant-trained tokens (mask 1) highlighted."""
    from nanochat_hf.tokenizer import render_conversation

    ids, mask = render_conversation(tokenizer, conversation, max_tokens=max_tokens)
    out, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            text = tokenizer.decode(ids[start:i])
            if mask[start]:
                text = f"{GREEN}{text}{RESET}" if color else f"{OPEN}{text}{CLOSE}"
            out.append(text)
            start = i
    return "".join(out) + f"\n({len(ids)} tokens, {sum(mask)} assistant-trained)"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_cli(PROG, lambda: preview(args))


def preview(args: argparse.Namespace) -> int:
    """Bad input (the config, the mixture and its files, the tokenizer, batch settings) raises UserError / OSError."""
    from nanochat_hf.data import PackedStream, load_mixture, loads, read_mixture, tokenize_conversations
    from nanochat_hf.training.arguments import config_values

    config = config_values(args.config)
    if args.mixture is None:
        args.mixture = (
            config["val_mixture"] if args.split == "val" and config["val_mixture"] else config["train_mixture"]
        )
    B = args.device_batch_size = args.device_batch_size or config["device_batch_size"]
    T = args.max_seq_len = args.max_seq_len or config["max_seq_len"]
    W = args.world_size
    args.total_batch_size = args.total_batch_size or config["total_batch_size"]
    if args.total_batch_size % (B * T * W):
        raise UserError(
            f"total_batch_size {args.total_batch_size} is not divisible by device_batch_size * "
            f"max_seq_len * world_size = {B}*{T}*{W} = {B * T * W}"
        )
    grad_accum = args.total_batch_size // (B * T * W)
    read_mixture(args.mixture, args.split)  # validates every entry and file before the tokenizer is loaded
    tokenizer = load_tokenizer(args.tokenizer, args.trust_pickle)
    ds = load_mixture(args.mixture, split=args.split, strict=args.strict)
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    name = args.mixture or "offline demo mixture"
    marked = "green" if color else f"between {OPEN} and {CLOSE}"
    print(f"Mixture: {name} [{args.split}], {len(ds):,} conversations")
    print(
        f"Assistant tokens (mask 1) are shown {marked}. nanochat mid-training trains on EVERY token; "
        "with assistant_only=True only on these.\n"
    )
    for i in range(min(args.n, len(ds))):
        print(f"--- conversation {i} (task {ds[i]['task']}) ---")
        print(show(tokenizer, loads(ds[i]), args.max_tokens, color))
        print()

    tds = tokenize_conversations(ds, tokenizer, max_tokens=args.max_tokens)
    lengths, tasks = tds["num_tokens"], tds["task"]
    by_task: dict[str, list[int]] = {}
    for n, task in zip(lengths, tasks):
        by_task.setdefault(task, []).append(n)
    print("Conversations and tokens per task:")
    print(f"  {'task':<18}{'conversations':>14}{'tokens':>14}{'mean tok/conv':>15}")
    for task, n_tok in sorted(by_task.items(), key=lambda kv: -len(kv[1])):
        print(f"  {task:<18}{len(n_tok):>14,}{sum(n_tok):>14,}{statistics.mean(n_tok):>15.1f}")
    total = sum(lengths)
    print(f"  {'total':<18}{len(lengths):>14,}{total:>14,}{total / len(lengths):>15.1f}")
    print(
        f"Tokens per conversation: min {min(lengths)}, median {statistics.median(lengths):g}, "
        f"mean {statistics.mean(lengths):.1f}, max {max(lengths)} (truncated at {args.max_tokens})"
    )
    stream = PackedStream(tds, max_seq_len=T, device_batch_size=B, rank=0, world_size=W)
    micro = stream.num_micro_batches()
    steps = stream.epoch_steps(grad_accum)  # what mid_train runs with num_iterations -1 (nanochat's epoch end)
    print(
        f"\nBatching: {W} rank(s) x {B} rows x {T} tokens, grad_accum {grad_accum} "
        f"-> {args.total_batch_size:,} tokens per optimizer step"
    )
    print(
        f"One epoch: {micro:,} micro-batches per rank -> {steps:,} optimizer steps "
        f"({steps * args.total_batch_size:,} tokens trained, the mixture has {total:,})"
    )
    if steps == 0:
        print("warning: the mixture is smaller than one optimizer step at these batch settings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
