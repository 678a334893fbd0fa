"""The PromQL of deploy/: every expression the Grafana dashboards and the Prometheus rules use,
in a form that can be sent to Prometheus's HTTP API, and the metric names they reference.

Dashboards: every target's `expr` and every query variable's `label_values(METRIC, LABEL)`
(checked as METRIC). Grafana's variables are replaced: $__rate_interval by RATE_INTERVAL,
$instance (a multi-value variable whose "All" is `.*`) by `.*`.
Rules: every recording rule's expr; for an alert, the expression without its final comparison
(`LHS > 0.9` -> `LHS`), the part that must return data on a healthy cluster (whether the
comparison fires is what `promtool test rules` checks).
"""
import glob
import json
import os
import re

import yaml

RATE_INTERVAL = "15s"
_COMPARISON = re.compile(r"^(.*?)\s*(==|!=|>=|<=|>|<)\s*(-?[0-9.eE+]+)\s*$", re.S)
_METRIC = re.compile(r"\b(adjsh_[a-z0-9_]+|adjsh:[a-z0-9_:]+)\b")
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def _substitute(expr):
    return expr.replace("$__rate_interval", RATE_INTERVAL).replace("$instance", ".*")


def dashboard_expressions(deploy_dir):
    """[(where, promql)] of every dashboard under deploy_dir/grafana/dashboards."""
    out = []
    for path in sorted(glob.glob(os.path.join(deploy_dir, "grafana", "dashboards", "*.json"))):
        with open(path) as f:
            d = json.load(f)
        name = os.path.basename(path)
        for p in d.get("panels", []):
            for t in p.get("targets", []):
                out.append((f"{name}: panel '{p['title']}' {t['refId']}", _substitute(t["expr"])))
        for v in d.get("templating", {}).get("list", []):
            q = v.get("query", {})
            q = q.get("query", "") if isinstance(q, dict) else q
            m = re.match(r"^label_values\((\w+),\s*\w+\)$", q)
            if v.get("type") == "query":
                assert m, f"{name}: variable {v['name']}: unsupported query {q!r}"
                out.append((f"{name}: variable {v['name']}", m.group(1)))
    return out


def rule_expressions(deploy_dir):
    """[(where, promql)] of deploy_dir/prometheus/rules.yml (alerts without their comparison)."""
    path = os.path.join(deploy_dir, "prometheus", "rules.yml")
    with open(path) as f:
        rules = yaml.safe_load(f)
    out = []
    for g in rules["groups"]:
        for r in g["rules"]:
            if "record" in r:
                out.append((f"rules.yml: record {r['record']}", r["expr"]))
            else:
                m = _COMPARISON.match(r["expr"].strip())
                assert m, f"rules.yml: alert {r['alert']}: expression is not 'QUERY <op> NUMBER'"
                out.append((f"rules.yml: alert {r['alert']}", m.group(1)))
    return out


def alert_rules(deploy_dir):
    """[(alert name, rule)] of deploy_dir/prometheus/rules.yml."""
    with open(os.path.join(deploy_dir, "prometheus", "rules.yml")) as f:
        rules = yaml.safe_load(f)
    return [(r["alert"], r) for g in rules["groups"] for r in g["rules"] if "alert" in r]


def recorded_names(deploy_dir):
    with open(os.path.join(deploy_dir, "prometheus", "rules.yml")) as f:
        rules = yaml.safe_load(f)
    return {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}


def referenced_metrics(expressions):
    """{metric family name: [where]} of the adjsh metrics the expressions use (histogram series
    _bucket/_sum/_count folded into their family)."""
    out = {}
    for where, expr in expressions:
        for name in _METRIC.findall(expr):
            out.setdefault(name, []).append(where)
    return out


def family_of(series_name, histograms):
    for s in _HISTOGRAM_SUFFIXES:
        if series_name.endswith(s) and series_name[: -len(s)] in histograms:
            return series_name[: -len(s)]
    return series_name


def parse_exposition(text):
    """({family: type}, {series name}) of a Prometheus text exposition."""
    types, series = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            types[name] = kind.strip()
        elif line and not line.startswith("#"):
            series.add(re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", line).group(1))
    return types, series
