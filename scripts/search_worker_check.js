#!/usr/bin/env node
// Run a built site's search worker (assets/javascripts/workers/search-segmented.*.js) outside the
// browser, on the site's own search_index.json, and report two things as JSON on stdout:
//   - the index's token set against its inverted index: words the set has and the index lacks
//     ("invented": a prefix query reaching one throws, lunr issue #314) and words the index has
//     and the set lacks ("lost": no query finds them); both must be empty;
//   - for each query given as an argument, the warning the worker printed (Material prints
//     "Invalid query" when lunr throws) or null, and how many results came back.
// Exit status 0 either way; 2 when the site cannot be read. Run by tests/test_search_browser.py.
//
// The worker expects a Web Worker's globals; this gives it the few it uses (self, addEventListener,
// postMessage, importScripts for lunr's language files next to it).
"use strict";
const fs = require("fs");
const path = require("path");

const site = process.argv[2];
const queries = process.argv.slice(3);
let workerFile, index;
try {
  const dir = path.join(site, "assets", "javascripts", "workers");
  workerFile = path.join(dir, fs.readdirSync(dir).find((f) => f.startsWith("search-segmented.")));
  index = JSON.parse(fs.readFileSync(path.join(site, "search", "search_index.json"), "utf8"));
} catch (e) {
  process.stderr.write(`cannot read the site's search worker or index under ${site}: ${e.message}\n`);
  process.exit(2);
}

const listeners = [];
let posted = [];
const warnings = [];
globalThis.self = globalThis;
globalThis.addEventListener = (type, fn) => listeners.push(fn);
globalThis.postMessage = (m) => posted.push(m);
globalThis.importScripts = (...urls) => {
  for (const url of urls) {
    const file = path.join(site, "assets", "javascripts", "lunr", url.replace(/^.*\/lunr\//, ""));
    (0, eval)(fs.readFileSync(file, "utf8"));
  }
};
console.warn = (...args) => warnings.push(args.join(" "));
(0, eval)(fs.readFileSync(workerFile, "utf8"));

let built = null;       // the lunr index the worker builds, caught on its way out of build()
const build = self.lunr.Builder.prototype.build;
self.lunr.Builder.prototype.build = function () {
  built = build.apply(this, arguments);
  return built;
};

async function send(message) {
  for (const fn of listeners) await fn({ data: message });
  // the worker answers from an async function: let it finish
  for (let i = 0; i < 50 && posted.length === 0; i++) await new Promise((r) => setTimeout(r, 20));
}

(async () => {
  index.options = Object.assign({ suggest: false }, index.options || {});
  await send({ type: 0, data: index });
  // the patched build hides the vocabulary behind a Proxy whose `has` is false: list its own keys
  const vocabulary = new Set(Reflect.ownKeys(built.invertedIndex));
  const set = new Set(built.tokenSet.toArray());
  const out = {
    words: vocabulary.size,
    invented: [...set].filter((w) => !vocabulary.has(w)).slice(0, 50),
    lost: [...vocabulary].filter((w) => !set.has(w)).slice(0, 50),
    queries: {},
  };
  for (const query of queries) {
    posted = [];
    warnings.length = 0;
    await send({ type: 2, data: query });
    const items = posted.length && posted[0].data && posted[0].data.items ? posted[0].data.items : [];
    out.queries[query] = { warning: warnings.length ? warnings.join("\n").slice(0, 500) : null, results: items.length };
  }
  process.stdout.write(JSON.stringify(out));
})();
