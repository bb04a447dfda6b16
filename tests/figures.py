"""Figures the documentation quotes, read again from the files they cite.

A claim is a passage of a page with its figures left as placeholders, ``{expression|format}``,
and the result files the expressions read. Rendered from the files, the passage must appear in
the page word for word (whitespace aside): a figure that differs from its file, or a passage
reworded without its claim, fails. An expression is Python over the files (each a ``Data``
under its alias, ``f`` when a claim reads one file) and a few helpers: ``median``, ``lo``,
``hi``, ``spread`` (median with min–max), ``span`` (min–max). A format is Python's format
spec; a value of two numbers renders as a range ``a–b``, a negative number with a minus sign.

The pages cite result files by path under ``benchmarks/results/``, by a name found once there,
by a folder (everything under it) or a glob, or as a suffix of the file cited before it on the
same line (``h200_step_costs.json``, ``_135m.json``); :func:`cited_files` resolves them.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
PLACEHOLDER = re.compile(r"\{(?P<expr>[^{}|]+)(?:\|(?P<spec>[^{}|]*))?\}")


class Data:
    """A JSON value read by path: ``d.a.b``, ``d["key-with-dash"]``, ``d.runs[0]``, and
    ``d.runs.where(prompt_set="mtbench", concurrency=1)`` for the first list item whose fields
    equal the given ones."""

    def __init__(self, value: Any, where: str = ""):
        self.value, self.path = value, where

    def __getattr__(self, key: str) -> Data:
        if key.startswith("__"):
            raise AttributeError(key)
        return self[key]

    def __getitem__(self, key):
        """A dict or list as Data, a number or string as it is."""
        try:
            value = self.value[key]
            return (
                Data(value, f"{self.path}[{key!r}]") if isinstance(value, (dict, list)) else value
            )
        except (KeyError, IndexError, TypeError) as exc:
            raise LookupError(f"no {key!r} at {self.path or 'the top'}") from exc

    def where(self, **fields) -> Data:
        for i, item in enumerate(self.value):
            if all(item.get(k) == v for k, v in fields.items()):
                return Data(item, f"{self.path}[{i}]")
        raise LookupError(f"no item with {fields} in {self.path or 'the top'}")

    def match(self, pattern: str):
        """In a text file: the first group of ``pattern``, a number where it reads as one."""
        m = re.search(pattern, self.value)
        if not m:
            raise LookupError(f"{pattern!r} not in {self.path or 'the file'}")
        return number(m[1].replace(",", ""), m[1])

    def numbers(self, pattern: str) -> list[float]:
        """In a text file: the first group of every match of ``pattern``, as numbers."""
        found = [float(m[1].replace(",", "")) for m in re.finditer(pattern, self.value)]
        if not found:
            raise LookupError(f"{pattern!r} not in {self.path or 'the file'}")
        return found

    def row(self, label: str, part: int | None = None):
        """In a Markdown page: the cell after ``label`` in its table row (``part`` of it where
        the cell holds ``a / b``), a number where it reads as one."""
        m = re.search(rf"^\| {re.escape(label)} \| ([^|]*) \|", self.value, re.MULTILINE)
        if not m:
            raise LookupError(f"no row {label!r} in {self.path or 'the page'}")
        cell = m[1].strip()
        if part is not None:
            cell = cell.split(" / ")[part]
        return number(cell.replace(",", ""), cell)

    def each(self, key: str) -> list:
        return [item[key] for item in self.value]

    def __len__(self) -> int:
        return len(self.value)

    def __iter__(self):
        return (self[i] for i in range(len(self.value)))


def plain(x):
    """The value under a Data, lists of Data included."""
    if isinstance(x, Data):
        return x.value
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


def median(x) -> float:
    return statistics.median(plain(x))


def lo(x) -> float:
    return min(plain(x))


def hi(x) -> float:
    return max(plain(x))


def span(x) -> tuple[float, float]:
    values = plain(x)
    return (min(values), max(values))


@dataclass(frozen=True)
class Spread:
    """A median with its min–max, as the pages write one: ``m (a–b)``."""

    values: tuple

    def render(self, spec: str) -> str:
        """A unit after the format (``.2f×``, ``.1f s``) follows the median."""
        spec, unit = split_unit(spec)
        return f"{fmt(median(self.values), spec)}{unit} ({fmt(span(self.values), spec)})"


def split_unit(spec: str) -> tuple[str, str]:
    """A format spec and the unit written after it: ``.2f×`` → ``.2f``, ``×``; ``.1f s`` →
    ``.1f``, `` s``."""
    if " " in spec:
        spec, unit = spec.split(" ", 1)
        return spec, f" {unit}"
    unit = spec[len(spec.rstrip("×")) :]
    return spec.removesuffix(unit), unit


def spread(x) -> Spread:
    return Spread(tuple(plain(x)))


def clock(text: str) -> int:
    """Seconds since midnight of ``hh:mm:ss``."""
    h, m, sec = (int(x) for x in text.split(":"))
    return 3600 * h + 60 * m + sec


def loads(*runs: Data) -> list[float]:
    """The load averages a rounds benchmark recorded: before the servers, with them up, and
    after every round."""
    return [
        x
        for run in runs
        for x in (
            run.surroundings_before.loadavg_1m,
            run.surroundings_servers_up.loadavg_1m,
            *(r.after.loadavg_1m for r in run.rounds),
        )
    ]


HELPERS = {
    "loads": loads,
    "clock": clock,
    "median": median,
    "lo": lo,
    "hi": hi,
    "span": span,
    "spread": spread,
    "abs": abs,
    "len": len,
    "sum": sum,
    "round": round,
    "int": int,
    "zip": zip,
    "log2": math.log2,
    "min": min,
    "max": max,
}


def fmt(value, spec: str) -> str:
    value = plain(value)
    if isinstance(value, Spread):
        return value.render(spec)
    spec, unit = split_unit(spec)
    if unit:
        return fmt(value, spec) + unit
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return "–".join(fmt(v, spec) for v in value)
    if isinstance(value, int) and not spec:
        spec = ","
    text = format(value, spec)
    if not isinstance(value, (int, float)):
        return text
    if "e" in text:  # 4.8e-05 is written 4.8e-5
        return re.sub(r"e([+-])0*(\d)", lambda m: f"e{m[1].replace('+', '')}{m[2]}", text)
    return text.replace("-", "−")


def read(path: Path) -> Any:
    """JSON as parsed; a Snakemake job benchmark (.tsv) as its first row, numbers as floats;
    other files as text."""
    if path.suffix == ".json":
        return json.loads(path.read_text())
    if path.suffix == ".tsv":
        head, row = path.read_text().splitlines()[:2]
        return {k: number(v) for k, v in zip(head.split("\t"), row.split("\t"), strict=True)}
    return path.read_text()


def number(text: str, otherwise=None):
    """``text`` as an int or a float, else ``otherwise`` (``text`` itself if not given)."""
    try:
        return int(text) if text.lstrip("-").isdigit() else float(text)
    except ValueError:
        return text if otherwise is None else otherwise


@dataclass
class Claim:
    """``text`` of ``page`` (under the repository), its figures read from ``files`` (paths
    under ``benchmarks/results/`` or the repository, by alias; a single path is ``f``)."""

    page: str
    files: str | dict[str, str]
    text: str
    figures: int = field(init=False)

    def __post_init__(self):
        self.figures = len(PLACEHOLDER.findall(self.text))

    def paths(self) -> dict[str, Path]:
        files = {"f": self.files} if isinstance(self.files, str) else self.files
        return {alias: resolve(name) for alias, name in files.items()}

    def render(self) -> str:
        names = {alias: Data(read(path)) for alias, path in self.paths().items()}

        def one(m: re.Match) -> str:
            value = eval(m["expr"], {"__builtins__": {}, **HELPERS, **names})
            return fmt(value, m["spec"] or "")

        return PLACEHOLDER.sub(one, self.text)


def resolve(name: str) -> Path:
    for base in (RESULTS, REPO):
        if (base / name).exists():
            return base / name
    raise FileNotFoundError(f"{name}: not under benchmarks/results/ or the repository")


def normalized(text: str) -> str:
    return " ".join(text.split())


def missing(claims: list[Claim]) -> list[str]:
    """The claims whose rendered text is not on their page, each with what it rendered."""
    pages: dict[str, str] = {}
    out = []
    for claim in claims:
        if claim.page not in pages:
            pages[claim.page] = normalized((REPO / claim.page).read_text())
        try:
            rendered = normalized(claim.render())
        except Exception as exc:  # a missing file or key is a failed claim, said as such
            out.append(f"{claim.page}: {claim.text[:60]!r}: {type(exc).__name__}: {exc}")
            continue
        if rendered not in pages[claim.page]:
            out.append(f"{claim.page}: not found: {rendered!r}")
    return out


# --- which result files the pages cite ---------------------------------------------------

CODE = re.compile(r"`([^`\n]+)`|\]\(([^)\s]+)\)")
RESULT_NAME = re.compile(r"[\w.*{},/-]+\.(?:json|log|txt|png|md|tsv|xz|jsonl|html)$|[\w./-]+/$")


def tracked_results() -> set[str]:
    """Result files in the checkout, as paths under benchmarks/results/."""
    return {p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file()}


def expand_braces(name: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return [name]
    return [
        n
        for part in m[1].split(",")
        for n in expand_braces(name[: m.start()] + part + name[m.end() :])
    ]


def matches(name: str, files: set[str], previous: str | None, folders: list[str]) -> set[str]:
    """The result files ``name`` (as a page writes it) stands for; empty if none. ``previous``:
    the file cited before it in the same paragraph (for a suffix such as ``_t1.json``);
    ``folders``: the folders cited before it there (for a path under them)."""
    name = name.removeprefix("../").removeprefix("benchmarks/results/")
    if name.startswith("_") and previous:  # a suffix of the name before it
        where, _, stem = previous.rpartition("/")
        stem = stem.rsplit(".", 1)[0]
        for i in sorted((i for i, c in enumerate(f"{stem}_") if c == "_"), reverse=True):
            candidate = f"{where}/{stem[:i]}{name}".lstrip("/")
            if candidate in files:
                return {candidate}
        return set()
    found: set[str] = set()
    for each in expand_braces(name):
        under = [f"{folder}{each}" for folder in folders]
        if "*" in each:
            for pattern in [*under, each]:
                found |= {f for f in files if fnmatch.fnmatch(f, pattern)}
        elif each in files:
            found.add(each)
        elif any(u in files for u in under):
            found |= {u for u in under if u in files}
        else:  # a name or path found once among the files
            named = {f for f in files if f == each or f.endswith(f"/{each}")}
            found |= named if len(named) == 1 else set()
    return found


def needed(cited: set[str]) -> set[str]:
    """What cited JSON files name under a ``files`` key: the files their figures come from."""
    out: set[str] = set()

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "files" and isinstance(v, list):
                    out.update(f for f in v if isinstance(f, str))
                else:
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    for name in cited:
        if name.endswith(".json"):
            walk(json.loads((RESULTS / name).read_text()))
    return out


def paragraphs(text: str) -> list[str]:
    """A page's paragraphs, each table row one of its own (a citation's context is its
    paragraph: the folder or file cited before it there)."""
    out: list[str] = []
    block: list[str] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("|"):
            out.append("\n".join(block))
            block = []
            if line.strip():
                out.append(line)
        else:
            block.append(line)
    return [*out, "\n".join(block)]


def cited_files(pages: list[Path], files: set[str]) -> tuple[set[str], list[str]]:
    """The files of ``files`` the pages cite, and the citations of result files that name
    none. A folder cites nothing itself: it is the context of the paths after it."""
    cited: set[str] = set()
    unresolved = []
    for page in pages:
        for paragraph in paragraphs(page.read_text()):
            previous, folders = None, []
            for m in CODE.finditer(" ".join(paragraph.split("\n"))):  # code spans cross lines
                name = (m[1] or m[2] or "").strip()
                if not RESULT_NAME.fullmatch(name) or name.startswith(("http", "#")):
                    continue
                if name.endswith("/"):  # a folder, or one under a folder cited before it
                    name = name.removeprefix("../").removeprefix("benchmarks/results/")
                    folders += [f"{f}{name}" for f in folders if (RESULTS / f / name).is_dir()]
                    folders.append(name)
                    continue
                found = matches(name, files, previous, folders)
                if found:
                    cited |= found | needed(found)
                    previous = sorted(found)[0] if len(found) == 1 else previous
                elif looks_like_result(name):
                    unresolved.append(f"{page.relative_to(REPO)}: {name}")
        # a full path anywhere on the page, commands included
        for name in re.findall(r"benchmarks/results/([\w./*{},-]+[\w*])", page.read_text()):
            found = matches(name, files, None, [])
            cited |= found | needed(found)
    return cited, unresolved


def looks_like_result(name: str) -> bool:
    """A citation of a result file (under a folder of benchmarks/results/, or a suffix of the
    file cited before it) rather than of a config, a script or a run's output path."""
    name = name.removeprefix("../").removeprefix("benchmarks/results/")
    folders = {p.name for p in RESULTS.iterdir() if p.is_dir()}
    return name.startswith("_") or name.split("/")[0] in folders
