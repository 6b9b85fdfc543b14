// Offline proofs of Decisions (c2sp.org/tlog-proof@v1), checked in the browser with WebCrypto:
// the checks of `agent-gateway verify-proof`. The proof's checkpoint is signed by the gateway's
// Ed25519 key (from its JWK Set), the Decision's leaf hashes into the checkpoint's root (RFC 9162),
// at least a quorum of the listed witnesses cosigned it (c2sp.org/tlog-cosignature), and the leaf
// (the proof's extra) is the Decision's JWS, which verifies under the same key and says what the
// page shows. Nothing here is trusted from the proof alone: keys come from the caller.
//
// A User's receipt of a Message (GET /messages/{seq}/receipt), checked as `agent-gateway
// verify-receipt` does: the Run ledger's checkpoint signed by the gateway's key, each entry in its
// tree, and each Run's payload and Prompt digests recomputed from the text the page shows and the
// template the instructions entry publishes. The page renders only templates of text and
// `{{ name }}` substitutions (the default's shape); the command checks any, with the gateway's own Jinja2.
"use strict";

window.agentGatewayProofs = (() => {
  const HEADER = "c2sp.org/tlog-proof@v1";
  const ED25519_NOTE_KEY = 0x01; // signed-note key type of the gateway's checkpoint signature
  const COSIGNATURE_V1 = 0x04; // signed-note key type of a witness's cosignature
  const encoder = new TextEncoder();

  // A proof that does not prove what it says; its message names the check.
  class Refused extends Error {}

  const base64 = (text) => Uint8Array.from(atob(text), (char) => char.charCodeAt(0));
  const base64url = (text) => base64(text.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((text.length + 3) % 4));
  const equal = (a, b) => a.length === b.length && a.every((byte, i) => byte === b[i]);

  function concat(...parts) {
    const whole = new Uint8Array(parts.reduce((sum, part) => sum + part.length, 0));
    let at = 0;
    for (const part of parts) {
      whole.set(part, at);
      at += part.length;
    }
    return whole;
  }

  async function sha256(...parts) {
    return new Uint8Array(await crypto.subtle.digest("SHA-256", concat(...parts)));
  }

  async function ed25519(raw, signature, data) {
    const key = await crypto.subtle.importKey("raw", raw, { name: "Ed25519" }, false, ["verify"]);
    return crypto.subtle.verify({ name: "Ed25519" }, key, signature, data);
  }

  // Whether this browser's WebCrypto has Ed25519 (Chromium 137+, Firefox 129+, Safari 17+).
  async function supported(jwks) {
    const key = gatewayKeys(jwks)[0];
    if (!key || !window.crypto || !crypto.subtle) return false;
    try {
      await crypto.subtle.importKey("raw", key, { name: "Ed25519" }, false, ["verify"]);
      return true;
    } catch (error) {
      return false;
    }
  }

  function gatewayKeys(jwks) {
    return ((jwks && jwks.keys) || []).filter((jwk) => jwk.kty === "OKP" && jwk.crv === "Ed25519").map((jwk) => base64url(jwk.x));
  }

  async function keyId(name, type, raw) {
    return (await sha256(encoder.encode(name + "\n"), Uint8Array.of(type), raw)).slice(0, 4);
  }

  function parse(text) {
    const cut = text.indexOf("\n\n");
    const lines = text.slice(0, Math.max(cut, 0)).split("\n");
    if (cut < 0 || lines[0] !== HEADER || !/^extra /.test(lines[1] || "") || !/^index (0|[1-9][0-9]*)$/.test(lines[2] || "")) {
      throw new Refused("not a tlog-proof");
    }
    try {
      return {
        extra: base64(lines[1].slice(6)),
        index: Number(lines[2].slice(6)),
        hashes: lines.slice(3).map(base64),
        note: text.slice(cut + 2),
      };
    } catch (error) {
      throw new Refused("a line of the proof is not base64");
    }
  }

  // The checkpoint note: its text (what is signed), origin, size and root, and its signature lines.
  function openNote(note) {
    const cut = note.lastIndexOf("\n\n");
    if (cut < 0 || !note.endsWith("\n")) throw new Refused("the checkpoint has no signatures");
    const text = note.slice(0, cut + 1);
    const [origin, size, root] = text.split("\n");
    const signatures = note.slice(cut + 2, -1).split("\n").map((line) => {
      // A line that is no signature (base64 that does not decode, less than a key ID and a byte) makes
      // the note malformed, whoever's key it names (signed-note; Go's note.Open alike).
      const match = /^\u2014 (\S+) ([A-Za-z0-9+/]+={0,2})$/.exec(line);
      let blob = null;
      try {
        blob = match && base64(match[2]);
      } catch (error) {
        blob = null;
      }
      if (!blob || blob.length < 5) throw new Refused("a signature line of the checkpoint is malformed");
      return { name: match[1], blob };
    });
    if (!/^(0|[1-9][0-9]*)$/.test(size || "")) throw new Refused("the checkpoint has no size");
    let digest;
    try {
      digest = base64(root || "");
    } catch (error) {
      throw new Refused("the checkpoint's root hash is not base64");
    }
    return { text, bytes: encoder.encode(text), origin, size: Number(size), root: digest, signatures };
  }

  // The gateway's key that signed the checkpoint (signed-note: a listed key's bad signature refuses it).
  async function signedBy(checkpoint, keys) {
    let signer = null;
    for (const raw of keys) {
      const id = await keyId(checkpoint.origin, ED25519_NOTE_KEY, raw);
      for (const { name, blob } of checkpoint.signatures) {
        if (name !== checkpoint.origin || !equal(blob.slice(0, 4), id)) continue;
        if (!(await ed25519(raw, blob.slice(4), checkpoint.bytes))) throw new Refused("the gateway's signature of the checkpoint does not verify");
        signer = raw;
      }
    }
    if (signer === null) throw new Refused("the checkpoint is not signed by the gateway's key");
    return signer;
  }

  // RFC 9162, 2.1.3.2: the leaf's hash, and the proof's hashes, into the root of a tree of ``size``.
  async function included(index, size, leaf, hashes, root) {
    if (index >= size) return false;
    let fn = index;
    let sn = size - 1;
    let hash = await sha256(Uint8Array.of(0), leaf);
    for (const sibling of hashes) {
      if (sn === 0) return false;
      if (fn % 2 === 1 || fn === sn) {
        hash = await sha256(Uint8Array.of(1), sibling, hash);
        while (fn % 2 === 0 && fn !== 0) {
          fn = Math.floor(fn / 2);
          sn = Math.floor(sn / 2);
        }
      } else {
        hash = await sha256(Uint8Array.of(1), hash, sibling);
      }
      fn = Math.floor(fn / 2);
      sn = Math.floor(sn / 2);
    }
    return sn === 0 && equal(hash, root);
  }

  // How many of the witnesses' keys (cosignature/v1 verifier keys) cosigned the checkpoint.
  async function cosignedBy(checkpoint, vkeys) {
    let count = 0;
    for (const vkey of vkeys) {
      const match = /^([^\s+]+)\+([0-9a-f]{8})\+([A-Za-z0-9+/]+={0,2})$/.exec(vkey);
      const blob = match ? base64(match[3]) : new Uint8Array();
      if (!match || blob[0] !== COSIGNATURE_V1 || blob.length !== 33) continue;
      const raw = blob.slice(1);
      const id = await keyId(match[1], COSIGNATURE_V1, raw);
      if (Array.from(id, (byte) => byte.toString(16).padStart(2, "0")).join("") !== match[2]) continue;
      for (const line of checkpoint.signatures) {
        if (line.name !== match[1] || line.blob.length !== 4 + 8 + 64 || !equal(line.blob.slice(0, 4), id)) continue;
        const time = new DataView(line.blob.buffer, line.blob.byteOffset + 4, 8).getBigUint64(0);
        const signed = concat(encoder.encode(`cosignature/v1\ntime ${time}\n`), checkpoint.bytes);
        if (await ed25519(raw, line.blob.slice(12), signed)) {
          count += 1;
          break;
        }
      }
    }
    return count;
  }

  // The Decision the JWS carries, once it verifies under the gateway's key.
  async function decisionOf(jws, key) {
    const parts = jws.split(".");
    if (parts.length !== 3) throw new Refused("the proof's leaf is not a JWS");
    let header;
    let payload;
    try {
      header = JSON.parse(new TextDecoder().decode(base64url(parts[0])));
      payload = JSON.parse(new TextDecoder().decode(base64url(parts[1])));
    } catch (error) {
      throw new Refused("the proof's leaf is not a JWS");
    }
    if (header.alg !== "EdDSA" || !(await ed25519(key, base64url(parts[2]), encoder.encode(parts[0] + "." + parts[1])))) {
      throw new Refused("the Decision's signature does not verify under the gateway's key");
    }
    return payload;
  }

  // ``decision`` ({seq, statement}) as the page shows it, proven by ``proofText`` against the JWK Set
  // ``jwks`` and ``witnesses`` ({quorum, witnesses: [vkey]}): {size, cosigned}, or a Refused error.
  async function verify(proofText, decision, jwks, witnesses) {
    const proof = parse(proofText);
    const checkpoint = openNote(proof.note);
    const key = await signedBy(checkpoint, gatewayKeys(jwks));
    if (!(await included(proof.index, checkpoint.size, proof.extra, proof.hashes, checkpoint.root))) {
      throw new Refused("the Decision is not in the checkpoint's tree");
    }
    const cosigned = await cosignedBy(checkpoint, witnesses.witnesses);
    if (cosigned < witnesses.quorum) {
      throw new Refused(`cosigned by ${cosigned} of the witnesses, ${witnesses.quorum} needed`);
    }
    const said = await decisionOf(new TextDecoder().decode(proof.extra), key);
    if (said.seq !== decision.seq || said.statement !== decision.statement) {
      throw new Refused("the proof is of another Decision");
    }
    return { size: checkpoint.size, cosigned };
  }

  // --- receipts of the Run ledger ---------------------------------------------------------

  const hexOf = (bytes) => Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
  const LEDGER_ORIGIN = /^agent-gateway\/ledger\/|\/ledger$/;

  // RFC 8785 for what JSON.parse gives: members sorted by UTF-16 code units, JSON.stringify's
  // strings and numbers (which RFC 8785 takes from ECMAScript).
  function canonical(value) {
    if (Array.isArray(value)) return "[" + value.map(canonical).join(",") + "]";
    if (value !== null && typeof value === "object") {
      return "{" + Object.keys(value).sort().map((name) => JSON.stringify(name) + ":" + canonical(value[name])).join(",") + "}";
    }
    return JSON.stringify(value);
  }

  // What the template makes of ``context``, as the gateway's Jinja2 does, for a template of text and
  // {{ name }} / {{ name.member }} substitutions of strings and integers; null for anything else
  // (a tag, a filter, another value), which the page then leaves to the command.
  function render(template, context) {
    if (/\{[%#]|\r/.test(template)) return null;
    let rendered = "";
    let at = 0;
    for (const match of template.matchAll(/\{\{(.*?)\}\}/gs)) {
      const name = /^ *([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*) *$/.exec(match[1]);
      if (!name) return null;
      let value = context;
      for (const part of name[1].split(".")) {
        if (value === null || typeof value !== "object" || Array.isArray(value) || !Object.hasOwn(value, part)) return null;
        value = value[part];
      }
      if (typeof value === "string") rendered += template.slice(at, match.index) + value;
      else if (Number.isSafeInteger(value)) rendered += template.slice(at, match.index) + String(value);
      else return null;
      at = match.index + match[0].length;
    }
    return rendered + template.slice(at);
  }

  // An entry of the receipt, once its leaf is proved in the checkpoint's tree and is a ``kind`` entry.
  async function provedEntry(entry, checkpoint, kind) {
    const leaf = encoder.encode(entry.leaf);
    let hashes;
    try {
      hashes = entry.hashes.map(base64);
    } catch (error) {
      throw new Refused(`entry ${entry.seq}: a proof hash is not base64`);
    }
    if (entry.index !== entry.seq - 1 || !(await included(entry.index, checkpoint.size, leaf, hashes, checkpoint.root))) {
      throw new Refused(`entry ${entry.seq} is not in the Run ledger's checkpoint`);
    }
    const content = JSON.parse(entry.leaf);
    if (canonical(content) !== entry.leaf || content.type !== kind) throw new Refused(`entry ${entry.seq} is not a ${kind} entry`);
    return { ...content, seq: entry.seq };
  }

  // The receipt of ``message`` ({seq, text} as the page shows it, and userId, the logged-in User's),
  // checked against the JWK Set ``jwks``: {instructions: [the entries the Runs ran under],
  // promptsChecked}, or a Refused error. A receipt with no Run yet answers {instructions: []}.
  async function verifyReceipt(receipt, message, jwks) {
    const checkpoint = openNote(receipt.checkpoint);
    if (!LEDGER_ORIGIN.test(checkpoint.origin)) throw new Refused("the checkpoint is not the Run ledger's");
    await signedBy(checkpoint, gatewayKeys(jwks));
    const runs = [];
    for (const entry of receipt.runs) runs.push(await provedEntry(entry, checkpoint, "run"));
    const told = new Map();
    for (const entry of receipt.instructions) told.set(entry.seq, await provedEntry(entry, checkpoint, "instructions"));
    // Another User's Message with the same text would verify otherwise: the receipt names its User.
    if (receipt.message.userId !== message.userId) throw new Refused("the receipt is of another User's Message");
    if (receipt.message.seq !== message.seq) throw new Refused("the receipt is of another Message");
    const payload = { ...receipt.message, text: message.text };
    const signal = receipt.signal;
    const context = { payload, signal: { id: signal.id, kind: signal.kind, emittedAt: signal.emittedAt }, ...payload };
    let promptsChecked = true;
    for (const run of runs) {
      if (run.signal !== signal.id || run.kind !== signal.kind) throw new Refused("a Run of another Signal");
      const instructions = told.get(run.instructions);
      if (!instructions) throw new Refused(`the receipt lacks instructions #${run.instructions}`);
      // The instructions in force were appended before the Run: a later entry says nothing of its Prompt.
      if (!(run.instructions < run.seq)) throw new Refused(`instructions #${run.instructions} were appended after the Run`);
      if (hexOf(await sha256(encoder.encode(canonical(payload)))) !== run.payload) {
        throw new Refused("the agent was not given this text for this Message");
      }
      const handler = (instructions.instructions.handlers || []).find((each) => each.kind === signal.kind);
      const prompt = handler && typeof handler.template === "string" ? render(handler.template, context) : null;
      const session = handler && typeof handler.session === "string" ? render(handler.session, context) : `run_${run.run}`;
      if (prompt === null || session === null) {
        promptsChecked = false;
        continue;
      }
      if (hexOf(await sha256(encoder.encode(prompt))) !== run.prompt || session !== run.session) {
        throw new Refused(`the template of instructions #${run.instructions} does not make the Prompt the agent was given`);
      }
    }
    return { instructions: [...new Set(runs.map((run) => run.instructions))].map((seq) => told.get(seq)), promptsChecked };
  }

  return { verify, verifyReceipt, supported, Refused };
})();
