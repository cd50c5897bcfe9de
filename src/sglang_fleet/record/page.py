"""The run record as one self-contained HTML page: styles and the small filter script inline,
no external URL (its Content-Security-Policy forbids every request), every text from a node
or the inventory escaped. Rendered here, not by the script: the page reads without it."""

from __future__ import annotations

import html
import json
import re
import time
from typing import Any

# Servers of a verdict group shown open; a larger group of ready servers starts collapsed.
OPEN_READY_UP_TO = 8
_PHASE_CLASS = re.compile(r"[^a-z_]")

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{padding:14px 20px;background:#fff;border-bottom:1px solid #dde}
h1{font-size:20px;margin:0 0 4px}.host{font-weight:700}h2{font-size:16px;margin:22px 0 8px}
main{padding:0 20px 30px}.meta{color:#555;font-size:13px}
.fleet{font-size:17px;font-weight:600;padding:8px 12px;border-radius:6px;margin:6px 0}
.s-yes{background:#e3f4e6;color:#14532d}.s-partly{background:#fff4d6;color:#7a4b00}
.s-no,.s-unknown{background:#fde4e4;color:#8c1c22}
.note{background:#fde4e4;color:#8c1c22;padding:6px 10px;border-radius:4px}
.bar{display:flex;gap:8px;align-items:center;margin:12px 0}
input,select{font:inherit;padding:3px 6px}
details.group{margin:8px 0;background:#fff;border:1px solid #dde;border-radius:6px}
details.group>summary{padding:6px 10px;font-weight:600;cursor:pointer}
details.server{border-top:1px solid #eef}
details.server>summary{display:grid;grid-template-columns:170px 110px 1fr 300px;gap:10px;
 padding:5px 10px;cursor:pointer;align-items:center}
.v{display:inline-block;padding:1px 7px;border-radius:9px;font-size:12px;font-weight:600}
.v-ready{background:#d8f0dc;color:#14532d}.v-progressing{background:#e0ecff;color:#1e3a8a}
.v-stopped,.v-not_started{background:#eee;color:#444}
.v-other{background:#fde4e4;color:#8c1c22}
.tl{position:relative;height:14px;background:#eef0f4;border-radius:3px;overflow:hidden}
.tl span{position:absolute;top:0;bottom:0;border-right:1px solid #fff}
.body{padding:6px 14px 12px 24px;font-size:13px}
.body dt{font-weight:600;float:left;width:90px;clear:left}.body dd{margin:0 0 4px 100px}
pre{background:#111;color:#ddd;padding:8px;overflow:auto;max-height:320px;font-size:12px;
 white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse;background:#fff;width:100%;font-size:13px}
td,th{border:1px solid #dde;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f0f2f6}.secret{color:#7a4b00}.muted{color:#777}
.ph-validated{background:#c7cdd8}.ph-files_written{background:#aab3c5}
.ph-staging_weights,.ph-launching{background:#9cc3f0}.ph-loading_weights{background:#6fa8e8}
.ph-allocating_kv_cache{background:#8e9be6}.ph-capturing_cuda_graph{background:#b48be0}
.ph-starting_http{background:#7fd0d6}.ph-warming_up{background:#f0d27a}
.ph-ready,.ph-serving,.ph-joined_router{background:#6cc28a}
.ph-drained,.ph-stopped,.ph-killed{background:#999}
.ph-stalled,.ph-crashed,.ph-unhealthy,.ph-gpu_fault{background:#e06565}
.legend span{display:inline-block;padding:0 6px;margin:0 4px 4px 0;border-radius:3px;font-size:12px}
"""

# Filter by host or group (text) and by verdict; filtering opens the groups that match, and
# clearing the filter folds them back as they were.
SCRIPT = """
(function(){
var q=document.getElementById('q'),v=document.getElementById('verdict');
function apply(){
 var t=q.value.trim().toLowerCase(),w=v.value,rows=document.querySelectorAll('details.server');
 for(var i=0;i<rows.length;i++){var r=rows[i];
  var hit=(!t||r.getAttribute('data-host').indexOf(t)>=0||
   r.getAttribute('data-groups').indexOf(t)>=0)&&(!w||r.getAttribute('data-verdict')===w);
  r.hidden=!hit;}
 var groups=document.querySelectorAll('details.group');
 for(var j=0;j<groups.length;j++){var g=groups[j];
  var shown=g.querySelectorAll('details.server:not([hidden])').length;
  if(!g.hasAttribute('data-open')){g.setAttribute('data-open',g.open?'1':'');}
  g.hidden=shown===0;g.open=(t||w)?shown>0:g.getAttribute('data-open')==='1';}
 document.getElementById('shown').textContent=
  document.querySelectorAll('details.server:not([hidden])').length+' shown';
}
q.addEventListener('input',apply);v.addEventListener('change',apply);apply();
})();
"""

SECRET_NOTE = ' <span class="secret">(secret: fingerprints)</span>'
CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
       "img-src data:; base-uri 'none'; form-action 'none'")


def e(value: Any) -> str:
    """Text for the page: escaped, whatever it holds."""
    return html.escape("" if value is None else str(value), quote=True)


def when(at: float | None, with_date: bool = False) -> str:
    if not at:
        return ""
    fmt = "%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S"
    return time.strftime(fmt, time.gmtime(at)) + (" UTC" if with_date else "")


def _verdict_badge(verdict: str) -> str:
    known = verdict if verdict in ("ready", "progressing", "stopped") else \
        "not_started" if verdict == "not started" else \
        "progressing" if verdict == "recovered" else "other"
    return f'<span class="v v-{known}">{e(verdict)}</span>'


def _phase_class(phase: str) -> str:
    return "ph-" + _PHASE_CLASS.sub("_", str(phase).lower())


def timeline_bar(points: list[dict[str, Any]], start: float, end: float) -> str:
    """The server's phases as segments over the run's span: each from its start to the next."""
    span = max(end - start, 1e-6)
    parts = []
    for i, p in enumerate(points):
        until = points[i + 1]["at"] if i + 1 < len(points) else end
        left = min(max((p["at"] - start) / span, 0.0), 1.0) * 100
        width = max(min((until - p["at"]) / span * 100, 100 - left), 0.4)
        title = f"{p['phase']} at {when(p['at'])} ({p['source']}) {p.get('text') or ''}"
        parts.append(f'<span class="{_phase_class(p["phase"])}" style="left:{left:.2f}%;'
                     f'width:{width:.2f}%" title="{e(title.strip())}"></span>')
    return f'<div class="tl">{"".join(parts)}</div>'


def _evidence_html(ev: dict[str, Any] | None) -> str:
    if not ev:
        return ""
    links = " ".join(f'<a href="{e(f["href"])}">{e(f["name"])}</a>' for f in ev["files"])
    tail = "\n".join(ev.get("log_tail") or [])
    out = f"<dt>evidence</dt><dd><code>{e(ev['folder'])}</code><br>{links}</dd>"
    if tail:
        out += f"<dt>log tail</dt><dd><pre>{e(tail)}</pre></dd>"
    return out


def _gate_evidence_html(seen: dict[str, Any] | None, has_bundle: bool) -> str:
    """What the gate read when it judged the server failed: its signals, and the log's last
    lines when no evidence bundle holds them."""
    if not seen:
        return ""
    out = "".join(f"<dt>{e(k.replace('_', ' '))}</dt><dd>{e(_value(v))}</dd>"
                  for k, v in seen["signals"].items())
    if seen["last_lines"] and not has_bundle:
        out += f"<dt>log (gate)</dt><dd><pre>{e(chr(10).join(seen['last_lines']))}</pre></dd>"
    return out


def _timeline_rows(points: list[dict[str, Any]]) -> str:
    rows = "".join(f"<tr><td>{e(when(p['at']))}</td><td>{e(p['phase'])}</td>"
                   f"<td>{e(p['source'])}</td><td>{e(p.get('text'))}</td></tr>" for p in points)
    return ("<table><tr><th>time (UTC)</th><th>phase</th><th>from</th><th>said</th></tr>"
            f"{rows}</table>") if rows else '<span class="muted">no observation</span>'


def _server_html(s: dict[str, Any], start: float, end: float, opened: bool) -> str:
    fields = [("verdict", s["verdict"] + (f" in {s['phase']}" if s.get("phase") else "")),
              ("status", s["status"]), ("reason", s.get("reason")),
              ("failed as", s.get("failed_verdict")), ("cause", s.get("cause")),
              ("fix", s.get("fix")), ("failure", s.get("failure")),
              ("deployment", f"{s.get('deployment') or ''} config {s.get('config_hash') or ''}"),
              ("groups", ", ".join(s.get("groups") or []))]
    if s.get("recovery"):
        rec = s["recovery"]
        fields.append(("recovery", f"{rec.get('verdict')} in {rec.get('phase')}; next "
                                   f"{(rec.get('next') or {}).get('source')}"))
    dl = "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in fields if v)
    dl += _evidence_html(s.get("evidence"))
    dl += _gate_evidence_html(s.get("gate_evidence"), bool(s.get("evidence")))
    dl += f"<dt>timeline</dt><dd>{_timeline_rows(s['timeline'])}</dd>"
    short = s.get("reason") or s.get("progress") or ""
    recovered = " (recovered)" if s.get("recovered") else ""
    if s.get("recovered") and s.get("failed_verdict"):
        short = f"recovered from {s['failed_verdict']}"
    return (f'<details class="server"{" open" if opened else ""} '
            f'data-host="{e(s["host"].lower())}" '
            f'data-groups="{e(" ".join(s.get("groups") or []).lower())}" '
            f'data-verdict="{e(s["verdict"])}"><summary><span class="host">{e(s["host"])}</span>'
            f'<span>{_verdict_badge(s["verdict"])}{e(recovered)}</span>'
            f'<span>{e(short[:160])}</span>{timeline_bar(s["timeline"], start, end)}</summary>'
            f'<div class="body"><dl>{dl}</dl></div></details>')


def _groups_html(record: dict[str, Any]) -> str:
    servers = record["servers"]
    run = record["run"]
    points = [p["at"] for s in servers for p in s["timeline"]]
    start = min([run.get("started") or 0] + points) if points else (run.get("started") or 0)
    end = max([run.get("finished") or start] + points)
    order: list[str] = []
    for s in servers:  # already failed first
        if s["group"] not in order:
            order.append(s["group"])
    out = []
    for group in order:
        members = [s for s in servers if s["group"] == group]
        opened = group != "ready" or len(members) <= OPEN_READY_UP_TO
        detail = group not in ("ready", "stopped") and len(members) <= OPEN_READY_UP_TO
        rows = "".join(_server_html(s, start, end, detail) for s in members)
        out.append(f'<details class="group" data-group="{e(group)}"'
                   f'{" open" if opened else ""}><summary>'
                   f'{_verdict_badge(group)} {len(members)} server'
                   f'{"s" if len(members) != 1 else ""}</summary>{rows}</details>')
    return "".join(out) or '<p class="muted">no server in this run</p>'


def _value(v: Any) -> str:
    return "" if v is None else json.dumps(v) if not isinstance(v, str) else v


def _changes_html(changes: list[dict[str, Any]]) -> str:
    if not changes:
        return '<p class="muted">no LaunchSpec was built in this run</p>'
    out = []
    for c in changes:
        head = f"{e(c['host'])}: deployment {e(c['deployment'])}, config {e(c['config_hash'])}"
        if not c["against"]:
            out.append(f"<p>{head}: no earlier good run of this deployment in the ledger</p>")
            continue
        against = c["against"]
        head += (f" against its last good config {e(against['config_hash'])} "
                 f"(ready {e(when(against.get('at'), True))})")
        if not c["settings"]:
            out.append(f"<p>{head}: no setting changed</p>")
            continue
        rows = "".join(
            f'<tr class="change"><td>{e(s["name"])}{SECRET_NOTE if s["secret"] else ""}'
            f"</td><td>{e(_value(s['old']))}</td><td>{e(_value(s['new']))}</td></tr>"
            for s in c["settings"])
        out.append(f"<p>{head}:</p><table><tr><th>setting</th><th>old</th><th>new</th></tr>"
                   f"{rows}</table>")
    return "".join(out)


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str]], empty: str,
           css: str = "") -> str:
    if not rows:
        return f'<p class="muted">{e(empty)}</p>'
    head = "".join(f"<th>{e(title)}</th>" for _, title in columns)
    body = "".join("<tr" + (f' class="{css}"' if css else "") + ">" + "".join(
        f"<td>{e(when(r.get(k)) if k == 'at' else r.get(k))}</td>" for k, _ in columns)
        + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _legend() -> str:
    phases = ("validated", "files_written", "launching", "loading_weights",
              "allocating_kv_cache", "capturing_cuda_graph", "warming_up", "ready",
              "joined_router", "drained", "stalled")
    return '<div class="legend">' + "".join(
        f'<span class="{_phase_class(p)}">{e(p)}</span>' for p in phases) + "</div>"


def _files_html(record: dict[str, Any]) -> str:
    names = ["run.json", "summary.json", "junit.xml"]
    return " ".join(f'<a href="{n}">{n}</a>' for n in names)


def render_page(record: dict[str, Any]) -> str:
    run, fleet = record["run"], record["fleet"]
    verdicts = sorted({s["verdict"] for s in record["servers"]})
    options = "".join(f'<option value="{e(v)}">{e(v)}</option>' for v in verdicts)
    note = f'<p class="note">{e(run["note"])}</p>' if run.get("note") else ""
    took = (f", {run['finished'] - run['started']:.0f} s" if run.get("finished")
            and run.get("started") else "")
    canary = _table(record["canary"], [("host", "host"), ("passed", "passed"),
                                       ("message", "judgement")], "no canary in this run")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>sglang-fleet {e(run['command'])} {e(run['id'])}: {e(fleet['serving'])}</title>
<style>{CSS}</style></head><body>
<header><h1>sglang-fleet {e(run['command'])} &middot; {e(run['id'])}</h1>
<div class="fleet s-{e(fleet['serving'])}" id="fleet">{e(fleet['line'])}</div>
<div class="meta">started {e(when(run.get('started'), True))}{e(took)}; result
{e(run['result'])}; inventory {e(run.get('inventory') or '(default)')}; limit
{e(run.get('limit') or '(none)')}; files: {_files_html(record)}</div>{note}</header>
<main>
<h2>Servers</h2>
<div class="bar"><input id="q" placeholder="host or group" aria-label="filter by host or group">
<select id="verdict" aria-label="filter by verdict"><option value="">every verdict</option>
{options}</select><span id="shown" class="muted"></span></div>
{_legend()}
<div id="servers">{_groups_html(record)}</div>
<h2>What changed against the last good run</h2>
<div id="changes">{_changes_html(record['changes'])}</div>
<h2>Destructive actions</h2>
<div id="actions">{_table(record['actions'], [('at', 'time (UTC)'), ('host', 'host'),
                                               ('kind', 'action'), ('what', 'what'),
                                               ('reason', 'why')],
                          'nothing was killed, drained, switched or taken over', 'action')}</div>
<h2>Router membership</h2>
<div id="routers">{_table(record['routers'], [('at', 'time (UTC)'), ('host', 'server'),
                                               ('router', 'router'), ('action', 'change'),
                                               ('view', 'router view'),
                                               ('finding', 'finding')],
                          'no router membership changed in this run')}</div>
<h2>Canary</h2>
<div id="canary">{canary}</div>
<p class="muted">Schema {e(record['schema'])} (docs/run-record.md); written
{e(when(run.get('written_at'), True))}.</p>
</main>
<script>{SCRIPT}</script>
</body></html>
"""
