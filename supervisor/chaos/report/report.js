(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("hermes-data").textContent);
  var inlineEl = document.getElementById("hermes-inline");
  var INLINE = inlineEl ? JSON.parse(inlineEl.textContent) : null;
  var CASES = DATA.cases.map(function (c) {
    return {stem: c[0], id: c[1], scenario: c[2], cell: c[3], status: c[4], kills: c[5], restarts: c[6],
            seconds: c[7], fired: c[8], violations: c[9], history: c[10]};
  });
  var BY_STEM = {};
  CASES.forEach(function (c) { BY_STEM[c.stem] = c; });
  var RANK = {violation: 0, unknown: 1, pass: 2};
  var panel = document.getElementById("panel");
  var loaded = {};

  function el(tag, attrs) {
    var node = document.createElement(tag);
    if (attrs) Object.keys(attrs).forEach(function (k) {
      if (k === "text") node.textContent = attrs[k];
      else if (k === "cls") node.className = attrs[k];
      else node.setAttribute(k, attrs[k]);
    });
    for (var i = 2; i < arguments.length; i++) {
      var child = arguments[i];
      if (child === null || child === undefined) continue;
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }
  function hash(params) {
    return "#" + Object.keys(params).map(function (k) {
      return k + "=" + encodeURIComponent(params[k]);
    }).join("&");
  }
  function caseLink(c) { return el("a", {href: hash({"case": c.stem})}, el("code", {text: c.id})); }
  function clear() { while (panel.firstChild) panel.removeChild(panel.firstChild); }

  // ------------------------------------------------------------------ case list
  function violated(c) {
    // Each violation links to its entry (invariant, witness rows, repro) under "Violations".
    var td = el("td");
    c.violations.forEach(function (v, i) {
      if (i) td.appendChild(document.createTextNode(", "));
      td.appendChild(v[1] >= 0 ? el("a", {href: "#v-" + v[1], text: v[0]}) : el("span", {text: v[0]}));
    });
    return td;
  }
  function showList(title, cases, params, page) {
    clear();
    cases = cases.slice().sort(function (a, b) { return RANK[a.status] - RANK[b.status]; });
    var size = DATA.page_size, pages = Math.max(1, Math.ceil(cases.length / size));
    page = Math.min(Math.max(1, page || 1), pages);
    panel.appendChild(el("h2", {text: title + " (" + cases.length + ")"}));
    var pager = el("div", {cls: "pager", "data-pages": String(pages), "data-page": String(page)});
    function to(p) { var q = Object.assign({}, params, {page: String(p)}); return hash(q); }
    pager.appendChild(page > 1 ? el("a", {href: to(page - 1), text: "« previous"}) : el("span", {text: "« previous"}));
    pager.appendChild(el("span", {text: "page " + page + " of " + pages}));
    pager.appendChild(page < pages ? el("a", {href: to(page + 1), text: "next »"}) : el("span", {text: "next »"}));
    panel.appendChild(pager);
    var body = el("tbody");
    cases.slice((page - 1) * size, page * size).forEach(function (c) {
      body.appendChild(el("tr", {"data-case-row": c.stem, "data-status": c.status},
        el("td", {cls: "status " + c.status, text: c.status}), el("td", null, caseLink(c)),
        el("td", {text: String(c.kills)}), el("td", {text: String(c.restarts)}), el("td", {text: String(c.seconds)}),
        el("td", {cls: "mono", text: c.fired.join(", ")}), violated(c)));
    });
    panel.appendChild(el("table", {cls: "cases", id: "case-list"},
      el("thead", null, el("tr", null, el("th", {text: "verdict"}), el("th", {text: "case"}),
        el("th", {text: "kills"}), el("th", {text: "restarts"}), el("th", {text: "seconds"}),
        el("th", {text: "kill fired at"}), el("th", {text: "violated"}))), body));
    if (!cases.length) panel.appendChild(el("p", {text: "No cases."}));
  }

  // ------------------------------------------------------------------ timeline
  function snapshotRows(rows) {
    if (Array.isArray(rows)) return rows.map(function (r) { return {id: r[0], role: r[1], active: r[2], digest: r[3]}; });
    return Object.keys(rows || {}).map(function (k) {
      var r = rows[k]; return {id: Number(k), role: r.role, active: r.active, digest: r.digest, turn: r.turn,
                               cloned_from: r.cloned_from};
    }).sort(function (a, b) { return a.id - b.id; });
  }
  function ids(list) { return (list || []).join(", "); }
  function describe(e, state) {
    // -> [what, detail, rows node or text, extra row classes]
    switch (e.type) {
      case "spawn":
        var restart = e.command === "resume" || e.incarnation > 1;
        return [(restart ? "restart: " : "start: ") + e.command,
                "pid " + e.pid + ", " + e.turn_id + ", process " + e.process +
                (e.kill_at ? ", kill planned at " + e.kill_at + " (" + e.kill_mode + ")" : ""),
                "", restart ? "restart" : ""];
      case "hello": return ["hello", "pid " + e.pid, "", ""];
      case "probe":
        var ctx = e.ctx || {};
        var bits = Object.keys(ctx).map(function (k) { return k + "=" + ctx[k]; });
        return [(e.name.indexOf("resume.") === 0 ? "resume step " : "probe ") + e.name + ":" + e.n +
                (e.kill ? " — KILL" : ""), bits.join(", "), "",
                (e.name.indexOf("resume.") === 0 ? "resume " : "") + (e.kill ? "planned" : "")];
      case "ui":
        var w = e.witness || {};
        var rows = w.row_ids || (w.row_id !== undefined ? [w.row_id] : []);
        var text = e.text ? " “" + String(e.text).slice(0, 80) + "”" : "";
        return ["UI " + e.kind, e.turn + (e.tool_call_id ? " " + e.tool_call_id : "") + text +
                (e.durable ? " — durable" : " — NOT durable"), "rows " + (ids(rows) || "none"),
                e.durable ? "" : "bad"];
      case "effect":
        var ew = e.witness || {};
        return ["effect " + e.tool + " (" + e.policy + ")", e.tool_call_id + ", request " +
                (e.request_durable ? "durable" : "NOT durable") + ", intent " + (e.intent_durable ? "durable" : "NOT durable"),
                "call in rows " + (ids(ew.assistant_row_ids) || "none") + "; intent attempts " +
                (ids(ew.intent_attempts) || "none"), (e.request_durable && e.intent_durable) ? "" : "bad"];
      case "kill": return ["KILL (" + e.by + ")", "pid " + e.pid + ", signal " + e.signal +
                           (e.probe ? " at " + e.probe : ""), "", ""];
      case "exit": return ["exit", "pid " + e.pid + (e.signal ? ", killed by signal " + e.signal :
                           ", returncode " + e.returncode), "", ""];
      case "outcome":
        var r = e.result || {};
        return ["outcome: " + r.outcome, r.failure_reason ? r.failure_reason :
                (r.final_response ? "“" + String(r.final_response).slice(0, 100) + "”" : ""), "", ""];
      case "snapshot":
        var rowsNow = snapshotRows(e.rows), span = el("span"), before = state.rows;
        rowsNow.forEach(function (row, i) {
          if (i) span.appendChild(document.createTextNode(" "));
          var fresh = before && !before[row.id];
          span.appendChild(el("span", {cls: (row.active ? "" : "inactive ") + (fresh ? "new" : ""),
                                       title: row.role + (row.active ? "" : ", inactive") + ", digest " + row.digest,
                                       text: row.id + ":" + (row.role || "?").charAt(0)}));
        });
        state.rows = {};
        rowsNow.forEach(function (row) { state.rows[row.id] = true; });
        return ["durable rows after " + (e.after === "mend" ? "mending storage" : "exit"),
                rowsNow.length + " row(s)" + (rowsNow.length ? "" : " (no database yet)"), span, ""];
      case "pause": return ["SIGSTOP", "pid " + e.pid, "", ""];
      case "cont": return ["SIGCONT", "pid " + e.pid, "", ""];
      case "storage_fault":
        if (e.phase === "broken") return ["STORAGE " + e.fault, (e.what || "") + "; the next worker must fail as " +
                                          e.expect, "", "planned"];
        return ["storage " + e.fault + " " + e.phase, e.reason || "", "", ""];
      case "model_fault": return ["MODEL " + e.fault, "the next worker talks to " + e.url, "", "planned"];
      case "power_cut":
        var lost = Object.keys(e.lost_rows || {});
        var files = (e.files || []).filter(function (f) { return f.dropped || (f.dropped_ranges || []).length; })
          .map(function (f) { return f.path + " -" + f.dropped + "/" + f.writes; }).join(", ");
        return ["POWER CUT " + e.mode, "synchronous=" + e.synchronous + "; " + e.dropped_writes +
                " unsynced write(s) dropped" + (files ? " (" + files + ")" : "") + (e.torn ? "; one torn" : "") +
                "; integrity " + (e.integrity === "ok" ? "ok" : JSON.stringify(e.integrity)),
                lost.length ? "lost row(s) " + lost.join(", ") : "no row lost", "planned"];
      default: return [e.type, JSON.stringify(e).slice(0, 160), "", ""];
    }
  }

  function showCase(c, data, error) {
    clear();
    panel.appendChild(el("h2", null, "Case ", el("code", {text: c.id})));
    var back = c.cell !== undefined ? hash({cell: c.cell, scenario: c.scenario}) : "#list=all";
    panel.appendChild(el("p", null, el("a", {href: back, text: "« other cases of this cell"}), " · ",
      el("span", {cls: "status " + c.status, text: "verdict: " + c.status}), " · kills " + c.kills +
      ", restarts " + c.restarts + ", " + c.seconds + " s"));
    if (!data) {
      panel.appendChild(el("p", {cls: "bad", id: "timeline-missing",
                                 text: error || "No history was recorded for this case."}));
      return;
    }
    panel.appendChild(el("p", null, "repro: ", el("code", {cls: "repro", text: data.repro})));
    var body = el("tbody"), state = {rows: null}, marks = data.witness_events || {};
    data.events.forEach(function (e, i) {
      var d = describe(e, state);
      var cls = "ev-" + e.type + (d[3] ? " " + d[3] : "") + (marks[i] ? " witness" : "");
      var rowsCell = el("td", {cls: "rows"});
      if (typeof d[2] === "string") rowsCell.textContent = d[2]; else rowsCell.appendChild(d[2]);
      var what = el("td", {cls: "what", text: d[0]});
      if (marks[i]) what.appendChild(el("span", {cls: "bad", text: " ← witness of " +
        marks[i].map(function (v) { return data.verdict.violations[v].invariant; }).join(", ")}));
      body.appendChild(el("tr", {cls: cls, "data-timeline-row": String(i), "data-type": e.type},
        el("td", {text: String(i + 1)}), el("td", {text: Number(e.t).toFixed(3)}),
        el("td", {text: e.incarnation !== undefined ? "#" + e.incarnation : ""}), what,
        el("td", {text: d[1]}), rowsCell));
    });
    panel.appendChild(el("table", {cls: "timeline", id: "timeline", "data-case": c.stem,
                                   "data-events": String(data.events.length)},
      el("thead", null, el("tr", null, el("th", {text: "#"}), el("th", {text: "t (s)"}),
        el("th", {text: "process"}), el("th", {text: "event"}), el("th", {text: "detail"}),
        el("th", {text: "durable row ids"}))), body));
    if (data.slim) panel.appendChild(el("p", {cls: "hint", text:
      "Passing case: snapshot rows are kept as id, role and digest prefix (the full rows are in cases/" +
      c.stem + ".json)."}));
    // The final verdict.
    var v = data.verdict || {}, box = el("div", {cls: "box", id: "case-verdict"});
    box.appendChild(el("h3", {text: "Verdict: " + (v.valid === true ? "pass" : v.valid === false ? "VIOLATION" :
                                                     String(v.valid))}));
    if (v.message) box.appendChild(el("p", {text: v.message}));
    (v.violations || []).forEach(function (x) {
      box.appendChild(el("div", {cls: "box", "data-case-violation": x.invariant},
        el("strong", {text: x.invariant}), el("div", {text: x.message}),
        el("div", {text: "witness rows: " + (ids(x.rows) || "none named")}),
        el("div", null, "repro: ", el("code", {cls: "repro", text: data.repro})),
        el("details", null, el("summary", {text: "witness"}),
           el("pre", {text: JSON.stringify(x.witness, null, 2)}))));
    });
    if (v.parts) box.appendChild(el("p", {cls: "mono", text: v.parts.map(function (p) {
      return p.name + ": " + (p.valid === true ? "ok" : String(p.valid)); }).join(" · ")}));
    panel.appendChild(box);
  }

  function expand(data) {
    // Probe hits travel as [t, incarnation, name, n, ctx, kill].
    data.events = data.events.map(function (e) {
      return Array.isArray(e) ? {type: "probe", t: e[0], incarnation: e[1], name: e[2], n: e[3], ctx: e[4],
                                 kill: !!e[5]} : e;
    });
    return data;
  }
  if (INLINE) Object.keys(INLINE).forEach(function (k) { expand(INLINE[k]); });
  window.hermesCase = function (data) { loaded[data.stem] = expand(data); };
  function loadCase(stem, done) {
    if (INLINE && INLINE[stem]) return done(INLINE[stem]);
    if (loaded[stem]) return done(loaded[stem]);
    var s = document.createElement("script");
    s.src = "cases/" + encodeURIComponent(stem) + ".js";
    s.onload = function () { done(loaded[stem] || null, "cases/" + stem + ".js did not define the case"); };
    s.onerror = function () { done(null, "Could not load " + s.src + " (is the cases/ directory next to this page?)"); };
    document.head.appendChild(s);
  }

  function route() {
    var h = location.hash.replace(/^#/, "");
    if (h && h.indexOf("=") < 0) return;  // a plain anchor, e.g. #v-3
    var q = new URLSearchParams(h), page = parseInt(q.get("page") || "1", 10);
    if (q.has("case")) {
      var stem = q.get("case"), c = BY_STEM[stem];
      if (!c) { clear(); panel.appendChild(el("p", {cls: "bad", text: "No case " + stem + " in this report."})); return; }
      clear();
      panel.appendChild(el("p", {text: "Loading " + c.id + " …"}));
      // A #case= link shows the case where the page scrolls to it, on first load too, once it is drawn.
      var shown = function (data, error) { showCase(c, data, error); panel.scrollIntoView(); };
      if (!c.history) return shown(null);
      loadCase(stem, shown);
      return;
    }
    if (q.has("cell")) {
      var cell = q.get("cell"), scenario = q.get("scenario");
      var label = cell === DATA.no_probe ? "no probe" : cell;
      return showList("Cases of " + scenario + " killed at " + label,
        CASES.filter(function (c) { return c.cell === cell && c.scenario === scenario; }),
        {cell: cell, scenario: scenario}, page);
    }
    var failing = CASES.filter(function (c) { return c.status !== "pass"; });
    if (q.get("list") === "all" || (!q.has("list") && !failing.length))
      return showList("All cases", CASES, {list: "all"}, page);
    return showList("Failing cases", failing, {list: "failing"}, page);
  }
  window.addEventListener("hashchange", function () {
    route();
    if (location.hash.indexOf("=") >= 0) panel.scrollIntoView();
  });
  route();
})();
