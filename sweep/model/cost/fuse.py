"""Fused evaluation: run an elementwise numpy function as one compiled loop (issue 19).

The cost core is written once, as numpy over columns of candidates. A numpy expression
makes one pass over memory per operation and a temporary per result; the calibrated
model's ~700 operations per candidate run at about 0.5 ns each that way, most of it memory
traffic. :func:`fused` turns such a function into a single loop over candidates, compiled
by numba, in which every intermediate stays in registers:

1. **Trace.** The function runs once on tracers (:class:`Tracer`) in place of its inputs.
   A tracer records every numpy ufunc and the few array functions the model uses
   (``np.where``, ``np.select``, ``np.clip``, ``np.broadcast_to``...) as a node of a
   graph. Scalar inputs (the context: job, hardware and calibration numbers) keep their
   value, so Python-level decisions on them still work; each such decision names the
   scalar inputs it read, and the graph is reused only for inputs that agree with it on
   those (a *guard*). A decision on array values cannot be traced: the function then
   runs as plain numpy.
2. **Generate and compile.** The graph becomes Python source - scalar nodes computed
   once before the loop, array nodes as scalar statements in it - written to the cache
   directory and compiled by numba with its on-disk cache (``cache=True``), so a graph
   compiles once per machine, not per run. A long loop over whole blocks (``chunked``)
   runs chunk by chunk, its inputs first copied into two buffers, so that LLVM can
   vectorise it (see :func:`_generate`).
3. **Call.** Later calls with the same input structure and guard values go straight to
   the compiled loop.
4. **Keep.** The trace of a function of sweep.model (its guard, its kernel's name, how the
   arguments and results are laid out) is kept in the cache directory too, in a folder
   named by a digest of the model's source, numpy's and Python's versions: a new process
   whose inputs agree with a kept guard loads the kernel without tracing the model again.

Results: the loop does the operations numpy does, in the same order and with numpy's
dtypes (integer results are cast back to numpy's type; ``maximum`` / ``minimum`` follow
numpy's rules for NaN and for signed zeros), without fast-math, so sums, products and
quotients are bit for bit numpy's. Transcendental functions (log, exp, sqrt, pow) come
from LLVM / the C library rather than numpy's SIMD loops and could differ in the last bit;
on the shipped specs and the tests' blocks every column is bit for bit numpy's
(tests/model/test_fuse.py, tests/engine/test_results_identity.py).

Optional: without numba (``pip install -e '.[fast]'`` in the checkout), or with
``SWEEP_FUSE=0``, every call runs the numpy function itself. Pure: no MPI, no printing; files only in the cache
directory (``SWEEP_CACHE_DIR``, else ``$XDG_CACHE_HOME/sweep`` or ``~/.cache/sweep``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import json
import os
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

__all__ = ["fused", "Tracer", "TraceError", "Gathered", "available", "enabled", "as_array",
           "map_leaves",
           "cache_dir", "load_kernel", "startup_seconds"]

#: CPU seconds this process has spent tracing graphs and in the first call of each compiled
#: loop with new argument types (numba compiling it, seconds to minutes on a machine whose
#: cache is cold, or loading it from the on-disk cache): paid once per process, not per
#: candidate, so ``sweep plan``'s estimate keeps it apart (bench.estimate_search_seconds)
_startup_cpu_s = 0.0


def startup_seconds() -> float:
    """CPU seconds spent so far in this process tracing graphs and compiling or loading
    compiled loops (see ``_startup_cpu_s``)."""
    return _startup_cpu_s


def _add_startup(cpu_s: float) -> None:
    global _startup_cpu_s
    _startup_cpu_s += cpu_s


class TraceError(Exception):
    """The function did something a trace cannot follow (a decision on array values)."""


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """numba can be imported (looked up once: every evaluation asks)."""
    return importlib.util.find_spec("numba") is not None


def enabled() -> bool:
    """Fused evaluation is on: numba is available and ``SWEEP_FUSE`` is not 0."""
    return os.environ.get("SWEEP_FUSE", "1").strip() not in ("0", "false", "no", "off") \
        and available()


def cache_dir() -> Path:
    """Where generated kernels and numba's compiled code are kept."""
    if os.environ.get("SWEEP_CACHE_DIR"):
        return Path(os.environ["SWEEP_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sweep"


def as_array(v, dtype=None):
    """``np.asarray(v, dtype)`` that lets a :class:`Tracer` through (np.asarray cannot)."""
    if isinstance(v, Tracer):
        return v if dtype is None or v.dtype == np.dtype(dtype) else v.astype(dtype)
    return np.asarray(v, dtype=dtype)


class Gathered:
    """``values[index]`` not yet taken: a per-layer term on a block's distinct layers and
    the distinct layer of each candidate. The compiled loop reads ``values[index[i]]``
    itself (one pass less over memory per term); anything else gets :meth:`array`."""

    __slots__ = ("values", "index")

    def __init__(self, values: np.ndarray, index: np.ndarray):
        self.values, self.index = values, index

    def array(self) -> np.ndarray:
        return self.values[self.index]


def map_leaves(tree, fn: Callable):
    """``tree`` (a nest of dicts, lists and tuples) with each leaf ``v`` replaced by
    ``fn(v)``: the dicts plain dicts, in their keys' order."""
    leaves: list = []
    _walk(tree, leaves, [])
    return _rebuild(tree, iter([fn(v) for v in leaves]))


def _materialized(tree):
    """``tree`` with every :class:`Gathered` taken."""
    return map_leaves(tree, lambda v: v.array() if isinstance(v, Gathered) else v)


# ------------------------------------------------------------------------------ tracing

class _Graph:
    """Nodes of one trace. A node: (op, args, dtype, is_array); args are node ids, except
    for op 'const' (the value), 'param' / 'input' (the leaf's position)."""

    def __init__(self, n: int):
        self.n = n
        self.nodes: list[tuple] = []
        self.guard_leaves: set[int] = set()  # positions of scalar leaves decisions read
        self.memo: dict[tuple, int] = {}

    def add(self, op, args, dtype, is_array, value=None, leaves=frozenset()) -> Tracer:
        dtype = np.dtype(dtype)
        # the same operation on the same operands is one node (common subexpressions: the
        # model computes e.g. a GEMM's tile counts again for its backward)
        key = None
        if op not in ("param", "input", "take"):
            key = (op, (type(args[0]), repr(args[0])) if op == "const" else args, dtype.str,
                   is_array)
            i = self.memo.get(key)
            if i is not None:
                return Tracer(self, i, dtype, is_array, value, leaves)
        self.nodes.append((op, args, dtype, is_array))
        if key is not None:
            self.memo[key] = len(self.nodes) - 1
        return Tracer(self, len(self.nodes) - 1, dtype, is_array, value, leaves)

    def lift(self, v) -> Tracer:
        """A tracer for an operand: tracers as they are, Python / numpy scalars as constants."""
        if isinstance(v, Tracer):
            if v.g is not self:
                raise TraceError("operand of another trace")
            return v
        if isinstance(v, np.ndarray) and v.ndim > 0:
            raise TraceError("an array that is not an input of the trace")
        if isinstance(v, (bool, int, float, np.generic, np.ndarray)):
            return self.add("const", (v,), np.asarray(v).dtype, False, v)
        raise TraceError(f"operand of type {type(v).__name__}")


def _sample(t: Tracer):
    """A stand-in with the tracer's type for numpy's type resolution (the value for scalars:
    NEP 50 types Python scalars by kind, not size)."""
    return np.ones(1, t.dtype) if t.is_array else t.value


class Tracer:
    """A traced value: an array of candidates (``is_array``) or a scalar whose ``value`` is
    known. Supports what the cost model does with numpy."""

    __slots__ = ("g", "i", "dtype", "is_array", "value", "leaves")
    __array_priority__ = 1000.0

    def __init__(self, g, i, dtype, is_array, value, leaves):
        self.g, self.i, self.dtype, self.is_array = g, i, dtype, is_array
        self.value, self.leaves = value, leaves

    @property
    def shape(self):
        return (self.g.n,) if self.is_array else np.shape(self.value)

    @property
    def ndim(self):
        return len(self.shape)

    def _concrete(self):
        if self.is_array:
            raise TraceError("a decision on array values")
        self.g.guard_leaves.update(self.leaves)
        return self.value

    def __bool__(self):
        return bool(self._concrete())

    def __float__(self):
        return float(self._concrete())

    def __int__(self):
        return int(self._concrete())

    def __index__(self):
        return int(self._concrete())

    def astype(self, dtype):
        value = None if self.is_array else np.asarray(self.value).astype(dtype)[()]
        return self.g.add("cast", (self.i,), dtype, self.is_array, value, self.leaves)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__" or kwargs.get("out") is not None or ufunc.nout != 1 or \
                any(k not in ("out", "dtype") for k in kwargs):
            raise TraceError(f"{ufunc.__name__}.{method}")
        return _apply(ufunc, inputs, kwargs.get("dtype"))

    def __array_function__(self, func, types, args, kwargs):
        handler = _FUNCTIONS.get(func)
        if handler is None:
            raise TraceError(f"np.{func.__name__}")
        return handler(*args, **kwargs)

    # Python operators as their ufuncs (ndarray's own operators defer to these)
    def __add__(self, o): return np.add(self, o)
    def __radd__(self, o): return np.add(o, self)
    def __sub__(self, o): return np.subtract(self, o)
    def __rsub__(self, o): return np.subtract(o, self)
    def __mul__(self, o): return np.multiply(self, o)
    def __rmul__(self, o): return np.multiply(o, self)
    def __truediv__(self, o): return np.true_divide(self, o)
    def __rtruediv__(self, o): return np.true_divide(o, self)
    def __floordiv__(self, o): return np.floor_divide(self, o)
    def __rfloordiv__(self, o): return np.floor_divide(o, self)
    def __mod__(self, o): return np.remainder(self, o)
    def __rmod__(self, o): return np.remainder(o, self)
    def __pow__(self, o): return np.power(self, o)
    def __rpow__(self, o): return np.power(o, self)
    def __neg__(self): return np.negative(self)
    def __pos__(self): return self
    def __abs__(self): return np.absolute(self)
    def __invert__(self): return np.invert(self)
    def __and__(self, o): return np.bitwise_and(self, o)
    def __rand__(self, o): return np.bitwise_and(o, self)
    def __or__(self, o): return np.bitwise_or(self, o)
    def __ror__(self, o): return np.bitwise_or(o, self)
    def __xor__(self, o): return np.bitwise_xor(self, o)
    def __lt__(self, o): return np.less(self, o)
    def __le__(self, o): return np.less_equal(self, o)
    def __gt__(self, o): return np.greater(self, o)
    def __ge__(self, o): return np.greater_equal(self, o)
    def __eq__(self, o): return np.equal(self, o)
    def __ne__(self, o): return np.not_equal(self, o)
    __hash__ = None


def _graph_of(values) -> _Graph:
    for v in values:
        if isinstance(v, Tracer):
            return v.g
    raise TraceError("no traced operand")


def _apply(ufunc, inputs, dtype=None) -> Tracer:
    g = _graph_of(inputs)
    ops = [g.lift(v) for v in inputs]
    with np.errstate(all="ignore"):
        if not any(o.is_array for o in ops):
            value = ufunc(*(o.value for o in ops), dtype=dtype) if dtype else \
                ufunc(*(o.value for o in ops))
            leaves = frozenset().union(*(o.leaves for o in ops))
            return g.add(ufunc.__name__, tuple(o.i for o in ops), np.asarray(value).dtype,
                         False, value, leaves)
        out = ufunc(*(_sample(o) for o in ops), dtype=dtype) if dtype else \
            ufunc(*(_sample(o) for o in ops))
    return g.add(ufunc.__name__, tuple(o.i for o in ops), out.dtype, True)


def _where(cond, a=None, b=None):
    if a is None or b is None:
        raise TraceError("np.where with one argument")
    g = _graph_of((cond, a, b))
    c, x, y = g.lift(cond), g.lift(a), g.lift(b)
    if not (c.is_array or x.is_array or y.is_array):
        value = np.where(c.value, x.value, y.value)
        return g.add("where", (c.i, x.i, y.i), value.dtype, False, value,
                     c.leaves | x.leaves | y.leaves)
    dtype = np.where(np.ones(1, bool), _sample(x), _sample(y)).dtype
    return g.add("where", (c.i, x.i, y.i), dtype, True)


def _select(condlist, choicelist, default=0):
    out = default
    for cond, choice in reversed(list(zip(condlist, choicelist))):
        out = _where(cond, choice, out)
    return out


def _clip(a, a_min, a_max, **kwargs):
    if kwargs:
        raise TraceError("np.clip with keywords")
    return np.minimum(np.maximum(a, a_min), a_max)


def _broadcast_to(a, shape, subok=False):
    g = _graph_of((a,))
    t = g.lift(a)
    if t.is_array or shape == ():
        return t
    return g.add("broadcast", (t.i,), t.dtype, True)


def _any(a, *args, **kwargs):
    if args or kwargs:
        raise TraceError("np.any with arguments")
    t = a if isinstance(a, Tracer) else None
    return np.any(t._concrete()) if t is not None else np.any(a)


def _all(a, *args, **kwargs):
    if args or kwargs:
        raise TraceError("np.all with arguments")
    return np.all(a._concrete()) if isinstance(a, Tracer) else np.all(a)


def _like(fill):
    def like(a, dtype=None, **kwargs):
        g = _graph_of((a,))
        t = g.lift(a)
        dt = np.dtype(dtype) if dtype is not None else t.dtype
        const = g.lift(np.asarray(fill, dt)[()])
        return _broadcast_to(const, t.shape) if t.is_array else const
    return like


def _scalar_only(func):
    def concrete(a, *args, **kwargs):
        if not isinstance(a, Tracer):
            return func(a, *args, **kwargs)
        return func(a._concrete(), *args, **kwargs)
    return concrete


_FUNCTIONS: dict[Callable, Callable] = {
    np.max: _scalar_only(np.max), np.min: _scalar_only(np.min),
    np.where: _where, np.select: _select, np.clip: _clip, np.broadcast_to: _broadcast_to,
    np.any: _any, np.all: _all, np.shape: lambda a: a.shape, np.ndim: lambda a: a.ndim,
    np.ones_like: _like(1), np.zeros_like: _like(0),
}


# ------------------------------------------------------------------------------ inputs

def _walk(tree, leaves: list, shape: list) -> None:
    """Append the leaves of a nest of dicts / lists / tuples to ``leaves`` (dicts in their
    keys' order) and its shape to ``shape``, in the same order: each dict's keys (a
    tuple), each list's or tuple's length (an int; -1 - length for a tuple), and None for
    each leaf (so that the shape is the whole tree: ``[[x], y]`` and ``[x, [y]]`` differ).
    (On every evaluation: leaves and plain containers are recognised before the ABCs.)"""
    kind = _container(tree)
    if kind == 1:
        keys = tuple(tree)
        shape.append(keys)
        for k in keys:
            v = tree[k]
            if type(v) in _ATOMS:
                leaves.append(v)
                shape.append(None)
            else:
                _walk(v, leaves, shape)
    elif kind == 2:
        shape.append(-1 - len(tree) if isinstance(tree, tuple) else len(tree))
        for v in tree:
            if type(v) in _ATOMS:
                leaves.append(v)
                shape.append(None)
            else:
                _walk(v, leaves, shape)
    else:
        leaves.append(tree)
        shape.append(None)


#: types that are never containers (checked before the Mapping ABC, which is slow)
_LEAF_TYPES = frozenset((np.ndarray, float, int, bool, str, type(None), np.float64, np.int64,
                         np.int32, np.int8, np.bool_))


#: leaves recognised by their type alone (what the hot path meets: arrays, numbers, the
#: gathered per-layer terms, tracers)
_ATOMS = _LEAF_TYPES | {Gathered, Tracer}


def _container(tree) -> int:
    """1 for a mapping, 2 for a list or tuple, 0 for a leaf."""
    t = type(tree)
    if t in _ATOMS:
        return 0
    if t is dict:
        return 1
    if t is list or t is tuple:
        return 2
    if isinstance(tree, Mapping):
        return 1
    return 2 if isinstance(tree, (list, tuple)) else 0


def _rebuild(tree, leaves):
    """``tree`` with its leaves replaced, in _walk's order."""
    kind = _container(tree)
    if kind == 1:
        return {k: next(leaves) if type(tree[k]) in _ATOMS else _rebuild(tree[k], leaves)
                for k in tree}  # (the keys as _walk takes them)
    if kind == 2:
        out = [_rebuild(v, leaves) for v in tree]
        return out if isinstance(tree, list) else tuple(out)
    return next(leaves)


#: _leaf_kind of a Python number, by its type
_NUMBER_KINDS = {bool: ("scalar", "bool"), int: ("scalar", "int"), float: ("scalar", "float")}


def _leaf_kind(v, n):
    """('array', dtype) for a column of n, ('take', dtypes) for a Gathered one, ('scalar',
    type) for a number, ('static', v) for anything else, ('bad',) for arrays of another
    length (not traceable)."""
    t = type(v)
    if t is np.ndarray and v.ndim == 1:  # (the common cases first)
        return ("array", v.dtype) if v.shape[0] == n else ("bad",)
    if t in _NUMBER_KINDS:
        return _NUMBER_KINDS[t]
    if isinstance(v, Gathered):
        if v.index.ndim != 1 or v.index.shape[0] != n or v.values.ndim != 1:
            return ("bad",)
        return ("take", v.values.dtype, v.index.dtype)
    if isinstance(v, np.ndarray) and v.ndim > 0:
        if v.shape != (n,):
            return ("bad",)  # an array of another shape: not traceable
        return ("array", v.dtype)
    if isinstance(v, (bool, np.bool_)):
        return ("scalar", "bool")
    if isinstance(v, (int, float, np.integer, np.floating)) or \
            (isinstance(v, np.ndarray) and v.ndim == 0):
        return ("scalar", np.asarray(v).dtype.str if isinstance(v, (np.generic, np.ndarray))
                else type(v).__name__)
    return ("static", v if isinstance(v, (str, type(None))) else id(v))


# ------------------------------------------------------------------------------ codegen

_HELPERS = '''
import numpy as np
from numba import njit


@njit(cache=True)
def _max(a, b):  # np.maximum: NaN if either is NaN, the second operand on ties (-0.0, 0.0)
    return a if (a > b or a != a) else b


@njit(cache=True)
def _min(a, b):
    return a if (a < b or a != a) else b


@njit(cache=True)
def _sel(c, a, b):
    return a if c else b


@njit(cache=True)
def _not(a):
    return not a


@njit(cache=True)
def _mod(a, b):  # np.remainder on floats: the sign of the divisor
    return np.remainder(a, b)
'''

_BINARY = {"add": "+", "subtract": "-", "multiply": "*", "true_divide": "/",
           "divide": "/", "floor_divide": "//", "less": "<", "less_equal": "<=",
           "greater": ">", "greater_equal": ">=", "equal": "==", "not_equal": "!=",
           "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^",
           "logical_and": "&", "logical_or": "|"}
_CALLS = {"maximum": "_max", "minimum": "_min", "fmax": "np.fmax", "fmin": "np.fmin",
          "remainder": "_mod", "ceil": "np.ceil", "floor": "np.floor", "sqrt": "np.sqrt",
          "log": "np.log", "log2": "np.log2", "log10": "np.log10", "exp": "np.exp",
          "absolute": "np.abs", "isnan": "np.isnan", "isfinite": "np.isfinite",
          "isinf": "np.isinf", "trunc": "np.trunc", "rint": "np.rint", "sign": "np.sign",
          "square": "np.square", "reciprocal": "np.reciprocal", "negative": "-",
          "logical_not": "_not", "positive": ""}


def _expr(op, args, nodes, names) -> str:
    a = [names[i] for i in args]
    if op in _BINARY:
        return f"({a[0]} {_BINARY[op]} {a[1]})"
    if op == "power":
        return f"np.power({a[0]}, {a[1]})"
    if op == "invert":
        return f"_not({a[0]})" if nodes[args[0]][2] == np.bool_ else f"(~{a[0]})"
    if op == "where":
        return f"_sel({a[0]}, {a[1]}, {a[2]})"
    if op in ("cast", "broadcast"):
        return a[0]
    if op in _CALLS:
        return f"{_CALLS[op]}({', '.join(a)})"
    raise TraceError(f"no code for {op}")


def _typed(expr, dtype, arg_dtypes) -> str:
    """Cast an expression to numpy's result type where numba's scalar rules differ."""
    if dtype == np.bool_:
        return expr
    if dtype.kind in "iu":
        return f"np.{dtype.name}({expr})"
    if dtype == np.float64 and any(d.kind != "f" for d in arg_dtypes):
        return f"np.float64({expr})"
    if dtype.kind == "f" and dtype != np.float64:
        return f"np.{dtype.name}({expr})"
    return expr


#: rows per chunk of a compiled loop: its inputs are copied chunk by chunk into two
#: buffers (_generate), which stay in the L2 cache
CHUNK_ROWS = 512
#: statements a row from which a loop is chunked: the copies cost about as much as a loop
#: of ~150 statements saves by running 4 rows at a time (the nersc2024 totals: 2 - 10 %
#: slower chunked; the calibrated model's 400 - 900 statements: 1.9x faster)
CHUNK_MIN_STATEMENTS = 300
#: functions whose vectorised versions (SVML, when numba finds it) may differ from the C
#: library's in the last bit
_LIBM = frozenset(("exp", "log", "log2", "log10", "power"))
#: padding of each buffer row (elements), so that the rows do not start a multiple of 4 KiB
#: apart (loads and stores whose addresses agree in their low 12 bits stall each other:
#: a power-of-two row length made the DeepSeek-V3 loop 2x slower)
CHUNK_PAD = {"f": 8, "i": 24}


#: padding of each row of a kernel's block of output columns (elements; fused._run)
OUTPUT_PAD = 24


def _generate(g: _Graph, n_params: int, n_inputs: int, outputs: list[int],
              chunked: bool = False, min_statements: int | None = None) -> str:
    """Python source of the kernel ``kernel(n, p0.., a0.., o0..)``.

    ``chunked`` (and at least ``min_statements`` statements, default CHUNK_MIN_STATEMENTS,
    none of them exp, log or power): the loop runs over chunks of CHUNK_ROWS rows. Each
    chunk's 64-bit inputs (columns, and gathered terms ``values[index[i]]``) are first
    copied into a float and an integer buffer, one short loop each; the statements then
    read the buffers. LLVM vectorises a loop only if it can prove, or check at run time,
    that its stores never overlap its loads, and gives up beyond a few dozen pointer
    pairs: a cost model reading 50 arrays and gathering through indices stayed scalar (86
    scalar divisions a row), while reading two buffers it runs 4 rows per instruction
    (AVX2). Every operation is the same IEEE operation (+ - * /, comparisons, selects,
    floor, ceil, sqrt: correctly rounded) on the same operands, so the results are bit for
    bit the scalar loop's.
    """
    nodes = g.nodes
    used = set(outputs)
    for i in range(len(nodes) - 1, -1, -1):  # live nodes only
        if i in used and nodes[i][0] not in ("const", "param", "input", "take"):
            used.update(nodes[i][1])
    statements = sum(1 for i in used if nodes[i][3] and nodes[i][0] not in
                     ("const", "param", "input", "take"))
    # (vectorised, numba may call SVML's exp / log / power, within an ulp of the C
    # library's but not bit for bit: such loops stay scalar)
    least = CHUNK_MIN_STATEMENTS if min_statements is None else min_statements
    chunked = chunked and statements >= least and not any(
        nodes[i][0] in _LIBM for i in used if nodes[i][3])
    names: dict[int, str] = {}
    head, body = [], []
    params = [f"p{k}" for k in range(n_params)]
    inputs = [f"a{k}" for k in range(n_inputs)]
    outs = [f"o{k}" for k in range(len(outputs))]
    copies: dict[str, list[tuple[str, str]]] = {"f": [], "i": []}  # (slot, row read)
    read_slot: dict[str, str] = {}
    for i, (op, args, dtype, is_array) in enumerate(nodes):
        if i not in used:
            continue
        if op == "const":
            v = args[0]
            lit = repr(bool(v)) if dtype == np.bool_ else repr(v.item() if hasattr(v, "item")
                                                             else v)
            if dtype.kind == "f":
                lit = f"np.float64({float(v)!r})" if dtype == np.float64 else \
                    f"np.{dtype.name}({float(v)!r})"
            elif dtype.kind in "iu":
                lit = f"np.{dtype.name}({int(v)})"
            names[i] = lit
            continue
        if op == "param":
            names[i] = params[args[0]]
            continue
        if op in ("input", "take"):
            read = f"{inputs[args[0]]}[r]" if op == "input" else \
                f"{inputs[args[0]]}[{inputs[args[0] + 1]}[r]]"
            kind = {np.dtype(np.float64): "f", np.dtype(np.int64): "i"}.get(np.dtype(dtype))
            if kind is None or not chunked:  # (other dtypes are rare: read in place)
                names[i] = read.replace("[r]", "[i]")
                continue
            if read not in read_slot:
                buf = "bf" if kind == "f" else "bi"
                read_slot[read] = f"{buf}[{len(copies[kind])}, j]"
                copies[kind].append((read_slot[read], read))
            names[i] = read_slot[read]
            continue
        expr = _typed(_expr(op, args, nodes, names), dtype, [nodes[j][2] for j in args])
        names[i] = f"v{i}"
        (body if is_array else head).append(f"v{i} = {expr}")
    lines = [_HELPERS, "", "@njit(cache=True, error_model='numpy', nogil=True)",
             f"def kernel(n, {', '.join(params + inputs + outs) or '_'}):"]
    lines += [f"    {s}" for s in head]
    lines += [f"    {o}[0] = {names[j]}" for o, j in zip(outs, outputs) if not nodes[j][3]]
    stores = [f"{o}[i] = {names[j]}" for o, j in zip(outs, outputs) if nodes[j][3]]
    if not chunked or (not body and not stores):
        lines.append("    for i in range(n):")
        lines += [f"        {s}" for s in body + stores] or ["        pass"]
        return "\n".join(lines) + "\n"
    # (of a width known when compiling: LLVM then checks each buffer's rows as one range;
    # a width of min(n, CHUNK_ROWS) made them one range each, too many to check)
    for kind, buf, dt in (("f", "bf", "float64"), ("i", "bi", "int64")):
        lines.append(f"    {buf} = np.empty(({max(len(copies[kind]), 1)}, "
                     f"{CHUNK_ROWS + CHUNK_PAD[kind]}), np.{dt})")
    lines.append(f"    for start in range(0, n, {CHUNK_ROWS}):")
    lines.append(f"        m = min({CHUNK_ROWS}, n - start)")
    for kind in ("f", "i"):
        for slot, read in copies[kind]:
            lines.append("        for j in range(m):")
            lines.append("            r = start + j")
            lines.append(f"            {slot} = {read}")
    lines.append("        for j in range(m):")
    lines.append("            i = start + j")
    lines += [f"            {s}" for s in body + stores]
    return "\n".join(lines) + "\n"


def load_kernel(source: str):
    """The function ``kernel`` of ``source`` (a module that compiles it with numba),
    loaded through a module file in the cache directory, so that numba's on-disk cache
    finds it again in the next process. Raises TraceError if the directory is not
    writable."""
    return _load(source)


def compile_loop(*functions):
    """The last of ``functions`` (plain Python loops over numpy arrays) compiled by numba as
    ``kernel``, the others compiled beside it for it to call, loaded as load_kernel loads a
    kernel; None if its module cannot be written (numpy it is)."""
    *helpers, main = functions
    decorator = "@njit(cache=True, nogil=True)\n"
    parts = ["import numpy as np\nfrom numba import njit\n"]
    parts += [decorator + inspect.getsource(fn) for fn in helpers]
    parts.append(decorator + inspect.getsource(main).replace(f"def {main.__name__}(",
                                                              "def kernel(", 1))
    try:
        return _FirstCallsTimed(load_kernel("\n\n".join(parts)))
    except TraceError:
        return None


class _FirstCallsTimed:
    """A compiled loop whose calls that add a signature (numba compiling the loop for new
    argument types, or loading it from its on-disk cache) count toward startup_seconds."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel

    def __call__(self, *args):
        known, start = len(self.kernel.overloads), time.process_time()
        out = self.kernel(*args)
        if len(self.kernel.overloads) != known:
            _add_startup(time.process_time() - start)
        return out


def _import_numba() -> None:
    """Import numba and the numpy support its loops load (numba.np.arraymath) with scipy
    hidden, unless something imported scipy before: arraymath's check for a BLAS imports
    scipy.linalg (20 MB a process, a fifth of a second) for np.dot and friends, which no
    loop here calls. Once; scipy imports as usual afterwards."""
    if "numba.np.arraymath" in sys.modules:
        return
    hide = "scipy" not in sys.modules
    if hide:
        sys.modules["scipy"] = None  # type: ignore[assignment]  (an ImportError for numba)
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        if hide and sys.modules.get("scipy", 0) is None:
            del sys.modules["scipy"]


def _load(source: str):
    """Compile a kernel's source through a module file in the cache directory (so numba's
    on-disk cache finds it again in the next process)."""
    _import_numba()
    digest = _digest(source)
    path = _kernel_path(digest)
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # (ranks compiling the same kernel agree; a file left damaged is written again)
        if not path.exists() or path.read_bytes() != source.encode():
            _write_atomic(path, source.encode())
    except OSError as e:  # (a read-only home on a cluster: numpy it is)
        raise TraceError(f"cache directory {folder}: {e.strerror}") from e
    return _import_kernel(digest, path)


def _digest(source: str) -> str:
    """The name of a kernel's module file: a digest of its source."""
    return hashlib.sha256(source.encode()).hexdigest()[:20]


def _kernel_path(digest: str) -> Path:
    """The module file of the kernel of that digest, in the cache directory."""
    return cache_dir() / "fused" / f"k_{digest}.py"


def _import_kernel(digest: str, path: Path):
    """The function ``kernel`` of the module file ``path`` (once a process)."""
    name = f"_sweep_fused_{digest}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return module.kernel


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` through a temporary file beside it: readers see all of it or none."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError:
        os.unlink(tmp)
        raise


# ------------------------------------------------------------------------- kept traces
# A trace of a function of sweep.model is kept on disk (``traces/`` in the cache directory):
# its guard, the name of its kernel's module file and how the kernel's arguments and results
# are laid out. A new process whose inputs have the same structure and agree with a kept
# guard loads that kernel instead of tracing the model again (the nersc2024 search's nine
# traces: ~0.35 s a process, docs/speed.md). What else a trace depends on is in the name of
# the folder the traces are kept in (_model_fingerprint), so an edited model is traced anew.

#: what a kept trace is: (guard_leaves, guard_values, kernel digest, param_leaves,
#: input_leaves, outputs, the result's nest with None for its leaves)
_KEPT_FIELDS = 7


@functools.lru_cache(maxsize=1)
def _model_fingerprint() -> str:
    """_fingerprint of this package, sweep.model, once a process: sweep.model.cost takes it
    as soon as its modules are imported (freeze_fingerprint), so that a source edited while
    the process runs files no trace of the old code under the new code's name."""
    return _fingerprint(Path(__file__).resolve().parents[1])


def freeze_fingerprint() -> None:
    """Take the model's fingerprint now (sweep.model.cost calls it once imported)."""
    _model_fingerprint()


def _fingerprint(root: Path) -> str:
    """What a trace depends on besides its inputs: the source of every module under
    ``root`` (the traced functions, all they call, this tracer and code generator), numpy's
    version (its array functions dispatch to the tracer) and Python's. Files no import can
    name (an editor's .#lock or backup) are left out; an unreadable one counts as such."""
    h = hashlib.sha256(f"{np.__version__} {sys.version_info[:2]}".encode())
    for path in sorted(root.rglob("*.py")):
        if not path.stem.isidentifier():
            continue
        try:
            data = path.read_bytes()
        except OSError as exc:
            data = f"unreadable: {exc.strerror}".encode()
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + data + b"\0")
    return h.hexdigest()[:20]


def _kept_path(fused_fn: fused, key: tuple) -> Path | None:
    """Where the traces of ``fused_fn`` for inputs of structure ``key`` are kept; None if
    they are not: a function outside sweep.model (its source is not in the fingerprint) or
    an input told apart by its identity, which a new process does not share."""
    fn = fused_fn.fn
    # (a module-level function of the model alone: a closure, a bound method or a callable
    # object carries state its name does not tell apart)
    if not (inspect.isfunction(fn) and fn.__closure__ is None
            and "<locals>" not in fn.__qualname__
            and fn.__module__.startswith(_MODEL_PACKAGE)) or \
            any(kind[0] == "static" and not isinstance(kind[1], (str, type(None)))
                for kind in key[1]):
        return None
    name = repr((fn.__module__, fn.__qualname__, fused_fn.chunked,
                 fused_fn.chunk_min_statements, fused_fn.max_nodes, key))
    digest = hashlib.sha256(name.encode()).hexdigest()[:24]
    return trace_dir() / _model_fingerprint() / f"{digest}.json"


def trace_dir() -> Path:
    """Where traces are kept: ``SWEEP_TRACE_DIR``, else ``traces`` in the cache directory
    (the test suite keeps its own: it patches model constants)."""
    return Path(os.environ.get("SWEEP_TRACE_DIR") or cache_dir() / "traces")


#: the package whose functions' traces are kept
_MODEL_PACKAGE = __name__.rsplit(".", 2)[0] + "."


def _none(_):
    return None


def _read_kept(path: Path) -> list:
    """The traces kept in ``path``; none if it is missing, damaged or of another layout (the
    functions are then traced as before)."""
    try:
        kept = _decode(json.loads(path.read_bytes()))
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return []  # (missing, or not what _keep writes)
    if not isinstance(kept, list) or \
            not all(isinstance(t, tuple) and len(t) == _KEPT_FIELDS for t in kept):
        return []
    return kept


def _encode(v):
    """``v`` (nests of dicts, lists and tuples of numbers, numpy scalars and dtypes, strings
    and None: what a trace's layout holds) as JSON, types kept; TypeError for anything else."""
    if v is None or type(v) in (bool, int, str):
        return v
    if type(v) is float:
        return {"f": v}  # (JSON's float, tagged: NaN and infinities come back as floats)
    if isinstance(v, (np.generic, np.ndarray)) and np.ndim(v) == 0 and v.dtype.kind in "biuf":
        return {"np": v.dtype.str, "nd": isinstance(v, np.ndarray), "v": v.item()}
    if isinstance(v, np.dtype):
        return {"dtype": v.str}
    if type(v) is tuple:
        return {"tuple": [_encode(x) for x in v]}
    if type(v) is list:
        return [_encode(x) for x in v]
    if type(v) is dict:
        return {"dict": [[_encode(k), _encode(x)] for k, x in v.items()]}
    raise TypeError(f"a {type(v).__name__} is not kept")


def _decode(v):
    """What _encode encoded."""
    if isinstance(v, list):
        return [_decode(x) for x in v]
    if not isinstance(v, dict):
        return v
    if "f" in v:
        return float(v["f"])
    if "np" in v:
        value = np.dtype(v["np"]).type(v["v"])
        return np.asarray(value) if v["nd"] else value
    if "dtype" in v:
        return np.dtype(v["dtype"])
    if "tuple" in v:
        return tuple(_decode(x) for x in v["tuple"])
    return {_decode(k): _decode(x) for k, x in v["dict"]}


def _keep(path: Path, trace: tuple) -> None:
    """Add ``trace`` to those kept in ``path`` (if the cache directory cannot be written,
    the next process traces again)."""
    kept = [t for t in _read_kept(path) if t[:2] != trace[:2]][-(MAX_GRAPHS - 1):]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, json.dumps(_encode(kept + [trace])).encode())
    except (OSError, TypeError, ValueError):  # (unwritable, or a value _encode does not keep)
        pass


#: statements beyond which a graph is left to numpy: numba compiles about 500 statements
#: a second (2-core VM), once per machine (its on-disk cache), and a first run should not
#: wait half a minute for a loop that saves a few percent
MAX_NODES = 4000
#: graphs kept per input structure (one per combination of the values decisions read)
MAX_GRAPHS = 64


class _Compiled:
    """One traced graph: its guard, the kernel and how to lay its results out again."""

    def __init__(self, guard_leaves, guard_values, kernel, param_leaves, input_leaves,
                 outputs, out_tree):
        self.guard_leaves, self.guard_values = guard_leaves, guard_values
        self.kernel, self.param_leaves, self.input_leaves = kernel, param_leaves, input_leaves
        self.outputs, self.out_tree = outputs, out_tree  # (array|scalar, dtype) | (static, v)
        self.columns_of_dtype = Counter(dtype for kind, dtype in outputs if kind == "array")


class fused:
    """``fused(fn)(*args)`` computes ``fn(*args)`` through a compiled loop when it can (see
    the module docstring), else ``fallback(*args)`` (default ``fn``; a fallback may return
    more). ``fn`` must be elementwise over its array arguments (all of the same length n)
    and return a nest of dicts / lists of arrays and scalars. Calls on fewer than
    ``min_rows`` rows run the fallback (the loop's call costs tens of microseconds)."""

    def __init__(self, fn: Callable, min_rows: int = 2048, fallback: Callable | None = None,
                 max_nodes: int = MAX_NODES, chunked: bool = False,
                 chunk_min_statements: int | None = None):
        self.fn, self.min_rows, self.max_nodes = fn, min_rows, max_nodes
        # chunked: inputs copied into buffers chunk by chunk so that the loop vectorises
        # (_generate); for loops over whole blocks of candidates, not a block's few
        # distinct layers (it costs a third more compile time); from so many statements
        # (None: CHUNK_MIN_STATEMENTS)
        self.chunked, self.chunk_min_statements = chunked, chunk_min_statements
        self.fallback = fallback or fn  # what runs when the loop cannot (same results)
        self._cache: dict[tuple, list[_Compiled]] = {}
        self._untraceable: set[tuple] = set()
        self._kept: dict[tuple, list] = {}  # traces kept on disk, read once per structure
        self.traces = 0  # graphs traced (tests)

    def __call__(self, *args, min_rows: int | None = None):
        """``fn(*args)``; ``min_rows``: this call's own threshold instead of the object's
        (a few rows picked out of a block: the graph and the loop are the block's)."""
        leaves: list = []
        shape: list = []
        _walk(args, leaves, shape)
        n = next((v.shape[0] for v in leaves if isinstance(v, np.ndarray) and v.ndim), 0)
        if n < (self.min_rows if min_rows is None else min_rows) or not enabled():
            return self.fallback(*_materialized(args))
        kinds = [_leaf_kind(v, n) for v in leaves]
        key = (tuple(shape), tuple(kinds))
        if key in self._untraceable or ("bad",) in kinds:
            return self.fallback(*_materialized(args))
        entries = self._cache.setdefault(key, [])
        for entry in entries:
            if tuple([leaves[j] for j in entry.guard_leaves]) == entry.guard_values:
                return self._run(entry, leaves, n)
        if len(entries) >= MAX_GRAPHS:  # inputs whose decisions vary without end
            return self.fallback(*_materialized(args))
        start = time.process_time()  # a new graph: traced, its loop compiled or loaded
        try:
            entry = self._kept_entry(key, leaves) or self._trace(args, leaves, kinds, n, key)
        except TraceError:
            self._untraceable.add(key)
            _add_startup(time.process_time() - start)
            return self.fallback(*_materialized(args))
        entries.append(entry)
        try:
            return self._run(entry, leaves, n)
        finally:  # (with the first block's own rows: a block, once a graph)
            _add_startup(time.process_time() - start)

    def _kept_entry(self, key, leaves) -> _Compiled | None:
        """A graph traced by an earlier process for inputs of this structure that agree
        with its guard, its kernel loaded; None if there is none."""
        if key not in self._kept:
            path = _kept_path(self, key)
            self._kept[key] = [] if path is None else _read_kept(path)
        for trace in self._kept[key]:
            try:
                guard_leaves, guard_values, digest, param_leaves, input_leaves, outputs, \
                    skeleton = trace
                if tuple([leaves[j] for j in guard_leaves]) != guard_values:
                    continue
                path = _kernel_path(digest)
                if not path.exists():
                    return None  # (its kernel's file was removed: traced again)
                _import_numba()
                return _Compiled(guard_leaves, guard_values, _import_kernel(digest, path),
                                 param_leaves, input_leaves, outputs, skeleton)
            except (TypeError, ValueError, IndexError, KeyError, AttributeError, OSError,
                    ImportError, SyntaxError):  # (a record of the right layout with wrong
                # contents, a damaged kernel file: traced again, as a missing record is)
                self._kept[key] = []
                return None
        return None

    def _trace(self, args, leaves, kinds, n, key) -> _Compiled:
        self.traces += 1
        g = _Graph(n)
        traced, param_leaves, input_leaves = [], [], []  # (inputs: (leaf, part))
        for j, (v, kind) in enumerate(zip(leaves, kinds)):
            if kind[0] == "array":
                traced.append(g.add("input", (len(input_leaves),), v.dtype, True))
                input_leaves.append((j, None))
            elif kind[0] == "take":  # two kernel arguments: the values and the index
                traced.append(g.add("take", (len(input_leaves),), v.values.dtype, True))
                input_leaves += [(j, "values"), (j, "index")]
            elif kind[0] == "scalar":
                traced.append(g.add("param", (len(param_leaves),), np.asarray(v).dtype,
                                    False, v, frozenset((j,))))
                param_leaves.append(j)
            else:
                traced.append(v)
        result = self.fn(*_rebuild(args, iter(traced)))
        out_leaves: list = []
        _walk(result, out_leaves, [])
        outputs, ids = [], []
        for v in out_leaves:
            if isinstance(v, Tracer) and (v.is_array or v.leaves):
                # a column, or a scalar computed from the inputs (by the kernel's head)
                outputs.append(("array" if v.is_array else "scalar", v.dtype))
                ids.append(v.i)
            elif isinstance(v, Tracer):
                outputs.append(("static", v.value))
            elif isinstance(v, np.ndarray) and v.ndim:
                raise TraceError("an array result that is not traced")
            else:
                outputs.append(("static", v))
        guard = tuple(sorted(g.guard_leaves))
        source = _generate(g, len(param_leaves), len(input_leaves), ids, self.chunked,
                           self.chunk_min_statements)
        statements = len(re.findall(r"^ +v\d+ = ", source, re.M))
        if statements > self.max_nodes:
            raise TraceError(f"{statements} statements: too long to compile")
        kernel = _load(source)
        entry = _Compiled(guard, tuple(leaves[j] for j in guard), kernel, param_leaves,
                          input_leaves, outputs, result)
        path = _kept_path(self, key)
        if path is not None:
            _keep(path, (entry.guard_leaves, entry.guard_values, _digest(source),
                         param_leaves, input_leaves, outputs, map_leaves(result, _none)))
        return entry

    @staticmethod
    def _run(entry: _Compiled, values, n):
        # (the column outputs of each dtype as the rows of one block: an allocation per
        # dtype, not per column; rows OUTPUT_PAD elements apart, so that a loop's stores to
        # its columns are not a multiple of 4 KiB apart: CHUNK_PAD)
        blocks = {dtype: iter(np.empty((count, n + OUTPUT_PAD), dtype)[:, :n])
                  for dtype, count in entry.columns_of_dtype.items()}
        outs = [next(blocks[dtype]) if kind == "array" else np.empty(1, dtype)
                for kind, dtype in entry.outputs if kind != "static"]
        entry.kernel(n, *(values[j] for j in entry.param_leaves),
                     *(values[j] if part is None else getattr(values[j], part)
                       for j, part in entry.input_leaves), *outs)
        it = iter(outs)
        flat = [value if kind == "static" else next(it) for kind, value in entry.outputs]
        flat = [v[0] if kind == "scalar" else v for (kind, _), v in zip(entry.outputs, flat)]
        return _rebuild(entry.out_tree, iter(flat))
