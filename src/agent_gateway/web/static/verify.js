// Offline proofs of Decisions (c2sp.org/tlog-proof@v1), checked in the browser with WebCrypto:
// the checks of `agent-gateway verify-proof`. The proof's checkpoint is signed by the gateway's
// Ed25519 key (from its JWK Set), the Decision's leaf hashes into the checkpoint's root (RFC 9162),
// at least a quorum of the listed witnesses cosigned it (c2sp.org/tlog-cosignature), and the leaf
// (the proof's extra) is the Decision's JWS, which verifies under the same key and says what the
// page shows. Nothing here is trusted from the proof alone: keys come from the caller.
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
      const match = /^\u2014 (\S+) ([A-Za-z0-9+/]+={0,2})$/.exec(line);
      if (!match) throw new Refused("a signature line of the checkpoint is malformed");
      return { name: match[1], blob: base64(match[2]) };
    });
    if (!/^(0|[1-9][0-9]*)$/.test(size || "")) throw new Refused("the checkpoint has no size");
    return { text, bytes: encoder.encode(text), origin, size: Number(size), root: base64(root || ""), signatures };
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

  return { verify, supported, Refused };
})();
