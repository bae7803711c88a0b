"""Request traces for the simulator: seeded generators and loading lengths from a file.

A request is only what memory management needs: when it arrives, how long its prompt
is and how many tokens it will generate. Time is counted in scheduler steps (one
decode iteration each), so an arrival rate is in requests per step.

The two built-in traces match the means the PagedAttention paper reports for its
datasets (ShareGPT: 161 prompt / 338 output tokens; Alpaca: 19 / 58). Lengths are
log-normal: strictly positive, right-skewed with a long tail, like the paper's
histograms of both datasets. The spread (``sigma``) is our choice, not the paper's;
``TRACES`` documents it, and :func:`load_workload` takes real lengths instead.
Each length is rounded, kept >= 1, and a request's total is capped at ``max_len``
(the model's context, 2048 in the paper) by shortening its output; the log-normal's
centre is solved so that the capped mean still equals the target.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from .._validate import as_count, as_iterable
from ..errors import InvalidArgumentError, InvalidTypeError

DEFAULT_MAX_LEN = 2048
# Requests per step for trace files without arrivals.
DEFAULT_RATE = 1.0


class WorkloadError(InvalidArgumentError):
    """A trace file or a workload parameter is unusable; the message says where and why (a ``ValueError``)."""


class TraceRequest(NamedTuple):
    """One request of a trace: arrival step (float), prompt tokens, output tokens (both >= 1).

    Only lengths, no token ids: the engine's :class:`~paged_kv_lib.engine.Request` is the
    request a model serves, this is the one the memory simulation schedules.
    """

    arrival: float
    prompt_len: int
    output_len: int

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.output_len


@dataclass(frozen=True)
class TraceShape:
    """Log-normal length model of a dataset: target means, spreads (sigma of log length), default rate.

    The default rate (requests per step) is about ten times what a paged cache of
    15,728 slots can serve, so a queue builds from the start and the measurement is
    of a loaded system.
    """

    prompt_mean: float
    output_mean: float
    prompt_sigma: float
    output_sigma: float
    rate: float


TRACES: Dict[str, TraceShape] = {
    # Means from the paper (Fig. 11). Sigma 0.75 gives a coefficient of variation of
    # about 0.8: most requests are a few hundred tokens, a few reach the context limit.
    # Paged serving finishes about 0.1 request per step.
    "sharegpt": TraceShape(161.31, 337.99, 0.75, 0.75, rate=1.0),
    # Alpaca instructions and answers are short and more uniform; about 3 per step finish.
    "alpaca": TraceShape(19.31, 58.45, 0.5, 0.75, rate=30.0),
}


@dataclass(frozen=True)
class Workload:
    """A named, arrival-ordered tuple of requests and the context length they respect."""

    name: str
    requests: Tuple[TraceRequest, ...]
    max_len: int = DEFAULT_MAX_LEN

    def __len__(self) -> int:
        return len(self.requests)

    def mean_prompt(self) -> float:
        return sum(r.prompt_len for r in self.requests) / max(len(self.requests), 1)

    def mean_output(self) -> float:
        return sum(r.output_len for r in self.requests) / max(len(self.requests), 1)


def make_workload(
    name: str,
    num_requests: int,
    seed: int = 0,
    *,
    rate: Optional[float] = None,
    max_len: int = DEFAULT_MAX_LEN,
) -> Workload:
    """Generate ``num_requests`` requests shaped like trace ``name`` ("sharegpt" or "alpaca").

    Arrivals are a Poisson process of ``rate`` requests per step (default: the trace's
    saturating rate); the same seed gives the same workload.
    """
    shape = TRACES.get(name) if isinstance(name, str) else None
    if shape is None:
        raise WorkloadError(f"unknown workload {name!r}: choose one of {sorted(TRACES)} or a trace file")
    num_requests = as_count(num_requests, "num_requests", minimum=1)
    seed = as_count(seed, "seed")
    max_len = as_count(max_len, "max_len", minimum=2)
    rate = shape.rate if rate is None else _positive(rate, "rate")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, num_requests))
    mu_p = _lognormal_mu(shape.prompt_mean, shape.prompt_sigma, max_len - 1)
    mu_o = _lognormal_mu(shape.output_mean, shape.output_sigma, max_len)
    prompts = _lengths(rng.lognormal(mu_p, shape.prompt_sigma, num_requests), max_len - 1)
    outputs = _lengths(rng.lognormal(mu_o, shape.output_sigma, num_requests), max_len)
    outputs = np.minimum(outputs, max_len - prompts)
    requests = tuple(
        TraceRequest(float(a), int(p), int(o)) for a, p, o in zip(arrivals, prompts, outputs)
    )
    return Workload(name, requests, max_len)


def load_workload(
    path: Union[str, os.PathLike],
    *,
    num_requests: Optional[int] = None,
    seed: int = 0,
    rate: float = DEFAULT_RATE,
    max_len: int = DEFAULT_MAX_LEN,
) -> Workload:
    """Read request lengths from a CSV or JSON file.

    CSV: a header with ``prompt_len`` and ``output_len`` (and optionally ``arrival``),
    one request per row. JSON: a list of objects with the same keys, or of
    ``[prompt_len, output_len]`` pairs. Without arrivals, Poisson arrivals at ``rate``
    are drawn from ``seed``. ``num_requests`` keeps the first that many. A request
    longer than ``max_len`` in total is an error (naming the row), not silently cut.
    """
    max_len = as_count(max_len, "max_len", minimum=2)
    rate = _positive(rate, "rate")
    if num_requests is not None:
        num_requests = as_count(num_requests, "num_requests", minimum=1)
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidTypeError(f"path must be a str or os.PathLike, got {type(path).__name__} {path!r}")
    path = os.fspath(path)
    if not isinstance(path, str):
        raise InvalidTypeError(f"path must name a file as text, got {type(path).__name__} {path!r}")
    if not os.path.isfile(path):
        raise WorkloadError(f"trace file {path!r} does not exist")
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in (".csv", ".json"):
        raise WorkloadError(f"trace file {path!r} must end in .csv or .json, got {suffix or 'no suffix'!r}")
    try:
        rows = _read_csv(path) if suffix == ".csv" else _read_json(path)
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"trace file {path!r} is not UTF-8 text: byte {exc.object[exc.start]:#04x} "
                            f"at position {exc.start}") from None
    if not rows:
        raise WorkloadError(f"trace file {path!r} holds no requests")
    if num_requests is not None:
        rows = rows[:num_requests]
    source = f"trace file {path!r}"
    lengths = [_checked_row(source, where, raw, max_len) for where, raw in rows]
    given = [arrival for arrival, _, _ in lengths]
    if all(a is None for a in given):
        rng = np.random.default_rng(as_count(seed, "seed"))
        arrivals: Sequence[float] = np.cumsum(rng.exponential(1.0 / rate, len(lengths))).tolist()
    elif any(a is None for a in given):
        raise WorkloadError(f"trace file {path!r}: give an arrival for every request or for none")
    else:
        arrivals = given  # type: ignore[assignment]
    requests = sorted(
        (TraceRequest(float(a), p, o) for a, (_, p, o) in zip(arrivals, lengths)),
        key=lambda r: r.arrival,
    )
    name = os.path.splitext(os.path.basename(path))[0]
    return Workload(name, tuple(requests), max_len)


def requests_from_lengths(
    lengths: Iterable[Tuple[int, int]],
    *,
    rate: float = DEFAULT_RATE,
    seed: int = 0,
    max_len: int = DEFAULT_MAX_LEN,
    name: str = "custom",
) -> Workload:
    """A workload from ``(prompt_len, output_len)`` pairs with Poisson arrivals (handy in lessons and tests)."""
    max_len = as_count(max_len, "max_len", minimum=2)
    pairs = [_checked_row("lengths", f"pair {i}", {"prompt_len": p, "output_len": o}, max_len)[1:]
             for i, (p, o) in enumerate(_pairs(lengths))]
    if not pairs:
        raise WorkloadError("a workload needs at least one request")
    rng = np.random.default_rng(as_count(seed, "seed"))
    arrivals = np.cumsum(rng.exponential(1.0 / _positive(rate, "rate"), len(pairs)))
    return Workload(name, tuple(TraceRequest(float(a), p, o) for a, (p, o) in zip(arrivals, pairs)), max_len)


# ----------------------------------------------------------------- internals
def _pairs(lengths: Any) -> List[Tuple[Any, Any]]:
    """``lengths`` as a list of 2-item pairs, or a typed error naming the first that is not one."""
    pairs = []
    for i, pair in enumerate(as_iterable(lengths, "lengths")):
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Iterable):
            raise InvalidTypeError(f"lengths, pair {i}: expected (prompt_len, output_len), got {pair!r}")
        items = tuple(pair)
        if len(items) != 2:
            raise WorkloadError(f"lengths, pair {i}: expected 2 values (prompt_len, output_len), got {len(items)}")
        pairs.append((items[0], items[1]))
    return pairs


def _positive(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise InvalidArgumentError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _lengths(samples: np.ndarray, cap: int) -> np.ndarray:
    return np.clip(np.rint(samples), 1, cap).astype(np.int64)


def _capped_mean(mu: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for X log-normal(mu, sigma)."""
    z = (math.log(cap) - mu) / sigma
    below = math.exp(mu + sigma * sigma / 2) * _phi(z - sigma)
    return below + cap * (1.0 - _phi(z))


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _lognormal_mu(mean: float, sigma: float, cap: int) -> float:
    """The mu whose log-normal, capped at ``cap``, has mean ``mean`` (bisection; the capped mean rises with mu)."""
    if mean >= cap:
        raise WorkloadError(f"mean length {mean} does not fit under max length {cap}")
    low, high = math.log(mean) - 3 * sigma * sigma, math.log(cap) + 10 * sigma
    for _ in range(100):
        mid = (low + high) / 2
        if _capped_mean(mid, sigma, cap) < mean:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def _read_csv(path: str) -> List[Tuple[str, dict]]:
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        fields = reader.fieldnames or []
        missing = {"prompt_len", "output_len"} - set(fields)
        if missing:
            raise WorkloadError(
                f"trace file {path!r}: the CSV header must name prompt_len and output_len "
                f"(optional: arrival); missing {sorted(missing)}, found {fields}"
            )
        return [(f"row {i}", dict(row)) for i, row in enumerate(reader, start=2)]


def _read_json(path: str) -> List[Tuple[str, dict]]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"trace file {path!r} is not valid JSON: {exc}") from None
    if not isinstance(data, list):
        raise WorkloadError(f"trace file {path!r}: expected a JSON list of requests, got {type(data).__name__}")
    rows = []
    for i, item in enumerate(data):
        if isinstance(item, list) and len(item) == 2:
            item = {"prompt_len": item[0], "output_len": item[1]}
        if not isinstance(item, dict):
            raise WorkloadError(
                f"trace file {path!r}, item {i}: expected an object with prompt_len and "
                f"output_len or a [prompt_len, output_len] pair, got {item!r}"
            )
        rows.append((f"item {i}", item))
    return rows


def _checked_row(source: str, where: str, raw: dict, max_len: int) -> Tuple[Optional[float], int, int]:
    lengths = []
    for key in ("prompt_len", "output_len"):
        value = raw.get(key)
        number = _as_int(value)
        if number is None or number < 1:
            raise WorkloadError(f"{source}, {where}: {key} must be an integer >= 1, got {value!r}")
        lengths.append(number)
    prompt, output = lengths
    if prompt + output > max_len:
        raise WorkloadError(
            f"{source}, {where}: prompt_len + output_len = {prompt + output} "
            f"exceeds max_len {max_len}"
        )
    arrival = raw.get("arrival")
    if arrival in (None, ""):
        return None, prompt, output
    try:
        when = float(arrival)
    except (TypeError, ValueError):
        when = float("nan")
    if not (math.isfinite(when) and when >= 0):
        raise WorkloadError(f"{source}, {where}: arrival must be a number >= 0, got {arrival!r}")
    return when, prompt, output


def _as_int(value: object) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None
