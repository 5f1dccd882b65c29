"""Chat with a nanochat-hf model, calculator tool included.

    python scripts/chat.py --model DIR_OR_REPO --prompt "What is 12*7+3?"     # one reply, then exit
    python scripts/chat.py --model DIR_OR_REPO                                # REPL: 'clear' resets, 'quit' ends

Tool calls are shown on their own lines: "[calculator] 12*7+3" then "[result] 87". A conversation longer than
the model's sequence_len (minus --max-new-tokens) is cut to <|bos|> and its most recent tokens, with a note.
"""

from __future__ import annotations

import argparse
import sys

from nanochat_hf.errors import OneLineArgumentParser, UserError, add_version, run_cli

PROG = "chat"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="model directory or Hub repo id (tokenizer alongside)")
    parser.add_argument("--prompt", default=None, help="answer this one message and exit (default: interactive)")
    parser.add_argument("--temperature", type=float, default=0.6, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=50, help="0 = no top-k filtering")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="default: 256, or half the model's sequence_len if that is less",
    )
    parser.add_argument("--seed", type=int, default=None, help="make sampling reproducible")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument(
        "--dtype", choices=["bfloat16", "float32"], default=None, help="default: bfloat16 on cuda, float32 on cpu"
    )
    parser.add_argument(
        "--num-threads",
        "--num_threads",
        type=int,
        default=None,
        help="CPU threads, 1 to the cores (default: the cores idle when it starts, as mid_train)",
    )
    add_version(parser)
    return parser.parse_args(argv)


class ReplyPrinter:
    """A generate() streamer printing reply tokens as they come: text streamed, tool calls and results on lines
    of their own. (generate() calls a streamer's put and end only; transformers' BaseStreamer declares just those,
    and subclassing it would import torch before the arguments are read.)"""

    def __init__(self, tokenizer, at_line_start: bool = True, out=None):
        # imported here, as in chat(): beyond the package (torch, the model), what a reply needs is loaded once the
        # arguments are checked
        from nanochat_hf.inference import tool_part_tokens
        from nanochat_hf.tokenizer.chat_format import PYTHON, PYTHON_OUTPUT

        self.tokenizer, self.out = tokenizer, out or sys.stdout
        opening, self.closers, self.stops = tool_part_tokens(tokenizer)
        labels = {PYTHON: "  [calculator] ", PYTHON_OUTPUT: "  [result] "}
        self.openers = {token: labels[part] for token, part in opening.items()}
        self.run: list[int] = []
        self.shown = ""
        self.line_start = at_line_start
        self.prompt_seen = False

    def put(self, value) -> None:
        if not self.prompt_seen:  # generate() first hands over the prompt
            self.prompt_seen = True
            return
        for token in value.reshape(-1).tolist():  # one conversation: one token per step
            self(token)

    def end(self) -> None:
        self.flush()

    def __call__(self, token: int) -> None:
        if token in self.stops:
            self.flush()
            return
        if token in self.openers or token in self.closers:
            self.flush()
            self.run, self.shown = [], ""
            if token in self.closers:
                self.write("\n")
            else:  # a tool line starts on a line of its own
                self.write(("" if self.line_start else "\n") + self.openers[token])
            return
        self.run.append(token)
        text = self.tokenizer.decode(self.run)
        if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            self.write(text[len(self.shown) :])
            self.shown = text

    def flush(self) -> None:
        text = self.tokenizer.decode(self.run)
        self.write(text[len(self.shown) :])
        self.shown = text

    def write(self, s: str) -> None:
        if s:
            self.out.write(s)
            self.out.flush()
            self.line_start = s.endswith("\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_cli(PROG, lambda: chat(args))


def chat(args: argparse.Namespace) -> int:
    """One reply (--prompt) or the REPL; bad input (arguments, the model folder) raises UserError or OSError."""
    if (args.max_new_tokens is not None and args.max_new_tokens < 1) or args.temperature < 0 or args.top_k < 0:
        raise UserError("--max-new-tokens must be >= 1, --temperature >= 0, --top-k >= 0")

    import torch

    from nanochat_hf.inference import fit_prompt, generate_tokens, parts_from_tokens
    from nanochat_hf.tokenizer import BOS_TOKEN, render_for_completion
    from nanochat_hf.training.device import check_num_threads, use_cpu_threads
    from nanochat_hf.training.model_source import load_pretrained

    check_num_threads(args.num_threads, f"--num-threads {args.num_threads}")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = (
        getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    )
    top_k = args.top_k or None
    model, tokenizer = load_pretrained(args.model, dtype)
    model = model.to(device).eval()

    sequence_len = model.config.sequence_len
    if args.max_new_tokens is None:
        args.max_new_tokens = min(256, sequence_len // 2)
    if args.max_new_tokens > sequence_len - 2:
        raise UserError(
            f"--max-new-tokens {args.max_new_tokens} leaves no room for a prompt within the model's "
            f"sequence_len {sequence_len}"
        )
    if device.startswith("cpu"):  # measured as the work starts, after any bad input
        print(f"{PROG}: {use_cpu_threads(args.num_threads, flag='--num-threads')}", file=sys.stderr, flush=True)

    def reply(messages: list[dict], at_line_start: bool) -> dict:
        prompt = render_for_completion(tokenizer, {"messages": messages}, max_tokens=None)  # fit_prompt keeps the end
        fitted = fit_prompt(prompt, sequence_len, args.max_new_tokens)
        if len(fitted) < len(prompt):
            print(
                f"note: the conversation is {len(prompt)} tokens, more than the "
                f"model's sequence_len {sequence_len} minus --max-new-tokens {args.max_new_tokens}: the model sees "
                f"{BOS_TOKEN} and the last {len(fitted) - 1} tokens",
                file=sys.stderr,
            )
        printer = ReplyPrinter(tokenizer, at_line_start)
        (tokens,) = generate_tokens(
            model, tokenizer, [fitted], args.max_new_tokens, args.temperature, top_k, args.seed, streamer=printer
        )
        if not printer.line_start:
            printer.write("\n")
        return {"role": "assistant", "content": parts_from_tokens(tokenizer, tokens)}

    if args.prompt is not None:
        reply([{"role": "user", "content": args.prompt}], at_line_start=True)
        return 0

    print("nanochat-hf chat. 'clear' starts a new conversation, 'quit' or Ctrl-D ends.")
    messages: list[dict] = []
    while True:
        try:
            line = input("\nUser: ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if line.lower() in ("quit", "exit"):
            return 0
        if line.lower() == "clear":
            messages = []
            print("(conversation cleared)")
            continue
        if not line:
            continue
        messages.append({"role": "user", "content": line})
        print("Assistant: ", end="", flush=True)
        try:
            messages.append(reply(messages, at_line_start=False))
        except KeyboardInterrupt:  # Ctrl-C stops the reply; the unanswered message is dropped
            messages.pop()
            print("\n(interrupted)")


if __name__ == "__main__":
    sys.exit(main())
