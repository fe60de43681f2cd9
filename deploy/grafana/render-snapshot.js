// Draws the graph panels of a dashboard snapshot (the series the live
// Prometheus test saved with GC_DASHBOARD_SNAPSHOT) as one SVG: a grid of
// small line charts with their titles, units and legends, in the dashboard's
// order. For the README's picture of the dashboard; Grafana draws the real
// thing.
//   node render-snapshot.js SNAPSHOT.json OUT.svg [COLUMNS]
"use strict";

const fs = require("fs");

const [input, output, columnsArg] = process.argv.slice(2);
if (!output) {
  console.error("usage: render-snapshot.js SNAPSHOT.json OUT.svg [COLUMNS]");
  process.exit(2);
}
const snapshot = JSON.parse(fs.readFileSync(input, "utf8"));
const columns = Number(columnsArg || 3);
const W = 420, H = 230, PAD = { left: 74, right: 12, top: 28, bottom: 62 };
const colors = ["#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1",
                "#ba43a9", "#705da0", "#508642", "#cca300"];

function escape(text) {
  return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

// A value in the panel's unit, shortly.
function format(value, unit) {
  if (!Number.isFinite(value)) return "";
  const si = (v, suffix) => {
    const steps = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
    for (const [scale, prefix] of steps) if (Math.abs(v) >= scale) return `${+(v / scale).toPrecision(3)} ${prefix}${suffix}`;
    return `${+v.toPrecision(3)} ${suffix}`.trim();
  };
  switch (unit) {
    case "s":
      if (value === 0) return "0";
      if (Math.abs(value) < 1e-3) return `${+(value * 1e6).toPrecision(3)} µs`;
      if (Math.abs(value) < 1) return `${+(value * 1e3).toPrecision(3)} ms`;
      return `${+value.toPrecision(3)} s`;
    case "bytes": {
      const steps = [[2 ** 40, "TiB"], [2 ** 30, "GiB"], [2 ** 20, "MiB"], [2 ** 10, "KiB"]];
      for (const [scale, name] of steps) if (Math.abs(value) >= scale) return `${+(value / scale).toPrecision(3)} ${name}`;
      return `${value} B`;
    }
    case "Bps": return si(value, "B/s");
    case "flops": return si(value, "FLOP/s");
    case "reqps": return si(value, "req/s");
    case "percentunit": return `${+(value * 100).toPrecision(3)}%`;
    default: return si(value, "");
  }
}

function chart(panel, x0, y0) {
  const out = [];
  const plotW = W - PAD.left - PAD.right, plotH = H - PAD.top - PAD.bottom;
  out.push(`<rect x="${x0 + 4}" y="${y0 + 4}" width="${W - 8}" height="${H - 8}" rx="3" fill="#181b1f" stroke="#2c3235"/>`);
  out.push(`<text x="${x0 + 12}" y="${y0 + 20}" fill="#d8d9da" font-size="12" font-weight="600">${escape(panel.title)}</text>`);
  const series = panel.series.filter((s) => s.points.some(([, y]) => Number.isFinite(y)));
  let ymin = 0, ymax = 0;
  for (const s of series) for (const [, y] of s.points) if (Number.isFinite(y)) ymax = Math.max(ymax, y), ymin = Math.min(ymin, y);
  if (ymax === ymin) ymax = ymin + 1;
  const px = (t) => x0 + PAD.left + (t / snapshot.seconds) * plotW;
  const py = (v) => y0 + PAD.top + plotH - ((v - ymin) / (ymax - ymin)) * plotH;
  for (let i = 0; i <= 4; i++) {
    const v = ymin + ((ymax - ymin) * i) / 4, y = py(v);
    out.push(`<line x1="${x0 + PAD.left}" x2="${x0 + W - PAD.right}" y1="${y}" y2="${y}" stroke="#2c3235"/>`);
    out.push(`<text x="${x0 + PAD.left - 4}" y="${y + 3}" fill="#8e8e8e" font-size="9" text-anchor="end">${escape(format(v, panel.unit))}</text>`);
  }
  out.push(`<text x="${x0 + W - PAD.right}" y="${y0 + PAD.top + plotH + 11}" fill="#8e8e8e" font-size="9" text-anchor="end">${snapshot.seconds} s</text>`);
  if (!series.length) {
    out.push(`<text x="${x0 + W / 2}" y="${y0 + PAD.top + plotH / 2}" fill="#8e8e8e" font-size="11" text-anchor="middle">no data (needs a GPU or the DCGM exporter)</text>`);
  }
  series.slice(0, colors.length).forEach((s, i) => {
    let d = "", pen = "M";
    for (const [t, y] of s.points) {
      if (!Number.isFinite(y)) { pen = "M"; continue; }
      d += `${pen}${px(t).toFixed(1)},${py(y).toFixed(1)} `;
      pen = "L";
    }
    out.push(`<path d="${d}" fill="none" stroke="${colors[i]}" stroke-width="1.3"/>`);
  });
  // Legend: up to 6 entries in two columns under the plot.
  series.slice(0, 6).forEach((s, i) => {
    const lx = x0 + 12 + (i % 2) * (W / 2 - 8), ly = y0 + PAD.top + plotH + 24 + Math.floor(i / 2) * 12;
    out.push(`<rect x="${lx}" y="${ly - 7}" width="8" height="3" fill="${colors[i]}"/>`);
    out.push(`<text x="${lx + 12}" y="${ly - 3}" fill="#c7d0d9" font-size="9">${escape(s.legend.slice(0, 34))}</text>`);
  });
  if (series.length > 6) {
    out.push(`<text x="${x0 + W - 12}" y="${y0 + H - 10}" fill="#8e8e8e" font-size="9" text-anchor="end">+${series.length - 6} more</text>`);
  }
  return out.join("\n");
}

const rows = Math.ceil(snapshot.panels.length / columns);
const parts = [`<svg xmlns="http://www.w3.org/2000/svg" width="${columns * W}" height="${rows * H}" ` +
               `font-family="Helvetica, Arial, sans-serif">`,
               `<rect width="100%" height="100%" fill="#111217"/>`];
snapshot.panels.forEach((panel, i) => parts.push(chart(panel, (i % columns) * W, Math.floor(i / columns) * H)));
parts.push("</svg>");
fs.writeFileSync(output, parts.join("\n") + "\n");
console.log(`${snapshot.panels.length} panels drawn to ${output}`);
