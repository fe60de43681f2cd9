// Checks rendered Kubernetes manifests (kubectl kustomize output):
//   1. the API schemas: every object against the OpenAPI schema of its kind
//      (kubernetes-models, @kubernetes-models/prometheus-operator: types,
//      formats, required fields, enums);
//   2. no unknown fields (a typo the schemas let through, which the API
//      server rejects or drops): every object as a TypeScript literal of its
//      kind's interface, under TypeScript's excess-property check;
//   3. gpucompute's own rules: the restricted Pod Security profile, probes,
//      a grace period that covers the drain, memory limits that cover what
//      the server flags allow, GPUs matching the backend, every flag known to
//      the server binary, Services and the PDB selecting the pods.
//
//   node check-manifests.js [--server=PATH] FILE.yaml...
//   node check-manifests.js [--server=PATH] --self-test FILE.yaml
// --server: the gpucompute-server binary, whose --helpfull lists the flags.
// --self-test: breaks FILE's Deployment in one way at a time and fails unless
// each break is caught. Exit 0 when clean, 1 with one line per problem.
"use strict";

const fs = require("fs");
const os = require("os");
const path = require("path");
const { execFileSync } = require("child_process");
const yaml = require("js-yaml");
const ts = require("typescript");

// The model module of an apiVersion and kind.
function modelModule(apiVersion, kind) {
  if (apiVersion === "monitoring.coreos.com/v1") {
    return `@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/${kind}`;
  }
  return `kubernetes-models/${apiVersion}/${kind}`;
}

function where(doc) {
  const m = doc.metadata || {};
  return `${doc.kind}/${m.name}`;
}

// 1. The schema of each kind.
function schemaProblems(docs) {
  const problems = [];
  for (const { doc, file } of docs) {
    let Model;
    try {
      Model = require(modelModule(doc.apiVersion, doc.kind))[doc.kind];
    } catch (e) {
      problems.push(`${file}: ${where(doc)}: no schema for ${doc.apiVersion} ${doc.kind}`);
      continue;
    }
    try {
      new Model(doc).validate();
    } catch (e) {
      problems.push(`${file}: ${where(doc)}: ${e.message}`);
    }
  }
  return problems;
}

// 2. Unknown fields, through the TypeScript compiler.
function unknownFieldProblems(docs) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gc-manifests-"));
  const source = path.join(dir, "manifests.ts");
  const lines = [];
  const owners = [];  // line of each object's literal -> the object
  docs.forEach(({ doc, file }, i) => {
    let module;
    try {
      module = require.resolve(modelModule(doc.apiVersion, doc.kind));
    } catch (e) {
      return;  // reported by the schema check
    }
    lines.push(`import type { I${doc.kind} as T${i} } from ${JSON.stringify(module.replace(/\.js$/, ""))};`);
    owners.push(null);
  });
  docs.forEach(({ doc, file }, i) => {
    const json = JSON.stringify(doc, null, 1).split("\n");
    lines.push(`export const o${i}: T${i} = ${json[0]}`);
    owners.push({ doc, file });
    for (const line of json.slice(1)) {
      lines.push(line);
      owners.push({ doc, file });
    }
    lines[lines.length - 1] += ";";
  });
  fs.writeFileSync(source, lines.join("\n") + "\n");
  const program = ts.createProgram([source], {
    noEmit: true,
    strict: true,
    skipLibCheck: true,
    types: [],
    baseUrl: __dirname,
    typeRoots: [],
    moduleResolution: ts.ModuleResolutionKind.Node10,
  });
  const problems = [];
  for (const d of ts.getPreEmitDiagnostics(program)) {
    const message = ts.flattenDiagnosticMessageText(d.messageText, " ");
    if (d.file && d.file.fileName === source) {
      const { line } = d.file.getLineAndCharacterOfPosition(d.start);
      const owner = owners[line];
      problems.push(owner ? `${owner.file}: ${where(owner.doc)}: ${message}` : message);
    } else {
      problems.push(message);
    }
  }
  fs.rmSync(dir, { recursive: true, force: true });
  return problems;
}

// Bytes of a Kubernetes quantity ("32Gi", "512M", "1073741824").
function bytesOf(quantity) {
  const m = /^([0-9.]+)([KMGTPE]i?)?$/.exec(String(quantity));
  if (!m) return NaN;
  const scale = { K: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18,
                  Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60 };
  return parseFloat(m[1]) * (m[2] ? scale[m[2]] : 1);
}

// "--name=value" args -> {name: value}.
function flagsOf(args) {
  const flags = {};
  for (const arg of args || []) {
    const m = /^--([a-z_0-9]+)(?:=(.*))?$/.exec(arg);
    if (m) flags[m[1]] = m[2] === undefined ? "true" : m[2];
  }
  return flags;
}

// Seconds of an absl duration flag ("30s", "5m", "1h").
function secondsOf(duration) {
  const m = /^([0-9.]+)(ms|s|m|h)$/.exec(duration || "");
  if (!m) return NaN;
  return parseFloat(m[1]) * { ms: 1e-3, s: 1, m: 60, h: 3600 }[m[2]];
}

// The server's defaults, where the manifests leave a flag out.
const kDefaults = {
  max_inflight_bytes: 4 * 2 ** 30,
  retain_host_memory_bytes: 2 ** 31 - 1,
  pinned_staging_bytes: 256 * 2 ** 20,
  request_staging_bytes: -1,
  shutdown_timeout: "30s",
  cpu_devices: "1",
};
const kGiB = 2 ** 30;

function matches(selector, labels) {
  return Object.entries(selector || {}).every(([k, v]) => labels[k] === v);
}

// 3. gpucompute's rules.
function policyProblems(docs, serverFlags) {
  const problems = [];
  const deployments = docs.filter(({ doc }) => doc.kind === "Deployment");
  for (const { doc, file } of deployments) {
    const at = `${file}: ${where(doc)}`;
    const pod = doc.spec.template.spec;
    const podLabels = doc.spec.template.metadata.labels || {};
    const psc = pod.securityContext || {};
    if (psc.runAsNonRoot !== true) problems.push(`${at}: pod securityContext.runAsNonRoot is not true`);
    if (psc.runAsUser === 0) problems.push(`${at}: pod runs as root`);
    if (!psc.seccompProfile || !["RuntimeDefault", "Localhost"].includes(psc.seccompProfile.type)) {
      problems.push(`${at}: pod securityContext.seccompProfile is not RuntimeDefault`);
    }
    if (pod.automountServiceAccountToken !== false) {
      problems.push(`${at}: the service account token is mounted (the server needs none)`);
    }
    if (pod.hostNetwork || pod.hostPID || pod.hostIPC) problems.push(`${at}: host namespaces`);
    for (const c of pod.containers) {
      const cat = `${at}: container ${c.name}`;
      const sc = c.securityContext || {};
      if (sc.allowPrivilegeEscalation !== false) problems.push(`${cat}: allowPrivilegeEscalation is not false`);
      if (sc.readOnlyRootFilesystem !== true) problems.push(`${cat}: readOnlyRootFilesystem is not true`);
      if (sc.privileged) problems.push(`${cat}: privileged`);
      if (sc.runAsUser === 0) problems.push(`${cat}: runs as root`);
      const drop = (sc.capabilities && sc.capabilities.drop) || [];
      if (!drop.includes("ALL")) problems.push(`${cat}: capabilities.drop lacks ALL`);
      if (sc.capabilities && (sc.capabilities.add || []).length) problems.push(`${cat}: adds capabilities`);
      const flags = flagsOf(c.args);
      // Probes: kubelet's gRPC probe, which speaks plaintext only; with TLS
      // on the port, the CLI's health command in the container, over TLS.
      // Either way readiness asks for the compute service (NOT_SERVING while
      // draining), and with tokens health must be exempt from them.
      const tls = flags.tls_cert !== undefined;
      if (flags.token_file !== undefined && flags.auth_exempt_health === "false") {
        problems.push(`${cat}: --token_file with --auth_exempt_health=false: the probes have no token`);
      }
      for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
        const p = c[probe];
        const wantService = probe === "readinessProbe" ? "gpucompute.v1.Compute" : undefined;
        if (!tls) {
          if (!p || !p.grpc) problems.push(`${cat}: no gRPC ${probe}`);
          else if (p.grpc.service !== wantService) problems.push(`${cat}: ${probe} asks for service ${p.grpc.service}`);
          continue;
        }
        const command = (p && p.exec && p.exec.command) || [];
        if (command[0] !== "gpucompute" || !command.includes("health") || !command.includes("--tls")) {
          problems.push(`${cat}: ${probe} is not "gpucompute --tls ... health" (the port serves TLS)`);
        } else if (flagsOf(command.slice(1)).service !== wantService) {
          problems.push(`${cat}: ${probe} asks for service ${flagsOf(command.slice(1)).service}`);
        }
      }
      if (serverFlags) {
        for (const name of Object.keys(flags)) {
          if (!serverFlags.has(name)) problems.push(`${cat}: --${name} is not a gpucompute-server flag`);
        }
      }
      // The drain: preStop, then SIGTERM and up to --shutdown_timeout.
      const preStop = c.lifecycle && c.lifecycle.preStop;
      let preStopSeconds = 0;
      if (!preStop) {
        problems.push(`${cat}: no preStop`);
      } else if (preStop.exec && preStop.exec.command[0] === "sleep") {
        preStopSeconds = parseFloat(preStop.exec.command[1]);
      }
      const shutdown = secondsOf(flags.shutdown_timeout || kDefaults.shutdown_timeout);
      const grace = pod.terminationGracePeriodSeconds === undefined ? 30 : pod.terminationGracePeriodSeconds;
      if (!(grace >= preStopSeconds + shutdown + 5)) {
        problems.push(`${cat}: terminationGracePeriodSeconds ${grace} < preStop ${preStopSeconds} s + ` +
                      `--shutdown_timeout ${shutdown} s + 5 s to exit`);
      }
      // Devices.
      const res = c.resources || {};
      const limits = res.limits || {};
      const requests = res.requests || {};
      const gpus = parseInt(limits["nvidia.com/gpu"] || "0", 10);
      const backend = flags.backend || "auto";
      if (gpus > 0 && backend === "cpu") problems.push(`${cat}: ${gpus} GPUs for --backend=cpu`);
      if (gpus === 0 && backend !== "cpu") problems.push(`${cat}: --backend=${backend} without GPUs`);
      if (gpus > 0 && flags.devices && flags.devices.split(",").length !== gpus) {
        problems.push(`${cat}: --devices=${flags.devices} uses not all of its ${gpus} GPUs`);
      }
      // Host memory: what the flags let the server hold, against the limit.
      const memoryLimit = bytesOf(limits.memory);
      if (!(memoryLimit > 0)) {
        problems.push(`${cat}: no memory limit`);
        continue;
      }
      if (bytesOf(requests.memory) !== memoryLimit) {
        problems.push(`${cat}: memory request ${requests.memory} is not its limit ${limits.memory}`);
      }
      if (!requests.cpu) problems.push(`${cat}: no CPU request`);
      const number = (name) => Number(flags[name] !== undefined ? flags[name] : kDefaults[name]);
      let need = number("max_inflight_bytes") + number("retain_host_memory_bytes") + kGiB;
      if (number("max_inflight_bytes") === 0) problems.push(`${cat}: --max_inflight_bytes=0 bounds nothing`);
      // The request arena: -1 is 1 GiB on the CUDA backend, none on the CPU.
      const arena = number("request_staging_bytes");
      need += arena >= 0 ? arena : gpus > 0 ? kGiB : 0;
      if (gpus > 0) {
        need += gpus * (number("pinned_staging_bytes") + kGiB / 2);
      } else {
        // Resident tensors live in host memory on the CPU backend.
        const resident = Number(flags.resident_max_bytes_per_device);
        if (!(resident > 0)) {
          problems.push(`${cat}: the CPU backend needs --resident_max_bytes_per_device > 0 ` +
                        `(its default is half the node's memory)`);
        } else {
          need += resident * number("cpu_devices");
        }
      }
      if (memoryLimit < need) {
        problems.push(`${cat}: memory limit ${limits.memory} < ${(need / kGiB).toFixed(2)} GiB ` +
                      `that the flags allow`);
      }
    }
    // Services and the PDB select these pods.
    const services = docs.filter(({ doc: d }) => d.kind === "Service");
    if (!services.some(({ doc: s }) => s.spec.clusterIP === "None" && matches(s.spec.selector, podLabels))) {
      problems.push(`${at}: no headless Service selects its pods`);
    }
    if (!services.some(({ doc: s }) => s.spec.clusterIP !== "None" && matches(s.spec.selector, podLabels))) {
      problems.push(`${at}: no ClusterIP Service selects its pods`);
    }
    const pdbs = docs.filter(({ doc: d }) => d.kind === "PodDisruptionBudget");
    if (!pdbs.some(({ doc: p }) => matches(p.spec.selector.matchLabels, podLabels))) {
      problems.push(`${at}: no PodDisruptionBudget selects its pods`);
    }
  }
  return problems;
}

function check(docs, serverFlags) {
  return [...schemaProblems(docs), ...unknownFieldProblems(docs), ...policyProblems(docs, serverFlags)];
}

function load(file) {
  return yaml.loadAll(fs.readFileSync(file, "utf8")).filter((d) => d).map((doc) => ({ doc, file }));
}

// The flags of the server binary, from --helpfull ("--name (help)").
function serverFlagsOf(binary) {
  let text;
  try {
    text = execFileSync(binary, ["--helpfull"], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  } catch (e) {
    text = (e.stdout || "") + (e.stderr || "");  // --helpfull exits 1
  }
  const flags = new Set();
  for (const m of text.matchAll(/^\s+--([a-z_0-9]+) /gm)) flags.add(m[1]);
  if (!flags.has("max_inflight_bytes")) throw new Error(`${binary} --helpfull lists no server flags`);
  return flags;
}

// Each break of a good render must be caught, by the check named.
function selfTest(docs, serverFlags) {
  const clean = check(docs, serverFlags);
  if (clean.length) return ["the self-test needs a clean file:", ...clean];
  const breaks = [
    ["an unknown field", (d) => { d.spec.template.spec.containers[0].imagePullPolicyy = "Always"; }, /imagePullPolicyy/],
    ["a wrong type", (d) => { d.spec.replicas = "two"; }, /replicas must be integer/],
    ["a missing required field", (d) => { delete d.spec.selector; }, /required property selector/],
    ["a bad quantity", (d) => { d.spec.template.spec.containers[0].resources.limits.memory = "lots"; }, /quantity/],
    ["a writable root", (d) => { d.spec.template.spec.containers[0].securityContext.readOnlyRootFilesystem = false; }, /readOnlyRootFilesystem/],
    ["kept capabilities", (d) => { d.spec.template.spec.containers[0].securityContext.capabilities.drop = []; }, /lacks ALL/],
    ["a short grace period", (d) => { d.spec.template.spec.terminationGracePeriodSeconds = 10; }, /terminationGracePeriodSeconds/],
    ["too little memory", (d) => {
      const r = d.spec.template.spec.containers[0].resources;
      r.limits.memory = r.requests.memory = "1Gi";
    }, /memory limit 1Gi/],
    ["an unknown server flag", (d) => { d.spec.template.spec.containers[0].args.push("--max_inflight_byte=1"); }, /not a gpucompute-server flag/],
    ["plaintext probes of a TLS port", (d) => {
      d.spec.template.spec.containers[0].args.push("--tls_cert=/c", "--tls_key=/k");
    }, /readinessProbe is not "gpucompute --tls/],
    ["probes without a token", (d) => {
      d.spec.template.spec.containers[0].args.push("--token_file=/t", "--auth_exempt_health=false");
    }, /--auth_exempt_health=false/],
    ["readiness of the whole server", (d) => { delete d.spec.template.spec.containers[0].readinessProbe.grpc.service; }, /readinessProbe asks for service/],
  ];
  const problems = [];
  for (const [name, breakIt, expected] of breaks) {
    const broken = docs.map(({ doc, file }) => ({ doc: JSON.parse(JSON.stringify(doc)), file }));
    const deployment = broken.find(({ doc }) => doc.kind === "Deployment");
    breakIt(deployment.doc);
    const found = check(broken, serverFlags);
    if (!found.some((p) => expected.test(p))) {
      problems.push(`self-test: ${name} was not caught (${expected}); found: ${found.join(" | ") || "nothing"}`);
    } else {
      console.log(`self-test: ${name} caught`);
    }
  }
  return problems;
}

function main() {
  const args = process.argv.slice(2);
  const server = args.find((a) => a.startsWith("--server="));
  const files = args.filter((a) => !a.startsWith("--"));
  const serverFlags = server ? serverFlagsOf(server.slice("--server=".length)) : null;
  let problems;
  if (args.includes("--self-test")) {
    if (!serverFlags) problems = ["--self-test needs --server"];
    else problems = selfTest(load(files[0]), serverFlags);
  } else {
    // Each file is one render: its Services and PDB must select its pods.
    problems = [];
    for (const file of files) {
      const docs = load(file);
      const found = check(docs, serverFlags);
      problems.push(...found);
      if (!found.length) console.log(`${file}: ${docs.length} objects: schemas, fields and rules clean`);
    }
  }
  for (const p of problems) console.error(p);
  process.exit(problems.length ? 1 : 0);
}

main();
