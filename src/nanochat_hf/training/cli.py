"""mid_train's command line without the training stack: the defaults, aliases and refusals of its arguments, the
config file, the --help text, and an instant answer to --help, --version and argument errors.

`MidTrainingArguments` (a transformers `TrainingArguments`, in `arguments.py`) defines the arguments; parsing them
needs torch and transformers, seconds of imports. So that `mid_train --help` and a mistyped flag answer at once,
`answer_quickly` parses the command line first with a plain argparse parser rebuilt from `ARGUMENTS_FILE`, a
description of MidTrainingArguments' parser (option strings, types, defaults, help) written by
`python -m nanochat_hf.training.arguments` and checked against the real parser by the tests. It prints exactly
what the real parser would (the same actions, defaults and help), and steps aside (the real parse then answers)
whenever it could differ: another transformers version than the file's, --inherit_from_base (the defaults come
from a checkpoint's meta), a value of a type it does not know (the real parse checks it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from importlib.metadata import version
from pathlib import Path

import yaml

from ..errors import OneLineArgumentParser, UserError, add_version, error_line, first_rank

PROG = "mid_train"
DESCRIPTION = (
    "Mid-train a nanochat model: mid_train.py [config.yaml] [--flag value ...]. The defaults shown are the ones this "
    "command line gets: a config file's values, else the demo config's unless --model_source names a model."
)
ARGUMENTS_FILE = Path(__file__).with_name("mid_train_arguments.json")

# The demo run's settings (also `configs/demo.yaml`, a link to this file): used when neither a config file nor a
# --model_source other than "demo" is given. Flags still override them.
DEMO_CONFIG = Path(__file__).with_name("demo.yaml")

# nanochat knob -> the TrainingArguments field it is an alias of
ALIASES = {
    "num_iterations": "max_steps",
    "device_batch_size": "per_device_train_batch_size",
    "eval_every": "eval_steps",
}

# TrainingArguments fields this recipe does not read: setting one (to anything but its default) is an error.
REFUSED = {
    "learning_rate": "use matrix_lr / embedding_lr / unembedding_lr (nanochat's per-group rates) and init_lr_frac",
    "lr_scheduler_type": "the schedule is nanochat's (constant, then linear to 0 over the last warmdown_ratio of "
    "progress)",
    "lr_scheduler_kwargs": "the schedule is nanochat's (constant, then linear to 0 over the last warmdown_ratio of "
    "progress)",
    "warmup_steps": "nanochat's schedule has no LR warm-up (Muon's momentum warms up over 300 steps)",
    "optim": "the optimizer is nanochat's Muon + AdamW (matrix_lr, embedding_lr, unembedding_lr, weight_decay)",
    "optim_args": "the optimizer is nanochat's Muon + AdamW (matrix_lr, embedding_lr, unembedding_lr, weight_decay)",
    "optim_target_modules": "Muon takes every transformer.h matrix, AdamW the embedding and lm_head",
    "adam_beta1": "nanochat's AdamW betas are fixed at (0.8, 0.95)",
    "adam_beta2": "nanochat's AdamW betas are fixed at (0.8, 0.95)",
    "adam_epsilon": "nanochat's AdamW eps is fixed at 1e-10",
    "fp16": "use dtype (auto, bfloat16, float32): nanochat trains in bfloat16 autocast on CUDA",
    "num_train_epochs": "use num_iterations (-1 = one epoch of the train mixture, N = N optimizer steps)",
    "label_smoothing_factor": "nanochat trains on plain cross-entropy",
    "auto_find_batch_size": "set device_batch_size (grad accumulation is derived from total_batch_size)",
    "dataloader_num_workers": "the per-rank token stream keeps its position in the main process",
    "ignore_data_skip": "the data position is restored from the checkpoint, never skipped",
    "average_tokens_across_devices": "nanochat's loss is the per-micro-batch mean / grad accumulation",
}

# Our --help text for the TrainingArguments fields this recipe reads with a meaning of its own (the rest keep
# transformers' text and meaning).
HELP = {
    "resume_from_checkpoint": "true: continue from the newest intact checkpoint-<step> in output_dir (a damaged newer "
    "one is skipped, saying why); or a checkpoint folder. Every file is checked first; any number of processes "
    "may resume it (the same device_batch_size and total_batch_size: the data keeps the run's shards)",
    "torch_compile": "compile the training step with torch.compile (on CPU this needs a C++ compiler; the first steps "
    "take a minute or more longer); false: eager",
    "save_total_limit": "keep at most this many checkpoint-<step> folders (the best one is kept)",
    "load_best_model_at_end": "load the best checkpoint at the end (with --metric_for_best_model val_bpb)",
    "metric_for_best_model": "val_bpb (lower is better) picks the best checkpoint",
    "disable_tqdm": "no progress bar (the bar is drawn only when stdout and stderr are a terminal)",
    "push_to_hub": "push the final model (and checkpoints, see hub_strategy) to hub_model_id",
    "ddp_timeout": "seconds a process waits for the others at a collective before failing (every backend)",
}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """One default per knob: the value a run gets (a config file's included). None is not shown (the help says what
    it means), nor on an alias (its knob shows it) or where the help states the default itself."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or "default" in text or text.startswith("alias of"):
            return text
        return super()._get_help_string(action)


def own_help(parser: argparse.ArgumentParser, refused: Iterable[str] = REFUSED) -> None:
    """Refused fields hidden from --help (still parsed, to refuse them in one line), our texts, one default each."""
    for action in parser._actions:  # a bool field defaulting to True has a second, --no_<name> action
        if action.dest in refused:
            action.help = argparse.SUPPRESS
    actions = {a.dest: a for a in parser._actions if a.help != argparse.SUPPRESS}
    for name, text in HELP.items():
        actions[name].help = text
    for knob, hf in ALIASES.items():  # a knob left at None takes its alias' value
        shown = actions[knob].default if actions[knob].default is not None else actions[hf].default
        actions[knob].help = f"{actions[knob].help} (default: {shown})"


def config_defaults(path: Path, known: set[str]) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} not found")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(e, "problem", None) or "malformed"
        raise UserError(f"config file {path}: not valid YAML{line} ({problem})") from None
    if not isinstance(values, dict):
        raise UserError(f"config file {path}: expected a mapping of argument names to values")
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserError(f"config file {path}: unknown argument(s) {', '.join(unknown)}")
    return values


def flags(argv: list[str]) -> set[str]:
    return {a[2:].split("=")[0] for a in argv if a.startswith("--")}


def drop_overridden(values: dict, argv: list[str]) -> dict:
    """A config value of an alias pair gives way to a flag naming EITHER name of the pair."""
    given = flags(argv)
    pairs = [*ALIASES.items(), ("dtype", "bf16")]
    overridden = {name for pair in pairs if given & set(pair) for name in pair}
    return {k: v for k, v in values.items() if k not in overridden}


def config_file(argv: list[str], known: set[str]) -> dict | None:
    """The defaults a config file at the front of `argv` gives (popped from it), less a value of an alias pair a
    flag overrides; None without one (`--flag=x.yaml` is a flag)."""
    if argv and argv[0].endswith((".yaml", ".yml")) and not argv[0].startswith("-"):
        return drop_overridden(config_defaults(Path(argv.pop(0)), known), argv)
    return None


def config_for(argv: list[str], known: set[str], peek_parser: argparse.ArgumentParser) -> dict:
    """The defaults a config file gives (popped from the front of `argv`), else the demo config's unless
    --model_source names a model; a value of an alias pair a flag overrides is left out. `peek_parser` is an empty
    parser of the caller's class, to read --model_source as the real parse will."""
    if (values := config_file(argv, known)) is not None:
        return values
    peek_parser.add_argument("--model_source", default=None)
    source = peek_parser.parse_known_args(argv)[0].model_source
    if source in (None, "", "demo"):
        return drop_overridden(config_defaults(DEMO_CONFIG, known), argv)
    return {}


def string_to_bool(v) -> bool:
    """transformers.hf_argparser.string_to_bool (the same name and errors: argparse names the type in its message)."""
    if isinstance(v, bool):
        return v
    if v.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if v.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(
        f"Truthy value expected: got {v} but expected one of yes/no, true/false, t/f, y/n, 1/0 (case insensitive)."
    )


def choice_type(choices: list):
    """transformers' `make_choice_type_function`: a value given as text becomes the choice it spells."""
    by_text = {str(c): c for c in choices}
    return lambda arg: by_text.get(arg, arg)


# the argparse action classes and value types MidTrainingArguments' parser uses, by the names the file stores
ACTIONS = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_StoreConstAction": "store_const",
    "_AppendAction": "append",
}
TYPES = {"int": int, "float": float, "str": str, "string_to_bool": string_to_bool, "text": str}
KEYS = ("option_strings", "dest", "nargs", "const", "default", "type", "choices", "required", "help", "metavar")


def _plain(value):
    """A default or choice as the file stores it: JSON values as they are, anything else as its text (how --help
    shows it)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) and all(v is None or isinstance(v, (bool, int, float, str)) for v in value):
        return list(value)
    return str(value)


def describe(parser: argparse.ArgumentParser) -> dict:
    """The description of `parser`'s arguments that `ARGUMENTS_FILE` holds (--help's own action left out)."""
    actions = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        kind = ACTIONS.get(type(action).__name__)
        if kind is None:
            raise TypeError(f"argument {action.dest}: argparse's {type(action).__name__} is not described")
        type_name = None if action.type is None else getattr(action.type, "__name__", "")
        if type_name not in (None, *TYPES) and not (type_name == "<lambda>" and action.choices):
            type_name = "text"  # another type (a dict, an enum list): any text passes here, the real parse checks it
        entry = {key: getattr(action, key) for key in KEYS}
        entry.update(
            action=kind,
            type=type_name,
            default=_plain(action.default),
            const=_plain(action.const),
            choices=None if action.choices is None else [_plain(c) for c in action.choices],
        )
        actions.append(entry)
    return {"transformers": version("transformers"), "actions": actions}


def described_parser(description: dict, prog: str = PROG, text: str = DESCRIPTION) -> OneLineArgumentParser:
    """A plain argparse parser with the described arguments."""
    parser = OneLineArgumentParser(prog=prog, formatter_class=HelpFormatter, description=text)
    for a in description["actions"]:
        kwargs = {"dest": a["dest"], "default": a["default"], "help": a["help"], "required": a["required"]}
        if a["action"] == "store":
            kwargs.update(nargs=a["nargs"], const=a["const"], choices=a["choices"], metavar=a["metavar"])
            kwargs["type"] = choice_type(a["choices"]) if a["type"] == "<lambda>" else TYPES.get(a["type"])
        elif a["action"] == "store_const":
            kwargs["const"] = a["const"]
        parser.add_argument(*a["option_strings"], action=a["action"], **kwargs)
    return parser


def answer_quickly(argv: list[str] | None = None) -> None:
    """Answer --help, --version and argument errors of mid_train as the real parse would, without importing torch
    or transformers (exit 0 after help or version, 2 after an error line); return when the command line parses or
    when only the real parse can tell (see the module's docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "inherit_from_base" in flags(argv):
        return
    peek = OneLineArgumentParser(prog=PROG, add_help=False)
    quick_answer(argv, ARGUMENTS_FILE, PROG, DESCRIPTION, lambda argv, known: config_for(argv, known, peek))


def quick_answer(
    argv: list[str],
    arguments_file: Path,
    prog: str,
    text: str,
    config: Callable[[list[str], set[str]], dict | None],
    refused: Iterable[str] = REFUSED,
) -> None:
    """`answer_quickly` of a script: its parser rebuilt from `arguments_file`, `config(argv, known)` the defaults its
    config file gives (popping it from argv), `refused` the fields its --help hides."""
    try:
        description = json.loads(arguments_file.read_text())
    except (OSError, ValueError):  # a damaged or missing file: the real parse answers
        return
    if description["transformers"] != version("transformers"):
        return
    parser = described_parser(description, prog, text)
    known = {action.dest for action in parser._actions}
    try:
        parser.set_defaults(**(config(argv, known) or {}))
    except (UserError, OSError) as e:  # the config file: the line run.py says for it
        if first_rank():
            print(error_line(prog, e), file=sys.stderr, flush=True)
        sys.exit(2)
    add_version(parser)
    own_help(parser, refused)
    unknown = parser.parse_known_args(argv)[1]
    if unknown:  # as parse_args in arguments.py says it
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
