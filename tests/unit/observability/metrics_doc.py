"""The metric catalog in docs/metrics.md, read as data (shared by the observability tests).

A metric row is a table row whose first cell is a back-quoted name starting with `dropless_`:
| `name` | type | unit | labels | meaning |
"""
import re

_ROW = re.compile(r"^\|\s*`(dropless_[a-z0-9_]+)`\s*\|(.*)\|\s*$")
_LABELS = re.compile(r"^(`[a-zA-Z_][a-zA-Z0-9_]*`(\s*,\s*`[a-zA-Z_][a-zA-Z0-9_]*`)*)?$")
TYPES = ("counter", "gauge", "histogram", "summary")


class Metric:
    def __init__(self, name, mtype, unit, labels, meaning, line):
        self.name, self.type, self.unit = name, mtype, unit
        self.labels, self.meaning, self.line = labels, meaning, line

    def __repr__(self):
        return "Metric(%s %s {%s})" % (self.name, self.type, ",".join(sorted(self.labels)))


def parse(path):
    """name -> Metric; raises ValueError naming the line of a malformed or repeated row."""
    metrics = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            m = _ROW.match(line.rstrip("\n"))
            if not m:
                continue
            name = m.group(1)
            cells = [c.strip() for c in m.group(2).split("|")]
            where = "%s:%d (%s)" % (path, number, name)
            if len(cells) != 4:
                raise ValueError("%s: want 5 cells (name, type, unit, labels, meaning), got %d"
                                 % (where, len(cells) + 1))
            mtype, unit, labels_cell, meaning = cells
            if mtype not in TYPES:
                raise ValueError("%s: type %r is not one of %s" % (where, mtype, TYPES))
            if not unit or not meaning:
                raise ValueError("%s: unit and meaning must not be empty" % where)
            if not _LABELS.match(labels_cell):
                raise ValueError("%s: labels must be back-quoted names separated by commas, got %r"
                                 % (where, labels_cell))
            labels = set(re.findall(r"`([a-zA-Z_][a-zA-Z0-9_]*)`", labels_cell))
            if "job" in labels:
                raise ValueError("%s: no label may be named `job`: Prometheus sets `job` on every "
                                 "scraped target (use job_id)" % where)
            if mtype == "counter" and not name.endswith("_total"):
                raise ValueError("%s: a counter's name ends in _total" % where)
            if mtype == "histogram" and not name.endswith("_seconds") and unit == "seconds":
                raise ValueError("%s: a latency histogram's name ends in _seconds" % where)
            if name in metrics:
                raise ValueError("%s: listed twice (first at line %d)" % (where, metrics[name].line))
            metrics[name] = Metric(name, mtype, unit, labels, meaning, number)
    if not metrics:
        raise ValueError("%s: no metric rows found" % path)
    return metrics


def family_of(series_name, documented):
    """The documented family a sample name belongs to (X_bucket/X_sum/X_count -> X), or None."""
    if series_name in documented:
        return series_name
    for suffix in ("_bucket", "_sum", "_count"):
        if series_name.endswith(suffix):
            base = series_name[: -len(suffix)]
            if base in documented and documented[base].type in ("histogram", "summary"):
                return base
    return None
