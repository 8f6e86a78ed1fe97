// Renders chat-template cases with @huggingface/jinja (the reference renderer).
// Usage: node reference_render.cjs NODE_MODULES_DIR CASES.json
// CASES.json: [{"template": "...", "vars": {...}}, ...]; prints [{"text": "..."} | {"error": "..."}, ...].
const path = require('path');
const fs = require('fs');
const { Template } = require(path.join(process.argv[2], '@huggingface/jinja'));
const cases = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));
const out = cases.map((c) => {
  try {
    return { text: new Template(c.template).render(c.vars) };
  } catch (e) {
    return { error: String(e.message) };
  }
});
process.stdout.write(JSON.stringify(out));
