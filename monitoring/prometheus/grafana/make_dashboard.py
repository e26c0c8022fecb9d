#!/usr/bin/python3
"""Writes troupe-dashboard.json (next to this script), the Grafana dashboard of a troupe job.
Edit the panels here and run it; tests/integration/prometheus_queries_test.py checks that the
JSON is what this script writes, that it is provisionable, and that every query names a
series troupe exports or a recording rule of ../troupe.rules.yml."""

import json
import os
import sys

DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
SEL = 'instance=~"$instance"'
panels = []
next_id = [1]


def target(expr, legend, ref):
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref,
            "range": True, "editorMode": "code"}


def panel(title, desc, grid, targets, unit="short", kind="timeseries", stack=False,
          min_=None, max_=None, thresholds=None, mappings=None, draw="line"):
    p = {"id": next_id[0], "type": kind, "title": title, "description": desc,
         "datasource": DS, "gridPos": grid,
         "targets": [target(e, l, chr(ord("A") + i)) for i, (e, l) in enumerate(targets)]}
    next_id[0] += 1
    defaults = {"unit": unit}
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    if thresholds:
        defaults["thresholds"] = {"mode": "absolute", "steps": thresholds}
    if mappings:
        defaults["mappings"] = mappings
    if kind == "timeseries":
        defaults["custom"] = {"drawStyle": draw, "lineWidth": 1,
                              "fillOpacity": 60 if stack else (80 if draw == "bars" else 10),
                              "stacking": {"mode": "normal" if stack else "none", "group": "A"},
                              "showPoints": "never", "spanNulls": False}
        if thresholds:
            defaults["custom"]["thresholdsStyle"] = {"mode": "line"}
        p["options"] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}}
    else:
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "value", "graphMode": "area", "textMode": "auto",
                        "justifyMode": "auto", "orientation": "auto"}
    p["fieldConfig"] = {"defaults": defaults, "overrides": []}
    return p


def row(title, y):
    p = {"id": next_id[0], "type": "row", "title": title, "collapsed": False,
         "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []}
    next_id[0] += 1
    return p


green_red = [{"color": "green", "value": None}, {"color": "red", "value": 80}]
state_map = [{"type": "value", "options": {
    "0": {"text": "forming", "color": "blue", "index": 0},
    "1": {"text": "training", "color": "green", "index": 1},
    "2": {"text": "recovering", "color": "orange", "index": 2},
    "3": {"text": "done", "color": "text", "index": 3},
    "4": {"text": "failed", "color": "red", "index": 4}}}]

y = 0
panels.append(row("Job", y)); y += 1
panels.append(panel("State", "troupe_job_state: forming, training, recovering, done, failed.",
                    {"h": 4, "w": 4, "x": 0, "y": y}, [(f"troupe_job_state{{{SEL}}}", "{{instance}}")],
                    kind="stat", mappings=state_map))
panels.append(panel("Step", "Last committed step.", {"h": 4, "w": 4, "x": 4, "y": y},
                    [(f"troupe_step{{{SEL}}}", "{{instance}}")], kind="stat"))
panels.append(panel("Generation", "Generations formed so far (a new one per recovery, grow or rebalance).",
                    {"h": 4, "w": 4, "x": 8, "y": y}, [(f"troupe_generation{{{SEL}}}", "{{instance}}")], kind="stat"))
panels.append(panel("World", "Ranks in the current generation.", {"h": 4, "w": 4, "x": 12, "y": y},
                    [(f"troupe_world_size{{{SEL}}}", "{{instance}}")], kind="stat"))
panels.append(panel("Goodput (whole run)", "troupe_goodput_ratio: compute rank-seconds over all rank-seconds since the job started, as of the last committed step.",
                    {"h": 4, "w": 4, "x": 16, "y": y}, [(f"troupe_goodput_ratio{{{SEL}}}", "{{instance}}")],
                    unit="percentunit", kind="stat", min_=0, max_=1))
panels.append(panel("MFU", "troupe_mfu_ratio: the committed tokens' model FLOPs over the job's rank-seconds at peak (troupe_peak_flops each), as of the last committed step.",
                    {"h": 4, "w": 4, "x": 20, "y": y}, [(f"troupe_mfu_ratio{{{SEL}}}", "{{instance}}")],
                    unit="percentunit", kind="stat", min_=0, max_=1))
y += 4
panels.append(row("Training", y)); y += 1
panels.append(panel("Loss", "Training loss of the last committed step and the last validation loss (nats per byte).",
                    {"h": 8, "w": 12, "x": 0, "y": y},
                    [(f"troupe_loss{{{SEL}}}", "train {{instance}}"),
                     (f"troupe_validation_loss{{{SEL}}}", "validation {{instance}}")]))
panels.append(panel("Tokens per second", "The last step's throughput, and tokens committed per second over the interval.",
                    {"h": 8, "w": 12, "x": 12, "y": y},
                    [(f"troupe_tokens_per_second{{{SEL}}}", "last step {{instance}}"),
                     (f"rate(troupe_tokens_total{{{SEL}}}[$__rate_interval])", "committed {{instance}}")]))
y += 8
panels.append(panel("Step time", "Wall time between commits: quantiles over 5 minutes (recording rules of troupe.rules.yml) and the mean over the interval.",
                    {"h": 8, "w": 12, "x": 0, "y": y},
                    [(f"troupe:step_seconds:p50_rate5m{{{SEL}}}", "p50 {{instance}}"),
                     (f"troupe:step_seconds:p90_rate5m{{{SEL}}}", "p90 {{instance}}"),
                     (f"troupe:step_seconds:p99_rate5m{{{SEL}}}", "p99 {{instance}}"),
                     (f"rate(troupe_step_seconds_sum{{{SEL}}}[$__rate_interval]) / rate(troupe_step_seconds_count{{{SEL}}}[$__rate_interval])",
                      "mean {{instance}}")], unit="s"))
panels.append(panel("Step parts (last step, mean per rank)", "Forward and backward, gradient all-reduce, and the wait for the commit.",
                    {"h": 8, "w": 12, "x": 12, "y": y},
                    [(f"troupe_step_compute_seconds{{{SEL}}}", "compute {{instance}}"),
                     (f"troupe_step_comm_seconds{{{SEL}}}", "comm {{instance}}"),
                     (f"troupe_step_control_seconds{{{SEL}}}", "control {{instance}}")], unit="s"))
y += 8
panels.append(row("Where the time goes", y)); y += 1
panels.append(panel("Phase breakdown", "Rank-seconds per second in each phase (troupe_rank_seconds_total): the stack is the number of ranks.",
                    {"h": 9, "w": 12, "x": 0, "y": y},
                    [(f"sum by (phase) (rate(troupe_rank_seconds_total{{{SEL}}}[$__rate_interval]))", "{{phase}}")],
                    stack=True))
panels.append(panel("Goodput and MFU", "Goodput over 5 minutes (troupe:goodput:ratio_rate5m) and since the start (troupe_goodput_ratio); model-FLOPs utilisation since the start (troupe_mfu_ratio).",
                    {"h": 9, "w": 12, "x": 12, "y": y},
                    [(f"troupe:goodput:ratio_rate5m{{{SEL}}}", "goodput 5m {{instance}}"),
                     (f"troupe_goodput_ratio{{{SEL}}}", "goodput whole run {{instance}}"),
                     (f"troupe_mfu_ratio{{{SEL}}}", "MFU {{instance}}")], unit="percentunit", min_=0, max_=1))
y += 9
panels.append(row("Membership and recovery", y)); y += 1
panels.append(panel("Generation and world", "The job's generation and its world size; state 0 forming, 1 training, 2 recovering, 3 done, 4 failed.",
                    {"h": 8, "w": 8, "x": 0, "y": y},
                    [(f"troupe_generation{{{SEL}}}", "generation {{instance}}"),
                     (f"troupe_world_size{{{SEL}}}", "world {{instance}}"),
                     (f"troupe_job_state{{{SEL}}}", "state {{instance}}")]))
panels.append(panel("Recoveries", "Recoveries by cause and ranks lost, per interval.",
                    {"h": 8, "w": 8, "x": 8, "y": y},
                    [(f"sum by (cause) (increase(troupe_recoveries_total{{{SEL}}}[$__rate_interval]))", "{{cause}}"),
                     (f"increase(troupe_ranks_lost_total{{{SEL}}}[$__rate_interval])", "ranks lost {{instance}}")],
                    draw="bars"))
panels.append(panel("Recovery time", "From a failure's detection to the new generation training (troupe_recovery_seconds).",
                    {"h": 8, "w": 8, "x": 16, "y": y},
                    [(f"histogram_quantile(0.5, sum by (le) (rate(troupe_recovery_seconds_bucket{{{SEL}}}[$__rate_interval])))", "p50"),
                     (f"histogram_quantile(0.99, sum by (le) (rate(troupe_recovery_seconds_bucket{{{SEL}}}[$__rate_interval])))", "p99")],
                    unit="s"))
y += 8
panels.append(row("Checkpoints", y)); y += 1
panels.append(panel("Committed step", "The last committed step and the step of the newest committed checkpoint: the gap is what a failure would cost.",
                    {"h": 8, "w": 8, "x": 0, "y": y},
                    [(f"troupe_step{{{SEL}}}", "step {{instance}}"),
                     (f"troupe_checkpoint_last_committed_step{{{SEL}}}", "checkpoint {{instance}}")]))
panels.append(panel("Checkpoints committed and failed", "Per interval.",
                    {"h": 8, "w": 8, "x": 8, "y": y},
                    [(f"increase(troupe_checkpoints_total{{{SEL}}}[$__rate_interval])", "committed {{instance}}"),
                     (f"increase(troupe_checkpoint_failures_total{{{SEL}}}[$__rate_interval])", "failed {{instance}}")],
                    draw="bars"))
panels.append(panel("Checkpoint stall and write", "Mean training stall per checkpoint (snapshot) and mean background write, over the interval.",
                    {"h": 8, "w": 8, "x": 16, "y": y},
                    [(f"rate(troupe_checkpoint_stall_seconds_sum{{{SEL}}}[$__rate_interval]) / rate(troupe_checkpoint_stall_seconds_count{{{SEL}}}[$__rate_interval])", "stall {{instance}}"),
                     (f"rate(troupe_checkpoint_write_seconds_sum{{{SEL}}}[$__rate_interval]) / rate(troupe_checkpoint_write_seconds_count{{{SEL}}}[$__rate_interval])", "write {{instance}}")],
                    unit="s"))
y += 8
panels.append(row("Ranks", y)); y += 1
panels.append(panel("Heartbeat age per rank", "Seconds since each rank's last heartbeat; a rank is declared lost at --heartbeat-timeout-ms (2 s by default).",
                    {"h": 8, "w": 12, "x": 0, "y": y},
                    [(f"troupe_heartbeat_age_seconds{{{SEL}}}", "rank {{rank}}")], unit="s"))
panels.append(panel("Straggler score per rank", "Each rank's typical compute time over the median rank's (1 is typical; the detector flags 1.3, TroupeStraggler alerts above 1.5 for 10 minutes when that costs over 2 ms a step). Ranks no longer in the world keep their last value.",
                    {"h": 8, "w": 12, "x": 12, "y": y},
                    [(f"troupe_straggler_score{{{SEL}}}", "rank {{rank}}")],
                    thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1.3},
                                {"color": "red", "value": 1.5}]))

dash = {
    "title": "troupe training job",
    "uid": "troupe-job",
    "description": "One troupe job's coordinator metrics, picked by its job id (monitoring/prometheus/README.md).",
    "tags": ["troupe", "training"],
    "schemaVersion": 38,
    "version": 1,
    "editable": True,
    "graphTooltip": 1,
    "refresh": "10s",
    "time": {"from": "now-1h", "to": "now"},
    "timepicker": {},
    "timezone": "",
    "fiscalYearStartMonth": 0,
    "liveNow": False,
    "weekStart": "",
    "links": [],
    "annotations": {"list": [{
        "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
        "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts",
        "type": "dashboard"}]},
    "templating": {"list": [
        {"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [],
         "refresh": 1, "regex": "", "skipUrlSync": False},
        # One job at a time: its id (troupe_job_info's job_id, the --job-id or the run
        # directory's name), then the coordinator endpoints that export it, which every panel
        # selects by. A job's series carry no job_id label of their own: troupe_job_info says
        # which scrape target is which job.
        {"name": "job_id", "label": "Job", "type": "query", "datasource": DS,
         "definition": "label_values(troupe_job_info, job_id)",
         "query": {"query": "label_values(troupe_job_info, job_id)", "refId": "PrometheusVariableQueryEditor-VariableQuery"},
         "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [],
         "refresh": 2, "regex": "", "skipUrlSync": False, "sort": 1},
        {"name": "instance", "label": "Coordinator", "type": "query", "datasource": DS,
         "definition": 'label_values(troupe_job_info{job_id="$job_id"}, instance)',
         "query": {"query": 'label_values(troupe_job_info{job_id="$job_id"}, instance)', "refId": "PrometheusVariableQueryEditor-VariableQuery"},
         "current": {}, "hide": 0, "includeAll": True, "multi": True, "options": [],
         "refresh": 2, "regex": "", "skipUrlSync": False, "sort": 1},
    ]},
    "panels": panels,
}


def render():
    return json.dumps(dash, indent=2) + "\n"


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "troupe-dashboard.json")
    with open(out, "w") as f:
        f.write(render())
