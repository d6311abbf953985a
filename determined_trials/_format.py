"""Text output shared by `det-trials` and the experiment runner's report: aligned tables, CSV and strict JSON,
and how single values print.

May import: nothing
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import io
import json
import math
from collections.abc import Sequence
from typing import Any, TextIO

__all__ = ["FORMATS", "Column", "emit", "flat_hparams", "human_size", "jsonable", "local_time", "table", "text"]

_ELLIPSIS = "…"
_MIN_SQUEEZED = 12  # a squeezed column keeps at least this many characters (or its title's)

FORMATS = ("table", "csv", "json")


@dataclasses.dataclass(frozen=True)
class Column:
    """One output column: ``key`` heads CSV output, ``title`` heads the text table."""

    key: str
    title: str


def local_time(value: _dt.datetime | None) -> str:
    """A timestamp in the local time zone, to the second ('' for none)."""
    return "" if value is None else value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def human_size(size: int) -> str:
    """Bytes as a short human-readable size (1.5 MiB)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def text(value: Any) -> str:
    """How a value prints in a table cell: short floats, compact JSON for structures."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, _dt.datetime):
        return local_time(value)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(jsonable(value), separators=(",", ":"))
    return str(value)


def _csv_text(value: Any) -> str:
    """How a value prints in a CSV cell: full precision, ISO times, compact JSON for structures."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    return text(value)


def jsonable(value: Any) -> Any:
    """``value`` as strict JSON data: datetimes as ISO text, NaN/Infinity as the strings "NaN" etc."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _squeeze(columns: Sequence[Column], widths: list[int], fit: int, squeeze: Sequence[str]) -> list[int]:
    """Column widths narrowed, the ``squeeze`` keys first to last, until the table fits ``fit``
    characters (or every squeezable column is at its minimum)."""
    widths = list(widths)
    excess = sum(widths) + 2 * (len(widths) - 1) - fit
    for key in squeeze:
        if excess <= 0:
            break
        index = next((i for i, c in enumerate(columns) if c.key == key), None)
        if index is None:
            continue
        floor = max(len(columns[index].title), _MIN_SQUEEZED)
        cut = min(excess, max(0, widths[index] - floor))
        widths[index] -= cut
        excess -= cut
    return widths


def _clip(cell: str, width: int) -> str:
    return cell if len(cell) <= width else cell[: max(0, width - len(_ELLIPSIS))] + _ELLIPSIS


def table(columns: Sequence[Column], rows: Sequence[Sequence[Any]], *, fit: int | None = None,
          squeeze: Sequence[str] = ()) -> str:
    """An aligned plain-text table; numeric columns are right-aligned. With ``fit`` (a terminal's
    width), the columns keyed in ``squeeze`` are narrowed, their long cells cut with an ellipsis,
    until the table fits."""
    cells = [[text(v) for v in row] for row in rows]
    widths = [len(c.title) for c in columns]
    for row in cells:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row)]
    if fit is not None and squeeze:
        widths = _squeeze(columns, widths, fit, squeeze)
        cells = [[_clip(cell, w) for cell, w in zip(row, widths)] for row in cells]
    numeric = [
        bool(rows) and all(_is_number(row[i]) or row[i] is None for row in rows) for i in range(len(columns))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)
        ]
        return "  ".join(parts).rstrip()

    out = [line([c.title for c in columns]), line(["-" * w for w in widths])]
    out.extend(line(row) for row in cells)
    return "\n".join(out) + "\n"


def _csv(columns: Sequence[Column], rows: Sequence[Sequence[Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([c.key for c in columns])
    writer.writerows([_csv_text(v) for v in row] for row in rows)
    return buffer.getvalue()


def emit(
    out: TextIO,
    fmt: str,
    columns: Sequence[Column],
    rows: Sequence[Sequence[Any]],
    records: Any,
    *,
    fit: int | None = None,
    squeeze: Sequence[str] = (),
) -> None:
    """Write ``rows`` as a table (fitted to ``fit`` characters by narrowing the ``squeeze`` columns)
    or CSV, or ``records`` (the full data) as JSON, to ``out``."""
    if fmt == "json":
        out.write(json.dumps(jsonable(records), indent=2, allow_nan=False) + "\n")
    elif fmt == "csv":
        out.write(_csv(columns, rows))
    else:
        out.write(table(columns, rows, fit=fit, squeeze=squeeze))


def flat_hparams(hparams: dict[str, Any], prefix: str = "") -> list[str]:
    """``name=value`` pairs, nested hyperparameters as ``outer.inner=value``."""
    pairs: list[str] = []
    for key, value in hparams.items():
        if isinstance(value, dict) and value:
            pairs.extend(flat_hparams(value, f"{prefix}{key}."))
        else:
            pairs.append(f"{prefix}{key}={text(value)}")
    return pairs
