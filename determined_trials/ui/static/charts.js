/* det-trials ui: small hand-written SVG charts (line chart, scatter plot, parallel coordinates).
   Labels are set with textContent only; nothing here parses HTML. */
"use strict";
(function () {
  const NS = "http://www.w3.org/2000/svg";

  function svg(tag, attrs, text) {
    const node = document.createElementNS(NS, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function color(i) {
    return "hsl(" + Math.round((i * 137.508) % 360) + ", 62%, 44%)";
  }

  function fmt(v) {
    if (typeof v !== "number" || !isFinite(v)) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
    return String(Number(v.toPrecision(4)));
  }

  function range(values) {
    let lo = Infinity, hi = -Infinity;
    for (const v of values) { if (v < lo) lo = v; if (v > hi) hi = v; }
    if (lo === Infinity) return [0, 1];
    if (lo === hi) { const pad = lo === 0 ? 1 : Math.abs(lo) * 0.1; return [lo - pad, hi + pad]; }
    return [lo, hi];
  }

  function ticks(lo, hi, count) {
    const step0 = (hi - lo) / Math.max(count, 1);
    const mag = Math.pow(10, Math.floor(Math.log10(step0)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0) || step0;
    const out = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(Number(t.toPrecision(12)));
    return out;
  }

  function scale(d0, d1, r0, r1) {
    const k = (r1 - r0) / (d1 - d0);
    return (v) => r0 + (v - d0) * k;
  }

  /* A log10 axis over positive values: its domain in decades, the scale and the ticks (the powers of ten
     within it, or the linear ticks of the exponent when it spans less than two). */
  function logAxis(values, r0, r1) {
    const dom = range(values.filter((v) => v > 0).map(Math.log10));
    const s = scale(dom[0], dom[1], r0, r1);
    const decades = [];
    const every = Math.max(1, Math.ceil((dom[1] - dom[0]) / 8));
    for (let t = Math.ceil(dom[0]); t <= dom[1]; t += every) decades.push(t);
    const at = decades.length >= 2 ? decades : ticks(dom[0], dom[1], 4);
    return { scale: (v) => s(Math.log10(v)), ticks: at.map((t) => Math.pow(10, t)) };
  }

  /* Axes, grid and labels; returns the svg, the plot scales and the plot area. The data is drawn o.pad pixels
     inside the axes (a dot's radius: dots at the edges are whole); xLog: xDomain holds the x values (> 0),
     drawn on a log axis. */
  function frame(o, xDomain, yDomain, xCategories) {
    const width = o.width || 560, height = o.height || 300, pad = o.pad || 0;
    const m = { left: 62, right: 14, top: 10, bottom: 38 };
    const root = svg("svg", { width: width, height: height, viewBox: "0 0 " + width + " " + height, role: "img",
      "data-x-log": o.xLog ? 1 : 0 });
    const xLog = o.xLog ? logAxis(xDomain, m.left + pad, width - m.right - pad) : null;
    const sx = xLog ? xLog.scale : scale(xDomain[0], xDomain[1], m.left + pad, width - m.right - pad);
    const sy = scale(yDomain[0], yDomain[1], height - m.bottom - pad, m.top + pad);
    const axis = svg("g", { class: "axis" });
    for (const t of ticks(yDomain[0], yDomain[1], 5)) {
      axis.append(svg("line", { class: "grid", x1: m.left, x2: width - m.right, y1: sy(t), y2: sy(t) }));
      axis.append(svg("text", { x: m.left - 6, y: sy(t) + 4, "text-anchor": "end" }, fmt(t)));
    }
    const xTicks = xCategories ? xCategories.map((_, i) => i) : xLog ? xLog.ticks : ticks(xDomain[0], xDomain[1], 6);
    for (const t of xTicks) {
      axis.append(svg("text", { x: sx(t), y: height - m.bottom + 15, "text-anchor": "middle" },
        xCategories ? String(xCategories[t]).slice(0, 14) : fmt(t)));
    }
    axis.append(svg("line", { x1: m.left, x2: width - m.right, y1: height - m.bottom, y2: height - m.bottom }));
    axis.append(svg("line", { x1: m.left, x2: m.left, y1: m.top, y2: height - m.bottom }));
    if (o.xLabel) axis.append(svg("text", { x: (m.left + width - m.right) / 2, y: height - 6, "text-anchor": "middle" }, o.xLabel));
    if (o.yLabel) {
      axis.append(svg("text", { x: 12, y: (m.top + height - m.bottom) / 2, "text-anchor": "middle",
        transform: "rotate(-90 12 " + (m.top + height - m.bottom) / 2 + ")" }, o.yLabel));
    }
    root.append(axis);
    return { root: root, sx: sx, sy: sy };
  }

  function wrap(title, root, legendItems) {
    const box = document.createElement("div");
    box.className = "chart";
    if (title) { const t = document.createElement("div"); t.className = "chart-title"; t.textContent = title; box.append(t); }
    box.append(root);
    if (legendItems && legendItems.length) {
      const legend = document.createElement("div");
      legend.className = "legend";
      for (const item of legendItems) {
        const span = document.createElement("span");
        const swatch = document.createElement("i");
        swatch.style.background = item.color;
        span.append(swatch, item.label);
        legend.append(span);
      }
      box.append(legend);
    }
    return box;
  }

  /* series: [{id, label, color, xs, ys}] drawn as polylines on shared axes. */
  function lineChart(o) {
    const all = o.series.filter((s) => s.xs.length);
    const xDomain = range(all.flatMap((s) => s.xs));
    const yDomain = range(all.flatMap((s) => s.ys));
    const f = frame(o, xDomain, yDomain, null);
    const lines = svg("g", { class: "lines", fill: "none", "stroke-width": 1.5 });
    for (const s of all) {
      const pts = s.xs.map((x, i) => f.sx(x).toFixed(1) + "," + f.sy(s.ys[i]).toFixed(1)).join(" ");
      const line = svg("polyline", { points: pts, stroke: s.color, "data-series": s.id });
      line.append(svg("title", {}, s.label));
      lines.append(line);
      if (s.xs.length === 1) {
        lines.append(svg("circle", { cx: f.sx(s.xs[0]), cy: f.sy(s.ys[0]), r: 2.5, fill: s.color }));
      }
    }
    f.root.append(lines);
    const legend = all.length <= (o.maxLegend || 20) ? all.map((s) => ({ color: s.color, label: s.label })) : null;
    return wrap(o.title, f.root, legend);
  }

  /* points: [{x, y, label, color}]; categorical x when categories is given (x is then an index). */
  function scatterChart(o) {
    const r = 3.5;
    const xs = o.points.map((p) => p.x);
    const xDomain = o.categories ? [-0.5, o.categories.length - 0.5] : o.xLog ? xs : range(xs);
    const f = frame(Object.assign({ pad: r + 1 }, o), xDomain, range(o.points.map((p) => p.y)), o.categories || null);
    const dots = svg("g", { class: "dots" });
    for (const p of o.points) {
      const dot = svg("circle", { cx: f.sx(p.x), cy: f.sy(p.y), r: r, fill: p.color, "fill-opacity": 0.75 });
      dot.append(svg("title", {}, p.label));
      dots.append(dot);
    }
    f.root.append(dots);
    return wrap(o.title, f.root, null);
  }

  /* axes: [{name, categories|null, log}]; rows: [{values, color, label}] with values numbers (or category indexes);
     a log axis holds positive numbers. */
  function parallelCoordinates(o) {
    const width = o.width || 900, height = o.height || 320;
    const m = { left: 50, right: 70, top: 24, bottom: 26 };
    const root = svg("svg", { width: width, height: height, viewBox: "0 0 " + width + " " + height, role: "img" });
    const n = o.axes.length;
    const ax = (i) => m.left + (n === 1 ? 0 : (i * (width - m.left - m.right)) / (n - 1));
    const ys = o.axes.map((a, i) => {
      const values = o.rows.map((r) => r.values[i]).filter((v) => v !== null && v !== undefined);
      if (a.log && !a.categories) {
        const log = logAxis(values, height - m.bottom, m.top);
        return { y: log.scale, marks: log.ticks.map((t) => [t, fmt(t)]) };
      }
      const dom = a.categories ? [-0.5, a.categories.length - 0.5] : range(values);
      const marks = a.categories ? a.categories.map((c, k) => [k, String(c).slice(0, 12)]) : ticks(dom[0], dom[1], 4).map((t) => [t, fmt(t)]);
      return { y: scale(dom[0], dom[1], height - m.bottom, m.top), marks: marks };
    });
    const lines = svg("g", { fill: "none", "stroke-width": 1.2, "stroke-opacity": 0.7 });
    for (const r of o.rows) {
      const pts = [];
      r.values.forEach((v, i) => { if (v !== null && v !== undefined) pts.push(ax(i).toFixed(1) + "," + ys[i].y(v).toFixed(1)); });
      const line = svg("polyline", { points: pts.join(" "), stroke: r.color });
      line.append(svg("title", {}, r.label));
      lines.append(line);
    }
    root.append(lines);
    const axes = svg("g", { class: "axis" });
    o.axes.forEach((a, i) => {
      const x = ax(i);
      axes.append(svg("line", { x1: x, x2: x, y1: m.top, y2: height - m.bottom }));
      axes.append(svg("text", { x: x, y: m.top - 8, "text-anchor": "middle", "font-weight": 600, "data-axis": a.name, "data-log": a.log ? 1 : 0 },
        String(a.name).slice(0, 24)));
      for (const [v, label] of ys[i].marks) axes.append(svg("text", { x: x + 4, y: ys[i].y(v) + 4 }, label));
    });
    root.append(axes);
    return wrap(o.title, root, null);
  }

  window.DetCharts = { color: color, fmt: fmt, lineChart: lineChart, scatterChart: scatterChart, parallelCoordinates: parallelCoordinates };
})();
