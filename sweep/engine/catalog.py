"""Finding and loading ``hardware/*.yaml`` and ``jobs/*.yaml`` by name.

A name is looked up, in order, in: the directories of ``SWEEP_CATALOG_PATH`` (``:``
separated, each holding ``hardware/`` and ``jobs/``), the directory of the spec that refers
to it, the current directory, and the catalogs shipped at the top of this repository. A
name may also be a path to a YAML file.

Every spec, job and hardware file is read by :func:`read_yaml`: UTF-8, at most
:data:`MAX_YAML_BYTES`, no duplicate keys, at most :data:`MAX_YAML_NODES` nodes with aliases
expanded (alias bombs) and at most :data:`MAX_YAML_DEPTH` levels of nesting; anything else is
a one-line SpecError.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from ..errors import SpecError
from ..model.hardware import GENERATIONS, Hardware, check_calibration, parse_hardware
from ..model.job import Job, parse_job
from ..model.units import brief

__all__ = ["load_hardware", "check_generation", "load_job", "read_yaml", "load_checked",
           "parse_value", "label_value", "search_roots", "list_names", "load_calibration",
           "REPO_ROOT", "CALIBRATION_FILE", "RANGES_FILE", "MAX_YAML_BYTES", "MAX_YAML_NODES",
           "MAX_YAML_DEPTH", "MAX_YAML_SEQUENCE"]

#: the repository checkout this package lives in (catalogs ship at its top level)
REPO_ROOT = Path(__file__).resolve().parents[2]

#: largest YAML file read: these files are hand-written (the largest shipped is ~3 kB)
MAX_YAML_BYTES = 2**20
#: YAML nodes of one file, an alias counting as every node it repeats (a "billion laughs"
#: file is a few lines with 10**9 nodes); above the 100,000 values a list may have
MAX_YAML_NODES = 1_000_000
#: items of one YAML list, refused while it is read (no spec list may have more: spec.py
#: MAX_AXIS_POINTS); a 1 MiB list of half a million items took 9 s and 430 MB to build
MAX_YAML_SEQUENCE = 100_000
#: nesting levels of one file (a spec needs about 6); deeper input would exhaust the stack
MAX_YAML_DEPTH = 100


class _Refused(Exception):
    """A file the loader refuses: the key (or "") and the message, at a node's line."""

    def __init__(self, key: str, message: str, mark: Any) -> None:
        super().__init__(f"{message} at line {mark.line + 1}")
        self.key = key


class _Checks:
    """The refusals read_yaml adds to PyYAML's safe loader: duplicate keys, recursive
    aliases, more than MAX_YAML_NODES nodes once aliases are expanded, more than
    MAX_YAML_DEPTH levels of nesting, lists longer than MAX_YAML_SEQUENCE, huge integers."""

    def _start_checks(self) -> None:
        self._nodes = 0  # so far, an alias counting as the nodes of what it repeats
        self._depth = 0
        self._size: dict[int, int] = {}  # id(node) -> its nodes, aliases expanded

    def _count(self, n: int, mark: Any) -> None:
        self._nodes += n
        if self._nodes > MAX_YAML_NODES:
            raise _Refused("", f"more than {MAX_YAML_NODES:,} YAML nodes once aliases are "
                               f"expanded", mark)

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(index, int) and index >= MAX_YAML_SEQUENCE:  # stop early: a long list
            raise _Refused("", f"a list of more than {MAX_YAML_SEQUENCE:,} items",
                           event.start_mark)
        if isinstance(event, yaml.AliasEvent):
            node = self.anchors.get(event.anchor)
            if node is not None:  # (an unknown alias is the composer's error)
                if id(node) not in self._size:
                    raise _Refused("", f"alias *{event.anchor} refers to a node that "
                                       f"contains it", event.start_mark)
                self._count(self._size[id(node)], event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise _Refused("", f"nested more than {MAX_YAML_DEPTH} levels deep", event.start_mark)
        before = self._nodes
        self._count(1, event.start_mark)
        node = super().compose_node(parent, index)
        self._size[id(node)] = self._nodes - before
        self._depth -= 1
        return node

    def compose_mapping_node(self, anchor: Any) -> Any:
        node = super().compose_mapping_node(anchor)
        first: dict[Any, Any] = {}  # key -> its mark
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue  # (merge keys may override; unhashable keys are the constructor's)
            key = self.construct_object(key_node)
            if key in first:
                raise _Refused(str(key), f"duplicate key (first given at line "
                                         f"{first[key].line + 1}), again", key_node.start_mark)
            first[key] = key_node.start_mark
        return node

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as exc:  # e.g. a date 2024-13-45
            raise _Refused("", f"cannot read {brief(node.value)}: {exc}", node.start_mark) \
                from None

    def construct_yaml_int(self, node: Any) -> int:
        # integers of more than 4300 digits are a ValueError; none is useful past a few dozen
        if len(node.value) > 100:
            raise _Refused("", f"an integer of {len(node.value)} characters", node.start_mark)
        return super().construct_yaml_int(node)


class _PyLoader(_Checks, yaml.SafeLoader):
    """The checked loader in pure Python (PyYAML's own scanner and parser)."""

    def __init__(self, stream: str) -> None:
        yaml.SafeLoader.__init__(self, stream)
        self._start_checks()


_CParser = getattr(getattr(yaml, "cyaml", None), "CParser", None)

if _CParser is not None:
    class _Loader(_Checks, yaml.composer.Composer, _CParser, yaml.constructor.SafeConstructor,
                  yaml.resolver.Resolver):
        """The checked loader on libyaml's scanner and parser (C) under PyYAML's composer
        (Python), where the checks see every node: a list of 100,000 items reads in 0.85 s
        instead of 3.7 s. _load leaves to _PyLoader what libyaml refuses (for PyYAML's
        verdict and messages) and what it reads otherwise than PyYAML (_pyyaml_only)."""

        def __init__(self, stream: str) -> None:
            _CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            self._start_checks()
else:  # (a PyYAML built without libyaml)
    _Loader = _PyLoader

for _cls in dict.fromkeys((_PyLoader, _Loader)):
    _cls.add_constructor("tag:yaml.org,2002:int", _Checks.construct_yaml_int)
    # numbers in exponent form without a dot or an exponent sign (5e3, 1.6e1) are floats,
    # as in YAML 1.2's core schema; PyYAML's YAML 1.1 rules read them as strings (its own
    # resolvers run first, so nothing they already read changes)
    _cls.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
        list("-+0123456789."))


def _pyyaml_only(text: str) -> bool:
    """Whether ``text`` has what libyaml reads otherwise than PyYAML: a BOM after the start
    (libyaml skips one where a line's token starts: the line's content moves), a tag (the
    bare ``!`` on an empty value: '' for libyaml, None for PyYAML), or characters PyYAML
    refuses before parsing (a NUL, a lone surrogate from undecodable argument bytes)."""
    return ("\ufeff" in text or bool(_TAG.search(text))
            or bool(yaml.reader.Reader.NON_PRINTABLE.search(text)))


#: a tag's ``!`` where a token starts (not a comment's ``!=``)
_TAG = re.compile(r"(?:^|[\s\[{,])!(?!=)", re.MULTILINE)


def _load(text: str) -> Any:
    """The one document in ``text``, read by _Loader, or by _PyLoader where libyaml finds it
    malformed (PyYAML's verdict and messages are the ones given) or would read it otherwise
    (_pyyaml_only). libyaml reads a few inputs PyYAML refuses (tabs as separators, a comment
    right after a block scalar's indicator). Raises _Refused, yaml.YAMLError or
    RecursionError."""
    if _Loader is not _PyLoader and not _pyyaml_only(text):
        try:
            return _read_with(_Loader, text)
        except (yaml.YAMLError, UnicodeError):
            pass  # (PyYAML's verdict, below)
    return _read_with(_PyLoader, text)


def _read_with(loader_class: type, text: str) -> Any:
    loader = loader_class(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


#: PyYAML's safe loader on its C parser where PyYAML has libyaml (a spec: 19 -> 2 ms)
_C_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_checked(text: str) -> Any:
    """A YAML document that read_yaml's checks have passed once already (a run's stored
    spec, read again by every rank), parsed by the safe loader without the checks."""
    return yaml.load(text, Loader=_C_SAFE_LOADER)  # (a safe loader)


def parse_value(text: str) -> Any:
    """One YAML value given on the command line (``--set KEY=VALUE``), read as the files
    are (5e3 a number). Raises yaml.YAMLError when it is not YAML or the loader refuses it."""
    try:
        return _load(text)
    except _Refused as exc:
        raise yaml.YAMLError(str(exc)) from None


#: characters of a label's text that its ``key=value,...`` list would split or misread
LABEL_SYNTAX = set(',[]{}="\t')


def label_value(value: Any) -> str:
    """``value`` in a ``name[key=value,...]`` label: ``str(value)`` when parse_value reads it
    back as the value and it holds none of LABEL_SYNTAX, else a double-quoted YAML string (an
    MTP pattern ``*E`` would read as a YAML alias, an empty one as null, ``a,b`` as two
    items). A list of names, as a job's offload_modules, is written joined by ``+``, the
    spelling the job reads back."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        joined = "+".join(value)
        if not LABEL_SYNTAX & set(joined):
            return joined
    text = str(value)
    try:
        if parse_value(text) == value and not LABEL_SYNTAX & set(text):
            return text
    except yaml.YAMLError:
        pass
    return json.dumps(str(value))


def read_yaml(path: Path) -> Any:
    """Parse one YAML file (limits: see the module); any problem is a one-line SpecError."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_YAML_BYTES + 1)  # never more, whatever the file is
    except OSError as exc:
        raise SpecError(str(path), "", f"cannot read: {exc.strerror}") from None
    if len(data) > MAX_YAML_BYTES:
        raise SpecError(str(path), "", f"larger than {MAX_YAML_BYTES:,} bytes; spec, job and "
                                       f"hardware files are hand-written YAML")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecError(str(path), "", f"not UTF-8 text (byte 0x{data[exc.start]:02x} at "
                                       f"offset {exc.start}); save it as UTF-8") from None
    try:
        return _load(text)
    except _Refused as exc:
        raise SpecError(str(path), exc.key, str(exc)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(str(path), "", f"malformed YAML: {where}{problem}") from None
    except RecursionError:  # not expected past MAX_YAML_DEPTH; never a traceback
        raise SpecError(str(path), "", "nested too deeply") from None


def search_roots(near: Path | None = None) -> list[Path]:
    """Directories searched for ``hardware/`` and ``jobs/``, in order."""
    roots = [Path(p) for p in os.environ.get("SWEEP_CATALOG_PATH", "").split(":") if p]
    if near is not None:
        roots.append(near)
    roots += [Path.cwd(), REPO_ROOT]
    seen, out = set(), []
    for r in roots:
        key = r.resolve()
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _find(kind: str, name: str, near: Path | None) -> Path | None:
    if kind == "hardware" and name in {Path(f).stem for f in NOT_HARDWARE}:
        return None
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml"):
        for base in ([near] if near else []) + [Path.cwd()]:
            p = candidate if candidate.is_absolute() else base / candidate
            if p.is_file():
                return p
        return None
    for root in search_roots(near):
        for ext in (".yaml", ".yml"):
            p = root / kind / f"{name}{ext}"
            if p.is_file():
                return p
    return None


def list_names(kind: str, near: Path | None = None) -> list[str]:
    """Every name available in the catalogs of ``kind`` (``hardware`` or ``jobs``)."""
    names = set()
    for root in search_roots(near):
        d = root / kind
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.y*ml")
                         if not (kind == "hardware" and p.name in NOT_HARDWARE))
    return sorted(names)


def _unknown(kind: str, name: str, source: str, key: str, near: Path | None) -> SpecError:
    what = kind[:-1] if kind == "jobs" else kind
    if Path(name).suffix in (".yaml", ".yml"):  # (a file name: looked up as a path)
        where = [str(Path(name))] if Path(name).is_absolute() else \
            [str(b / name) for b in ([near] if near else []) + [Path.cwd()]]
        return SpecError(source, key, f"{what} file {name!r} not found (looked for "
                                      f"{' and '.join(dict.fromkeys(where))})")
    known = list_names(kind, near)
    hint = f"; known: {', '.join(known)}" if known else ""
    return SpecError(source, key, f"unknown {what} {name!r} (no {kind}/{name}.yaml found){hint}")


#: per-generation parameters of the calibrated profile, next to the hardware files
CALIBRATION_FILE = "calibration.yaml"
#: their cited physical ranges (sweep.analysis.calibration.load_ranges)
RANGES_FILE = "parameter_ranges.yaml"
#: files in hardware/ that are not hardware
NOT_HARDWARE = (CALIBRATION_FILE, RANGES_FILE)


@lru_cache(maxsize=64)
def load_calibration(path: Path) -> dict[str, dict[str, float]]:
    """``hardware/calibration.yaml``: generation -> {parameter: value} (plus ``memory``)."""
    raw = read_yaml(path) or {}
    if not isinstance(raw, dict):
        raise SpecError(str(path), "", "expected a mapping of generation -> parameters")
    out: dict[str, dict[str, float]] = {}
    for gen, params in raw.items():
        if gen == "fitted":
            continue
        if not isinstance(params, dict):
            raise SpecError(str(path), str(gen), "expected a mapping of parameter -> number")
        out[str(gen)] = check_calibration(params, str(path), str(gen))
    return out


@lru_cache(maxsize=256)
def _load_hardware_file(path: Path) -> Hardware:
    """A hardware file with its generation's calibrated parameters: from the calibration
    file beside it, else the shipped catalog's (a file copied elsewhere, or on
    SWEEP_CATALOG_PATH, is calibrated as the catalog's own); its own ``calibration`` values
    over both."""
    hw = parse_hardware(read_yaml(path), str(path), path.stem)
    cal_path = path.parent / CALIBRATION_FILE
    if not cal_path.is_file():
        cal_path = REPO_ROOT / "hardware" / CALIBRATION_FILE
    if cal_path.is_file():
        table = load_calibration(cal_path)
        merged = {**table.get("memory", {}), **table.get(hw.generation, {}), **hw.calibration}
        hw = dataclasses.replace(hw, calibration=merged)
    return hw


@lru_cache(maxsize=256)
def _load_job_file(path: Path) -> Job:
    return parse_job(read_yaml(path), str(path), path.stem)


def load_hardware(name: str, source: str = "<command line>", key: str = "hardware",
                  near: Path | None = None) -> Hardware:
    """Load a hardware catalog entry by name (or path).

    Raises:
        SpecError: naming ``source`` and ``key`` when the name is unknown, or naming the
            hardware file when its content is invalid.
    """
    path = _find("hardware", str(name), near)
    if path is None:
        raise _unknown("hardware", str(name), source, key, near)
    return _load_hardware_file(path.resolve())


def check_generation(hw: Hardware, name: str, profile: str, source: str = "<command line>",
                     key: str = "hardware", near: Path | None = None) -> None:
    """Refuse (SpecError naming the hardware file) a hardware definition without
    ``generation`` under the calibrated profile: its fitted parameters are per generation,
    and without one it would be costed with none of them (1.5 x faster than its
    generation's, measured on an H100 file)."""
    if profile != "calibrated" or hw.generation:
        return
    why = (f"missing; the calibrated profile's parameters are fitted per GPU generation "
           f"({', '.join(GENERATIONS)})")
    path = _find("hardware", str(name), near)
    if path is None:  # (a definition the run folder recorded)
        raise SpecError(source, key, f"{name}: generation: {why}")
    raise SpecError(str(path), "generation", why)


def load_job(name: str, source: str = "<command line>", key: str = "job",
             near: Path | None = None) -> Job:
    """Load a job catalog entry by name (or path); errors as :func:`load_hardware`."""
    path = _find("jobs", str(name), near)
    if path is None:
        raise _unknown("jobs", str(name), source, key, near)
    job = _load_job_file(path.resolve())
    if Path(str(name)).suffix not in (".yaml", ".yml") and job.name != path.stem:
        # (found by its file name, labelled by its name: results it labels could not be
        # found again by name)
        raise SpecError(str(path), "name",
                        f"{job.name!r} differs from the file's name {path.stem!r}: a "
                        f"catalog job is found by its file name (make them the same)")
    return job
