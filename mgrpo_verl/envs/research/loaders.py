"""Benchmark files in their published formats -> verl parquet rows (:func:`.dataset.make_row`).

GAIA, XBench-DeepSearch (decrypted with each row's canary, as xbench-evals does) and WebWalkerQA, read from
files the user downloads (nothing here fetches them); each loader returns a :class:`LoadedItems` counting the
rows read and skipped. The formats, their sources, our choices (GAIA's hidden answers refused, the levels):
``docs/research.md``, "Benchmark formats". CLI::

    python -m mgrpo_verl.envs.research.loaders BENCHMARK PATH --out OUT.parquet [--limit N]
"""

from __future__ import annotations

import argparse
import base64
import binascii
import csv
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from mgrpo_verl.envs.research import dataset

PathLike = Union[str, Path]

#: Skip reasons (the keys of :attr:`LoadedItems.skipped`).
EMPTY_QUESTION = "empty question"
EMPTY_ANSWER = "empty answer"
HIDDEN_ANSWER = "hidden answer '?' (GAIA test split)"
HAS_ATTACHMENT = "has an attachment (file_name)"
UNDECRYPTABLE = "undecryptable"

#: extra_info keys that make_row sets itself: no item meta may use them.
RESERVED_META_KEYS = frozenset({"split", "index", "question", "answers", "level", "source", "id"})

#: GAIA's hidden answer on the test split.
GAIA_HIDDEN = "?"
GAIA_SPLITS = ("validation", "test")
GAIA_FORMAT = (
    "GAIA metadata.jsonl / metadata.parquet (gaia-benchmark/GAIA, 2023/<split>/) with columns "
    "task_id, Question, Level, Final answer, file_name (and Annotator Metadata)"
)
XBENCH_FORMAT = (
    "the xbench-evals DeepSearch CSV (id,prompt,answer,reference_steps,canary; prompt and answer "
    "base64 of UTF-8 XOR the row's canary), or the same columns with plain-text prompt and answer"
)
WEBWALKER_FORMAT = (
    "WebWalkerQA rows (callanwu/WebWalkerQA): question, answer, root_url, info{domain, lang, type, "
    "difficulty_level, source_website, golden_path}, or the README's Question/Answer/Root_Url/"
    "Info{Hop, Domain, Language, Difficulty_Level, ...}"
)


class BenchmarkFormatError(ValueError):
    """A benchmark file that is not in the expected published format (the message says which)."""


class HiddenAnswersError(BenchmarkFormatError):
    """A GAIA file with hidden (``"?"``) answers: the test split, which cannot be scored."""


@dataclass(frozen=True)
class BenchmarkItem:
    """One benchmark question: ``id`` (the benchmark's, as text), ``question``, accepted ``answers``,
    ``level`` (``""`` when the benchmark has none) and small text-valued ``meta``."""

    id: str
    question: str
    answers: tuple[str, ...]
    level: str
    meta: dict[str, str] = field(default_factory=dict)


class LoadedItems(list):
    """The items a loader kept (a plain list of :class:`BenchmarkItem`), plus ``benchmark``, ``path``,
    ``rows_read`` (rows in the file) and ``skipped`` (reason -> count): ``rows_read == len + sum(skipped)``."""

    def __init__(
        self,
        items: Iterable[BenchmarkItem],
        *,
        benchmark: str,
        path: PathLike,
        rows_read: int,
        skipped: Mapping[str, int],
    ) -> None:
        super().__init__(items)
        self.benchmark = benchmark
        self.path = Path(path)
        self.rows_read = rows_read
        self.skipped = dict(skipped)

    def summary(self) -> str:
        """One line: rows read, kept, and skipped per reason."""
        skipped = sum(self.skipped.values())
        text = f"{self.benchmark}: read {self.rows_read} rows from {self.path}; kept {len(self)}; skipped {skipped}"
        if skipped:
            text += " (" + ", ".join(f"{reason}: {n}" for reason, n in sorted(self.skipped.items())) + ")"
        return text


# --------------------------------------------------------------------------------------------------------------
# XBench's published scheme: base64( UTF-8(text) XOR UTF-8(canary) repeated )


def _xor(data: bytes, key: bytes) -> bytes:
    if not key:
        raise ValueError("the XOR key (the row's canary) is empty")
    return bytes(byte ^ key[i % len(key)] for i, byte in enumerate(data))


def encrypt_xbench_text(text: str, key: str) -> str:
    """``text`` encrypted the way xbench-evals publishes it: base64 of its UTF-8 bytes XOR ``key``'s UTF-8
    bytes (the key repeated). Inverse of :func:`decrypt_xbench_text`; used to build test fixtures."""
    return base64.b64encode(_xor(text.encode("utf-8"), key.encode("utf-8"))).decode("ascii")


def decrypt_xbench_text(cipher: str, key: str) -> str:
    """The plain text of an xbench-evals cell: strict base64 decode, XOR with ``key``'s UTF-8 bytes, UTF-8 decode.

    Raises:
        ValueError: not base64, an empty key, or bytes that are not UTF-8 (wrong key).
    """
    try:
        raw = base64.b64decode(cipher.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not base64: {exc}") from None
    try:
        return _xor(raw, key.encode("utf-8")).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"decrypted bytes are not UTF-8 (wrong canary key?): {exc}") from None


def _is_base64(text: str) -> bool:
    if not text or len(text) % 4:
        return False
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


# --------------------------------------------------------------------------------------------------------------
# Reading files


def _pandas_na() -> Any:
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is a dependency
        return object()
    return pd.NA


def _plain(value: Any) -> Any:
    """numpy / pyarrow values from parquet as plain Python (arrays -> lists, scalars -> items)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is _pandas_na():
        return None
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return _plain(value.tolist())
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    return value


def _text(value: Any) -> str:
    """A cell as stripped text: missing / null / NaN -> ``""``, integral floats without ``.0``."""
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value.is_integer():
            return str(int(value))
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value).strip()


def _check_exists(path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")


def _read_json_lines(path: Path, text: str) -> list[Any]:
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as exc:
            raise BenchmarkFormatError(f"{path}: line {number} is not valid JSON ({exc})") from None
    return records


def read_records(path: PathLike) -> list[dict[str, Any]]:
    """The rows of a ``.jsonl``, ``.json`` (an array of objects, or JSON lines), ``.csv`` (UTF-8, BOM
    allowed; every cell text) or ``.parquet`` file, as dicts of plain Python values.

    Raises:
        FileNotFoundError: ``path`` does not exist or is a folder.
        BenchmarkFormatError: an unknown suffix, malformed JSON, or a row that is not an object.
    """
    path = Path(path)
    _check_exists(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is a folder, not a data file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pandas as pd

        try:
            frame = pd.read_parquet(path)
        except Exception as exc:  # pyarrow raises several types for a file that is not parquet
            raise BenchmarkFormatError(f"{path}: cannot read as parquet ({exc})") from None
        records: list[Any] = [_plain(r) for r in frame.to_dict(orient="records")]
    elif suffix == ".csv":
        with path.open(encoding="utf-8-sig", newline="") as handle:
            reader = csv.DictReader(handle)
            if reader.fieldnames is None:
                return []
            records = [{k: v for k, v in row.items() if k is not None} for row in reader]
    elif suffix in (".jsonl", ".json"):
        text = path.read_text(encoding="utf-8-sig")
        if suffix == ".json":
            try:
                value = json.loads(text)
            except ValueError:
                records = _read_json_lines(path, text)  # JSON lines under a .json name
            else:
                records = value if isinstance(value, list) else [value]
        else:
            records = _read_json_lines(path, text)
    else:
        raise BenchmarkFormatError(f"{path}: unknown file type {suffix!r}; expected .jsonl, .json, .csv or .parquet")
    for number, record in enumerate(records, start=1):
        if not isinstance(record, dict):
            raise BenchmarkFormatError(f"{path}: row {number} is {type(record).__name__}, not an object")
    return records


def _require_columns(
    path: Path, records: Sequence[Mapping[str, Any]], required: Mapping[str, Sequence[str]], fmt: str
) -> None:
    """Raise when a required column (any of its spellings) appears in no row: the message names them."""
    present = set().union(*(r.keys() for r in records)) if records else set()
    missing = [name for name, spellings in required.items() if not present.intersection(spellings)]
    if missing:
        found = ", ".join(sorted(present)) or "none"
        raise BenchmarkFormatError(
            f"{path}: missing column(s) {', '.join(missing)} (columns found: {found}); expected {fmt}"
        )


def _pick(record: Mapping[str, Any], spellings: Sequence[str]) -> Any:
    for key in spellings:
        if key in record:
            return record[key]
    return None


# --------------------------------------------------------------------------------------------------------------
# GAIA


def _gaia_file(path: Path, split_hint: Optional[str]) -> Path:
    _check_exists(path)
    if path.is_file():
        return path
    split = split_hint or "validation"
    folders = [path, path / split, path / "2023" / split]
    for folder in folders:
        for name in ("metadata.jsonl", "metadata.parquet"):
            if (folder / name).is_file():
                return folder / name
    looked = ", ".join(str(f / "metadata.{jsonl,parquet}") for f in folders)
    raise FileNotFoundError(f"no GAIA metadata file under {path} (looked for {looked})")


def _gaia_level(value: Any) -> str:
    text = _text(value)
    return str(int(text)) if text.isdigit() else text


def load_gaia(
    path: PathLike, *, split_hint: Optional[str] = None, text_only: bool = True, skip_hidden_answers: bool = False
) -> LoadedItems:
    """GAIA questions from ``path`` (a metadata file, a split folder, or the dataset root; see the module
    docstring). ``text_only`` skips the rows with an attachment; ``split_hint`` (``"validation"`` or
    ``"test"``) picks the split folder under a root and is recorded as ``meta["gaia_split"]`` (else the split
    is read from the path's folder names).

    Raises:
        FileNotFoundError: nothing at ``path``, or no metadata file in the folder.
        BenchmarkFormatError: a missing column (named).
        HiddenAnswersError: ``"?"`` answers (the test split) while ``skip_hidden_answers`` is false.
    """
    if split_hint not in (None, *GAIA_SPLITS):
        raise ValueError(f"split_hint must be one of {GAIA_SPLITS} or None, got {split_hint!r}")
    file = _gaia_file(Path(path), split_hint)
    records = read_records(file)
    required = {"task_id": ["task_id"], "Question": ["Question"], "Level": ["Level"], "Final answer": ["Final answer"]}
    if text_only:
        required["file_name"] = ["file_name"]
    _require_columns(file, records, required, GAIA_FORMAT)
    split = split_hint or next((part for part in reversed(file.parent.parts) if part in GAIA_SPLITS), "")

    hidden = sum(_text(r.get("Final answer")) == GAIA_HIDDEN for r in records)
    if hidden and not skip_hidden_answers:
        raise HiddenAnswersError(
            f"{file}: {hidden} of {len(records)} rows have the hidden answer {GAIA_HIDDEN!r} (GAIA's test split "
            "keeps its answers private), so they cannot be scored. Use the validation split "
            "(2023/validation/metadata.jsonl), or pass skip_hidden_answers=True (CLI: --skip-hidden) to leave "
            "those rows out (they are counted)."
        )
    items, skipped = [], Counter()
    for record in records:
        question = _text(record.get("Question"))
        answer = _text(record.get("Final answer"))
        file_name = _text(record.get("file_name"))
        if not question:
            skipped[EMPTY_QUESTION] += 1
        elif answer == GAIA_HIDDEN:
            skipped[HIDDEN_ANSWER] += 1
        elif not answer:
            skipped[EMPTY_ANSWER] += 1
        elif text_only and file_name:
            skipped[HAS_ATTACHMENT] += 1
        else:
            annotator = record.get("Annotator Metadata")
            annotator = annotator if isinstance(annotator, Mapping) else {}
            meta = {
                "gaia_split": split,
                "file_name": file_name,
                "steps": _text(annotator.get("Number of steps")),
                "tools": _text(annotator.get("Number of tools")),
            }
            level = _gaia_level(record.get("Level"))
            items.append(BenchmarkItem(_text(record.get("task_id")), question, (answer,), level, meta))
    return LoadedItems(items, benchmark="gaia", path=file, rows_read=len(records), skipped=skipped)


# --------------------------------------------------------------------------------------------------------------
# XBench-DeepSearch

_EDITION = re.compile(r"canary GUID\s+([^:\s]+):")


def load_xbench_deepsearch(path: PathLike, *, encrypted: Optional[bool] = None) -> LoadedItems:
    """XBench-DeepSearch questions from a CSV (or JSON / JSONL / parquet with the same columns).
    ``encrypted``: ``True`` (the published files), ``False`` (already decrypted), ``None`` (detect; see
    ``docs/research.md``, "Benchmark formats"). ``level`` is ``""``: the format has none.

    Raises:
        FileNotFoundError: nothing at ``path``.
        BenchmarkFormatError: a missing column (named), or an encrypted file in which no row decrypts.
    """
    file = Path(path)
    records = read_records(file)
    required = {"id": ["id"], "prompt": ["prompt"], "answer": ["answer"]}
    if encrypted:
        required["canary"] = ["canary"]
    _require_columns(file, records, required, XBENCH_FORMAT)
    if encrypted is None:
        prompts = [_text(r.get("prompt")) for r in records]
        prompts = [p for p in prompts if p]
        encrypted = bool(prompts) and any("canary" in r for r in records) and all(map(_is_base64, prompts))

    items, skipped = [], Counter()
    for record in records:
        canary = _text(record.get("canary"))
        question, answer = _text(record.get("prompt")), _text(record.get("answer"))
        if encrypted:
            try:
                question = decrypt_xbench_text(question, canary).strip() if question else ""
                answer = decrypt_xbench_text(answer, canary).strip() if answer else ""
            except ValueError:
                skipped[UNDECRYPTABLE] += 1
                continue
        if not question:
            skipped[EMPTY_QUESTION] += 1
        elif not answer:
            skipped[EMPTY_ANSWER] += 1
        else:
            match = _EDITION.search(canary)
            meta = {"edition": match.group(1) if match else ""}
            items.append(BenchmarkItem(_text(record.get("id")), question, (answer,), "", meta))
    if encrypted and records and skipped[UNDECRYPTABLE] == len(records):
        raise BenchmarkFormatError(
            f"{file}: none of its {len(records)} rows decrypts with its canary; expected {XBENCH_FORMAT} "
            "(pass encrypted=False / --plain for a decrypted file)"
        )
    return LoadedItems(items, benchmark="xbench_deepsearch", path=file, rows_read=len(records), skipped=skipped)


# --------------------------------------------------------------------------------------------------------------
# WebWalkerQA

_WW_FIELDS = {"question": ["question", "Question"], "answer": ["answer", "Answer"], "info": ["info", "Info"]}
_WW_ROOT = ["root_url", "Root_Url"]
_WW_INFO = {
    "type": ["type", "Hop"],
    "difficulty": ["difficulty_level", "Difficulty_Level"],
    "domain": ["domain", "Domain"],
    "lang": ["lang", "Language"],
}


def _norm_label(text: str) -> str:
    return re.sub(r"[\s-]+", "_", text.strip().lower())


def load_webwalkerqa(path: PathLike) -> LoadedItems:
    """WebWalkerQA questions from a JSON, JSONL or parquet file (either spelling: ``docs/research.md``).
    ``level`` is ``"<type>/<difficulty>"``, e.g. ``"multi_source/medium"`` (the parts present).

    Raises:
        FileNotFoundError: nothing at ``path``.
        BenchmarkFormatError: a missing column (named).
    """
    file = Path(path)
    records = read_records(file)
    _require_columns(file, records, _WW_FIELDS, WEBWALKER_FORMAT)
    items, skipped = [], Counter()
    for position, record in enumerate(records):
        question = _text(_pick(record, _WW_FIELDS["question"]))
        answer = _text(_pick(record, _WW_FIELDS["answer"]))
        if not question:
            skipped[EMPTY_QUESTION] += 1
            continue
        if not answer:
            skipped[EMPTY_ANSWER] += 1
            continue
        info = _pick(record, _WW_FIELDS["info"])
        if isinstance(info, str):
            try:
                info = json.loads(info)
            except ValueError:
                info = {}
        info = info if isinstance(info, Mapping) else {}
        meta = {key: _text(_pick(info, spellings)) for key, spellings in _WW_INFO.items()}
        meta["type"], meta["difficulty"] = _norm_label(meta["type"]), _norm_label(meta["difficulty"])
        meta["root_url"] = _text(_pick(record, _WW_ROOT))
        level = "/".join(part for part in (meta["type"], meta["difficulty"]) if part)
        items.append(BenchmarkItem(str(position), question, (answer,), level, meta))
    return LoadedItems(items, benchmark="webwalkerqa", path=file, rows_read=len(records), skipped=skipped)


# --------------------------------------------------------------------------------------------------------------
# Conversion and CLI

#: Benchmark name -> loader (each returns a :class:`LoadedItems`).
LOADERS: dict[str, Callable[..., LoadedItems]] = {
    "gaia": load_gaia,
    "xbench_deepsearch": load_xbench_deepsearch,
    "webwalkerqa": load_webwalkerqa,
}


def load(benchmark: str, path: PathLike, **options: Any) -> LoadedItems:
    """``LOADERS[benchmark](path, **options)``.

    Raises:
        ValueError: an unknown benchmark (the message lists the known ones).
    """
    if benchmark not in LOADERS:
        raise ValueError(f"unknown benchmark {benchmark!r}; known: {', '.join(sorted(LOADERS))}")
    return LOADERS[benchmark](path, **options)


def to_rows(benchmark: str, items: Sequence[BenchmarkItem], *, sub: str = "sub") -> list[dict[str, Any]]:
    """verl rows (``dataset.make_row``, split ``"test"``) for ``items``, indexed 0.. in order;
    ``extra_info`` gets ``id`` and the item's meta."""
    rows = []
    for index, item in enumerate(items):
        clash = RESERVED_META_KEYS.intersection(item.meta)
        if clash:
            raise ValueError(f"item {item.id!r}: meta keys {sorted(clash)} would overwrite extra_info's own")
        extra = {"id": item.id, **{k: str(v) for k, v in item.meta.items()}}
        rows.append(
            dataset.make_row(
                item.question,
                item.answers,
                source=benchmark,
                index=index,
                split="test",
                level=item.level,
                sub=sub,
                extra=extra,
            )
        )
    return rows


def convert(
    benchmark: str,
    path: PathLike,
    out_path: PathLike,
    *,
    limit: Optional[int] = None,
    sub: str = "sub",
    report: Optional[Callable[[str], Any]] = print,
    **options: Any,
) -> Path:
    """Load ``benchmark`` from ``path`` (``options`` go to its loader), keep the first ``limit`` items, and
    write them to the parquet ``out_path`` (parent folders created). ``report`` (default ``print``; ``None``
    for silence) receives the summary: rows read, kept, skipped per reason, and written.

    Raises:
        ValueError: an unknown benchmark, ``limit < 1``, or no item left to write (the summary says why);
            the loader's errors pass through.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    items = load(benchmark, path, **options)
    chosen = items[:limit] if limit is not None else list(items)
    if not chosen:
        raise BenchmarkFormatError(f"no rows to write: {items.summary()}")
    import pandas as pd

    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(to_rows(benchmark, chosen, sub=sub)).to_parquet(out)
    if report is not None:
        limited = f" (first {len(chosen)} of {len(items)}: --limit {limit})" if len(chosen) < len(items) else ""
        report(f"{items.summary()}\nwrote {len(chosen)} rows to {out}{limited}")
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mgrpo_verl.envs.research.loaders",
        description="Convert a benchmark file (published format) to verl's parquet layout.",
    )
    parser.add_argument("benchmark", choices=sorted(LOADERS))
    parser.add_argument("path", help="the benchmark file (GAIA: also its split folder or dataset root)")
    parser.add_argument("--out", required=True, help="output parquet path")
    parser.add_argument("--limit", type=int, default=None, help="keep the first N questions")
    parser.add_argument("--sub", default="sub", help="the sub-agent name the prompt uses")
    gaia = parser.add_argument_group("gaia")
    gaia.add_argument("--split", choices=GAIA_SPLITS, default=None, help="split folder under a GAIA root")
    gaia.add_argument("--with-attachments", action="store_true", help="keep questions with a file attachment")
    gaia.add_argument("--skip-hidden", action="store_true", help="leave out (and count) test-split '?' answers")
    xbench = parser.add_argument_group("xbench_deepsearch").add_mutually_exclusive_group()
    xbench.add_argument("--encrypted", dest="encrypted", action="store_true", default=None, help="cells are encrypted")
    xbench.add_argument("--plain", dest="encrypted", action="store_false", help="cells are already decrypted")
    args = parser.parse_args(argv)

    options: dict[str, Any] = {}
    gaia_flags = args.split is not None or args.with_attachments or args.skip_hidden
    if args.benchmark == "gaia":
        options = {
            "split_hint": args.split,
            "text_only": not args.with_attachments,
            "skip_hidden_answers": args.skip_hidden,
        }
    elif gaia_flags:
        parser.error("--split, --with-attachments and --skip-hidden apply to gaia only")
    if args.benchmark == "xbench_deepsearch":
        options = {"encrypted": args.encrypted}
    elif args.encrypted is not None:
        parser.error("--encrypted / --plain apply to xbench_deepsearch only")
    try:
        convert(args.benchmark, args.path, args.out, limit=args.limit, sub=args.sub, **options)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
