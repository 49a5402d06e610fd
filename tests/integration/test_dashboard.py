"""Goal: the Grafana dashboard in deploy/grafana shows what exists. Every query of every panel
parses as PromQL, and every metric it selects, with every label it matches on, is in a live
scrape of a real gateway (its /metrics) or of a real `lmcache server` with our plugin (LMCache
0.5.6 serves its own on its HTTP port), after traffic through both. The dashboard covers what an
operator asked for: hit ratio per tier, bytes stored and loaded, the write rate, op latency,
sessions, capacity, evictions and refusals."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import promql_parser
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import ROOT, Gateway, LMCacheServer, free_port, store_then_load_from_l2

pytestmark = pytest.mark.integration
DASHBOARD = ROOT / "deploy" / "grafana" / "lmcache-adp.json"
# Grafana's own variables, as Grafana would fill them in before Prometheus sees the query.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
Labels = dict[str, set[str]]  # metric (sample) name -> the label names its series carry


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel."""
    return [
        (panel["title"], target["expr"])
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """The metric and the label names matched by each series selector of ``expr``."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    found: list[tuple[str, set[str]]] = []

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            labels = {matcher.name for matcher in node.matchers.matchers}
            found.append((node.name, labels))

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def problems(expr: str, scraped: Labels) -> list[str]:
    """What in ``expr`` the scrapes do not have: metrics, or labels of a metric."""
    said = []
    for metric, labels in selectors(expr):
        if metric not in scraped:
            said.append(f"no metric {metric}")
        elif labels - scraped[metric]:
            said.append(f"{metric} has no label {sorted(labels - scraped[metric])}")
    return said


def scrape(url: str) -> Labels:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    scraped: Labels = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            scraped.setdefault(sample.name, set()).update(sample.labels)
    return scraped


@pytest.fixture
def live(make_gateway: Callable[..., Gateway], make_server: Callable[..., LMCacheServer]) -> Labels:
    """Both scrapes, after chunks went through a real server into the gateway and back."""
    address = f"127.0.0.1:{free_port()}"
    gateway = make_gateway("1GiB", "--metrics-address", address).start()
    server = make_server(gateway.l2_adapter_json()).start()
    store_then_load_from_l2(server, seed=11, chunks="2")
    ours = scrape(f"http://{address}/metrics")
    lmcache = scrape(f"http://127.0.0.1:{server.http_port}/metrics")
    assert "adp_gateway_keys_total" in ours and "lmcache_mp_l2_usage_bytes" in lmcache
    return {**lmcache, **ours}


def test_every_panel_query_selects_metrics_and_labels_a_live_stack_serves(live: Labels) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    found = queries(dashboard)
    assert len(found) >= 20, found
    wrong = {f"{title}: {expr}": problems(expr, live) for title, expr in found}
    assert not {query: said for query, said in wrong.items() if said}
    used = {metric for _, expr in found for metric, _ in selectors(expr)}
    assert any(m.startswith("adp_gateway_") for m in used)
    assert any(m.startswith("lmcache_mp_") for m in used)

    # The check can fail: a misspelt metric, a label the metric lacks, a query that is no PromQL.
    assert problems("rate(adp_gateway_written_byte_total[5m])", live) == [
        "no metric adp_gateway_written_byte_total"
    ]
    assert problems('adp_gateway_used_bytes{tenant="a"}', live) == [
        "adp_gateway_used_bytes has no label ['tenant']"
    ]
    with pytest.raises(ValueError):
        selectors("sum(rate(adp_gateway_keys_total[5m])")


def test_the_dashboard_covers_what_an_operator_asked_for() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    titles = " | ".join(panel["title"].lower() for panel in panels(dashboard))
    for wanted in (
        "hit ratio per tier",
        "bytes stored and loaded",
        "write rate",
        "latency",
        "sessions",
        "capacity",
        "evictions",
        "refused",
    ):
        assert wanted in titles, f"no panel on {wanted}: {titles}"
    text = DASHBOARD.read_text()
    for tier in ("lmcache_mp_lookup_hit_l1_tokens_total", "lmcache_mp_lookup_hit_l2_tokens_total"):
        assert tier in text
    # One Prometheus data source, picked at import: no uid of somebody's Grafana inside.
    uids = set(re.findall(r'"uid": "([^"]*)"', text)) - {dashboard["uid"]}
    assert uids == {"${datasource}"}, uids
