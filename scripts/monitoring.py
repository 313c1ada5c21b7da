#!/usr/bin/env python3
"""Writes what derives from deploy/monitoring/alerts.yaml and dashboard.json (`make monitoring`):

- deploy/monitoring/prometheusrule.yaml: the rule file's groups as a PrometheusRule;
- deploy/helm/wasmop/files/: byte copies of both, which the chart ships.

tests/e2e/monitoring.rs and tests/e2e/chart.rs fail when these are stale.
"""
import pathlib
import shutil

ROOT = pathlib.Path(__file__).resolve().parent.parent
MON = ROOT / "deploy" / "monitoring"
CHART_FILES = ROOT / "deploy" / "helm" / "wasmop" / "files"

HEADER = """# wasmop's alerts for the prometheus-operator (kube-prometheus): alerts.yaml's groups as a
# PrometheusRule, written by `make monitoring` (scripts/monitoring.py); a test checks that its
# groups are alerts.yaml's. Your Prometheus selects rules by labels (`ruleSelector`): add its
# labels in an overlay (kube-prometheus-stack: `release: <its release name>`).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: wasmop
  namespace: wasmop-system
spec:
"""


def main() -> None:
    rules = (MON / "alerts.yaml").read_text()
    body = [line for line in rules.splitlines() if not line.startswith("#")]
    spec = "\n".join(("  " + line) if line else line for line in body)
    (MON / "prometheusrule.yaml").write_text(HEADER + spec + "\n")
    CHART_FILES.mkdir(parents=True, exist_ok=True)
    for name in ("alerts.yaml", "dashboard.json"):
        shutil.copyfile(MON / name, CHART_FILES / name)


if __name__ == "__main__":
    main()
