// The security rules of a rendered deployment (docs/deploy.md, "Security"):
//
//   TLS              every BATON_TLS_* file a baton process is given lives in
//                    a volume mounted read-only in that container (a Secret
//                    that the deployment holds, that cert-manager makes or
//                    that overlays/tls/make-secrets makes; the node's
//                    hostPath; a CSI volume); all three files or none; no
//                    BATON_INSECURE with TLS; the coordinator and every
//                    process that dials it agree on TLS; agents do not share
//                    one certificate; no gloo data transport with TLS.
//   NetworkPolicies  the coordinator's pods are isolated and admit the agent
//                    and trainer pods on the gRPC port and no one else; the
//                    agents' pods admit agent pods on every port (the data
//                    plane's are ephemeral) and no one else.
//
// The coordinator's probes with TLS are checked in checks.mjs (tlsOf).

const FLAGS = ["tls_cert", "tls_key", "tls_ca"];
const envName = (flag) => `BATON_${flag.toUpperCase()}`;
// Keys of the Secrets cert-manager and make-secrets write.
const TLS_KEYS = ["tls.crt", "tls.key", "ca.crt"];
// A port of the agents' data plane: ephemeral, any will do.
const DATA_PORT = { number: 40000 };

// A baton process's TLS settings: the files (flag -> path, "" when not
// given), which are given, whether TLS is on (all three), and
// BATON_INSECURE / --insecure when set (undefined otherwise).
export function tlsOf(c, binaries) {
  const files = {};
  for (const flag of FLAGS) {
    const v = c.flag(flag, binaries);
    files[flag] = v.value ?? (v.field ? `<${v.field}>` : "");
  }
  const given = FLAGS.filter((f) => files[f] !== "");
  const insecure = c.flag("insecure", binaries);
  return { files, given, on: given.length === FLAGS.length, insecure: insecure.isDefault ? undefined : insecure.value };
}

// batonrun without --coordinator runs its own cluster, plaintext on loopback.
function dialsCoordinator(c, binaries) {
  return c.binary !== "batonrun" || c.argFlags(binaries.get("batonrun").all).has("coordinator");
}

export function checkTls(objects, { coordinators, agents, launchers }, context) {
  const errors = [];
  const error = (where, message) => errors.push(`${where}: ${message}`);
  const { binaries, operatorSecrets } = context;

  // Secrets the deployment provides: "namespace/name" -> {keys, source}.
  const provided = new Map();
  for (const o of objects) {
    const ns = o.metadata?.namespace ?? "default";
    if (o.kind === "Secret") {
      provided.set(`${ns}/${o.metadata.name}`, { keys: new Set([...Object.keys(o.data ?? {}), ...Object.keys(o.stringData ?? {})]), source: `Secret ${o.metadata.name}` });
    }
    if (o.kind === "Certificate" && o.apiVersion?.startsWith("cert-manager.io/") && o.spec?.secretName) {
      provided.set(`${ns}/${o.spec.secretName}`, { keys: new Set(TLS_KEYS), source: `made by cert-manager from Certificate ${o.metadata.name}` });
    }
  }
  const findSecret = (ns, name) => {
    const found = provided.get(`${ns}/${name}`);
    if (found) return found;
    if (operatorSecrets.names.has(name)) return { keys: new Set(TLS_KEYS), source: `made by ${operatorSecrets.script}` };
    return null;
  };
  const missingSecret = (ns, name) =>
    `Secret ${ns}/${name}, which the deployment does not contain, no cert-manager Certificate makes, and ${operatorSecrets.script} does not make (it makes ${[...operatorSecrets.names].join(", ")})`;

  const coordinatorTls = coordinators.some((c) => tlsOf(c, binaries).on);
  for (const c of [...coordinators, ...agents, ...launchers]) {
    if (!dialsCoordinator(c, binaries)) continue;
    const t = tlsOf(c, binaries);
    const isCoordinator = c.binary === "baton-coordinator";
    if (t.given.length > 0 && !t.on) {
      const missing = FLAGS.filter((f) => !t.given.includes(f)).map(envName);
      error(c.where, `sets ${t.given.map(envName).join(", ")} but not ${missing.join(", ")}: give all three or none (${c.binary} exits 2)`);
      continue;
    }
    if (!t.on) {
      if (coordinatorTls && !isCoordinator) {
        error(c.where, `the coordinator requires a client certificate (its BATON_TLS_* are set), but ${c.binary} has no BATON_TLS_CERT, BATON_TLS_KEY and BATON_TLS_CA: the coordinator would refuse its connections`);
      }
      continue;
    }
    if (t.insecure !== undefined) {
      error(c.where, `sets BATON_INSECURE (or --insecure) to "${t.insecure}" although TLS is on: remove it, so that plaintext is never an option`);
    }
    if (c.binary === "baton-agent" && c.flag("data_transport", binaries).value === "gloo") {
      error(c.where, "BATON_DATA_TRANSPORT=gloo with TLS: gloo's connections between agents cannot be authenticated, and the agent refuses to start unless BATON_INSECURE accepts that; use tcp (the default)");
    }
    if (!isCoordinator && coordinators.length > 0 && !coordinatorTls) {
      error(c.where, `${c.binary} speaks TLS, but the coordinator has no BATON_TLS_*: every handshake would fail`);
    }
    for (const flag of FLAGS) {
      const file = t.files[flag];
      const what = `${envName(flag)} ${file}`;
      const at = c.locate(file);
      if (!file.startsWith("/")) {
        error(c.where, `${what} is not an absolute path in the container`);
        continue;
      }
      if (at.kind === "container" || at.kind === "other") {
        error(c.where, `${what} is on ${at.text}: mount the volume that holds it (a Secret, the node's hostPath or a CSI volume) read-only on ${file.slice(0, file.lastIndexOf("/")) || "/"}`);
        continue;
      }
      if (at.mount.readOnly !== true) error(c.where, `the volume ${at.volume} that holds ${what} is mounted writable: mount it readOnly`);
      if (at.kind === "configMap" && flag === "tls_key") error(c.where, `${what} is a private key in ${at.text}: keep keys in Secrets or on the node`);
      if (at.kind !== "secret") continue;
      const name = at.secret.secretName;
      const found = findSecret(c.pod.namespace, name);
      if (!found) {
        error(c.where, `${what} is in ${missingSecret(c.pod.namespace, name)}`);
      } else if (!at.key.includes("$(")) {
        const items = at.secret.items;
        if (items && !items.some((i) => i.path === at.key)) {
          error(c.where, `${what}: the volume ${at.volume} projects only ${items.map((i) => i.path).join(", ")} of Secret ${name}`);
        } else if (!items && !found.keys.has(at.key)) {
          error(c.where, `${what}: Secret ${name} (${found.source}) has no key ${at.key} (it has ${[...found.keys].join(", ")})`);
        }
      }
      if (c.binary === "baton-agent" && flag !== "tls_ca" && !file.includes("$(BATON_NODE)")) {
        error(c.where, `${what}: every agent pod reads the same certificate from Secret ${name}, but each agent's must name its own node (BATON_NODE): use the node's /etc/baton/tls (hostPath), or $(BATON_NODE) in the file's name`);
      }
    }
  }

  // cert-manager: the Issuers the Certificates name, the CA an Issuer reads.
  const issuers = objects.filter((o) => ["Issuer", "ClusterIssuer"].includes(o.kind) && o.apiVersion?.startsWith("cert-manager.io/"));
  for (const cert of objects.filter((o) => o.kind === "Certificate" && o.apiVersion?.startsWith("cert-manager.io/"))) {
    const ns = cert.metadata?.namespace ?? "default";
    const issuerRef = cert.spec?.issuerRef ?? {};
    const kind = issuerRef.kind ?? "Issuer";
    const known = issuers.some((i) => i.kind === kind && i.metadata.name === issuerRef.name && (kind === "ClusterIssuer" || (i.metadata.namespace ?? "default") === ns));
    if (!known) errors.push(`Certificate ${ns}/${cert.metadata.name}: names ${kind} ${issuerRef.name}, which the deployment does not contain`);
  }
  for (const issuer of issuers) {
    const secret = issuer.spec?.ca?.secretName;
    const ns = issuer.metadata?.namespace ?? "cert-manager";
    if (secret && !findSecret(ns, secret)) errors.push(`${issuer.kind} ${ns}/${issuer.metadata.name}: its CA is in ${missingSecret(ns, secret)}`);
  }
  return errors;
}

// --- NetworkPolicies ----------------------------------------------------------

// A label selector (matchLabels, matchExpressions); {} selects everything.
function matches(selector, labels) {
  if (!selector) return true;
  for (const [k, v] of Object.entries(selector.matchLabels ?? {})) if (labels[k] !== v) return false;
  for (const e of selector.matchExpressions ?? []) {
    const has = Object.prototype.hasOwnProperty.call(labels, e.key);
    const ok = {
      In: has && (e.values ?? []).includes(labels[e.key]),
      NotIn: !has || !(e.values ?? []).includes(labels[e.key]),
      Exists: has,
      DoesNotExist: !has,
    }[e.operator];
    if (!ok) return false;
  }
  return true;
}

export function checkNetworkPolicies(objects, { coordinators, agents, launchers }, context) {
  const errors = [];
  const error = (where, message) => errors.push(`${where}: ${message}`);
  const policies = objects.filter((o) => o.kind === "NetworkPolicy");
  const namespaceLabels = (ns) => ({
    "kubernetes.io/metadata.name": ns,
    ...(objects.find((o) => o.kind === "Namespace" && o.metadata.name === ns)?.metadata?.labels ?? {}),
  });
  const nsOf = (o) => o.metadata?.namespace ?? "default";
  const types = (p) => p.spec?.policyTypes ?? ["Ingress", ...(p.spec?.egress ? ["Egress"] : [])];
  const isolating = (pod) => policies.filter((p) => nsOf(p) === pod.namespace && types(p).includes("Ingress") && matches(p.spec?.podSelector ?? {}, pod.labels));

  // Does `from` ({namespace, labels}) match one of a rule's peers? An
  // ipBlock of /0 counts as any pod; a narrower one (the nodes' addresses,
  // for agents on the host network) as none: pods' addresses are not known
  // offline.
  const peerMatches = (peers, policy, from) =>
    !peers || peers.length === 0 ||
    peers.some((f) => {
      if (f.ipBlock) return /\/0$/.test(f.ipBlock.cidr ?? "");
      const nsOk = f.namespaceSelector ? matches(f.namespaceSelector, namespaceLabels(from.namespace)) : from.namespace === nsOf(policy);
      return nsOk && (!f.podSelector || matches(f.podSelector, from.labels));
    });
  const portMatches = (ports, port) =>
    !ports || ports.length === 0 ||
    ports.some((p) => {
      if ((p.protocol ?? "TCP") !== "TCP") return false;
      if (p.port === undefined) return true;
      if (typeof p.port === "number") return p.endPort ? port.number >= p.port && port.number <= p.endPort : p.port === port.number;
      return p.port === port.name || p.port === String(port.number);
    });
  // Whether a connection from `from` to `port` of the pod `to` is admitted.
  const admits = (from, to, port) => {
    const selecting = isolating(to);
    return selecting.length === 0 || selecting.some((p) => (p.spec.ingress ?? []).some((rule) => peerMatches(rule.from, p, from) && portMatches(rule.ports, port)));
  };
  const strangers = (ns) => [
    { namespace: ns, labels: { "app.kubernetes.io/name": "not-baton" }, text: `any other pod of namespace ${ns}` },
    { namespace: "not-baton", labels: {}, text: "pods of other namespaces" },
  ];
  const peer = (pod) => ({ namespace: pod.namespace, labels: pod.labels });
  const unique = (containers) => [...new Map(containers.map((c) => [c.pod.ref, c.pod])).values()];
  const agentPods = unique(agents).filter((p) => p.spec.hostNetwork !== true);
  const trainerPods = unique(launchers.filter((c) => c.argFlags(context.binaries.get("batonrun").all).has("coordinator")));

  for (const c of coordinators) {
    const listen = /:(\d+)$/.exec(c.flag("listen", context.binaries).value ?? "");
    if (!listen) continue;
    const number = Number(listen[1]);
    const port = { number, name: (c.spec.ports ?? []).find((p) => p.containerPort === number)?.name };
    const to = c.pod;
    if (isolating(to).length === 0) {
      error(to.ref, `no NetworkPolicy selects the coordinator's pods: any pod that reaches the pod network reaches its gRPC port ${number} (deploy/k8s/base/network-policy.yaml)`);
      continue;
    }
    for (const a of agentPods) {
      if (!admits(peer(a), to, port)) error(to.ref, `its NetworkPolicies do not admit the agent pods (${a.ref}) to the coordinator's gRPC port ${number}`);
    }
    for (const t of trainerPods) {
      if (!admits(peer(t), to, port)) {
        error(t.ref, `its pods (labels ${JSON.stringify(t.labels)}) are not admitted to the coordinator's gRPC port ${number} by any NetworkPolicy: label them baton.dev/trainer: "true", which the coordinator's policy admits`);
      }
    }
    for (const s of strangers(to.namespace)) {
      if (admits(s, to, port)) error(to.ref, `its NetworkPolicies admit ${s.text} to the coordinator's gRPC port ${number}: admit only agent and trainer pods`);
    }
  }
  for (const to of agentPods) {
    if (isolating(to).length === 0) {
      error(to.ref, "no NetworkPolicy selects the agent pods: any pod that reaches the pod network reaches their data ports (deploy/k8s/base/network-policy.yaml)");
      continue;
    }
    if (!admits(peer(to), to, DATA_PORT)) {
      error(to.ref, "its NetworkPolicies do not admit agent pods to the agents' data ports: they are ephemeral, so admit every port from the agent pods");
    }
    const others = [...strangers(to.namespace), ...trainerPods.map((t) => ({ ...peer(t), text: `the trainer pods (${t.ref})` }))];
    for (const s of others) {
      if (admits(s, to, DATA_PORT)) error(to.ref, `its NetworkPolicies admit ${s.text} to the agents' data ports: admit only agent pods`);
    }
  }
  return errors;
}
