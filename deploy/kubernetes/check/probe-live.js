// Runs the probes of a rendered overlay that serves TLS (overlays/gpu-node-secure)
// against a real server started with that overlay's TLS and token flags, on
// a certificate made here for the name the probes check, and checks that
// the tokens are enforced for everything but health.
//   node probe-live.js RENDERED.yaml SERVER_BINARY CLI_BINARY
// Exit 0 when every probe passes and a call without a token is refused.
"use strict";

const fs = require("fs");
const os = require("os");
const path = require("path");
const { execFileSync, spawn, spawnSync } = require("child_process");
const yaml = require("js-yaml");

const [rendered, server, cli] = process.argv.slice(2);
if (!rendered || !server || !cli) {
  console.error("usage: node probe-live.js RENDERED.yaml SERVER_BINARY CLI_BINARY");
  process.exit(2);
}
const docs = yaml.loadAll(fs.readFileSync(rendered, "utf8")).filter(Boolean);
const deployment = docs.find((d) => d.kind === "Deployment");
const container = deployment.spec.template.spec.containers[0];

// The Secrets' files, made here, and where the pod mounts them.
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gpucompute-probe-"));
const mounts = {};
for (const m of container.volumeMounts) mounts[m.name] = m.mountPath;
const tls = path.join(dir, "tls"), tokens = path.join(dir, "tokens");
fs.mkdirSync(tls);
fs.mkdirSync(tokens);
const name = "gpucompute.gpucompute.svc";
const ssl = (...args) => execFileSync("openssl", args, { stdio: "pipe" });
ssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
    "-subj", "/CN=probe-ca", "-keyout", path.join(dir, "ca.key"), "-out", path.join(tls, "ca.crt"));
ssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", `/CN=${name}`,
    "-keyout", path.join(tls, "tls.key"), "-out", path.join(dir, "tls.csr"));
fs.writeFileSync(path.join(dir, "ext.cnf"), `subjectAltName=DNS:${name}\n`);
ssl("x509", "-req", "-in", path.join(dir, "tls.csr"), "-CA", path.join(tls, "ca.crt"), "-CAkey",
    path.join(dir, "ca.key"), "-CAcreateserial", "-days", "1", "-extfile", path.join(dir, "ext.cnf"),
    "-out", path.join(tls, "tls.crt"));
fs.writeFileSync(path.join(tokens, "tokens"), "probe-token-0123456789 operator\n");
const local = (s) => s.replace(mounts.tls, tls).replace(mounts.tokens, tokens);

// The overlay's security flags, on a CPU server on loopback.
const security = container.args.filter((a) => /^--(tls_|token_file|auth_exempt_health)/.test(a));
const ready = path.join(dir, "ready.json");
const proc = spawn(server, ["--listen=127.0.0.1:0", "--metrics_listen=", `--ready_file=${ready}`,
                            "--backend=cpu", ...security.map(local)], { stdio: "inherit" });
const problems = [];
try {
  const until = Date.now() + 30000;
  while (!(fs.existsSync(ready) && fs.statSync(ready).size > 0)) {
    if (Date.now() > until) throw new Error("the server did not start");
    spawnSync("sleep", ["0.1"]);
  }
  const port = JSON.parse(fs.readFileSync(ready, "utf8")).grpc_port;
  const run = (args) => spawnSync(cli, args, { encoding: "utf8", timeout: 20000 });
  for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
    const command = container[probe].exec.command.slice(1).map(
        (a) => local(a).replace("--server=127.0.0.1:50051", `--server=127.0.0.1:${port}`));
    const r = run(command);
    if (r.status !== 0) problems.push(`${probe} failed (${r.status}): ${(r.stdout + r.stderr).trim()}`);
    else console.log(`probe-live: ${probe} passed: ${r.stdout.trim()}`);
  }
  const base = [`--server=127.0.0.1:${port}`, "--tls", `--tls_ca=${path.join(tls, "ca.crt")}`,
                `--tls_server_name=${name}`, "--timeout=10s"];
  const anonymous = run([...base, "info"]);
  if (anonymous.status === 0 || !/UNAUTHENTICATED/.test(anonymous.stderr)) {
    problems.push(`a call without a token was not refused UNAUTHENTICATED: ${anonymous.stderr.trim()}`);
  }
  const authorised = run([...base, "--token=probe-token-0123456789", "info"]);
  if (authorised.status !== 0) problems.push(`a call with the token failed: ${authorised.stderr.trim()}`);
  if (!problems.length) console.log("probe-live: tokens enforced: refused without, served with");
} catch (e) {
  problems.push(String(e));
} finally {
  proc.kill("SIGTERM");
  fs.rmSync(dir, { recursive: true, force: true });
}
for (const p of problems) console.error(`${rendered}: ${p}`);
process.exit(problems.length ? 1 : 0);
