// The dashboard and the alerts against real metrics: starts gpucompute-server
// (CPU backend, two devices) and Debian's Prometheus scraping it every
// second with deploy/prometheus/rules.yml and alerts.yml, drives traffic with
// the gpucompute CLI, then evaluates through Prometheus's HTTP API every query
// of every panel of deploy/grafana/gpucompute.json, every rule expression and
// the HPA adapter's query. Every query must be valid; every panel but those
// that need a GPU or the DCGM exporter must return finite data; every rule
// must evaluate healthy and none may fire on a healthy server; and once the
// server is killed, GpucomputeScrapeDown must go pending.
//
//   node prometheus_live_test.js SERVER CLI PROMETHEUS PROMTOOL REPO_ROOT
// With GC_DASHBOARD_SNAPSHOT=FILE.json it also saves every graph panel's
// series over the traffic (for deploy/grafana/render-snapshot.js), and
// GC_TRAFFIC_SECONDS sets how long the traffic runs (default 8).
"use strict";

const assert = require("assert");
const fs = require("fs");
const net = require("net");
const os = require("os");
const path = require("path");
const { spawn, spawnSync } = require("child_process");

const [serverBin, cliBin, prometheusBin, promtoolBin, repo] = process.argv.slice(2);
if (!repo) {
  console.error("usage: prometheus_live_test.js SERVER CLI PROMETHEUS PROMTOOL REPO_ROOT");
  process.exit(2);
}

// Panels that are empty without a GPU or without the DCGM exporter.
const kMayBeEmpty = new Set(["Transfer time p99 by direction", "GPU utilisation (DCGM exporter)"]);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const work = fs.mkdtempSync(path.join(os.tmpdir(), "gc-prometheus-"));
const children = [];
let failures = 0;

function fail(message) {
  failures++;
  console.error(`FAIL ${message}`);
}

function start(bin, args, log) {
  const out = fs.openSync(path.join(work, log), "w");
  const child = spawn(bin, args, { stdio: ["ignore", out, out] });
  children.push(child);
  return child;
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on("error", reject);
  });
}

async function waitFor(what, seconds, probe) {
  const until = Date.now() + seconds * 1000;
  let last;
  while (Date.now() < until) {
    try {
      const value = await probe();
      if (value) return value;
    } catch (e) {
      last = e;
    }
    await sleep(250);
  }
  throw new Error(`timed out waiting for ${what}${last ? `: ${last.message}` : ""}`);
}

let promUrl;
async function api(pathAndQuery) {
  const response = await fetch(`${promUrl}${pathAndQuery}`);
  const body = await response.json();
  return body;
}
async function query(expr) {
  return api(`/api/v1/query?query=${encodeURIComponent(expr)}`);
}

// Grafana's variables as this test fills them in.
function substitute(expr) {
  return expr
    .replaceAll("$__rate_interval", "1m")
    .replaceAll('job=~"$job"', 'job=~".*"')
    .replaceAll('instance=~"$instance"', 'instance=~".*"')
    .replaceAll("$peak_bytes_per_second", "4.8e12")
    .replaceAll("$peak_flops_per_second", "989e12");
}

function runCli(args, expectOk = true) {
  const r = spawnSync(cliBin, args, { encoding: "utf8", timeout: 120000 });
  if (expectOk && r.status !== 0) {
    throw new Error(`gpucompute ${args.join(" ")} exited ${r.status}: ${r.stdout}${r.stderr}`);
  }
  return r;
}

// Every graph panel's series from `from` (ms) to now, at one point a second.
async function snapshot(dashboard, from) {
  const start = Math.floor(from / 1000) - 2;
  const end = Math.ceil(Date.now() / 1000);
  const panels = [];
  for (const panel of dashboard.panels) {
    if (panel.type !== "timeseries") continue;
    const series = [];
    for (const t of panel.targets) {
      const expr = substitute(t.expr.replaceAll("$__rate_interval", "5s"));
      const r = await api(`/api/v1/query_range?query=${encodeURIComponent(expr)}&start=${start}&end=${end}&step=1`);
      if (r.status !== "success") continue;
      for (const s of r.data.result) {
        const legend = (t.legendFormat || "").replace(/\{\{ *(\w+) *\}\}/g, (_, k) => s.metric[k] || "");
        series.push({ legend: legend.trim(), points: s.values.map(([x, y]) => [x - start, parseFloat(y)]) });
      }
    }
    panels.push({ title: panel.title, unit: panel.fieldConfig.defaults.unit, series });
  }
  fs.writeFileSync(process.env.GC_DASHBOARD_SNAPSHOT, JSON.stringify({ seconds: end - start, panels }));
  console.log(`snapshot of ${panels.length} panels written to ${process.env.GC_DASHBOARD_SNAPSHOT}`);
}

async function main() {
  // The server.
  const ready = path.join(work, "ready.json");
  const server = start(serverBin, ["--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                                   `--ready_file=${ready}`, "--cpu_devices=2"], "server.log");
  const ports = await waitFor("the server's ready file", 60, () =>
    fs.existsSync(ready) && JSON.parse(fs.readFileSync(ready, "utf8")));
  const target = `127.0.0.1:${ports.grpc_port}`;

  // Prometheus, with the shipped rules and alerts, checked by promtool first.
  for (const file of ["rules.yml", "alerts.yml"]) {
    fs.copyFileSync(path.join(repo, "deploy/prometheus", file), path.join(work, file));
  }
  const config = path.join(work, "prometheus.yml");
  fs.writeFileSync(config, [
    "global: {scrape_interval: 1s, evaluation_interval: 1s}",
    "rule_files: [rules.yml, alerts.yml]",
    "scrape_configs:",
    "  - job_name: gpucompute",
    `    static_configs: [{targets: ["127.0.0.1:${ports.metrics_port}"]}]`,
    "",
  ].join("\n"));
  const check = spawnSync(promtoolBin, ["check", "config", config], { encoding: "utf8" });
  assert.strictEqual(check.status, 0, `promtool check config: ${check.stdout}${check.stderr}`);
  const promPort = await freePort();
  promUrl = `http://127.0.0.1:${promPort}`;
  start(prometheusBin, [`--config.file=${config}`, `--storage.tsdb.path=${path.join(work, "tsdb")}`,
                        `--web.listen-address=127.0.0.1:${promPort}`, "--log.level=warn"],
        "prometheus.log");
  await waitFor("Prometheus to scrape the server", 60, async () => {
    const r = await query('up{job="gpucompute"} == 1');
    return r.status === "success" && r.data.result.length === 1;
  });
  console.log(`server ${target}, metrics :${ports.metrics_port}, Prometheus :${promPort}`);

  // Traffic for some seconds of scrapes: every operation, a failure, Echo.
  const common = [`--server=${target}`, "--timeout=30s"];
  const trafficStart = Date.now();
  const until = trafficStart + 1000 * Number(process.env.GC_TRAFFIC_SECONDS || 8);
  let rounds = 0;
  while (Date.now() < until || rounds < 2) {
    runCli(["bench", "gemm", ...common, "--m=128", "--n=128", "--k=128", "--requests=40",
            "--concurrency=4", "--echo_baseline=false", "--warmup=0"]);
    runCli(["reduce", ...common, "--shape=64,1000", "--op=sum"]);
    runCli(["transpose", ...common, "--shape=64,300"]);
    runCli(["gemv", ...common, "--m=512", "--k=512"]);
    runCli(["attention", ...common, "--seq_q=32", "--seq_kv=64", "--head_dim=64"]);
    runCli(["echo", ...common, "--shape=1000"]);
    const bad = runCli(["transpose", ...common, "--shape=2,3", "--perm=0,0"], false);
    assert.notStrictEqual(bad.status, 0, "a bad permutation was accepted");
    rounds++;
  }
  await sleep(3000);  // scrapes of the last traffic

  // Every panel's queries.
  const dashboard = JSON.parse(fs.readFileSync(path.join(repo, "deploy/grafana/gpucompute.json"), "utf8"));
  let panels = 0;
  for (const panel of dashboard.panels) {
    if (panel.type === "row") continue;
    panels++;
    for (const t of panel.targets) {
      const expr = substitute(t.expr);
      if (/\$/.test(expr.replace(/\{\{[^}]*\}\}/g, ""))) fail(`${panel.title}: an unknown variable in ${expr}`);
      const r = await query(expr);
      if (r.status !== "success") {
        fail(`panel "${panel.title}" ${t.refId}: ${r.error}: ${expr}`);
        continue;
      }
      const finite = r.data.result.filter((s) => Number.isFinite(parseFloat(s.value[1])));
      if (kMayBeEmpty.has(panel.title)) {
        console.log(`ok   ${panel.title} ${t.refId}: valid (${r.data.result.length} series; may be empty here)`);
      } else if (finite.length === 0) {
        fail(`panel "${panel.title}" ${t.refId} is empty after traffic: ${expr}`);
      } else {
        console.log(`ok   ${panel.title} ${t.refId}: ${finite.length} series`);
      }
    }
  }

  if (process.env.GC_DASHBOARD_SNAPSHOT) await snapshot(dashboard, trafficStart);

  // Every rule: valid, and evaluated by Prometheus without error.
  const rules = await waitFor("every rule to be evaluated", 30, async () => {
    const r = await api("/api/v1/rules");
    const all = r.data.groups.flatMap((g) => g.rules);
    return all.length && all.every((rule) => rule.lastEvaluation !== "0001-01-01T00:00:00Z") && all;
  });
  for (const rule of rules) {
    const name = rule.name;
    if (rule.health !== "ok") fail(`rule ${name}: ${rule.health} ${rule.lastError || ""}`);
    const r = await query(rule.query);
    if (r.status !== "success") fail(`rule ${name}: ${r.error}`);
    if (rule.type === "alerting" && rule.state !== "inactive") {
      fail(`alert ${name} is ${rule.state} on a healthy server: ${JSON.stringify(rule.alerts)}`);
    }
    if (rule.type === "recording" && r.status === "success" && r.data.result.length === 0) {
      fail(`recording rule ${name} is empty after traffic`);
    }
    console.log(`ok   rule ${name} (${rule.type}, ${rule.health}${rule.state ? ", " + rule.state : ""})`);
  }
  assert.strictEqual(rules.filter((r) => r.type === "alerting").length, 8, "alerts.yml holds 8 alerts");

  // The HPA's custom metric, as the Prometheus adapter would ask for it.
  const adapter = fs.readFileSync(path.join(repo, "deploy/kubernetes/optional/hpa/adapter-rules.yaml"), "utf8");
  const metricsQuery = /metricsQuery: >-\n([\s\S]*?)(?:\n\S|\n?$)/.exec(adapter)[1].replace(/\s+/g, " ").trim();
  const hpa = await query(metricsQuery.replace("<<.GroupBy>>", "instance")
                                      .replace("<<.LabelMatchers>>", 'job="gpucompute"'));
  if (hpa.status !== "success" || hpa.data.result.length !== 1) {
    fail(`the adapter's metricsQuery: ${JSON.stringify(hpa)}`);
  } else {
    console.log(`ok   adapter metricsQuery: p90 queue ${hpa.data.result[0].value[1]} s`);
  }

  // A server that stops answering scrapes raises GpucomputeScrapeDown.
  server.kill("SIGKILL");
  await waitFor("GpucomputeScrapeDown to go pending", 30, async () => {
    const r = await query('ALERTS{alertname="GpucomputeScrapeDown"}');
    return r.status === "success" && r.data.result.length === 1;
  });
  console.log("ok   GpucomputeScrapeDown pending once the server was killed");
  console.log(`${panels} panels, ${rules.length} rules checked`);
}

main()
  .catch((e) => fail(e.stack || e.message))
  .finally(() => {
    for (const c of children) c.kill("SIGKILL");
    if (failures) {
      for (const log of ["server.log", "prometheus.log"]) {
        const file = path.join(work, log);
        if (fs.existsSync(file)) console.error(`--- ${log}\n${fs.readFileSync(file, "utf8").slice(-3000)}`);
      }
    }
    try {
      fs.rmSync(work, { recursive: true, force: true });
    } catch (e) {
      // Prometheus may still be writing as it dies; the folder is temporary.
    }
    console.log(failures ? `${failures} failed` : "all passed");
    process.exit(failures ? 1 : 0);
  });
