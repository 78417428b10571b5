"""Browse a run's rollout dumps in the terminal: ``python -m search_rl.tools.rollout_viewer RUN_DIR_OR_FILE``.

Opens ``<run>/rollouts/*.jsonl`` (training and validation dumps) and ``<run>/eval/*/trajectories.jsonl``
(``main_eval``), or one such file. The left pane lists trajectories; the right pane shows the selected one turn by
turn: the model's thoughts, its search queries, the retrieved passages (inserted ``<information>`` tokens that the
losses never see, drawn on a dark background and labelled "masked"), the answer, the gold answers and the reward.
Filter by data source, reward, step and free text (question, response, answer, gold, outcome: ``read_wrong``,
``retrieval_missed``, ..., where a read-wrong answer came from: ``gold_passage``, ...). Keys: ``/`` search,
``n``/``p`` next/previous trajectory, ``q`` quit. The record format is in docs/training.md ("Metrics and rollout
dumps"); the viewer needs no tokenizer. Each search lists the retrieval entry it used (``retrieval_key``, in runs that
record retrievals); with ``--recording FILE`` (``retriever.recording.path``) the passages stored there are shown too,
in full, as the search backend returned them.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Footer, Header, Input, Select, Static

from search_rl.logging_setup import MESSAGE_FORMAT, configure_logging
from search_rl.rollout.backends import DocumentEntry, Entry, RecordingStore
from search_rl.tracking.jsonl import read_jsonl

logger = logging.getLogger(__name__)

ALL = "__all__"
REWARD_FILTERS = {ALL: "any reward", "positive": "reward > 0", "zero": "reward = 0"}
TAG_RE = re.compile(r"<(think|search|answer)>(.*?)(</\1>|$)", re.DOTALL)
TAG_STYLES = {"think": "italic grey70", "search": "bold cyan", "answer": "bold green"}
OBSERVATION_STYLE = "white on grey15"


@dataclass(frozen=True)
class Filters:
    """What the list shows: every field narrows it; ``ALL`` / empty means no constraint."""

    source: str = ALL
    reward: str = ALL
    step: str = ALL
    text: str = ""


def dump_files(target: Path) -> list[Path]:
    """The dump files of a run folder (train/val dumps, then eval trajectories), or ``[target]`` for a file.

    Raises:
        FileNotFoundError: nothing to show there.
    """
    if target.is_file():
        return [target]
    files = sorted((target / "rollouts").glob("*.jsonl")) + sorted(target.glob("eval/*/trajectories.jsonl"))
    files += [] if files else sorted(target.glob("trajectories.jsonl"))
    if not files:
        raise FileNotFoundError(
            f"no rollout dumps under {target} (expected rollouts/*.jsonl or eval/*/trajectories.jsonl; "
            "runs write them with trainer.dump_rollouts=true)"
        )
    return files


def load_records(target: Path) -> list[dict[str, Any]]:
    """Every record of every dump file, each with ``_file`` set to the file it came from."""
    records: list[dict[str, Any]] = []
    for path in dump_files(target):
        records.extend({**record, "_file": path.name} for record in read_jsonl(path))
    return records


def matches(record: dict[str, Any], f: Filters) -> bool:
    """Whether ``record`` passes the filters (text search is case-insensitive)."""
    if f.source != ALL and record.get("data_source") != f.source:
        return False
    reward = float(record.get("reward") or 0.0)
    if (f.reward == "positive" and reward <= 0) or (f.reward == "zero" and reward != 0):
        return False
    if f.step != ALL and f"{record.get('kind')}:{record.get('step')}" != f.step:
        return False
    if f.text:
        keys = ("question", "response", "answer", "uid", "data_source", "outcome", "answer_source")
        haystack = " ".join(str(record.get(k) or "") for k in keys) + " ".join(record.get("gold") or [])
        return f.text.lower() in haystack.lower()
    return True


def filter_records(records: Sequence[dict[str, Any]], f: Filters) -> list[int]:
    """Indices of the records that pass ``f``."""
    return [i for i, r in enumerate(records) if matches(r, f)]


def model_text(text: str) -> Text:
    """A model segment with its ``<think>``, ``<search>`` and ``<answer>`` blocks styled (unclosed ones too)."""
    out = Text()
    pos = 0
    for m in TAG_RE.finditer(text):
        out.append(text[pos : m.start()])
        tag, body = m.group(1), m.group(2)
        label = {"think": "thought", "search": "SEARCH", "answer": "ANSWER"}[tag]
        out.append(f"[{label}] ", style=TAG_STYLES[tag] + " reverse" if tag != "think" else TAG_STYLES[tag])
        out.append(body.strip(), style=TAG_STYLES[tag])
        out.append("\n")
        pos = m.end()
    out.append(text[pos:])
    return out


def retrieval_text(record: dict[str, Any], recording: RecordingStore | None = None) -> Text:
    """Each search of a record with its retrieval entry, and with ``recording`` that entry's stored passages."""
    out = Text()
    calls = record.get("search_calls") or []
    keys = [c.get("retrieval_key") for c in calls]
    wanted = [k for k in keys if k]
    stored: dict[str, Entry | DocumentEntry] = (
        {**recording.get_many(wanted), **recording.get_documents(wanted)} if recording is not None else {}
    )
    for i, call in enumerate(calls, 1):
        key = call.get("retrieval_key")
        where = f"entry {key}" if key else "not recorded"
        tool = call.get("tool", "search")  # records name a tool only when it is not search
        out.append(f"{tool} {i}: {call.get('query')!r} · {'FAILED · ' if call.get('failed') else ''}{where}\n")
        entry = stored.get(key) if key else None
        if recording is not None and key and entry is None:
            out.append(f"  (not in {recording.path})\n", style="red")
        for j, passage in enumerate(entry.passages if entry else (), 1):
            out.append(f"  Doc {j} [{passage.id}] {passage.title}: ", style="bold")
            out.append(f"{passage.text}\n", style=OBSERVATION_STYLE)
    return out


def render_record(record: dict[str, Any], recording: RecordingStore | None = None) -> Text:
    """The whole trajectory as styled text: header, turns (model vs retrieved), answer, gold, reward, and each search's
    retrieval entry (with ``recording``, its stored passages)."""
    out = Text()
    out.append(f"{record.get('question', '')}\n", style="bold")
    out.append(
        f"{record.get('kind')} step {record.get('step')} · {record.get('data_source')} · uid {record.get('uid')} "
        f"sample {record.get('sample')} · {record.get('_file', '')}\n\n",
        style="grey62",
    )
    turn = 0
    for seg in record.get("segments") or [{"kind": "model", "text": record.get("response", "")}]:
        if seg["kind"] == "model":
            turn += 1
            out.append(
                f"── turn {turn} · model ({seg.get('end', 0) - seg.get('start', 0)} tokens, mask 1) ──\n",
                style="bold yellow",
            )
            out.append(model_text(seg["text"].strip()))
        else:
            out.append(
                f"\n── retrieved / feedback · masked ({seg.get('end', 0) - seg.get('start', 0)} tokens, "
                "mask 0: never trained) ──\n",
                style="bold magenta",
            )
            out.append(seg["text"].strip(), style=OBSERVATION_STYLE)
        out.append("\n\n")
    components = record.get("reward_components") or {}
    out.append("answer:   ", style="bold")
    out.append(f"{record.get('answer')!s}\n", style="green" if record.get("answer") else "red")
    out.append("gold:     ", style="bold")
    out.append(" | ".join(record.get("gold") or []) + "\n")
    out.append("reward:   ", style="bold")
    out.append(f"{float(record.get('reward') or 0):.3f}  ", style="bold green" if record.get("reward") else "bold red")
    out.append(" ".join(f"{k}={v:.2f}" for k, v in components.items()) + "\n")
    if record.get("outcome"):  # dumps from before the search diagnostics have none
        out.append("outcome:  ", style="bold")
        out.append(
            f"{record['outcome']} · gold retrieved: {'yes' if record.get('gold_retrieved') else 'no'}"
            + (f" · answer from: {record['answer_source']}" if record.get("answer_source") else "")
            + "\n",
            style="bold green" if record["outcome"] == "correct" else "bold red",
        )
    stats = record.get("stats") or {}
    out.append(
        f"stop: {record.get('stop_reason')} · turns {stats.get('turns')} · searches {stats.get('searches')} · "
        f"invalid actions {stats.get('invalid_actions')} · advantage {record.get('advantage')} · "
        f"tokens {record.get('model_tokens')}/{record.get('response_tokens')} model/response\n",
        style="grey62",
    )
    if record.get("search_calls"):
        out.append("\nretrievals:\n", style="bold")
        out.append(retrieval_text(record, recording))
    return out


def _options(values: Iterable[str], all_label: str) -> list[tuple[str, str]]:
    return [(all_label, ALL)] + [(v, v) for v in sorted(set(values))]


class RolloutViewer(App[None]):
    """The TUI: filters on top, the trajectory list on the left, the selected trajectory on the right."""

    TITLE = "search-rl rollout viewer"
    CSS = """
    #filters { height: 3; }
    #filters Select { width: 24; }
    #filters Input { width: 1fr; }
    #table { width: 52; }
    #detail { width: 1fr; padding: 0 1; }
    """
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("slash", "focus_search", "search"),
        Binding("n", "move(1)", "next"),
        Binding("p", "move(-1)", "previous"),
    ]

    def __init__(
        self, records: list[dict[str, Any]], source_name: str = "", recording: RecordingStore | None = None
    ) -> None:
        super().__init__()
        self.records, self.recording = records, recording
        self.sub_title = f"{source_name} · {len(records)} trajectories"
        self.filters = Filters()
        self.shown: list[int] = list(range(len(records)))

    def compose(self) -> ComposeResult:
        steps = [f"{r.get('kind')}:{r.get('step')}" for r in self.records]
        yield Header()
        with Horizontal(id="filters"):
            yield Select(
                _options((str(r.get("data_source")) for r in self.records), "all sources"),
                value=ALL,
                allow_blank=False,
                id="source",
            )
            yield Select(
                [(label, key) for key, label in REWARD_FILTERS.items()], value=ALL, allow_blank=False, id="reward"
            )
            yield Select(_options(steps, "all steps"), value=ALL, allow_blank=False, id="step")
            yield Input(placeholder="search question, response, answer, gold ...", id="search")
        with Horizontal():
            yield DataTable(id="table", cursor_type="row", zebra_stripes=True)
            with VerticalScroll(id="detail"):
                yield Static(id="body")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("step", "src", "reward", "srch", "question")
        self.refresh_table()
        table.focus()

    def refresh_table(self) -> None:
        """Re-apply the filters and refill the list (the first match is shown)."""
        self.shown = filter_records(self.records, self.filters)
        table = self.query_one(DataTable)
        table.clear()
        for i in self.shown:
            r = self.records[i]
            table.add_row(
                f"{str(r.get('kind'))[0]}{r.get('step')}",
                str(r.get("data_source")),
                f"{float(r.get('reward') or 0):.2f}",
                str((r.get("stats") or {}).get("searches", "")),
                str(r.get("question", ""))[:40],
                key=str(i),
            )
        self.show_record(self.shown[0] if self.shown else None)

    def show_record(self, index: int | None) -> None:
        body = self.query_one("#body", Static)
        body.update(
            render_record(self.records[index], self.recording) if index is not None else Text("no trajectory matches")
        )
        self.query_one("#detail", VerticalScroll).scroll_home(animate=False)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self.show_record(int(event.row_key.value))

    def on_select_changed(self, event: Select.Changed) -> None:
        value = str(event.value)
        field = {"source": "source", "reward": "reward", "step": "step"}[event.select.id or ""]
        self.filters = Filters(**{**self.filters.__dict__, field: value})
        self.refresh_table()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filters = Filters(**{**self.filters.__dict__, "text": event.value})
        self.refresh_table()

    def action_focus_search(self) -> None:
        self.query_one(Input).focus()

    def action_move(self, delta: int) -> None:
        table = self.query_one(DataTable)
        table.focus()
        if table.row_count:
            table.move_cursor(row=max(0, min(table.row_count - 1, table.cursor_row + delta)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", type=Path, help="a run folder, or one dump file (rollouts/*.jsonl, trajectories.jsonl)")
    ap.add_argument("--recording", type=Path, help="the run's retrieval recording (retriever.recording.path)")
    args = ap.parse_args(argv)
    configure_logging(fmt=MESSAGE_FORMAT)
    try:
        records = load_records(args.target)
        recording = RecordingStore(args.recording, read_only=True) if args.recording else None
    except FileNotFoundError as e:
        logger.error("%s", e)
        return 2
    RolloutViewer(records, str(args.target), recording).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
