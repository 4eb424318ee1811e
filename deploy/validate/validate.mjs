#!/usr/bin/env node
// Validates baton's Kubernetes manifests offline (no cluster): renders each
// deployment with kustomize, validates every object against the Kubernetes
// schemas (kubernetes-models, plus unknown fields), and runs baton's own
// checks (lib/checks.mjs). Then feeds the broken copies in testdata/ and
// expects each to be reported. Usually started by deploy/validate/run.
//
//   node validate.mjs --bin build/bin [--render "kubectl kustomize"]
//                     [--deployment NAME=DIR[,DIR...]]... [--no-negative]
//
// Exit 0 when every deployment passes and every broken copy is caught.

import fs from "node:fs";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import YAML from "yaml";
import { validateSchema, modelsVersion } from "./lib/schema.mjs";
import { checkDeployment } from "./lib/checks.mjs";
import { loadBinaries, loadContainerfile, loadOperatorSecrets, loadTrainerEnvironment } from "./lib/sources.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "../..");

// What is installed together: an overlay and the example job that runs on it.
const DEPLOYMENTS = [
  ["cpu", ["deploy/k8s/overlays/cpu", "deploy/k8s/examples/trainer"]],
  ["cpu-elastic", ["deploy/k8s/overlays/cpu", "deploy/k8s/examples/trainer-elastic"]],
  ["gpu", ["deploy/k8s/overlays/gpu", "deploy/k8s/examples/trainer-gpu"]],
  ["tls", ["deploy/k8s/overlays/tls", "deploy/k8s/examples/trainer-tls"]],
  ["cert-manager", ["deploy/k8s/overlays/cert-manager", "deploy/k8s/examples/trainer-tls"]],
];

function parseArgs(argv) {
  const options = { bin: path.join(root, "build/bin"), render: "kubectl kustomize", deployments: [], negative: true };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      return argv[++i];
    };
    if (a === "--bin") options.bin = path.resolve(value());
    else if (a === "--render") options.render = value();
    else if (a === "--deployment") {
      const [name, dirs] = value().split("=");
      if (!dirs) usage("--deployment takes NAME=DIR[,DIR...]");
      options.deployments.push([name, dirs.split(",")]);
    } else if (a === "--no-negative") options.negative = false;
    else usage(`unknown argument ${a}`);
  }
  if (options.deployments.length === 0) options.deployments = DEPLOYMENTS;
  return options;
}

function usage(message) {
  console.error(`validate.mjs: ${message}\nusage: node validate.mjs --bin DIR [--render CMD] [--deployment NAME=DIR[,DIR...]]... [--no-negative]`);
  process.exit(2);
}

// The objects `render DIR` prints (kustomize's output), in order.
function render(command, dir) {
  const [program, ...args] = command.split(" ").filter(Boolean);
  let out;
  try {
    out = execFileSync(program, [...args, path.resolve(root, dir)], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  } catch (e) {
    throw new Error(`${command} ${dir} failed: ${(e.stderr || e.message).trim()}`);
  }
  return YAML.parseAllDocuments(out).map((d) => d.toJSON()).filter(Boolean);
}

// Errors of one deployment (its directories rendered together).
function validate(dirs, context, renderCommand) {
  const objects = [];
  const errors = [];
  for (const dir of dirs) {
    for (const o of render(renderCommand, dir)) {
      objects.push(o);
      for (const e of validateSchema(o)) errors.push(`${o.kind} ${o.metadata?.namespace ?? ""}/${o.metadata?.name}: ${e}`);
    }
  }
  errors.push(...checkDeployment(objects, context));
  return { objects, errors };
}

function main() {
  const options = parseArgs(process.argv.slice(2));
  const docsPath = "docs/deploy.md";
  const context = {
    binaries: loadBinaries(options.bin),
    targets: loadContainerfile(path.join(root, "deploy/images/Containerfile")),
    trainerEnvironment: loadTrainerEnvironment(path.join(root, "docs/api.md")),
    operatorSecrets: loadOperatorSecrets(root, "deploy/k8s/overlays/tls/make-secrets"),
    docs: fs.readFileSync(path.join(root, docsPath), "utf8"),
    docsPath,
  };
  console.log(`validate: binaries from ${options.bin}; Kubernetes schemas from kubernetes-models ${modelsVersion()}; rendering with ${options.render}`);
  let passed = 0;
  let failed = 0;
  for (const [name, dirs] of options.deployments) {
    const { objects, errors } = validate(dirs, context, options.render);
    if (errors.length === 0) {
      passed++;
      const kinds = objects.map((o) => o.kind).join(", ");
      console.log(`ok   ${name}: ${dirs.join(" + ")}: ${objects.length} objects valid (${kinds})`);
    } else {
      failed++;
      console.log(`FAIL ${name}: ${dirs.join(" + ")}: ${errors.length} problem(s)`);
      for (const e of errors) console.log(`       ${e}`);
    }
  }
  if (options.negative) {
    // Each testdata/<case>/ breaks one thing in a copy of a cpu deployment;
    // expect.txt lists text the report must contain, one line each.
    const testdata = path.join(here, "testdata");
    for (const name of fs.readdirSync(testdata).sort()) {
      const dir = path.join(testdata, name);
      const expectFile = path.join(dir, "expect.txt");
      if (!fs.existsSync(expectFile)) continue;
      const expected = fs.readFileSync(expectFile, "utf8").split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("#"));
      let errors;
      try {
        ({ errors } = validate([path.relative(root, dir)], { ...context, docs: readCaseDocs(dir, context.docs) }, options.render));
      } catch (e) {
        errors = [String(e.message)];
      }
      const missing = expected.filter((x) => !errors.some((e) => e.includes(x)));
      if (errors.length > 0 && missing.length === 0) {
        passed++;
        console.log(`ok   broken copy ${name}: reported (${errors.length}): ${errors[0]}`);
        for (const e of errors.slice(1)) console.log(`       ${e}`);
      } else {
        failed++;
        console.log(`FAIL broken copy ${name}: expected ${missing.map((m) => JSON.stringify(m)).join(", ")} in the report; got ${errors.length}:`);
        for (const e of errors) console.log(`       ${e}`);
      }
    }
  }
  console.log(`deploy validation: ${passed} passed, ${failed} failed`);
  process.exit(failed === 0 ? 0 : 1);
}

// A case may take words out of docs/deploy.md: docs-drop.txt, one a line.
function readCaseDocs(dir, docs) {
  const file = path.join(dir, "docs-drop.txt");
  if (!fs.existsSync(file)) return docs;
  const drop = fs.readFileSync(file, "utf8").split("\n").map((l) => l.trim()).filter(Boolean);
  return drop.reduce((text, word) => text.split(word).join(""), docs);
}

try {
  main();
} catch (e) {
  console.error(`validate: ${e.message}`);
  process.exit(1);
}
