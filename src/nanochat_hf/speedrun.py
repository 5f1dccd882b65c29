"""nanochat HEAD's runs/speedrun.sh as one resumable chain of this project's scripts (scripts/speedrun.py).

Each stage is one command line (a subprocess of the stage's script, printed before it runs) that writes one folder
of the run folder; when it succeeds, `_speedrun.json` in that folder records its command, wall time and numbers.
A re-run skips the recorded stages (and says so) and starts at the first unfinished one; a training stage
interrupted mid-way resumes its newest intact checkpoint. A stage that fails stops the chain with one line naming
it, its command and how to resume; every finished stage's folder is kept. The end: report.md, the numbers HEAD's
speedrun prints per stage and their wall times, and a model card (README.md) in every model folder.
"""

from __future__ import annotations

import json
import random
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .atomic import write_text
from .errors import UserError, one_line
from .jsonfile import read_json, write_json

ROOT = Path(__file__).resolve().parents[2]  # the repository: scripts/ and configs/
MARKER = "_speedrun.json"  # "_*": Trainer.push_to_hub never uploads it
SETTINGS_FILE = "speedrun.json"
REPORT = "report.md"

# HEAD's speedrun on one 8-GPU node (runs/speedrun.sh at 92d63d4): 170 train shards (+ the validation shard),
# tok_train's defaults, base_train d24 (configs/base_d24.yaml), chat_sft / chat_eval with their defaults
FULL = dict(
    num_shards=170,
    vocab_size=32768,
    max_chars=2_000_000_000,
    base_config="configs/base_d24.yaml",
    sft_config="configs/sft_nanochat.yaml",
    rl_config="configs/rl_nanochat.yaml",
)
# the offline demo: synthetic shards, a tiny vocabulary and depth, the SFT demo mixture (2 CPU cores, minutes)
DEMO = dict(
    num_shards=3,
    docs_per_shard=2000,
    vocab_size=1024,
    max_chars=2_000_000,
    depth=2,
    base_steps=40,
    save_every=20,  # base_train's checkpoints, which an interrupted stage resumes
    sft_steps=60,
    core_rows=20,  # rows of each of the demo bundle's three CORE tasks
    chat_problems=16,
    rl_rows=8,  # demo GSM8K-layout problems: 2 steps of 4
    rl_eval=4,  # pass@k problems, at step 0 and the last
    rl_tokens=48,  # rl_demo.yaml's max_new_tokens
    base_config="configs/base_demo.yaml",
    sft_config="configs/sft_demo.yaml",
    rl_config="configs/rl_demo.yaml",
)


@dataclass
class Stage:
    name: str
    folder: str  # under the run folder (or an absolute path)
    what: str
    command: list[str] | None  # None: done in this process by `action`
    action: Callable[[], None] | None = None
    metrics: Callable[[], dict] = dict
    checkpoints: bool = False  # a training stage: resumes its newest checkpoint-<step>
    log: bool = False  # its output is also written to <folder>/<name>.log


@dataclass
class Speedrun:
    run_dir: Path
    demo: bool = False
    rl: bool = False
    gpus: int = 8
    data_dir: Path | None = None
    bundle_dir: str | None = None
    fp8: bool = False
    argv: list[str] = field(default_factory=list)  # the speedrun command, for the model cards

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir).expanduser().absolute()
        self.data_dir = (
            Path(self.data_dir).expanduser().absolute() if self.data_dir else self.run_dir / "base_data_climbmix"
        )
        self.sizes = DEMO if self.demo else FULL

    # ------------------------------------------------------------------------------------------------ commands
    def path(self, folder: str) -> Path:
        return self.run_dir / folder

    def launch(self, script: str, *args: str) -> list[str]:
        """`python scripts/<script>.py ...`, or under `accelerate launch` on several processes."""
        head = [sys.executable]
        if self.gpus > 1:
            head += ["-m", "accelerate.commands.launch", "--num_processes", str(self.gpus)]
        return [*head, str(ROOT / "scripts" / f"{script}.py"), *args]

    def stages(self) -> list[Stage]:
        s, d, demo = self.sizes, str(self.data_dir), self.demo
        tok, base, sft, rl = (str(self.path(f)) for f in ("tokenizer", "base", "sft", "rl"))
        base_args = [str(ROOT / s["base_config"]), "--data_dir", d, "--tokenizer_dir", tok, "--output_dir", base]
        if demo:
            base_args += ["--demo_data", "false", "--depth", str(s["depth"]), "--num_iterations", str(s["base_steps"])]
            base_args += ["--sample_every", "-1", "--save_every", str(s["save_every"])]
        if self.fp8:
            base_args += ["--fp8", "true"]
        core_args = ["--model", base, "--csv", str(self.path("base_eval") / "core.csv")]
        core_args += ["--json", str(self.path("base_eval") / "core.json"), "--data_dir", d]
        core_args += ["--device_batch_size", "8", "--split_tokens", "16384"] if demo else ["--device_batch_size", "16"]
        if demo:
            core_args += ["--bundle_dir", str(self.path("base_eval") / "eval_bundle"), "--max_per_task", "-1"]
        elif self.bundle_dir:
            core_args += ["--bundle_dir", self.bundle_dir]
        sft_args = [str(ROOT / s["sft_config"]), "--model_source", base, "--output_dir", sft]
        if demo:  # the chat evaluation is its own stage
            sft_args += ["--num_iterations", str(s["sft_steps"]), "--chat_eval_tasks", "", "--torch_compile", "false"]
        chat_args = ["--model", sft, "--json", str(self.path("chat_eval") / "scores.json")]
        if demo:
            chat_args += ["--tasks", "SpellingBee", "--max_problems", str(s["chat_problems"])]
        tok_args = ["--data_dir", d, "--output_dir", tok, "--vocab_size", str(s["vocab_size"])]
        tok_args += ["--max_chars", str(s["max_chars"]), "--overwrite"]  # a half-written tokenizer is replaced
        tok_eval_args = ["--tokenizer_dir", tok, "--data_dir", d, *(["--offline"] if demo else [])]
        stages = [
            Stage(
                "data", d, "pretraining shards", None, self.make_shards, self.data_metrics
            ),  # its record: beside the shards
            Stage(
                "tokenizer",
                "tokenizer",
                "tok_train",
                self.launch1("tok_train", *tok_args),
                None,
                self.tokenizer_metrics,
            ),
            Stage(
                "tok_eval",
                "tok_eval",
                "tok_eval",
                self.launch1("tok_eval", *tok_eval_args),
                None,
                self.tok_eval_metrics,
                log=True,
            ),
            Stage(
                "base",
                "base",
                "base_train",
                self.launch("base_train", *base_args),
                None,
                self.base_metrics,
                checkpoints=True,
            ),
            Stage(
                "base_eval",
                "base_eval",
                "base_eval (CORE)",
                self.launch("base_eval", *core_args),
                self.make_demo_bundle if demo else None,
                self.core_metrics,
                log=True,
            ),
            Stage(
                "sft",
                "sft",
                "SFT (mid_train)",
                self.launch("mid_train", *sft_args),
                None,
                self.sft_metrics,
                checkpoints=True,
            ),
            Stage(
                "chat_eval",
                "chat_eval",
                "chat_eval",
                self.launch("chat_eval", *chat_args),
                None,
                self.chat_metrics,
                log=True,
            ),
        ]
        if self.rl:
            rl_args = [str(ROOT / s["rl_config"]), "--model_source", sft, "--output_dir", rl]
            if demo:
                rl_args += ["--demo_rows", str(s["rl_rows"]), "--eval_examples", str(s["rl_eval"]), "--eval_every", "2"]
                rl_args += ["--max_new_tokens", str(s["rl_tokens"])]
            stages.append(
                Stage(
                    "rl",
                    "rl",
                    "chat_rl (GSM8K)",
                    self.launch("chat_rl", *rl_args),
                    None,
                    self.rl_metrics,
                    checkpoints=True,
                )
            )
        return stages

    def launch1(self, script: str, *args: str) -> list[str]:
        """Single-process stages (tokenizer training and its table)."""
        return [sys.executable, str(ROOT / "scripts" / f"{script}.py"), *args]

    # ------------------------------------------------------------------------------------------- data stages
    def make_shards(self) -> None:
        """The demo's synthetic shards; else the local folder when it holds shards; else HEAD's `python -m
        nanochat.dataset -n 170` from the hub (the first N train shards and the validation shard)."""
        from .data.pretraining import HUB_DATASET, HUB_LAST_SHARD, shard_name, write_synthetic_shards

        folder = self.data_dir
        have = sorted(folder.glob("shard_*.parquet")) if folder.is_dir() else []
        if self.demo:
            if not have:
                write_synthetic_shards(folder, self.sizes["num_shards"], self.sizes["docs_per_shard"], seed=0)
            return
        wanted = [shard_name(i) for i in range(self.sizes["num_shards"])] + [shard_name(HUB_LAST_SHARD)]
        missing = [n for n in wanted if not (folder / n).is_file()]
        if have and len(have) >= 2 and not (folder / shard_name(HUB_LAST_SHARD)).is_file():
            return  # a local folder of one's own shards (the last is the validation shard): used as it is
        if missing:
            from huggingface_hub import constants, hf_hub_download

            if constants.HF_HUB_OFFLINE:
                raise UserError(
                    f"{folder}: {len(missing)} of HEAD's shards missing and HF_HUB_OFFLINE is set: put shards there "
                    "(--data_dir) or go online"
                )
            for i, name in enumerate(missing):
                print(f"speedrun: downloading {HUB_DATASET}/{name} ({i + 1}/{len(missing)})", flush=True)
                hf_hub_download(HUB_DATASET, name, repo_type="dataset", local_dir=folder)

    def data_metrics(self) -> dict:
        from .data.pretraining import list_shards

        shards = list_shards(self.data_dir)
        return {"shards": len(shards), "folder": str(self.data_dir), "synthetic": self.demo}

    def make_demo_bundle(self) -> None:
        """The demo's CORE bundle, in the eval bundle's layout: three small tasks (one per task kind) built from
        the synthetic shards' validation documents (next words), so the offline chain runs CORE's code."""
        import pyarrow.parquet as pq

        from .data.pretraining import list_shards

        folder = self.path("base_eval") / "eval_bundle"
        if (folder / "core.yaml").is_file():
            return
        docs = [t.split() for t in pq.read_table(list_shards(self.data_dir)[-1], columns=["text"])["text"].to_pylist()]
        docs = [w for w in docs if len(w) >= 12][: 2 * self.sizes["core_rows"]]
        rng, rows = random.Random(0), self.sizes["core_rows"]
        mc, schema, lm = [], [], []
        for i, words in enumerate(docs[:rows]):
            other = docs[rows + i]
            choices = [" ".join(words[8:12]), " ".join(other[8:12]), " ".join(other[:4]), " ".join(words[:4])]
            gold = rng.randrange(4)
            choices[0], choices[gold] = choices[gold], choices[0]
            mc.append({"query": " ".join(words[:8]), "choices": choices, "gold": gold})
            schema.append({"context_options": [" ".join(words[:8]), " ".join(other[:8])],
                           "continuation": " ".join(words[8:12]), "gold": 0})  # fmt: skip
            lm.append({"context": " ".join(words[:10]), "continuation": words[10]})
        tasks = [("demo_next_words", "multiple_choice", mc, 25), ("demo_context", "schema", schema, 50),
                 ("demo_next_word", "language_modeling", lm, 0)]  # fmt: skip
        yaml = ["icl_tasks:"]
        meta = ["Eval Task,Task Category,Task Type,#shots,#datapoints,Random baseline,Centered Metric?,Description"]
        (folder / "eval_data" / "demo").mkdir(parents=True, exist_ok=True)
        for label, kind, data, baseline in tasks:
            write_text(folder / "eval_data" / "demo" / f"{label}.jsonl", "".join(json.dumps(r) + "\n" for r in data))
            yaml += ["-", f"  label: {label}", f"  dataset_uri: demo/{label}.jsonl", "  num_fewshot: [0]",
                     f"  icl_task_type: {kind}"]  # fmt: skip
            meta.append(f"{label},demo,{kind.replace('_', ' ')},0,{len(data)},{baseline},,synthetic (speedrun demo)")
        write_text(folder / "eval_meta_data.csv", "\n".join(meta) + "\n")
        write_text(folder / "core.yaml", "\n".join(yaml) + "\n")

    # ----------------------------------------------------------------------------------------------- numbers
    def tokenizer_metrics(self) -> dict:
        from .tokenizer.nanochat_format import load_tokenizer_dir

        return {"vocab_size": len(load_tokenizer_dir(self.path("tokenizer"), False))}

    def tok_eval_metrics(self) -> dict:
        """Ours' bytes per token on tok_eval's texts (the column HEAD's report keeps)."""
        from .data.pretraining import list_shards
        from .tokenizer import compression
        from .tokenizer.nanochat_format import load_tokenizer_dir

        encoder = compression.Encoder.of_transformers(load_tokenizer_dir(self.path("tokenizer"), False))
        results = compression.compression(encoder, compression.eval_texts(list_shards(self.data_dir)))
        return {f"ratio {name}": round(r["ratio"], 4) for name, r in results.items()}

    def trained(self, folder: str) -> dict:
        """steps, tokens seen and the last / minimum val bpb of a Trainer run's folder."""
        out = self.path(folder)
        state = read_json(out / "trainer_state.json")
        args = read_json(out / "training_args.json")
        bpb = [h["eval_val_bpb"] for h in state["log_history"] if "eval_val_bpb" in h]
        steps = state["global_step"]
        batch = args.get("total_batch_size")
        return {
            "steps": steps,
            "tokens": steps * batch if isinstance(batch, int) and batch > 0 else None,
            "val bpb": round(bpb[-1], 6) if bpb else None,
            "min val bpb": round(min(bpb), 6) if bpb else None,
        }

    def base_metrics(self) -> dict:
        return self.trained("base")

    def core_metrics(self) -> dict:
        """CORE and each task's centered score (core.json), train / val bpb (the lines base_eval prints)."""
        core = read_json(self.path("base_eval") / "core.json")
        log = (self.path("base_eval") / "base_eval.log").read_text(encoding="utf-8")
        bpb = {f"{m[1]} bpb": float(m[2]) for m in re.finditer(r"^(train|val) bpb: ([0-9.]+)$", log, re.M)}
        tasks = core.get("results", {})
        return {"CORE": round(core["core_metric"], 4), **bpb, **{k: round(v, 4) for k, v in tasks.items()}}

    def sft_metrics(self) -> dict:
        return self.trained("sft")

    def chat_scores(self) -> list:
        """chat_eval's scores.json as the evaluation's TaskScore rows."""
        from .evaluation.chat_eval import TaskScore

        rows = read_json(self.path("chat_eval") / "scores.json", expect_object=False)
        return [TaskScore(**{k: r[k] for k in ("task", "mode", "accuracy", "baseline", "n")}) for r in rows]

    def chat_metrics(self) -> dict:
        from .evaluation.chat_eval import chatcore

        scores = self.chat_scores()
        return {**{s.task: round(s.accuracy, 4) for s in scores}, "ChatCORE": round(chatcore(scores), 4)}

    def rl_metrics(self) -> dict:
        state = read_json(self.path("rl") / "trainer_state.json")
        passk = [h for h in state["log_history"] if "pass@1" in h]
        last = {k: round(v, 4) for k, v in passk[-1].items() if k.startswith("pass@")} if passk else {}
        return {"steps": state["global_step"], **last}

    # --------------------------------------------------------------------------------------------- the chain
    def check_settings(self) -> None:
        """A run folder belongs to one kind of run: the demo and the full run never mix in it."""
        settings = {"demo": self.demo, "data_dir": str(self.data_dir), "gpus": self.gpus, "fp8": self.fp8}
        path = self.run_dir / SETTINGS_FILE
        if path.is_file():
            old = read_json(path)
            changed = [k for k in settings if k in old and old[k] != settings[k]]
            if changed:
                k = changed[0]
                raise UserError(
                    f"{path}: this run folder was started with {k}={old[k]!r}, not {settings[k]!r}: re-run with the "
                    "same settings, or use another --run_dir"
                )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_json(path, settings)

    def done(self, stage: Stage) -> dict | None:
        marker = self.path(stage.folder) / MARKER
        return read_json(marker) if marker.is_file() else None

    def run(self) -> Path:
        self.check_settings()
        stages = self.stages()
        for script in {c for st in stages if st.command for c in st.command if c.endswith(".py")}:
            if not Path(script).is_file():
                raise UserError(f"{script}: missing (the speedrun runs from a checkout of nanochat-hf)")
        for i, stage in enumerate(stages):
            record = self.done(stage)
            if record:
                say(f"[{i + 1}/{len(stages)}] {stage.name}: done before ({record['seconds']:.0f} s), skipped")
                continue
            self.run_stage(stage, f"[{i + 1}/{len(stages)}]")
        self.write_cards(stages)
        return self.write_report(stages)

    def run_stage(self, stage: Stage, counter: str) -> None:
        folder = self.path(stage.folder)
        command = list(stage.command) if stage.command else None
        if (
            stage.checkpoints
            and command
            and any((p / "trainer_state.json").is_file() for p in folder.glob("checkpoint-*"))
        ):
            command += ["--resume_from_checkpoint", "true"]
            say(f"{counter} {stage.name}: resuming its newest checkpoint in {folder}")
        say(f"{counter} {stage.name} ({stage.what})" + (f": {shlex.join(command)}" if command else ""))
        start = time.time()
        try:
            if stage.action:
                stage.action()
            if command:
                folder.mkdir(parents=True, exist_ok=True)
                code = run_command(command, folder / f"{stage.name}.log" if stage.log else None)
                if code != 0:
                    raise StageFailed(stage, command, f"exit code {code}", self.resume_line())
            metrics = stage.metrics()
        except (UserError, OSError, KeyError, ValueError) as e:
            if isinstance(e, StageFailed):
                raise
            raise StageFailed(stage, command, one_line(e), self.resume_line()) from None
        seconds = time.time() - start
        record = {
            "stage": stage.name,
            "seconds": round(seconds, 1),
            "command": shlex.join(command) if command else None,
            "metrics": metrics,
            "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        }
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / MARKER, record)
        say(f"{counter} {stage.name}: done in {seconds:.0f} s " + json.dumps(metrics))

    def resume_line(self) -> str:
        return shlex.join(["python", "scripts/speedrun.py", *self.argv])

    def records(self, stages: list[Stage]) -> list[tuple[Stage, dict]]:
        return [(st, self.done(st)) for st in stages]

    def write_report(self, stages: list[Stage]) -> Path:
        """report.md (printed too): nanochat's summary table (CORE of the base model, the chat scores of SFT,
        pass@k of RL), then every stage's numbers and wall time, then the commands."""
        recs = {st.name: rec for st, rec in self.records(stages)}
        columns = {
            "BASE": [("base", ["val bpb"]), ("base_eval", ["train bpb", "val bpb", "CORE"])],
            "SFT": [("sft", ["val bpb"]), ("chat_eval", None)],
            "RL": [("rl", None)],
        }
        summary = {}
        for column, sources in columns.items():
            for stage, keys in sources:
                if stage in recs:
                    m = recs[stage]["metrics"]
                    summary.setdefault(column, {}).update({k: m[k] for k in keys or m if k in m and k != "steps"})
        metrics = list(dict.fromkeys(k for col in summary.values() for k in col))
        kind = "offline demo" if self.demo else f"d24 on {self.gpus} processes"
        lines = [f"# nanochat-hf speedrun report ({kind})", "", f"Run folder: `{self.run_dir}`", "", "## Summary", ""]
        lines += ["| Metric | " + " | ".join(summary) + " |", "|---" * (len(summary) + 1) + "|"]
        lines += [f"| {k} | " + " | ".join(str(col.get(k, "-")) for col in summary.values()) + " |" for k in metrics]
        total = sum(rec["seconds"] for rec in recs.values())
        lines += ["", f"Total wall clock time: {format_seconds(total)}", "", "## Stages", ""]
        lines += ["| stage | wall time | numbers |", "|---|---|---|"]
        for name, rec in recs.items():
            numbers = ", ".join(f"{k} {v}" for k, v in rec["metrics"].items() if v is not None)
            lines.append(f"| {name} | {format_seconds(rec['seconds'])} | {numbers} |")
        lines += ["", "## Commands", ""]
        lines += [f"- {name}: `{rec['command']}`" for name, rec in recs.items() if rec["command"]]
        text = "\n".join(lines) + "\n"
        path = self.run_dir / REPORT
        write_text(path, text)
        print(text, flush=True)
        return path

    def write_cards(self, stages: list[Stage]) -> None:
        """A model card in each published folder (tokenizer, base, sft, rl): its stage, data, tokens seen, scores
        and the command that made it; mid_train's and chat_rl's own card keep their content, this is added."""
        recs = dict((st.name, rec) for st, rec in self.records(stages))
        data = "synthetic shards (offline demo)" if self.demo else "karpathy/climbmix-400b-shuffle"
        speedrun = shlex.join([sys.executable, "scripts/speedrun.py", *self.argv])
        for name, evaluations in (("tokenizer", ["tok_eval"]), ("base", ["base_eval"]), ("sft", ["chat_eval"]),
                                  ("rl", [])):  # fmt: skip
            if name not in recs:
                continue
            rec = recs[name]
            stage_data = {
                "sft": f"the mixture of {self.sizes['sft_config']}",
                "rl": f"GSM8K ({self.sizes['rl_config']})",
            }
            lines = [f"## Speedrun stage: {name}", "", f"- made by: `{rec['command']}`", f"- chain: `{speedrun}`",
                     f"- data: {stage_data.get(name, data)}"]  # fmt: skip
            tokens = rec["metrics"].get("tokens")
            if tokens:
                lines.append(f"- tokens seen: {tokens:,} ({rec['metrics']['steps']} steps)")
            for ev in evaluations:
                if ev in recs:
                    lines.append(f"- {ev}: " + ", ".join(f"{k} {v}" for k, v in recs[ev]["metrics"].items()))
            for k, v in rec["metrics"].items():
                if k not in ("tokens", "steps"):
                    lines.append(f"- {k}: {v}")
            scores = self.chat_scores() if name == "sft" and "chat_eval" in recs else []
            dataset = data if name in ("tokenizer", "base") else None
            write_card(self.path(name), name, "\n".join(lines) + "\n", dataset, scores)


class StageFailed(UserError):
    def __init__(self, stage: Stage, command: list[str] | None, why: str, resume: str) -> None:
        self.stage = stage
        what = f" ({shlex.join(command)})" if command else ""
        super().__init__(
            f"stage {stage.name} failed: {why}{what}; the finished stages are kept: run the same command again to "
            f"resume at {stage.name} ({resume})"
        )


def write_card(folder: Path, stage: str, section: str, dataset: str | None, scores: list) -> None:
    """README.md with the hub metadata (huggingface_hub's ModelCard; the chat scores as its model-index); an
    existing card (mid_train's, chat_rl's) keeps its text and metadata and gets the section, once."""
    from huggingface_hub import ModelCard, ModelCardData

    from .evaluation import model_index_results

    path = folder / "README.md"
    start = "<!-- speedrun -->"
    if path.is_file():
        card = ModelCard.load(path)
    else:
        data = ModelCardData(
            license="mit",
            language=["en"],
            library_name="transformers" if stage != "tokenizer" else "tokenizers",
            tags=["nanochat", "nanochat-speedrun", stage],
            datasets=[dataset] if dataset and "/" in dataset else None,
            pipeline_tag="text-generation" if stage != "tokenizer" else None,
        )
        what = "nanochat's tokenizer" if stage == "tokenizer" else "nanochat's GPT"
        card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n# {folder.name}\n\n{what}, made by nanochat-hf's speedrun.\n")
    card.data.tags = list(dict.fromkeys([*(card.data.tags or []), "nanochat-speedrun", stage]))
    if scores:
        card.data.eval_results, card.data.model_name = model_index_results(scores), folder.name
    card.text = f"{card.text.split(start)[0].rstrip()}\n\n{start}\n{section}"
    write_text(path, str(card))


def run_command(command: list[str], log: Path | None) -> int:
    """The command with its output on the console (and in `log`); its exit code."""
    if log is None:
        return subprocess.run(command, cwd=ROOT).returncode
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p, \
            open(log, "w", encoding="utf-8") as f:  # fmt: skip
        for line in p.stdout:
            sys.stdout.write(line)
            f.write(line)
        sys.stdout.flush()
    return p.returncode


def format_seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def say(line: str) -> None:
    print(f"speedrun: {line}", flush=True)


def speedrun(argv: list[str], **options) -> Path:
    """The chain; StageFailed (a UserError) when a stage fails."""
    return Speedrun(argv=argv, **options).run()
