// What the manifests are checked against: the binaries' flags (their
// --help), the images (deploy/images/Containerfile) and the documented
// trainer environment (docs/api.md).

import fs from "node:fs";
import path from "node:path";
import { spawnSync } from "node:child_process";

// Flags printed by `binary helpFlag`, as Map name -> {type, fallback}.
// Both formats are read: baton's own (`  --name (text)\n      type: T
// default: D`) and gflags' (`    -name (text) type: T default: D`).
function parseHelp(text) {
  const flags = new Map();
  const starts = [...text.matchAll(/^\s+--?([A-Za-z0-9_]+) \(/gm)];
  starts.forEach((m, i) => {
    const entry = text.slice(m.index, i + 1 < starts.length ? starts[i + 1].index : text.length);
    const meta = entry.match(/type: (\w+)\s+default: ("(?:[^"\\]|\\.)*"|\S+)/);
    flags.set(m[1], meta ? { type: meta[1], fallback: meta[2].replace(/^"|"$/g, "") } : { type: "string", fallback: "" });
  });
  return flags;
}

function runHelp(binary, flag) {
  const r = spawnSync(binary, [flag], { encoding: "utf8", timeout: 10000 });
  if (r.error) throw new Error(`cannot run ${binary} ${flag}: ${r.error.message}`);
  return `${r.stdout}\n${r.stderr}`;
}

// For each binary: `own` (the flags its --help lists: baton's flags) and
// `all` (every flag it accepts: --helpfull adds glog's and gflags' own).
export function loadBinaries(binDir) {
  const binaries = new Map();
  for (const name of ["baton-coordinator", "baton-agent", "batonrun", "batonctl"]) {
    const file = path.join(binDir, name);
    if (!fs.existsSync(file)) throw new Error(`${file} does not exist: build it (tools/dev/build) or pass --bin`);
    const own = parseHelp(runHelp(file, "--help"));
    const all = new Map([...parseHelp(runHelp(file, "--helpfull")), ...own]);
    if (own.size === 0) throw new Error(`${file} --help lists no flags: cannot check flags against it`);
    binaries.set(name, { own, all });
  }
  return binaries;
}

// Files a RUN line's `install [-m MODE] SRC... DIR/` commands put into
// DIR (an absolute path), as full paths.
function installedFiles(run) {
  const files = [];
  for (const command of run.split("&&")) {
    const words = command.trim().split(/\s+/);
    if (words[0] !== "install" || words.includes("-d")) continue;
    const operands = [];
    for (let i = 1; i < words.length; i++) {
      if (words[i] === "-m" || words[i] === "-o" || words[i] === "-g") i++;
      else if (!words[i].startsWith("-")) operands.push(words[i]);
    }
    const dir = operands.pop();
    if (!dir?.startsWith("/") || !dir.endsWith("/")) continue;
    for (const src of operands) files.push(dir + path.basename(src));
  }
  return files;
}

// The runtime targets of the Containerfile: Map target -> {binaries (in
// /usr/local/bin), files (what the build stage installed and a COPY
// --from brought over, as paths in the image), entrypoint, exposed ports,
// uid}. Stages inherit from the stage they are FROM.
export function loadContainerfile(file) {
  const text = fs.readFileSync(file, "utf8").replace(/\\\n/g, " ");
  const stages = new Map();
  let current = null;
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const from = line.match(/^FROM\s+(\S+)(?:\s+AS\s+(\S+))?/i);
    if (from) {
      const parent = stages.get(from[1]);
      current = {
        binaries: new Set(parent ? parent.binaries : []),
        files: new Set(parent ? parent.files : []),
        entrypoint: parent ? parent.entrypoint : null,
        ports: new Set(parent ? parent.ports : []),
        uid: parent ? parent.uid : null,
      };
      if (from[2]) stages.set(from[2], current);
      continue;
    }
    if (!current) continue;
    const run = line.match(/^RUN\s+(.*)$/i);
    if (run) for (const f of installedFiles(run[1])) current.files.add(f);
    const copy = line.match(/^COPY\s+((?:--\S+\s+)*)(.+)\s+(\S+)$/i);
    if (copy && copy[3].replace(/\/$/, "") === "/usr/local/bin") {
      for (const src of copy[2].trim().split(/\s+/)) current.binaries.add(path.basename(src));
    }
    // COPY --from=STAGE SRC... DIR/: the files of STAGE under each SRC
    // directory, moved to DIR.
    const copyFrom = copy && copy[1].match(/--from=(\S+)/);
    if (copyFrom && stages.has(copyFrom[1]) && copy[3].endsWith("/")) {
      for (const src of copy[2].trim().split(/\s+/)) {
        if (!src.endsWith("/")) continue;
        for (const f of stages.get(copyFrom[1]).files) {
          if (f.startsWith(src)) current.files.add(copy[3] + f.slice(src.length));
        }
      }
    }
    const entry = line.match(/^ENTRYPOINT\s+(\[.*\])/i);
    if (entry) current.entrypoint = JSON.parse(entry[1]);
    const expose = line.match(/^EXPOSE\s+(.+)/i);
    if (expose) for (const p of expose[1].split(/\s+/)) current.ports.add(Number(p.split("/")[0]));
    const user = line.match(/^USER\s+(\d+)/i);
    if (user) current.uid = Number(user[1]);
  }
  const targets = new Map();
  for (const t of ["coordinator", "agent", "trainer"]) {
    if (!stages.has(t)) throw new Error(`${file} has no stage "${t}"`);
    targets.set(t, stages.get(t));
  }
  return targets;
}

// The BATON_* variables trainers read, from the table in docs/api.md.
export function loadTrainerEnvironment(file) {
  const names = new Set();
  for (const m of fs.readFileSync(file, "utf8").matchAll(/^\| `(BATON_[A-Z_]+)`(?:, `(BATON_[A-Z_]+)`)?/gm)) {
    names.add(m[1]);
    if (m[2]) names.add(m[2]);
  }
  if (names.size === 0) throw new Error(`${file} lists no BATON_* trainer variables (the table's format changed?)`);
  return names;
}

// The Secrets the operator makes with `script` (overlays/tls/make-secrets)
// rather than the deployment holding them: the names its `kubectl create
// secret` lines (directly or through its secret() helper) give.
export function loadOperatorSecrets(root, script) {
  const text = fs.readFileSync(path.join(root, script), "utf8");
  const names = new Set();
  for (const m of text.matchAll(/^\s*(?:kubectl create )?secret (?:tls |generic )?(baton-[a-z0-9-]+)\b/gm)) names.add(m[1]);
  if (names.size === 0) throw new Error(`${script} makes no Secret named baton-* (its kubectl create secret lines changed?)`);
  return { script, names };
}
