// Kubernetes schema validation, offline.
//
// Two passes over each rendered object:
//   1. kubernetes-models' validators (generated from the Kubernetes OpenAPI
//      schemas): types, enums, required fields, formats.
//   2. Unknown fields. Those validators accept any extra property, so a
//      misspelled field (`readinesProbe`) would pass, and an API server would
//      reject it (kubectl's default strict field validation) or drop it. The
//      package's type declarations (*.d.ts) list every field of every type;
//      each object is walked against them.

import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const modelsDir = path.dirname(require.resolve("kubernetes-models/package.json"));
const nodeModules = path.dirname(modelsDir);
// Kubernetes' own kinds, then cert-manager's (overlays/cert-manager).
const modelDirs = [modelsDir, path.dirname(require.resolve("@kubernetes-models/cert-manager/package.json"))];

// The file (without extension) declaring apiVersion/kind, or null when no
// package has it.
function modelFile(apiVersion, kind) {
  if (typeof apiVersion !== "string" || typeof kind !== "string") return null;
  for (const dir of modelDirs) {
    const file = path.join(dir, apiVersion, kind);
    if (fs.existsSync(`${file}.js`)) return file;
  }
  return null;
}

// The model class of apiVersion/kind, or null when no package has it.
function modelClass(apiVersion, kind) {
  const file = modelFile(apiVersion, kind);
  return file ? require(`${file}.js`)[kind] ?? null : null;
}

// --- type declarations -----------------------------------------------------

const interfaces = new Map(); // .d.ts file -> parsed interface or null

// Splits "A; B; { [key: string]: C; }" style text at depth 0.
function stripOuter(text, open, close) {
  text = text.trim();
  if (text.startsWith(open) && text.endsWith(close)) return text.slice(open.length, -close.length).trim();
  return null;
}

// A type expression from a declaration: {kind: "leaf"} | {kind: "array",
// of} | {kind: "map", of} | {kind: "ref", file}.
function parseType(text, imports, dir) {
  text = text.trim().replace(/;$/, "").trim();
  const array = stripOuter(text, "Array<", ">");
  if (array !== null) return { kind: "array", of: parseType(array, imports, dir) };
  const map = text.match(/^\{\s*\[key: string\]:\s*([\s\S]*?);?\s*\}$/);
  if (map) return { kind: "map", of: parseType(map[1], imports, dir) };
  if (/^[A-Za-z0-9_]+$/.test(text) && imports.has(text)) {
    const spec = imports.get(text);
    const file = spec.startsWith(".") ? path.resolve(dir, `${spec}.d.ts`) : path.join(nodeModules, `${spec}.d.ts`);
    return { kind: "ref", file };
  }
  return { kind: "leaf" };
}

// The first interface a .d.ts file exports, as Map field -> type; null for
// files that only export a type alias (IntOrString, Quantity, Time, ...).
function loadInterface(file) {
  if (interfaces.has(file)) return interfaces.get(file);
  interfaces.set(file, null); // breaks cycles (JSONSchemaProps refers to itself)
  if (!fs.existsSync(file)) return null;
  const source = fs.readFileSync(file, "utf8");
  const imports = new Map();
  for (const m of source.matchAll(/^import \{ ([^}]+) \} from "([^"]+)";$/gm)) {
    for (const name of m[1].split(",")) imports.set(name.trim(), m[2]);
  }
  const head = source.match(/^export interface \w+(?: extends ([\w, ]+))? \{$/m);
  if (!head) return null;
  const fields = new Map();
  if (head[1] && /\bTypeMeta\b/.test(head[1])) {
    fields.set("apiVersion", { kind: "leaf" });
    fields.set("kind", { kind: "leaf" });
  }
  const lines = source.slice(head.index + head[0].length).split("\n");
  let pending = null; // [name, text] of a field whose type spans lines
  let depth = 0;
  for (const line of lines) {
    if (pending) {
      pending[1] += " " + line.trim();
      depth += (line.match(/\{/g) || []).length - (line.match(/\}/g) || []).length;
      if (depth === 0) {
        fields.set(pending[0], parseType(pending[1], imports, path.dirname(file)));
        pending = null;
      }
      continue;
    }
    if (/^\}/.test(line)) break;
    const field = line.match(/^\s+"([^"]+)"\??: (.*)$/);
    if (!field) continue;
    const opens = (field[2].match(/\{/g) || []).length - (field[2].match(/\}/g) || []).length;
    if (opens > 0) {
      pending = [field[1], field[2]];
      depth = opens;
    } else {
      fields.set(field[1], parseType(field[2], imports, path.dirname(file)));
    }
  }
  const parsed = { fields };
  interfaces.set(file, parsed);
  return parsed;
}

function unknownFields(value, type, where, errors) {
  if (value === null || value === undefined) return;
  if (type.kind === "array") {
    if (Array.isArray(value)) value.forEach((v, i) => unknownFields(v, type.of, `${where}[${i}]`, errors));
    return;
  }
  if (type.kind === "map") {
    if (typeof value === "object") for (const [k, v] of Object.entries(value)) unknownFields(v, type.of, `${where}.${k}`, errors);
    return;
  }
  if (type.kind !== "ref" || typeof value !== "object" || Array.isArray(value)) return;
  const iface = loadInterface(type.file);
  if (!iface) return;
  for (const [key, v] of Object.entries(value)) {
    const fieldType = iface.fields.get(key);
    if (!fieldType) {
      errors.push(`unknown field "${where ? where + "." : ""}${key}" (${path.basename(type.file, ".d.ts")} has no such field)`);
      continue;
    }
    unknownFields(v, fieldType, where ? `${where}.${key}` : key, errors);
  }
}

// Errors (strings) of one object against the Kubernetes schemas.
export function validateSchema(object) {
  const errors = [];
  const Model = modelClass(object.apiVersion, object.kind);
  if (!Model) {
    return [`no Kubernetes schema for apiVersion "${object.apiVersion}" kind "${object.kind}"`];
  }
  try {
    new Model(object).validate();
  } catch (e) {
    const details = (e.errors || []).map((d) => `${d.instancePath || "/"} ${d.message}`);
    errors.push(`schema: ${details.length ? details.join("; ") : e.message}`);
  }
  unknownFields(object, { kind: "ref", file: `${modelFile(object.apiVersion, object.kind)}.d.ts` }, "", errors);
  return errors;
}

export function modelsVersion() {
  const version = (name) => require(`${name}/package.json`).version;
  return `${version("kubernetes-models")}, @kubernetes-models/cert-manager ${version("@kubernetes-models/cert-manager")}`;
}
