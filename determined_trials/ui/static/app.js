/* det-trials ui: the three pages (experiments, one experiment, one trial) drawn from the JSON API and
   refreshed by polling it. Every value from the store goes into the page as text (textContent). */
"use strict";
(function () {
  const POLL_MS = 1500;
  const meta = (name) => (document.querySelector('meta[name="' + name + '"]') || {}).content || "";
  const READ_ONLY = meta("det-ui-read-only") === "1";
  const C = window.DetCharts;

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = String(value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  /* The server's HttpOnly cookie (set when the printed ?token= address was opened) authenticates every request. */
  async function request(method, path) {
    const response = await fetch(path, { method: method, credentials: "same-origin", cache: "no-store" });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      const err = new Error(body.error || response.status + " " + response.statusText);
      err.status = response.status;
      throw err;
    }
    return body;
  }
  const api = (path) => request("GET", path);

  function setLive(ok, text) {
    const live = document.getElementById("live");
    live.textContent = ok ? "live" : text || "not updating";
    live.className = ok ? "" : "stale";
  }

  /* The error of the last refresh, shown above the page (an unknown id stops the refreshing). */
  function showError(err) {
    let box = document.getElementById("error");
    if (!box) {
      box = el("p", { id: "error", class: "error" });
      document.getElementById("main").prepend(box);
    }
    box.textContent = err ? (err.status === 404 ? "Not found: " : "Cannot update: ") + err.message : "";
  }

  /* Runs fn now and then every POLL_MS after it finishes (never two at once). */
  function poll(fn, notFound) {
    const tick = async () => {
      try {
        await fn();
        setLive(true);
        showError(null);
      } catch (err) {
        setLive(false, err.status === 410 ? "run folder gone" : null);  /* 410: deleted or replaced: restart */
        if (err.status === 404 && notFound) { notFound(err); return; }
        showError(err);
        if (err.status === 404 || err.status === 410) return;
      }
      setTimeout(tick, POLL_MS);
    };
    tick();
  }

  /* "1 trial", "3 trials". */
  function plural(n, word) { return n + " " + word + (n === 1 ? "" : "s"); }
  /* Reported with the metrics but they are the x-axis' units, not metrics: never drawn as one. */
  const X_UNITS = new Set(["batches", "epochs"]);
  const isMetric = (name) => !X_UNITS.has(name);

  function fmtNum(v) { return v === null || v === undefined ? "" : (typeof v === "number" ? C.fmt(v) : String(v)); }
  function fmtTime(iso) { return iso ? new Date(iso).toLocaleString() : ""; }
  function fmtSize(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let v = n, u = 0;
    while (v >= 1024 && u < units.length - 1) { v /= 1024; u += 1; }
    return u === 0 ? v + " B" : v.toFixed(1) + " " + units[u];
  }
  function stateBadge(state) { return el("span", { class: "state state-" + state, "data-state": state }, state); }
  function progressBar(p, id) {
    const fill = el("span");
    fill.style.width = Math.round((p || 0) * 100) + "%";
    return el("span", { class: "progress", id: id }, el("span", { class: "bar" }, fill), p === null ? "" : Math.round(p * 100) + "%");
  }
  const TIME_PARTS = ["queued", "start", "build", "train", "data_wait", "validation", "checkpoint", "restore", "replay", "other"];
  // Where the wall time went (seconds, share of the wall; an experiment's: summed over its trials, with the goodput).
  function fillTime(body, time) {
    if (!time) return;
    const wall = time.wall || 0;
    const share = (s) => (wall > 0 ? (100 * s / wall).toFixed(1) + " %" : "");
    const rows = TIME_PARTS.concat(["wall"]).map((p) => el("tr", { "data-part": p },
      el("th", {}, p), el("td", {}, (time[p] || 0).toFixed(2) + " s"), el("td", {}, share(time[p] || 0))));
    if (time.goodput !== undefined) {
      rows.push(el("tr", { "data-part": "goodput" }, el("th", {}, "goodput"), el("td", {}, (100 * time.goodput).toFixed(1) + " %"),
        el("td", { class: "muted" }, "train / wall")));
    }
    body.replaceChildren(...rows);
  }
  function crumbs(...items) { document.getElementById("crumbs").replaceChildren(...items); }
  function main(...children) { document.getElementById("main").replaceChildren(...children); }

  /* An unknown experiment or trial: the page says so instead of an empty skeleton (no buttons, no polling). */
  function notFoundPage(what) {
    return (err) => {
      document.title = "Not found · det-trials";
      crumbs(el("a", { href: "/" }, "Experiments"), el("span", {}, "› not found"));
      main(el("h1", { id: "title" }, "Not found"),
        el("p", { id: "not-found", class: "error" }, err.message || what + " not found"),
        el("p", {}, el("a", { href: "/" }, "All experiments")));
    };
  }

  function flatten(obj, prefix, out) {
    for (const [key, value] of Object.entries(obj || {})) {
      const name = prefix ? prefix + "." + key : key;
      if (value && typeof value === "object" && !Array.isArray(value)) flatten(value, name, out);
      else out[name] = value;
    }
    return out;
  }

  /* A table whose rows sort by clicking a column header; columns: [{key, title, value(row), cell(row)}]. */
  function sortableTable(id, columns, sort) {
    const table = el("table", { id: id });
    const tbody = el("tbody");
    let rows = [];
    const head = el("tr");
    const draw = () => {
      const col = columns.find((c) => c.key === sort.key) || columns[0];
      const sorted = rows.slice().sort((a, b) => {
        const x = col.value(a), y = col.value(b);
        if (x === y) return 0;
        if (x === null || x === undefined || x === "") return 1;
        if (y === null || y === undefined || y === "") return -1;
        const order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
        return sort.dir === "asc" ? order : -order;
      });
      for (const th of head.children) {
        th.className = "sortable" + (th.dataset.key === sort.key ? " sorted-" + sort.dir : "");
      }
      const td = (c, r) => {
        const v = c.cell(r);
        return el("td", { "data-col": c.key, class: "clip", title: typeof v === "string" && v.length > 16 ? v : null }, v);
      };
      tbody.replaceChildren(...sorted.map((r) => el("tr", { "data-id": r.id }, columns.map((c) => td(c, r)))));
    };
    for (const c of columns) {
      head.append(el("th", { "data-key": c.key, title: c.title.length > 16 ? c.title : null, onclick: () => {
        sort.dir = sort.key === c.key && sort.dir === "asc" ? "desc" : "asc";
        sort.key = c.key;
        draw();
      } }, c.title));
    }
    table.append(el("thead", {}, head), tbody);
    return { table: table, update: (next) => { rows = next; draw(); } };
  }

  // -- / : the experiments ---------------------------------------------------------------------------
  function experimentsPage() {
    document.title = "Experiments · det-trials";
    crumbs(el("span", {}, "Experiments"));
    const tbody = el("tbody");
    const table = el("table", { id: "experiments" },
      el("thead", {}, el("tr", {}, ["ID", "Name", "State", "Progress", "Best searcher metric", "Trials", "Started"].map((t) => el("th", {}, t)))),
      tbody);
    const empty = el("p", { class: "muted", id: "no-experiments" });
    main(el("h1", {}, "Experiments"), el("section", {}, el("div", { class: "table-wrap" }, table), empty));
    poll(async () => {
      const data = await api("/api/v1/experiments");
      empty.textContent = data.experiments.length ? "" : "No experiments in this run folder yet.";
      tbody.replaceChildren(...data.experiments.map((e) => el("tr", { "data-id": e.id },
        el("td", {}, el("a", { href: "/experiments/" + e.id }, String(e.id))),
        el("td", { "data-col": "name", class: "clip", title: e.name }, el("a", { href: "/experiments/" + e.id }, e.name)),
        el("td", {}, stateBadge(e.state)),
        el("td", {}, progressBar(e.progress)),
        el("td", { class: "clip" }, e.searcher.metric ? e.searcher.metric + " = " + fmtNum(e.best_metric) : ""),
        el("td", { "data-col": "trials", class: "clip" }, Object.entries(e.trial_counts).map(([s, n]) => s + " " + n).join(" · ") || "0"),
        el("td", {}, fmtTime(e.start_time)))));
    });
  }

  // -- /experiments/{id} -------------------------------------------------------------------------------
  function actionBar(experimentId, onDone) {
    const msg = el("span", { id: "action-msg", class: "muted" });
    const note = el("span", { id: "actions-note", class: "muted" });
    const bar = el("div", { class: "actions", id: "actions" });
    let msgState = null;  // the experiment's state the message was written in: a new state clears it
    let state = null;
    const run = async (name) => {
      if (name === "kill" && !window.confirm("Kill experiment " + experimentId + "? Its unfinished trials become CANCELED.")) return;
      for (const b of bar.querySelectorAll("button")) b.disabled = true;
      msg.className = "muted";
      msg.textContent = name + "…";
      try {
        const result = await request("POST", "/api/v1/experiments/" + experimentId + "/" + name);
        msg.textContent = name + ": experiment is " + result.state;
        msgState = result.state;
      } catch (err) {
        msg.className = "error";
        msg.textContent = name + " failed: " + err.message;
        msgState = state;
      }
      onDone();
    };
    const buttons = {
      pause: el("button", { id: "pause", disabled: true, onclick: () => run("pause") }, "Pause"),
      activate: el("button", { id: "activate", disabled: true, onclick: () => run("activate") }, "Continue"),
      kill: el("button", { id: "kill", class: "danger", disabled: true, onclick: () => run("kill") }, "Kill"),
    };
    if (READ_ONLY) {
      bar.append(el("span", { class: "muted", id: "no-actions" }, "read-only: no actions"));
    } else {
      bar.append(buttons.pause, buttons.activate, buttons.kill, note, msg);
    }
    const why = (button, text) => { if (text) button.title = text; else button.removeAttribute("title"); };
    return {
      bar: bar,
      update: (exp) => {
        const runner = exp.kind === "runner";
        const open = exp.state === "ACTIVE" || exp.state === "PAUSED";
        state = exp.state;
        if (msgState !== null && msgState !== exp.state) { msg.textContent = ""; msgState = null; }
        buttons.pause.disabled = !(runner && exp.state === "ACTIVE");
        buttons.activate.disabled = !(runner && exp.state === "PAUSED");
        buttons.kill.disabled = !open;
        const scriptNote = !runner && open ? "a plain script's run can only be killed" : "";
        note.textContent = scriptNote;
        why(buttons.pause, !runner ? "a plain script's run can only be killed (pause it in its terminal: Ctrl-C)"
          : buttons.pause.disabled ? "only an ACTIVE experiment can be paused" : "");
        why(buttons.activate, !runner ? "a plain script's run can only be killed (run the script again to continue)"
          : buttons.activate.disabled ? "only a PAUSED experiment can be continued" : "");
        why(buttons.kill, buttons.kill.disabled ? "the experiment is " + exp.state + ": nothing to kill" : "");
      },
    };
  }

  /* Where a trial or an experiment came from (the API's `origin` / `origins`), with links back to the parent trial
     and experiment: a fork's or a PBT child's parent, a warm start's checkpoint, an optuna study's earlier experiments. */
  function originLine(o) {
    const trialA = (tid) => el("a", { href: "/trials/" + tid, class: "origin-trial" }, "trial " + tid);
    const expA = (eid) => el("a", { href: "/experiments/" + eid, class: "origin-experiment" }, "experiment " + eid);
    const inExp = o.experiment_id === null || o.experiment_id === undefined ? [] : [" (", expA(o.experiment_id), ")"];
    const ckpt = o.checkpoint ? el("code", { class: "clip", title: o.checkpoint }, o.checkpoint) : "";
    if (o.kind === "study") {
      const links = o.experiments.flatMap((eid, i) => (i ? [", ", expA(eid)] : [expA(eid)]));
      return el("span", { class: "origin", "data-kind": o.kind }, "optuna study told the trials of ", ...links);
    }
    if (o.kind === "warm_start") {
      const from = o.trial_id === null || o.trial_id === undefined ? [] : [" of ", trialA(o.trial_id), ...inExp];
      return el("span", { class: "origin", "data-kind": o.kind }, "warm start: every trial from the weights of checkpoint ", ckpt, ...from);
    }
    const what = o.kind === "fork" ? "forked from " : "PBT child of ";
    return el("span", { class: "origin", "data-kind": o.kind }, what, trialA(o.trial_id), ...inExp, ", from checkpoint ", ckpt);
  }

  /* A hyperparameter drawn on a log axis: type `log` in the config (logNames), or positive numbers spanning
     three decades or more. */
  function logScaled(name, values, logNames) {
    if (!values.every((v) => typeof v === "number" && v > 0)) return false;
    return logNames.includes(name) || Math.max(...values) / Math.min(...values) >= 1000;
  }

  function hparamCharts(trials, metric, exp, box) {
    const usable = trials.filter((t) => t.best_metric !== null);
    const flat = usable.map((t) => flatten(t.hparams, "", {}));
    const key = (v) => JSON.stringify(v === undefined ? null : v);
    // a constant (one value in every trial, and not a range or choices of the config's) says nothing about the metric
    const all = trials.map((t) => flatten(t.hparams, "", {}));
    const searched = new Set(exp.searched_hparams || []);
    const names = Array.from(new Set(flat.flatMap((h) => Object.keys(h)))).sort()
      .filter((name) => searched.has(name) || new Set(all.map((h) => key(h[name]))).size > 1);
    if (!metric || !usable.length || !names.length) {
      box.replaceChildren(el("p", { class: "muted" }, !metric || !usable.length ? "No validation values of the searcher metric yet."
        : "Every hyperparameter has the same value in every trial: nothing to compare."));
      return;
    }
    const axes = names.map((name) => {
      const values = flat.map((h) => h[name]);
      const numeric = values.every((v) => typeof v === "number");
      const categories = numeric ? null : Array.from(new Set(values.map(key))).sort();
      return { name: name, categories: categories, log: numeric && logScaled(name, values, exp.log_hparams || []),
        value: (h) => numeric ? h[name] : categories.indexOf(key(h[name])) };
    });
    const metricRange = [Math.min(...usable.map((t) => t.best_metric)), Math.max(...usable.map((t) => t.best_metric))];
    const shade = (v) => "hsl(" + Math.round(220 - 200 * ((v - metricRange[0]) / ((metricRange[1] - metricRange[0]) || 1))) + ", 65%, 45%)";
    const scatters = el("div", { class: "charts", id: "hp-scatter" }, axes.map((a) => C.scatterChart({
      title: a.name + " vs " + metric, width: 340, height: 240, xLabel: a.name + (a.log ? " (log)" : ""), yLabel: metric, xLog: a.log,
      categories: a.categories ? a.categories.map((c) => JSON.parse(c)) : null,
      points: usable.map((t, i) => ({ x: a.value(flat[i]), y: t.best_metric, color: shade(t.best_metric), label: "trial " + t.id + ": " + fmtNum(t.best_metric) })),
    })));
    const parts = [scatters];
    if (axes.length > 1) {
      parts.push(el("div", { id: "hp-parallel" }, C.parallelCoordinates({
        title: "Parallel coordinates (colour: " + metric + ")", width: Math.max(500, 160 * (axes.length + 1)), height: 300,
        axes: axes.map((a) => ({ name: a.name, log: a.log, categories: a.categories ? a.categories.map((c) => JSON.parse(c)) : null })).concat([{ name: metric, categories: null }]),
        rows: usable.map((t, i) => ({ values: axes.map((a) => a.value(flat[i])).concat([t.best_metric]), color: shade(t.best_metric), label: "trial " + t.id })),
      })));
    }
    box.replaceChildren(...parts);
  }

  /* The search: the best-so-far of the searcher metric against trial number (every searcher) and, for PBT,
     the lineage by the round each trial started in (its parent trial and the checkpoint it continued). */
  function searchBlock(id) {
    const chart = el("div", { id: "best-so-far" });
    const lineage = el("div", { id: "lineage" });
    const section = el("section", { id: "search" }, el("h2", {}, "Search"), chart, lineage);
    let seen = "";
    const trialLink = (tid) => tid === null || tid === undefined ? "—" : el("a", { href: "/trials/" + tid }, String(tid));
    const drawLineage = (rows, metric) => {
      if (!rows.length) { lineage.replaceChildren(); return; }
      const rounds = Array.from(new Set(rows.map((r) => r.round))).sort((a, b) => a - b);
      lineage.replaceChildren(el("h3", {}, "PBT lineage"), ...rounds.map((round) => el("div", { class: "table-wrap" },
        el("table", { class: "lineage", "data-round": round },
          el("caption", {}, "Round " + round + (round === rounds[0] ? ": the first population" : ": children of the best")),
          el("thead", {}, el("tr", {}, ["Trial", "Parent", "Parent checkpoint", "State", "Best " + (metric || "metric"), "Hyperparameters"].map((h) => el("th", {}, h)))),
          el("tbody", {}, rows.filter((r) => r.round === round).map((r) => el("tr", { "data-id": r.trial_id },
            el("td", {}, trialLink(r.trial_id)), el("td", { "data-col": "parent" }, trialLink(r.parent_trial_id)),
            el("td", { class: "clip", "data-col": "parent-checkpoint", title: r.parent_checkpoint }, r.parent_checkpoint || "—"),
            el("td", {}, stateBadge(r.state)), el("td", {}, fmtNum(r.best_metric)),
            el("td", { class: "clip" }, Object.entries(flatten(r.hparams, "", {})).map(([k, v]) => k + "=" + fmtNum(v)).join(" ")))))))));
    };
    return {
      section: section,
      refresh: async () => {
        const s = await api("/api/v1/experiments/" + id + "/search");
        const key = JSON.stringify([s.best_so_far, s.lineage.map((r) => [r.trial_id, r.state, r.best_metric])]);
        if (key === seen) return;
        seen = key;
        const pts = s.best_so_far;
        chart.replaceChildren(pts.length ? C.lineChart({
          title: "Best " + s.metric + " so far, by trial number", width: 640, height: 260, xLabel: "trial number", yLabel: s.metric,
          series: [{ id: "best", label: "best so far", color: C.color(0), xs: pts.map((p) => p.number), ys: pts.map((p) => p.best) }],
        }) : el("p", { class: "muted" }, "No validation values of the searcher metric yet."));
        drawLineage(s.lineage, s.metric);
      },
    };
  }

  // The optuna searcher's parameter importances (Optuna's get_param_importances): one bar per hyperparameter.
  function drawImportances(importances, box) {
    const entries = Object.entries(importances || {});
    box.hidden = entries.length === 0;
    if (!entries.length) return;
    const rows = entries.map(([name, share]) => el("tr", { "data-hparam": name }, el("td", {}, name),
      el("td", {}, el("span", { class: "bar", style: "width: 240px" },
        el("span", { style: "width:" + Math.round(Math.min(1, Math.max(0, share)) * 100) + "%" }))),
      el("td", {}, C.fmt(share))));
    box.replaceChildren(el("h2", {}, "Parameter importances (Optuna)"), el("table", { id: "importance-table" }, ...rows));
  }

  function experimentPage(id) {
    document.title = "Experiment " + id + " · det-trials";
    const title = el("h1", { id: "title" }, "Experiment " + id);
    const summary = el("div", { class: "summary", id: "summary" });
    const actions = actionBar(id, () => refresh());
    const sort = { key: "id", dir: "asc" };
    let hpNames = [];
    let table = null;
    const tableBox = el("div", { class: "table-wrap" });
    const groupSel = el("select", { id: "curve-group" });
    const metricSel = el("select", { id: "curve-metric" });
    const curves = el("div", { id: "curves" });
    const hpBox = el("div", { id: "hparams" });
    const search = searchBlock(id);
    const importanceBox = el("section", { id: "importances", hidden: true });
    const timeBody = el("tbody");
    main(title, summary, actions.bar,
      el("section", {}, el("h2", {}, "Trials"), tableBox),
      el("section", {}, el("h2", {}, "Where the time went (all trials)"), el("table", { id: "experiment-time" }, timeBody)),
      el("section", {}, el("h2", {}, "Learning curves"), el("div", {}, groupSel, metricSel), curves),
      el("section", {}, el("h2", {}, "Hyperparameters against the searcher metric"), hpBox), importanceBox,
      search.section);
    let exp = null, last = "", curveKey = "";
    const chosen = { group: null, metric: null };

    const fillSelects = () => {
      const names = {};
      for (const [g, list] of Object.entries(exp.metric_names)) names[g] = list.filter(isMetric);
      const groups = Object.keys(names).filter((g) => names[g].length);
      if (!chosen.group || !groups.includes(chosen.group)) {
        chosen.group = groups.includes("validation") && names.validation.includes(exp.searcher.metric) ? "validation" : groups[0] || null;
      }
      const metrics = chosen.group ? names[chosen.group] : [];
      if (!chosen.metric || !metrics.includes(chosen.metric)) {
        chosen.metric = metrics.includes(exp.searcher.metric) ? exp.searcher.metric : metrics[0] || null;
      }
      groupSel.replaceChildren(...groups.map((g) => el("option", { value: g, selected: g === chosen.group }, g)));
      metricSel.replaceChildren(...metrics.map((m) => el("option", { value: m, selected: m === chosen.metric }, m)));
    };
    groupSel.addEventListener("change", () => { chosen.group = groupSel.value; chosen.metric = null; fillSelects(); drawCurves(true); });
    metricSel.addEventListener("change", () => { chosen.metric = metricSel.value; drawCurves(true); });

    async function drawCurves(force) {
      if (!chosen.group || !chosen.metric) { curves.replaceChildren(el("p", { class: "muted" }, "No metrics reported yet.")); return; }
      const key = chosen.group + "/" + chosen.metric + "/" + last;
      if (!force && key === curveKey) return;
      curveKey = key;
      const q = "?group=" + encodeURIComponent(chosen.group) + "&metric=" + encodeURIComponent(chosen.metric) + "&max_points=200";
      const data = await api("/api/v1/experiments/" + id + "/metrics" + q);
      const ids = Object.keys(data.trials).map(Number).sort((a, b) => a - b);
      curves.replaceChildren(C.lineChart({
        title: chosen.metric + " (" + chosen.group + "), every trial", width: 900, height: 340, xLabel: "batches", yLabel: chosen.metric,
        series: ids.map((tid) => ({ id: tid, label: "trial " + tid, color: C.color(tid), xs: data.trials[tid].steps, ys: data.trials[tid].values })),
      }));
    }

    async function refresh() {
      const [e, t] = await Promise.all([api("/api/v1/experiments/" + id), api("/api/v1/experiments/" + id + "/trials")]);
      exp = e;
      title.textContent = "Experiment " + e.id + ": " + e.name;
      crumbs(el("a", { href: "/" }, "Experiments"), el("span", {}, "› " + e.id));
      summary.replaceChildren(
        stateBadge(e.state), progressBar(e.progress, "exp-progress"),
        el("span", { id: "best" }, e.searcher.metric ? "best " + e.searcher.metric + ": " + fmtNum(e.best_metric) : ""),
        el("span", { id: "trial-counts" }, plural(e.num_trials, "trial") + ": " + Object.entries(e.trial_counts).map(([s, n]) => s + " " + n).join(", ")),
        e.reason ? el("span", { class: "muted wrap", id: "reason" }, e.reason) : "",
        e.state === "ACTIVE" && !e.running ? el("span", { class: "muted", id: "not-running" }, "no process runs it now") : "",
        (e.origins || []).length ? el("span", { id: "origins" }, ...e.origins.map(originLine)) : "");
      actions.update(e);
      fillTime(timeBody, e.time);
      const names = Array.from(new Set(t.trials.flatMap((tr) => Object.keys(flatten(tr.hparams, "", {}))))).sort();
      if (!table || names.join("\u0000") !== hpNames.join("\u0000")) {
        hpNames = names;
        const metric = t.searcher.metric || "metric";
        const columns = [
          { key: "id", title: "Trial", value: (r) => r.id, cell: (r) => el("a", { href: "/trials/" + r.id }, String(r.id)) },
          { key: "state", title: "State", value: (r) => r.state, cell: (r) => stateBadge(r.state) },
        ].concat(names.map((n) => ({ key: "hp:" + n, title: n, value: (r) => flatten(r.hparams, "", {})[n], cell: (r) => fmtNum(flatten(r.hparams, "", {})[n]) })), [
          { key: "batches", title: "Batches", value: (r) => r.batches, cell: (r) => fmtNum(r.batches) },
          { key: "best", title: "Best " + metric, value: (r) => r.best_metric, cell: (r) => fmtNum(r.best_metric) },
          { key: "restarts", title: "Restarts", value: (r) => r.restarts, cell: (r) => String(r.restarts) },
          { key: "progress", title: "Progress", value: (r) => r.progress, cell: (r) => progressBar(r.state === "COMPLETED" ? 1 : r.progress) },
        ]);
        table = sortableTable("trials", columns, sort);
        tableBox.replaceChildren(table.table);
      }
      table.update(t.trials);
      const now = t.trials.map((tr) => tr.id + ":" + tr.batches + ":" + tr.state).join(",");
      if (now !== last) {
        last = now;
        fillSelects();
        hparamCharts(t.trials, t.searcher.metric, e, hpBox);
      }
      drawImportances(e.param_importances, importanceBox);
      await Promise.all([drawCurves(false), search.refresh()]);
    }
    poll(refresh, notFoundPage("experiment " + id));
  }

  // -- /trials/{id} ---------------------------------------------------------------------------------------
  function trialPage(id) {
    document.title = "Trial " + id + " · det-trials";
    const title = el("h1", { id: "title" }, "Trial " + id);
    const info = el("tbody");
    const charts = { training: el("div", { class: "charts", id: "chart-training" }), validation: el("div", { class: "charts", id: "chart-validation" }) };
    const ckpts = el("tbody");
    const logs = el("pre", { id: "logs" });
    const config = el("pre", { id: "config" });
    const timeBody = el("tbody");
    main(title, el("section", {}, el("table", { id: "trial-info" }, info)),
      el("section", {}, el("h2", {}, "Where the time went"), el("table", { id: "trial-time" }, timeBody)),
      el("section", {}, el("h2", {}, "Training"), charts.training),
      el("section", {}, el("h2", {}, "Validation"), charts.validation),
      el("section", {}, el("h2", {}, "Checkpoints"), el("div", { class: "table-wrap" }, el("table", { id: "checkpoints" },
        el("thead", {}, el("tr", {}, ["UUID", "Steps", "State", "Size", "Reported"].map((h) => el("th", {}, h)))), ckpts))),
      el("section", {}, el("h2", {}, "Log (last 200 lines)"), logs),
      el("section", {}, el("h2", {}, "Config"), config));
    const seen = { training: "", validation: "" };
    let lastLog = null;

    async function drawGroup(group) {
      const data = await api("/api/v1/trials/" + id + "/metrics?group=" + group + "&max_points=500");
      const names = Object.keys(data.series).filter(isMetric);
      const key = names.map((n) => n + ":" + data.series[n].steps.length + ":" + data.series[n].steps.slice(-1)[0]).join(",");
      if (key === seen[group]) return;
      seen[group] = key;
      charts[group].replaceChildren(...(names.length ? names.map((n, i) => C.lineChart({
        title: n, width: 420, height: 240, xLabel: "batches", yLabel: n,
        series: [{ id: n, label: n, color: C.color(i + (group === "validation" ? 3 : 0)), xs: data.series[n].steps, ys: data.series[n].values }], maxLegend: 0,
      })) : [el("p", { class: "muted" }, "No " + group + " metrics yet.")]));
    }

    async function refresh() {
      const [t, c, l] = await Promise.all([api("/api/v1/trials/" + id), api("/api/v1/trials/" + id + "/checkpoints"),
        api("/api/v1/trials/" + id + "/logs?tail=200")]);
      title.textContent = "Trial " + t.id;
      crumbs(el("a", { href: "/" }, "Experiments"),
        el("a", { href: "/experiments/" + t.experiment_id }, "› " + t.experiment_id + " " + t.experiment_name),
        el("span", {}, "› trial " + t.id));
      const rows = [["State", stateBadge(t.state)], ["Status", t.status || ""], ["Batches", fmtNum(t.batches)],
        ["Progress", progressBar(t.state === "COMPLETED" ? 1 : t.progress, "trial-progress")],
        ["Best " + (t.searcher.metric || "metric"), fmtNum(t.best_metric)], ["Restarts", String(t.restarts)], ["Seed", String(t.seed)],
        ["Started from", t.origin ? originLine(t.origin) : ""],
        ["Reason", t.reason ? el("span", { class: "wrap", id: "trial-reason" }, t.reason) : ""], ["Started", fmtTime(t.start_time)], ["Ended", fmtTime(t.end_time)]];
      for (const [name, run] of Object.entries(t.trackers || {})) {
        const label = (name === "mlflow" ? "MLflow" : name === "wandb" ? "W&B" : name) + " run";
        const linked = run.url && /^https?:\/\//.test(run.url);
        rows.push([label, linked ? el("a", { href: run.url, target: "_blank", rel: "noopener noreferrer", class: "tracker-link" }, run.run_id) : run.run_id]);
      }
      for (const [k, v] of Object.entries(flatten(t.hparams, "", {}))) rows.push(["hp " + k, fmtNum(v)]);
      info.replaceChildren(...rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", { "data-field": k }, v))));
      fillTime(timeBody, t.time);
      ckpts.replaceChildren(...c.checkpoints.map((k) => el("tr", { "data-uuid": k.uuid },
        el("td", {}, k.uuid), el("td", {}, String(k.steps_completed)), el("td", {}, stateBadge(k.state)),
        el("td", {}, fmtSize(k.size)), el("td", {}, fmtTime(k.report_time)))));
      const text = l.available ? l.lines.join("\n") : "No log: only trials run by `det-trials experiment create` keep one.";
      if (text !== lastLog) {
        const atEnd = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 4;
        logs.textContent = text;
        lastLog = text;
        if (atEnd) logs.scrollTop = logs.scrollHeight;
      }
      if (!config.textContent) config.textContent = JSON.stringify(t.config, null, 2);
      await Promise.all([drawGroup("training"), drawGroup("validation")]);
    }
    poll(refresh, notFoundPage("trial " + id));
  }

  const path = location.pathname;
  let match;
  if ((match = path.match(/^\/experiments\/(\d+)$/))) experimentPage(match[1]);
  else if ((match = path.match(/^\/trials\/(\d+)$/))) trialPage(match[1]);
  else experimentsPage();
})();
