"""Readers for the LM probes' data: CoNLL-style BIO files and plain entity lists (LM_PROBE_SPEC "Data").

A BIO dataset is a folder holding one file per split; the split of a file is read from its name
(``*train*``, ``*test*``, ``*dev*`` / ``*valid*``; CoNLL's ``eng.testa`` is dev, ``eng.testb`` test), so the original layouts load as they are
(CoNLL-2003 ``train.txt``/``valid.txt``/``test.txt``, WNUT2017 ``wnut17train.conll``/``emerging.test.annotated``,
MIT Movie ``engtrain.bio``/``engtest.bio``). An entity list is a file, or a folder of files, with one
``entity<TAB>type`` per line (e.g. DBpedia dumps).

Formats (registry :data:`DATASET_FORMATS`):

* ``conll2003``  word in the first column, tag in the last; PER/LOC/ORG -> person/location/organisation,
  MISC dropped (the paper types only these three).
* ``wnut2017``   word first, tag last; person, location, corporation, group, product, creative-work
  -> "creative work".
* ``mit_movie``  tag in the FIRST column, word in the second (the MIT layout). Slots merged as in the
  paper: ACTOR and DIRECTOR -> person, TITLE and SONG -> creative work; every other slot (genre,
  rating, CHARACTER, ...) is dropped. Tags are matched case-insensitively so the trivia10k13 variant
  (``B-Actor``) reads too.
* ``bio``        any other BIO file: word first, tag last, type names lower-cased as they are.
* ``entity_list`` one entity and its type per line, tab-separated.

Tags may be IOB2 (B-/I-), IOB1 (the original CoNLL-2003: an I- tag may open an entity) or BIOES.
Sentences are token tuples; their text is the tokens joined by single spaces.

Raw sentences are data, not logs: nothing in this module prints or logs them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from iclmem.atomic import write_text_atomic
from iclmem.errors import DataError
from iclmem.registry import Registry

__all__ = [
    "Span",
    "Sentence",
    "LMDataset",
    "DatasetFormat",
    "DATASET_FORMATS",
    "canonical_type",
    "parse_bio_lines",
    "read_bio",
    "read_entity_list",
    "load_dataset",
    "entity_table",
    "write_bio",
]

# Canonical type names used by every probe (keywords, thresholds, reports).
_TYPE_ALIASES = {
    "per": "person",
    "persons": "person",
    "people": "person",
    "loc": "location",
    "org": "organisation",
    "organization": "organisation",
    "creative-work": "creative work",
    "creative_work": "creative work",
    "creativework": "creative work",
    "work": "creative work",
}


def canonical_type(raw: str) -> str:
    """Lower-case a type name and fold the usual aliases (ORG, organization, creative-work, ...)."""
    t = re.sub(r"\s+", " ", str(raw).strip().lower())
    return _TYPE_ALIASES.get(t, t)


@dataclass(frozen=True)
class Span:
    """An entity: tokens ``[start, end)`` of its sentence, with a canonical type."""

    start: int
    end: int
    type: str


@dataclass(frozen=True)
class Sentence:
    tokens: tuple[str, ...]
    spans: tuple[Span, ...] = ()

    @property
    def text(self) -> str:
        return " ".join(self.tokens)

    def entity_text(self, span: Span) -> str:
        return " ".join(self.tokens[span.start : span.end])

    def entities(self, entity_type: str | None = None) -> list[str]:
        """Entity strings of ``entity_type`` (all types when None), in sentence order."""
        return [self.entity_text(s) for s in self.spans if entity_type is None or s.type == entity_type]

    def has_type(self, entity_type: str) -> bool:
        return any(s.type == entity_type for s in self.spans)

    def replace_spans(self, replacements: Mapping[int, str]) -> Sentence:
        """A copy with span ``i`` replaced by the (whitespace-split) string ``replacements[i]``."""
        tokens: list[str] = []
        spans: list[Span] = []
        pos = 0
        for i, s in enumerate(self.spans):
            tokens.extend(self.tokens[pos : s.start])
            words = replacements[i].split() if i in replacements else list(self.tokens[s.start : s.end])
            start = len(tokens)
            tokens.extend(words)
            spans.append(Span(start, len(tokens), s.type))
            pos = s.end
        tokens.extend(self.tokens[pos:])
        return Sentence(tuple(tokens), tuple(spans))


@dataclass(frozen=True)
class DatasetFormat:
    name: str
    tag_column: int  # 0 = first column, -1 = last
    word_column: int
    type_map: Mapping[str, str] | None  # raw upper-cased type -> canonical; None keeps every type
    default_types: tuple[str, ...] = ()
    is_entity_list: bool = False

    def map_type(self, raw: str) -> str | None:
        if self.type_map is None:
            return canonical_type(raw)
        return self.type_map.get(raw.strip().upper())


DATASET_FORMATS: Registry[DatasetFormat] = Registry("LM dataset format")
for _fmt in (
    DatasetFormat("conll2003", -1, 0, {"PER": "person", "LOC": "location", "ORG": "organisation"},
                  ("person", "location", "organisation")),
    DatasetFormat("wnut2017", -1, 0,
                  {"PERSON": "person", "LOCATION": "location", "CORPORATION": "corporation",
                   "GROUP": "group", "PRODUCT": "product", "CREATIVE-WORK": "creative work"},
                  ("person", "location", "corporation", "group", "product", "creative work")),
    DatasetFormat("mit_movie", 0, 1,
                  {"ACTOR": "person", "DIRECTOR": "person", "TITLE": "creative work", "SONG": "creative work"},
                  ("person", "creative work")),
    DatasetFormat("bio", -1, 0, None),
    DatasetFormat("entity_list", -1, 0, None, is_entity_list=True),
):
    DATASET_FORMATS.register(_fmt.name, _fmt)


@dataclass(frozen=True)
class LMDataset:
    """One dataset: its splits (BIO formats) or its entity table (entity lists)."""

    name: str
    format: str
    splits: Mapping[str, tuple[Sentence, ...]] = field(default_factory=dict)
    entity_list: pd.DataFrame | None = None  # columns entity, entity_type (entity-list format only)

    @property
    def train(self) -> tuple[Sentence, ...]:
        return tuple(self.splits.get("train", ()))

    @property
    def test(self) -> tuple[Sentence, ...]:
        return tuple(self.splits.get("test", ()))

    def entities(self) -> pd.DataFrame:
        """Unique (entity, entity_type) pairs over every split, sorted (NET and exposure use these)."""
        if self.entity_list is not None:
            return self.entity_list
        return entity_table(s for split in self.splits.values() for s in split)

    def types(self) -> list[str]:
        return sorted(self.entities()["entity_type"].unique())

    @property
    def supports_ner(self) -> bool:
        return bool(self.splits.get("train")) and bool(self.splits.get("test"))


def entity_table(sentences: Iterable[Sentence]) -> pd.DataFrame:
    pairs = {(s.entity_text(sp), sp.type) for s in sentences for sp in s.spans}
    df = pd.DataFrame(sorted(pairs), columns=["entity", "entity_type"])
    return df.astype({"entity": str, "entity_type": str})


# ------------------------------------------------------------------------------------------- BIO
def _split_tag(tag: str) -> tuple[str, str | None]:
    tag = tag.strip()
    if tag in ("O", "o", "") or "-" not in tag:
        return "O", None
    prefix, _, typ = tag.partition("-")
    prefix = prefix.upper()
    if prefix not in ("B", "I", "E", "S"):
        return "O", None
    return prefix, typ


def parse_bio_lines(lines: Iterable[str], fmt: DatasetFormat, source: str = "<lines>") -> list[Sentence]:
    """Parse BIO lines (blank line between sentences; ``-DOCSTART-`` lines skipped).

    Entities whose type the format drops are left out (their tokens stay in the sentence)."""
    sentences: list[Sentence] = []
    tokens: list[str] = []
    spans: list[Span] = []
    open_start: int | None = None
    open_type: str | None = None  # raw type of the open entity

    def close(end: int) -> None:
        nonlocal open_start, open_type
        if open_start is not None and open_type is not None:
            mapped = fmt.map_type(open_type)
            if mapped:
                spans.append(Span(open_start, end, mapped))
        open_start, open_type = None, None

    def flush() -> None:
        nonlocal tokens, spans
        close(len(tokens))
        if tokens:
            sentences.append(Sentence(tuple(tokens), tuple(spans)))
        tokens, spans = [], []

    for lineno, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            flush()
            continue
        cols = line.split("\t") if "\t" in line else line.split()
        cols = [c for c in (c.strip() for c in cols) if c != ""]
        if cols and cols[0].startswith("-DOCSTART-"):
            flush()
            continue
        if len(cols) < 2:
            raise DataError(f"{source}:{lineno}: expected a word and a tag, got {len(cols)} column(s)")
        word, tag = cols[fmt.word_column], cols[fmt.tag_column]
        prefix, typ = _split_tag(tag)
        i = len(tokens)
        if prefix == "O":
            close(i)
        elif prefix in ("B", "S") or open_type is None or typ is None or typ.upper() != open_type.upper():
            # IOB1: an I- tag after O or after another type opens an entity
            close(i)
            open_start, open_type = i, typ
        tokens.append(word)
        if prefix in ("E", "S"):
            close(i + 1)
    flush()
    return sentences


def read_bio(path: str | Path, fmt: str | DatasetFormat = "bio") -> list[Sentence]:
    fmt = DATASET_FORMATS.get(fmt) if isinstance(fmt, str) else fmt
    path = Path(path)
    if not path.is_file():
        raise DataError(f"BIO file {path} does not exist")
    with path.open(encoding="utf-8", errors="replace") as fh:
        return parse_bio_lines(fh, fmt, str(path))


def write_bio(sentences: Sequence[Sentence], path: str | Path, tag_prefix: Mapping[str, str] | None = None,
              conll_columns: bool = True, docstart: bool = True) -> Path:
    """Write sentences as a CoNLL-2003-style file (``word POS CHUNK TAG``, IOB2). ``tag_prefix`` maps a
    canonical type to its raw tag (default: person -> PER, location -> LOC, organisation -> ORG)."""
    tag_prefix = dict(tag_prefix or {"person": "PER", "location": "LOC", "organisation": "ORG"})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out: list[str] = ["-DOCSTART- -X- -X- O", ""] if docstart else []
    for s in sentences:
        tags = ["O"] * len(s.tokens)
        for sp in s.spans:
            raw = tag_prefix.get(sp.type, sp.type.upper().replace(" ", "-"))
            tags[sp.start] = f"B-{raw}"
            for k in range(sp.start + 1, sp.end):
                tags[k] = f"I-{raw}"
        for w, t in zip(s.tokens, tags):
            out.append(f"{w} X X {t}" if conll_columns else f"{w}\t{t}")
        out.append("")
    return write_text_atomic(path, "\n".join(out) + "\n")


# ------------------------------------------------------------------------------------------- entity lists
def read_entity_list(path: str | Path) -> pd.DataFrame:
    """``entity<TAB>type`` per line (a file or every file of a folder); blank and ``#`` lines skipped.
    Returns unique (entity, entity_type) pairs with canonical types."""
    path = Path(path)
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise DataError(f"entity list {path} does not exist or holds no file")
    pairs: set[tuple[str, str]] = set()
    for f in files:
        with f.open(encoding="utf-8", errors="replace") as fh:
            for lineno, raw in enumerate(fh, start=1):
                line = raw.rstrip("\r\n")
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                if "\t" not in line:
                    raise DataError(f"{f}:{lineno}: expected 'entity<TAB>type'")
                entity, _, typ = line.rpartition("\t")
                entity = " ".join(entity.split())
                if not entity or not typ.strip():
                    raise DataError(f"{f}:{lineno}: empty entity or type")
                pairs.add((entity, canonical_type(typ)))
    if not pairs:
        raise DataError(f"entity list {path} holds no entity")
    return pd.DataFrame(sorted(pairs), columns=["entity", "entity_type"]).astype(str)


# ------------------------------------------------------------------------------------------- folders
_SPLIT_PATTERNS = (("train", ("train",)), ("test", ("test",)), ("dev", ("dev", "valid")))


def _split_of(name: str) -> str | None:
    low = name.lower()
    if "testa" in low:  # original CoNLL-2003 names: eng.testa is the development set, eng.testb the test set
        return "dev"
    for split, keys in _SPLIT_PATTERNS:
        if any(k in low for k in keys):
            return split
    return None


def load_dataset(path: str | Path, fmt: str = "bio", name: str | None = None,
                 entity_types: Sequence[str] | None = None) -> LMDataset:
    """Read a dataset folder (BIO formats) or an entity list file/folder.

    ``entity_types`` (canonical names) keeps only those types; a requested type absent from the data is
    a :class:`DataError` naming the types that are there."""
    f = DATASET_FORMATS.get(fmt)
    path = Path(path)
    name = name or path.stem
    if not path.exists():
        raise DataError(f"dataset {name!r}: {path} does not exist")
    keep = [canonical_type(t) for t in entity_types] if entity_types else None
    if f.is_entity_list:
        table = read_entity_list(path)
        if keep:
            _check_types(name, keep, set(table["entity_type"]))
            table = table[table["entity_type"].isin(keep)].reset_index(drop=True)
        return LMDataset(name, f.name, {}, table)
    if not path.is_dir():
        raise DataError(f"dataset {name!r}: {path} is not a folder (a BIO dataset is a folder of split files)")
    splits: dict[str, list[Sentence]] = {}
    for file in sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")):
        split = _split_of(file.name)
        if split is None:
            continue
        splits.setdefault(split, []).extend(read_bio(file, f))
    if not splits:
        raise DataError(
            f"dataset {name!r}: no split file in {path} (expected names containing train, test, dev or valid)"
        )
    if keep:
        present = {sp.type for ss in splits.values() for s in ss for sp in s.spans}
        _check_types(name, keep, present)
        splits = {k: [Sentence(s.tokens, tuple(sp for sp in s.spans if sp.type in keep)) for s in v]
                  for k, v in splits.items()}
    return LMDataset(name, f.name, {k: tuple(v) for k, v in splits.items()})


def _check_types(name: str, wanted: Sequence[str], present: set[str]) -> None:
    missing = [t for t in wanted if t not in present]
    if missing:
        raise DataError(
            f"dataset {name!r}: entity type(s) {missing} not found; types present: {sorted(present)}"
        )
