#!/usr/bin/env node
// Render every formula it is given with the site's own KaTeX (docs/assets/katex/katex.min.js) and
// report those that do not parse. Input on stdin: a JSON list of {where, tex, display}; output on
// stdout: a JSON list of {where, tex, error} (empty when all render). Exit status 0 either way;
// 2 when the input or KaTeX cannot be read. Run by tests/test_docs_render.py, which extracts the
// formulas of the chapter pages (as pymdownx.arithmatex does) and of the tutorial notebooks.
//
// Options match docs/assets/js/katex-init.js (strict: "ignore") except throwOnError: the browser
// shows a red source string for a bad formula; here it is an error.
"use strict";
const fs = require("fs");
const path = require("path");

const katexPath = path.join(__dirname, "..", "docs", "assets", "katex", "katex.min.js");
let katex;
try {
  katex = require(katexPath);
} catch (e) {
  process.stderr.write(`cannot load ${katexPath}: ${e.message}\n`);
  process.exit(2);
}

let items;
try {
  items = JSON.parse(fs.readFileSync(0, "utf8"));
} catch (e) {
  process.stderr.write(`stdin is not a JSON list of formulas: ${e.message}\n`);
  process.exit(2);
}

const errors = [];
for (const { where, tex, display } of items) {
  try {
    katex.renderToString(tex, { displayMode: !!display, throwOnError: true, strict: "ignore" });
  } catch (e) {
    errors.push({ where, tex, error: String(e.message || e) });
  }
}
process.stdout.write(JSON.stringify({ rendered: items.length, errors }));
