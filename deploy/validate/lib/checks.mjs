// baton's own checks of a rendered deployment (the objects of one overlay
// plus the trainer example that runs on it). Each check returns messages
// naming the object and container and saying what to fix.

import path from "node:path";
import { checkElasticJob } from "./elastic_job.mjs";
import { checkNetworkPolicies, checkTls, tlsOf } from "./security.mjs";

const LONG_RUNNING = new Set(["Deployment", "DaemonSet", "StatefulSet", "ReplicaSet"]);
const BATON_IMAGE = /^(?:(.*)\/)?baton-(coordinator|agent|trainer)(?::([^@]+))?(?:@.+)?$/;
// What a root init container may add: preparing host directories.
const ROOT_INIT_CAPABILITIES = new Set(["CHOWN", "DAC_OVERRIDE", "FOWNER"]);
// The launcher variables batonrun sets per trainer; a pod-level value would
// come first in the trainer's environment and hide batonrun's.
const PER_TRAINER = ["LOCAL_RANK", "RANK"];

const ref = (o) => `${o.kind} ${o.metadata?.namespace ? o.metadata.namespace + "/" : ""}${o.metadata?.name}`;

// Pod templates of the workloads, with what the checks need around them.
function podsOf(objects) {
  const pods = [];
  for (const o of objects) {
    let template = null;
    if (["Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"].includes(o.kind)) template = o.spec?.template;
    if (o.kind === "CronJob") template = o.spec?.jobTemplate?.spec?.template;
    if (o.kind === "Pod") template = o;
    if (!template?.spec) continue;
    pods.push({
      object: o,
      ref: ref(o),
      namespace: o.metadata?.namespace ?? "default",
      labels: template.metadata?.labels ?? {},
      annotations: template.metadata?.annotations ?? {},
      spec: template.spec,
      longRunning: LONG_RUNNING.has(o.kind),
    });
  }
  return pods;
}

// host:port -> {host, port} (port a number), or null.
function splitAddress(address) {
  const m = /^(.*):(\d+)$/.exec(address ?? "");
  return m ? { host: m[1], port: Number(m[2]) } : null;
}

function selects(selector, labels) {
  if (!selector || Object.keys(selector).length === 0) return false;
  return Object.entries(selector).every(([k, v]) => labels[k] === v);
}

// Everything about one container the checks look at.
class Container {
  constructor(pod, spec, init, context) {
    this.pod = pod;
    this.spec = spec;
    this.init = init;
    this.name = spec.name;
    this.where = `${pod.ref}: ${init ? "init container" : "container"} ${spec.name}`;
    const image = BATON_IMAGE.exec(spec.image ?? "");
    this.image = image ? { registry: image[1] ?? "", target: image[2], tag: image[3] ?? "" } : null;
    this.targetInfo = image ? context.targets.get(image[2]) : null;
    const command = spec.command ?? this.targetInfo?.entrypoint ?? [];
    this.program = command[0] ?? "";
    this.binary = path.basename(this.program);
    const args = [...command.slice(1), ...(spec.args ?? [])];
    const dash = args.indexOf("--");
    this.flagArgs = dash >= 0 ? args.slice(0, dash) : args;
    this.childCommand = dash >= 0 ? args.slice(dash + 1) : [];
    this.env = this.resolveEnv(context);
    const sc = spec.securityContext ?? {};
    const psc = pod.spec.securityContext ?? {};
    this.runAsUser = sc.runAsUser ?? psc.runAsUser;
    this.runAsNonRoot = sc.runAsNonRoot ?? psc.runAsNonRoot;
  }

  // name -> {value} | {field: fieldPath} | {configMap, key, missing}; env
  // wins over envFrom, as in Kubernetes.
  resolveEnv(context) {
    const env = new Map();
    this.configMapsUsed = [];
    // $(NAME) in an env value is expanded only when NAME comes from envFrom
    // or an earlier env entry; Kubernetes leaves anything else as it is.
    this.unexpanded = [];
    for (const from of this.spec.envFrom ?? []) {
      const name = from.configMapRef?.name;
      if (!name) continue;
      this.configMapsUsed.push(name);
      const cm = context.configMap(this.pod.namespace, name);
      if (!cm) {
        env.set(`<envFrom ${name}>`, { missingConfigMap: name });
        continue;
      }
      for (const [k, v] of Object.entries(cm.data ?? {})) env.set((from.prefix ?? "") + k, { value: v, configMap: name });
    }
    for (const e of this.spec.env ?? []) {
      if (e.valueFrom?.configMapKeyRef) {
        const { name, key } = e.valueFrom.configMapKeyRef;
        this.configMapsUsed.push(name);
        const value = context.configMap(this.pod.namespace, name)?.data?.[key];
        env.set(e.name, value === undefined ? { missingConfigMap: `${name} key ${key}` } : { value, configMap: name });
      } else if (e.valueFrom?.fieldRef) {
        env.set(e.name, { field: e.valueFrom.fieldRef.fieldPath });
      } else if (e.valueFrom) {
        env.set(e.name, { other: true });
      } else {
        for (const m of (e.value ?? "").matchAll(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g)) {
          if (!env.has(m[1])) this.unexpanded.push({ name: e.name, ref: m[1] });
        }
        env.set(e.name, { value: e.value ?? "" });
      }
    }
    return env;
  }

  // Flags given as arguments: name -> value ("--a=b", "--a b", "--a"),
  // names with dashes read as gflags reads batonrun's (--procs-per-node).
  argFlags(flags) {
    const out = new Map();
    for (let i = 0; i < this.flagArgs.length; i++) {
      const arg = this.flagArgs[i];
      const m = /^--?([^=]+)(?:=(.*))?$/.exec(arg);
      if (!m) continue;
      const name = m[1].replace(/-/g, "_");
      let value = m[2];
      if (value === undefined) {
        const type = flags?.get(name)?.type ?? flags?.get(name.replace(/^no/, ""))?.type;
        value = type === "bool" || i + 1 >= this.flagArgs.length ? "true" : this.flagArgs[++i];
      }
      out.set(name, value);
    }
    return out;
  }

  // A baton server's flag as it will run: argument, else BATON_<FLAG>, else
  // the default --help prints. {value} or {field} (downward API).
  flag(name, binaries) {
    const flags = binaries.get(this.binary)?.all;
    const arg = this.argFlags(flags).get(name);
    if (arg !== undefined) return { value: arg };
    const env = this.env.get(`BATON_${name.toUpperCase()}`);
    if (env) return env;
    return { value: flags?.get(name)?.fallback ?? "", isDefault: true };
  }

  port(nameOrNumber) {
    return (this.spec.ports ?? []).find((p) => p.name === nameOrNumber || p.containerPort === nameOrNumber);
  }

  // Where `file` (a path in the container) lives: the hostPath behind the
  // mount that holds it, or an emptyDir / the container's own filesystem.
  locate(file) {
    let best = null;
    for (const m of this.spec.volumeMounts ?? []) {
      const mount = m.mountPath.replace(/\/$/, "");
      if ((file === mount || file.startsWith(mount + "/")) && (!best || mount.length > best.mount.length)) best = { mount, m };
    }
    if (!best) return { kind: "container", text: "the container's own filesystem" };
    const volume = (this.pod.spec.volumes ?? []).find((v) => v.name === best.m.name);
    const rest = file.slice(best.mount.length);
    if (volume?.hostPath) {
      const host = path.posix.join(volume.hostPath.path, best.m.subPath ?? "", rest);
      return { kind: "host", host, volume: volume.name, mount: best.m, text: `host ${host}` };
    }
    const key = path.posix.join(best.m.subPath ?? "", rest).replace(/^\//, "");
    if (volume?.secret) {
      return { kind: "secret", secret: volume.secret, key, volume: volume.name, mount: best.m, text: `Secret ${volume.secret.secretName} (volume ${volume.name})` };
    }
    if (volume?.csi) return { kind: "csi", csi: volume.csi, key, volume: volume.name, mount: best.m, text: `CSI volume ${volume.name} (${volume.csi.driver})` };
    if (volume?.configMap) return { kind: "configMap", key, volume: volume.name, mount: best.m, text: `ConfigMap ${volume.configMap.name} (volume ${volume.name})` };
    if (volume?.projected) return { kind: "projected", key, volume: volume.name, mount: best.m, text: `projected volume ${volume.name}` };
    return { kind: "other", volume: best.m.name, mount: best.m, text: `volume ${best.m.name} (not a hostPath: not shared with other pods)` };
  }
}

// Runs every check; returns error messages.
export function checkDeployment(objects, context) {
  const errors = [];
  const error = (where, message) => errors.push(`${where}: ${message}`);
  const configMaps = objects.filter((o) => o.kind === "ConfigMap");
  context.configMap = (ns, name) => configMaps.find((c) => c.metadata.name === name && (c.metadata.namespace ?? "default") === ns);
  const pods = podsOf(objects);
  const containers = [];
  for (const pod of pods) {
    for (const c of pod.spec.initContainers ?? []) containers.push(new Container(pod, c, true, context));
    for (const c of pod.spec.containers ?? []) containers.push(new Container(pod, c, false, context));
  }
  const { binaries } = context;
  const coordinators = containers.filter((c) => !c.init && c.binary === "baton-coordinator");
  const agents = containers.filter((c) => !c.init && c.binary === "baton-agent");
  const launchers = containers.filter((c) => !c.init && c.binary === "batonrun");
  const trainers = containers.filter((c) => !c.init && (c.binary === "batonrun" || c.env.has("BATON_AGENT_SOCKET")));

  // --- every container: resources, securityContext, probes ----------------
  for (const c of containers) {
    const r = c.spec.resources ?? {};
    for (const kind of ["requests", "limits"]) {
      for (const res of ["cpu", "memory"]) {
        if (r[kind]?.[res] === undefined) error(c.where, `no resources.${kind}.${res}: every container states what it needs and its bound`);
      }
    }
    const sc = c.spec.securityContext;
    if (!sc) {
      error(c.where, "no securityContext: set allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, runAsNonRoot: true, capabilities.drop: [ALL]");
    } else {
      if (sc.allowPrivilegeEscalation !== false) error(c.where, "securityContext.allowPrivilegeEscalation must be false");
      if (sc.readOnlyRootFilesystem !== true) error(c.where, "securityContext.readOnlyRootFilesystem must be true (mount an emptyDir where it must write)");
      if (sc.privileged === true) error(c.where, "securityContext.privileged must not be set");
      if (!(sc.capabilities?.drop ?? []).includes("ALL")) error(c.where, "securityContext.capabilities.drop must include ALL");
      const added = sc.capabilities?.add ?? [];
      const root = c.runAsUser === 0 || c.runAsNonRoot !== true;
      if (root && !c.init) {
        error(c.where, "runs as root: set runAsNonRoot: true (and runAsUser) in its or the pod's securityContext");
      } else if (root && !added.every((a) => ROOT_INIT_CAPABILITIES.has(a))) {
        error(c.where, `a root init container may add only ${[...ROOT_INIT_CAPABILITIES].join(", ")}, not ${added.join(", ")}`);
      } else if (!root && added.length > 0) {
        error(c.where, `adds capabilities ${added.join(", ")}: baton's containers need none`);
      }
    }
    const probes = ["livenessProbe", "readinessProbe", "startupProbe"].filter((p) => c.spec[p]);
    if (c.init && c.spec.restartPolicy !== "Always" && probes.length > 0) {
      error(c.where, `init containers cannot have probes (${probes.join(", ")})`);
    }
    if (!c.init && c.pod.longRunning) {
      for (const p of ["livenessProbe", "readinessProbe"]) {
        if (!c.spec[p]) error(c.where, `no ${p}: every long-running container has liveness and readiness probes`);
      }
    }
    for (const p of probes) {
      const probe = c.spec[p];
      const port = probe.grpc?.port ?? probe.httpGet?.port ?? probe.tcpSocket?.port;
      if (port !== undefined && !c.port(port)) error(c.where, `${p} probes port ${port}, which is not one of the container's ports`);
    }
  }

  // --- images: one registry and tag; binaries, ports and user as built -----
  const batonImages = containers.filter((c) => c.image);
  const versions = new Set(batonImages.map((c) => `${c.image.registry}:${c.image.tag}`));
  if (versions.size > 1) {
    for (const c of batonImages) error(c.where, `image ${c.spec.image}: baton's images must share one registry and tag (found ${[...versions].map((v) => v.replace(/^:/, "(none):")).join(", ")})`);
  }
  for (const c of batonImages) {
    if (!c.image.tag) error(c.where, `image ${c.spec.image} has no tag: give the tag deploy/images/build.sh built`);
    if (c.image.tag === "latest") error(c.where, `image ${c.spec.image}: pin a tag, not latest`);
    const t = c.targetInfo;
    if (c.program.startsWith("/usr/local/") && !t.binaries.has(c.binary)) {
      error(c.where, `runs ${c.program}, which image baton-${c.image.target} does not contain (it has ${[...t.binaries].join(", ")})`);
    }
    for (const file of [...c.flagArgs, ...c.childCommand].filter((a) => a.startsWith("/opt/baton/"))) {
      if (!t.files.has(file)) {
        error(c.where, `runs ${file}, which image baton-${c.image.target} does not contain (deploy/images/Containerfile installs ${[...t.files].join(", ") || "nothing"} under /opt/baton)`);
      }
    }
    for (const p of c.spec.ports ?? []) {
      if (!t.ports.has(p.containerPort)) error(c.where, `port ${p.containerPort} is not one the image baton-${c.image.target} exposes (${[...t.ports].join(", ") || "none"})`);
    }
    if (c.runAsUser !== undefined && c.runAsUser !== 0 && c.runAsUser !== t.uid) {
      error(c.where, `runs as uid ${c.runAsUser}, but the image's user is ${t.uid}`);
    }
  }
  for (const c of containers) {
    if (c.image) continue;
    if (["baton-coordinator", "baton-agent", "batonrun"].includes(c.binary)) {
      error(c.where, `runs ${c.binary} from image ${c.spec.image}, not one of baton's images (baton-coordinator, baton-agent, baton-trainer)`);
    }
  }

  // --- flags: every BATON_* variable and argument is a flag of the binary ---
  for (const c of containers) {
    const info = binaries.get(c.binary);
    if (!info) continue;
    for (const [name, v] of c.env) {
      if (v.missingConfigMap) error(c.where, `refers to ConfigMap ${v.missingConfigMap}, which the deployment does not contain`);
    }
    const server = c.binary === "baton-coordinator" || c.binary === "baton-agent";
    if (server) {
      for (const [name, v] of c.env) {
        if (!name.startsWith("BATON_")) continue;
        const flag = name.slice(6).toLowerCase();
        const source = v.configMap ? `ConfigMap ${v.configMap} sets ${name}` : `${name}`;
        const known = info.all.get(flag);
        if (!known) {
          error(c.where, `${source}, but ${c.binary} has no flag --${flag} (${c.binary} --help lists its flags); it would be ignored`);
        } else if (v.value !== undefined) {
          const problem = badValue(v.value, known.type);
          if (problem) error(c.where, `${source}="${v.value}": ${problem} for --${flag} (${known.type})`);
        }
      }
    }
    for (const [flag, value] of c.argFlags(info.all)) {
      const known = info.all.get(flag) ?? (info.all.get(flag.replace(/^no/, ""))?.type === "bool" ? { type: "bool" } : null);
      if (!known) {
        error(c.where, `argument --${flag} is not a flag of ${c.binary} (${c.binary} --help lists its flags)`);
      } else {
        const problem = badValue(value, known.type);
        if (problem) error(c.where, `argument --${flag}=${value}: ${problem} (${known.type})`);
      }
    }
  }
  for (const c of containers) {
    for (const { name, ref: missing } of c.unexpanded) {
      error(c.where, `${name} refers to $(${missing}), which is not set before it (envFrom or an earlier env entry): Kubernetes passes "$(${missing})" on unexpanded; put ${missing} first`);
    }
  }
  for (const c of trainers) {
    // batonrun reads BATON_<FLAG> like --<flag> (BATON_TLS_CERT, ...).
    const launcherFlag = (name) => c.binary === "batonrun" && binaries.get("batonrun").own.has(name.slice(6).toLowerCase());
    for (const name of c.env.keys()) {
      if (name.startsWith("BATON_") && !context.trainerEnvironment.has(name) && !launcherFlag(name)) {
        error(c.where, `${name} is not a variable trainers read (docs/api.md lists ${[...context.trainerEnvironment].join(", ")})`);
      }
    }
  }
  const used = new Set(containers.flatMap((c) => c.configMapsUsed.map((n) => `${c.pod.namespace}/${n}`)));
  for (const pod of pods) {
    for (const v of pod.spec.volumes ?? []) if (v.configMap) used.add(`${pod.namespace}/${v.configMap.name}`);
  }
  for (const cm of configMaps) {
    if (!used.has(`${cm.metadata.namespace ?? "default"}/${cm.metadata.name}`)) error(ref(cm), "no container uses it");
  }

  // --- Services and PodDisruptionBudgets reach the pods they name ---------
  const podsSelectedBy = (ns, selector) => pods.filter((p) => p.namespace === ns && selects(selector, p.labels));
  for (const svc of objects.filter((o) => o.kind === "Service")) {
    const ns = svc.metadata.namespace ?? "default";
    const selected = podsSelectedBy(ns, svc.spec?.selector);
    if (selected.length === 0) {
      error(ref(svc), `its selector ${JSON.stringify(svc.spec?.selector ?? {})} matches no pod of the deployment`);
      continue;
    }
    for (const p of svc.spec.ports ?? []) {
      const target = p.targetPort ?? p.port;
      const found = selected.some((pod) => pod.spec.containers.some((c) => (c.ports ?? []).some((cp) => cp.name === target || cp.containerPort === target)));
      if (!found) error(ref(svc), `port ${p.name ?? p.port} targets ${target}, which no container of ${selected.map((x) => x.ref).join(", ")} declares`);
    }
  }
  for (const pdb of objects.filter((o) => o.kind === "PodDisruptionBudget")) {
    if (podsSelectedBy(pdb.metadata.namespace ?? "default", pdb.spec?.selector?.matchLabels).length === 0) {
      error(ref(pdb), "its selector matches no pod of the deployment");
    }
  }

  // --- metrics: the flag's port is the container's "metrics" port ---------
  for (const c of [...coordinators, ...agents]) {
    const metrics = c.flag("metrics_listen", binaries);
    const address = splitAddress(metrics.value);
    const annotation = c.pod.annotations["prometheus.io/port"];
    if (!address) {
      error(c.where, "no metrics endpoint: set BATON_METRICS_LISTEN (host:port) and a containerPort named metrics");
      continue;
    }
    const port = c.port("metrics");
    if (!port) error(c.where, `BATON_METRICS_LISTEN serves on port ${address.port}, but the container has no port named metrics`);
    else if (port.containerPort !== address.port) error(c.where, `BATON_METRICS_LISTEN serves on port ${address.port}, but the port named metrics is ${port.containerPort}`);
    if (c.pod.annotations["prometheus.io/scrape"] !== "true") error(c.where, 'the pod template lacks the annotation prometheus.io/scrape: "true"');
    if (annotation !== undefined && Number(annotation) !== address.port) error(c.where, `annotation prometheus.io/port is ${annotation}, but metrics are served on ${address.port}`);
    if (annotation === undefined) error(c.where, `the pod template lacks the annotation prometheus.io/port: "${address.port}"`);
  }

  // --- the coordinator -----------------------------------------------------
  if (coordinators.length === 0 && (agents.length > 0 || trainers.length > 0)) {
    errors.push("the deployment has agents or trainers but no baton-coordinator container");
  }
  for (const c of coordinators) {
    const listen = splitAddress(c.flag("listen", binaries).value);
    const grpc = c.port("grpc");
    if (!listen) error(c.where, "BATON_LISTEN is not host:port");
    else if (!grpc) error(c.where, `serves gRPC on port ${listen.port}, but the container has no port named grpc`);
    else if (grpc.containerPort !== listen.port) error(c.where, `BATON_LISTEN serves on port ${listen.port}, but the port named grpc is ${grpc.containerPort}`);
    const tls = tlsOf(c, binaries).on;
    for (const p of ["livenessProbe", "readinessProbe", "startupProbe"]) {
      const probe = c.spec[p];
      if (!probe) continue;
      if (tls && probe.grpc) {
        error(c.where, `${p} is a grpc probe, but the coordinator's port requires TLS, which the kubelet's gRPC probes do not speak: probe httpGet /metrics on the port metrics`);
      } else if (tls && probe.httpGet && c.port(probe.httpGet.port)?.name !== "metrics") {
        error(c.where, `${p} probes port ${probe.httpGet.port} over HTTP, but with TLS only the port metrics answers plaintext HTTP`);
      }
    }
    for (const p of ["livenessProbe", "readinessProbe"]) {
      if (!tls && c.spec[p] && !c.spec[p].grpc) error(c.where, `${p} should be a grpc probe (the grpc.health.v1 service the coordinator serves)`);
      if (listen && c.spec[p]?.grpc && c.spec[p].grpc.port !== listen.port) error(c.where, `${p} probes port ${c.spec[p].grpc.port}, but the coordinator serves on ${listen.port}`);
    }
    const o = c.pod.object;
    if (o.kind === "Deployment") {
      if ((o.spec.replicas ?? 1) !== 1) error(c.pod.ref, "runs more than one coordinator: a cluster has exactly one (agents would be split between them)");
      if (o.spec.strategy?.type !== "Recreate") error(c.pod.ref, "strategy must be Recreate: a rolling update runs two coordinators at once, and agents would be split between them");
    }
    const grace = Number(c.flag("shutdown_grace_ms", binaries).value);
    const tgps = c.pod.spec.terminationGracePeriodSeconds ?? 30;
    if (tgps * 1000 < Math.max(5000, grace + 1500)) {
      error(c.pod.ref, `terminationGracePeriodSeconds ${tgps} is too short: the coordinator needs BATON_SHUTDOWN_GRACE_MS (${grace} ms) plus its shutdown, up to 5 s, after SIGTERM`);
    }
    if (!objects.some((x) => x.kind === "PodDisruptionBudget" && selects(x.spec?.selector?.matchLabels, c.pod.labels))) {
      error(c.pod.ref, "no PodDisruptionBudget covers the coordinator");
    }
  }

  // An address (host:port) some container uses to reach the coordinator:
  // a Service of the deployment whose port leads to the coordinator's
  // listening port.
  const reachesCoordinator = (c, what, address) => {
    const a = splitAddress(address);
    if (!a) return error(c.where, `${what} "${address}" is not host:port`);
    const parts = a.host.split(".");
    const ns = parts[1] ?? c.pod.namespace;
    const tail = parts.slice(2).join(".");
    if (parts.length > 2 && !["svc", "svc.cluster.local"].includes(tail)) {
      return error(c.where, `${what} "${address}" is not the name of a Service (name, name.namespace, name.namespace.svc[.cluster.local])`);
    }
    const svc = objects.find((o) => o.kind === "Service" && o.metadata.name === parts[0] && (o.metadata.namespace ?? "default") === ns);
    if (!svc) return error(c.where, `${what} "${address}" names no Service of the deployment (Service ${ns}/${parts[0]})`);
    const sp = (svc.spec.ports ?? []).find((p) => p.port === a.port);
    if (!sp) return error(c.where, `${what} "${address}": Service ${ns}/${parts[0]} has no port ${a.port}`);
    const target = sp.targetPort ?? sp.port;
    const reached = coordinators.filter((k) => k.pod.namespace === ns && selects(svc.spec.selector, k.pod.labels));
    if (reached.length === 0) return error(c.where, `${what} "${address}": Service ${ns}/${parts[0]} does not select the coordinator`);
    for (const k of reached) {
      const port = k.port(target);
      const listen = splitAddress(k.flag("listen", binaries).value);
      if (!port || !listen || port.containerPort !== listen.port) {
        error(c.where, `${what} "${address}" reaches port ${port?.containerPort ?? target} of the coordinator, which serves on ${listen?.port}`);
      }
    }
    return a;
  };

  // --- agents ----------------------------------------------------------------
  for (const c of agents) {
    if (c.pod.object.kind !== "DaemonSet") error(c.pod.ref, "the agent runs as a DaemonSet: one per node");
    const coordinator = c.flag("coordinator", binaries);
    if (coordinator.value !== undefined) reachesCoordinator(c, "the agent's BATON_COORDINATOR", coordinator.value);
    const node = c.flag("node", binaries);
    if (node.field !== "spec.nodeName") error(c.where, "set BATON_NODE from the downward API (fieldRef spec.nodeName): the node name must be the node's, stable across agent restarts");
    const dataHost = c.flag("data_host", binaries);
    const hostNetwork = c.pod.spec.hostNetwork === true;
    const goodFields = hostNetwork ? ["status.hostIP", "status.podIP"] : ["status.podIP"];
    if (!goodFields.includes(dataHost.field)) {
      error(c.where, `set BATON_DATA_HOST from the downward API (fieldRef ${goodFields.join(" or ")}): peers connect to it${dataHost.isDefault ? " (the default 127.0.0.1 only works on one machine)" : ""}`);
    }
    const socket = c.flag("socket", binaries).value;
    const at = c.locate(socket);
    if (at.kind !== "host") error(c.where, `its socket ${socket} is on ${at.text}: put its directory on a hostPath volume that trainer pods mount`);
    const shm = c.locate("/dev/shm/x");
    if (shm.kind !== "host" && !c.pod.spec.hostIPC) {
      error(c.where, "/dev/shm is not a hostPath volume (and the pod is not hostIPC): trainer pods cannot map the agent's shared memory");
    }
  }
  if (trainers.length > 0 && agents.length === 0) errors.push("the deployment has trainers but no baton-agent DaemonSet");

  // --- trainers: the same socket and shared memory, on the agents' nodes ---
  for (const c of trainers) {
    const launcher = binaries.get(c.binary) ? c.argFlags(binaries.get("batonrun").all) : new Map();
    const flags = binaries.get("batonrun").own;
    const get = (name) => launcher.get(name) ?? flags.get(name)?.fallback;
    const socket = c.binary === "batonrun" ? get("socket") : c.env.get("BATON_AGENT_SOCKET")?.value;
    const envSocket = c.env.get("BATON_AGENT_SOCKET")?.value;
    if (c.binary === "batonrun" && envSocket !== undefined && envSocket !== socket) {
      error(c.where, `BATON_AGENT_SOCKET=${envSocket} differs from batonrun --socket=${socket}: the trainers would see the pod's value`);
    }
    const mine = c.locate(socket);
    for (const a of agents) {
      const theirs = a.flag("socket", binaries).value;
      const at = a.locate(theirs);
      if (theirs !== socket || at.host !== mine.host) {
        error(c.where, `socket path mismatch: trainers connect to ${socket} (${mine.text}) but the agent (${a.pod.ref}) serves ${theirs} (${at.text}); use the same path and the same hostPath directory`);
      }
      const agentShm = a.locate("/dev/shm/x");
      const trainerShm = c.locate("/dev/shm/x");
      const bothIpc = a.pod.spec.hostIPC === true && c.pod.spec.hostIPC === true;
      const sameHost = agentShm.kind === "host" && trainerShm.kind === "host" && agentShm.host === trainerShm.host;
      if (!sameHost && !(bothIpc && agentShm.kind !== "host" && trainerShm.kind !== "host")) {
        error(c.where, `shared memory mismatch: /dev/shm is ${trainerShm.text.replace(/\/x$/, "")} in the trainer but ${agentShm.text.replace(/\/x$/, "")} in the agent (${a.pod.ref}); mount the agent's hostPath on /dev/shm`);
      }
      if ((a.pod.spec.hostIPC === true) !== (c.pod.spec.hostIPC === true)) {
        error(c.where, `hostIPC is ${c.pod.spec.hostIPC === true} here but ${a.pod.spec.hostIPC === true} for the agent (${a.pod.ref}): CUDA IPC needs both in one IPC namespace`);
      }
      if (a.runAsUser !== c.runAsUser) {
        error(c.where, `runs as uid ${c.runAsUser}, the agent as ${a.runAsUser}: the agent's socket and shared memory (mode 0600) are its user's`);
      }
      const agentSelector = a.pod.spec.nodeSelector ?? {};
      const trainerSelector = c.pod.spec.nodeSelector ?? {};
      for (const [k, v] of Object.entries(agentSelector)) {
        if (trainerSelector[k] !== v) error(c.where, `nodeSelector lacks ${k}: "${v}", which the agent's has: the pod could land on a node without an agent`);
      }
      for (const t of c.pod.spec.tolerations ?? []) {
        const covered = (a.pod.spec.tolerations ?? []).some((x) => x.key === t.key && (x.effect ?? t.effect) === t.effect && (x.operator === "Exists" || x.value === t.value));
        if (!covered) error(c.where, `tolerates ${t.key}:${t.effect ?? ""}, which the agent does not: the pod could land on a tainted node without an agent`);
      }
    }
  }

  // --- batonrun jobs: the launcher environment, consistent -----------------
  for (const c of launchers) {
    const launcher = c.argFlags(binaries.get("batonrun").all);
    const fallback = binaries.get("batonrun").own;
    const get = (name) => launcher.get(name) ?? fallback.get(name)?.fallback;
    const nodes = Number(get("nodes"));
    const procs = Number(get("procs_per_node"));
    const coordinator = launcher.get("coordinator");
    if (!coordinator) {
      error(c.where, "batonrun without --coordinator starts a whole cluster inside the pod: give --coordinator the coordinator's Service address");
    } else {
      const a = reachesCoordinator(c, "batonrun --coordinator", coordinator);
      const master = c.env.get("MASTER_ADDR")?.value;
      const masterPort = c.env.get("MASTER_PORT")?.value;
      if (master === undefined || masterPort === undefined) error(c.where, "set MASTER_ADDR and MASTER_PORT to the coordinator's address (the job's rendezvous point)");
      if (a && master !== undefined && master !== a.host) error(c.where, `MASTER_ADDR=${master}, but the job's rendezvous point (--coordinator) is ${a.host}`);
      if (a && masterPort !== undefined && Number(masterPort) !== a.port) error(c.where, `MASTER_PORT=${masterPort}, but --coordinator's port is ${a.port}`);
    }
    // batonrun reads BATON_MIN_NODES like --min-nodes (the argument wins)
    // and gives every trainer its own value; 0 or unset: --nodes.
    const minArg = launcher.get("min_nodes");
    const minEnv = c.env.get("BATON_MIN_NODES")?.value;
    if (minArg !== undefined && minEnv !== undefined && Number(minEnv) !== Number(minArg)) {
      error(c.where, `BATON_MIN_NODES=${minEnv}, but --min-nodes is ${minArg}: batonrun's argument wins and the trainers get ${minArg}`);
    }
    const min = minArg ?? minEnv;
    const minNodes = min === undefined || Number(min) === 0 ? nodes : Number(min);
    if (!/^\d+$/.test(min ?? "0") || minNodes < 1 || minNodes > nodes) {
      error(c.where, `${minArg !== undefined ? "--min-nodes" : "BATON_MIN_NODES"}=${min} must be in 1..${nodes} (--nodes): batonrun exits 2`);
    }
    // A --min-nodes out of range still says the job is meant to be elastic.
    const elastic = min !== undefined && Number(min) !== 0 && minNodes !== nodes;
    const world = c.env.get("WORLD_SIZE")?.value;
    if (elastic) {
      if (world !== undefined) error(c.where, `WORLD_SIZE=${world} is set on the pod, but the job is elastic (--min-nodes=${minNodes} of --nodes=${nodes}): its size changes at every re-form and join; leave it unset and read baton.torch.size()`);
    } else if (world === undefined) {
      error(c.where, `set WORLD_SIZE (nodes x procs-per-node = ${nodes * procs})`);
    } else if (Number(world) !== nodes * procs) {
      error(c.where, `WORLD_SIZE=${world}, but --nodes=${nodes} x --procs-per-node=${procs} is ${nodes * procs}`);
    }
    const localWorld = c.env.get("LOCAL_WORLD_SIZE")?.value;
    if (localWorld !== undefined && Number(localWorld) !== procs) error(c.where, `LOCAL_WORLD_SIZE=${localWorld}, but --procs-per-node is ${procs}`);
    for (const name of PER_TRAINER) {
      if (c.env.has(name)) error(c.where, `${name} is set on the pod: ${name === "RANK" ? "the coordinator assigns each trainer's rank (node join order); baton refuses a RANK that differs" : "batonrun sets it per trainer, and a pod-level value would hide it"}`);
    }
    const nodesEnv = c.env.get("BATON_NODES")?.value;
    if (nodesEnv !== undefined && Number(nodesEnv) !== nodes) error(c.where, `BATON_NODES=${nodesEnv}, but --nodes is ${nodes}`);
    const jobEnv = c.env.get("BATON_JOB")?.value;
    if (jobEnv !== undefined && jobEnv !== get("job")) error(c.where, `BATON_JOB=${jobEnv}, but --job is ${get("job")}`);
    const o = c.pod.object;
    if (o.kind === "Job") {
      if (o.spec.completionMode !== "Indexed") error(c.pod.ref, "completionMode must be Indexed: one pod per node of the job");
      if (o.spec.completions !== nodes) error(c.pod.ref, `completions ${o.spec.completions} differs from batonrun --nodes=${nodes}`);
      if ((o.spec.parallelism ?? 1) !== nodes) error(c.pod.ref, `parallelism ${o.spec.parallelism ?? 1} differs from --nodes=${nodes}: the job forms only when all its nodes run at once`);
      if (elastic) errors.push(...checkElasticJob(o, c.pod.ref, c.name, minNodes));
    }
    const spread = (c.pod.spec.affinity?.podAntiAffinity?.requiredDuringSchedulingIgnoredDuringExecution ?? []).some(
      (t) => t.topologyKey === "kubernetes.io/hostname" && selects(t.labelSelector?.matchLabels, c.pod.labels));
    if (!spread) error(c.pod.ref, "needs a required podAntiAffinity on kubernetes.io/hostname matching its own pods: two pods of a job on one node would share that node's agent");
    const gpus = c.spec.resources?.limits?.["nvidia.com/gpu"];
    if (gpus !== undefined && Number(gpus) !== procs) error(c.where, `claims ${gpus} GPUs for --procs-per-node=${procs} trainers`);
    const stop = Number(get("stop_grace_ms"));
    const tgps = c.pod.spec.terminationGracePeriodSeconds ?? 30;
    if (tgps * 1000 <= stop) error(c.pod.ref, `terminationGracePeriodSeconds ${tgps} does not cover batonrun --stop_grace_ms=${stop}`);
  }

  // --- Jobs: what the API server would refuse -------------------------------
  for (const pod of pods) {
    if (pod.object.kind === "Job" && pod.object.spec.podFailurePolicy && pod.spec.restartPolicy !== "Never") {
      error(pod.ref, `has a podFailurePolicy, which needs the pod template's restartPolicy: Never (it is ${pod.spec.restartPolicy ?? "unset"}); the API server refuses it`);
    }
  }

  // --- TLS and NetworkPolicies (lib/security.mjs) ---------------------------
  const rolesOf = { coordinators, agents, launchers, trainers, pods };
  errors.push(...checkTls(objects, rolesOf, context));
  errors.push(...checkNetworkPolicies(objects, rolesOf, context));

  // --- docs: every flag the deployment sets or the servers have ------------
  if (context.docs !== undefined) {
    const documented = (flag) => context.docs.includes(`BATON_${flag.toUpperCase()}`) || context.docs.includes(`--${flag}`);
    for (const binary of ["baton-coordinator", "baton-agent"]) {
      for (const flag of binaries.get(binary).own.keys()) {
        if (!documented(flag)) errors.push(`${context.docsPath}: ${binary} --${flag} is not documented (BATON_${flag.toUpperCase()})`);
      }
    }
    for (const c of [...coordinators, ...agents]) {
      for (const [name, v] of c.env) {
        if (v.configMap && !context.docs.includes(name)) errors.push(`${context.docsPath}: ${name} (ConfigMap ${v.configMap}) is not documented`);
      }
    }
  }
  return errors;
}

function badValue(value, type) {
  if (["int32", "int64", "uint32", "uint64"].includes(type)) return /^-?\d+$/.test(value) ? null : "not an integer";
  if (type === "double") return Number.isFinite(Number(value)) && value !== "" ? null : "not a number";
  if (type === "bool") return /^(true|false|1|0|yes|no|t|f|y|n)$/i.test(value) ? null : "not a boolean";
  return null;
}
