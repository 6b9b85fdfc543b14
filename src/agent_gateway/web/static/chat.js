// The chat page: log in, read and send Messages, follow the live stream of the User's log.
//
// Only this origin is ever asked (the Content-Security-Policy enforces it). The Token is
// kept in sessionStorage: this tab only, gone when it closes; never in a URL or localStorage.
// The stream is read with fetch() because EventSource cannot send an Authorization header.
//
// With a NIP-07 browser extension (window.nostr) and a gateway that accepts NIP-98, a person
// logs in with their Nostr key instead: no Token then, every request carries an event the
// extension signs for it (its URL, method and body digest), which the gateway accepts once.
"use strict";

(() => {
  const TOKEN_KEY = "agent-gateway.token";
  const NOSTR_KEY = "agent-gateway.nostr"; // the public key (hex) of a Nostr login
  const USER_KEY = "agent-gateway.user";
  const NIP98_KIND = 27235;
  const PAGE_LIMIT = 50;
  const SEND_ATTEMPTS = 3; // a 503 means "not recorded, retry": try again twice by itself
  const RECONNECT_MAX_MS = 15000;
  // The gateway sends a keep-alive at least every 15 s; this much silence is a dead connection.
  const SILENCE_MS = 45000;

  const $ = (id) => document.getElementById(id);
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  // The logged-in session, or null; every async step checks it is still the current one.
  let session = null;

  class RequestFailed extends Error {
    constructor(status, message) {
      super(message);
      this.status = status; // 0 when the gateway could not be reached
    }
  }

  // A NIP-07 extension may appear after this script runs; it is asked for when needed.
  const nostrAvailable = () => Boolean(window.nostr) && window.isSecureContext;

  function hex(bytes) {
    return Array.from(new Uint8Array(bytes), (byte) => byte.toString(16).padStart(2, "0")).join("");
  }

  function base64(text) {
    return btoa(String.fromCharCode(...new TextEncoder().encode(text)));
  }

  // NIP-98: a kind 27235 event naming this request, signed by the extension (which may ask its user).
  async function nostrAuthorization(method, path, payload) {
    // The nonce: the same request twice in one second would otherwise be the same event (its id
    // covers only these fields), which the gateway takes for a replay the second time.
    const nonce = hex(crypto.getRandomValues(new Uint8Array(16)));
    const tags = [["u", new URL(path, location.href).href], ["method", method], ["nonce", nonce]];
    if (payload !== undefined) {
      tags.push(["payload", hex(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(payload)))]);
    }
    const template = { kind: NIP98_KIND, created_at: Math.floor(Date.now() / 1000), tags, content: "" };
    let event;
    try {
      event = await window.nostr.signEvent(template);
    } catch (error) {
      throw new RequestFailed(-1, "Your Nostr extension did not sign the request.");
    }
    return "Nostr " + base64(JSON.stringify(event));
  }

  // ``auth``: the session (its Token, or its Nostr key) the request acts for; none to log in.
  async function request(method, path, { body, auth, signal, headers = {} } = {}) {
    const init = { method, headers: { ...headers }, cache: "no-store", credentials: "omit", signal };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    if (auth && auth.token) init.headers.Authorization = "Bearer " + auth.token;
    if (auth && auth.nostr) init.headers.Authorization = await nostrAuthorization(method, path, init.body);
    return fetch(path, init).catch((error) => {
      if (error.name === "AbortError") throw error;
      throw new RequestFailed(0, "Cannot reach the gateway.");
    });
  }

  // A JSON API call: its parsed body (null for 204), or a RequestFailed with the spec's message.
  async function api(method, path, options) {
    const response = await request(method, path, options);
    if (response.status === 204) return null;
    const data = await response.json().catch(() => null);
    if (!response.ok) {
      throw new RequestFailed(response.status, (data && data.message) || response.statusText);
    }
    return data;
  }

  function show(element, text) {
    element.textContent = text;
    element.hidden = !text;
  }

  // --- logging in and out ---------------------------------------------------------------

  async function logIn(event) {
    event.preventDefault();
    show($("login-error"), "");
    show($("login-notice"), "");
    $("login-submit").disabled = true;
    try {
      const result = await api("POST", "/auth/tokens", {
        body: { user: $("login-user").value.trim(), password: $("login-password").value },
      });
      $("login-password").value = "";
      begin({ token: result.token }, result.user.id);
    } catch (error) {
      const messages = {
        401: "Wrong User id or password.",
        400: "Check what you typed: " + error.message,
        0: "Cannot reach the gateway. Check your connection and try again.",
      };
      show($("login-error"), messages[error.status] || "Login failed: " + error.message);
    } finally {
      $("login-submit").disabled = false;
    }
  }

  // The key of the extension, if it is linked to a User here: that User's session.
  async function logInWithNostr() {
    show($("login-error"), "");
    show($("login-notice"), "");
    $("login-nostr").disabled = true;
    let pubkey = null;
    try {
      pubkey = await window.nostr.getPublicKey();
      const me = await api("GET", "/users/me", { auth: { nostr: pubkey } });
      begin({ nostr: pubkey }, me.id);
    } catch (error) {
      const messages = {
        401: `This Nostr key (${pubkey}) is not linked to a User here, or the gateway does not accept Nostr logins. Ask the operator to link it.`,
        0: "Cannot reach the gateway. Check your connection and try again.",
        [-1]: error.message,
      };
      const message = pubkey === null ? "Your Nostr extension did not give its public key." : messages[error.status];
      show($("login-error"), message || "Login failed: " + error.message);
    } finally {
      $("login-nostr").disabled = false;
    }
  }

  // ``credentials``: { token } after a password login, { nostr: public key } after a Nostr one.
  function begin(credentials, userId) {
    if (credentials.token) sessionStorage.setItem(TOKEN_KEY, credentials.token);
    if (credentials.nostr) sessionStorage.setItem(NOSTR_KEY, credentials.nostr);
    sessionStorage.setItem(USER_KEY, userId);
    session = { ...credentials, userId, resumeAfter: null, oldest: null, controller: null };
    $("messages").replaceChildren();
    $("older").hidden = true;
    show($("chat-error"), "");
    $("chat-user").textContent = "User " + userId;
    $("login").hidden = true;
    $("chat").hidden = false;
    $("send-text").focus();
    follow(session);
  }

  // Back to the login form; ``notice`` says why.
  function end(notice, isError) {
    if (session && session.controller) session.controller.abort();
    session = null;
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(NOSTR_KEY);
    sessionStorage.removeItem(USER_KEY);
    $("messages").replaceChildren();
    $("decision-list").replaceChildren();
    $("decisions").hidden = true;
    $("chat").hidden = true;
    $("login").hidden = false;
    show($("login-error"), isError ? notice : "");
    show($("login-notice"), isError ? "" : notice);
    $("login-nostr").hidden = !nostrAvailable();
  }

  async function logOut() {
    const current = session;
    // A Nostr session holds no Token: there is nothing to revoke, only to forget.
    if (current.nostr) return end("You are logged out.", false);
    $("logout").disabled = true;
    try {
      await api("DELETE", "/auth/tokens/current", { auth: current });
    } catch (error) {
      // 401: the Token already stopped working, which is what logging out wants.
      if (error.status !== 401) {
        show($("chat-error"), "Could not log out (" + error.message + "); the Token still works. Try again.");
        return;
      }
    } finally {
      $("logout").disabled = false;
    }
    if (session === current) end("You are logged out.", false);
  }

  function sessionEnded() {
    const why = session && session.nostr ? "your Nostr key is no longer linked to this User" : "the Token expired or was revoked";
    end(`Your session has ended (${why}). Log in again.`, true);
  }

  // --- the conversation -----------------------------------------------------------------

  function nearBottom(log) {
    return log.scrollHeight - log.scrollTop - log.clientHeight < 80;
  }

  // Shows a Message once, in seq order, whichever way it arrived (page, send or stream).
  function add(message) {
    const list = $("messages");
    const seq = String(message.seq);
    if (list.querySelector(`li[data-seq="${seq}"]`)) return;
    const item = document.createElement("li");
    item.className = "message " + (message.direction === "inbound" ? "inbound" : "outbound");
    item.dataset.seq = seq;
    const meta = document.createElement("span");
    meta.className = "meta";
    const when = new Date(message.createdAt);
    const who = message.direction === "inbound" ? "You" : "Agent";
    meta.textContent = who + " · " + when.toLocaleString([], { dateStyle: "short", timeStyle: "short" });
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = message.text; // text, never markup
    item.append(meta, text);
    if (message.direction === "inbound") {
      // The receipt's mark: checks, when pressed, that the Message reached the agent as shown.
      const badge = document.createElement("button");
      badge.type = "button";
      badge.className = "mark";
      badge.textContent = "check receipt";
      badge.title = "Check in this browser that this Message reached the agent as written, and under which instructions";
      badge.addEventListener("click", () => checkReceipt(session, message, item));
      item.append(badge);
    }
    let next = null;
    for (const other of list.children) {
      if (Number(other.dataset.seq) > message.seq) {
        next = other;
        break;
      }
    }
    list.insertBefore(item, next);
    if (session && (session.oldest === null || message.seq < session.oldest)) session.oldest = message.seq;
  }

  function addAtEnd(messages) {
    const log = $("log");
    const follow = nearBottom(log);
    messages.forEach(add);
    if (follow) log.scrollTop = log.scrollHeight;
  }

  // The newest page; the stream then resumes right after it, so nothing falls in between.
  async function loadNewest(current) {
    const page = await api("GET", "/messages?limit=" + PAGE_LIMIT, { auth: current });
    if (session !== current) return;
    addAtEnd(page.messages);
    $("log").scrollTop = $("log").scrollHeight;
    $("older").hidden = page.messages.length < PAGE_LIMIT;
    const last = page.messages[page.messages.length - 1];
    current.resumeAfter = last ? last.seq : 0;
  }

  async function loadOlder() {
    const current = session;
    if (!current || current.oldest === null || $("older").disabled) return;
    $("older").disabled = true;
    try {
      const page = await api("GET", `/messages?before=${current.oldest}&limit=${PAGE_LIMIT}`, {
        auth: current,
      });
      if (session !== current) return;
      const log = $("log");
      const fromBottom = log.scrollHeight - log.scrollTop;
      page.messages.forEach(add);
      log.scrollTop = log.scrollHeight - fromBottom; // the reader stays where they were
      $("older").hidden = page.messages.length < PAGE_LIMIT;
    } catch (error) {
      if (error.status === 401) return sessionEnded();
      show($("chat-error"), "Could not load older messages: " + error.message);
    } finally {
      $("older").disabled = false;
    }
  }

  async function send(event) {
    event.preventDefault();
    const current = session;
    const text = $("send-text").value;
    if (!current || text === "") return;
    $("send").disabled = true;
    show($("chat-error"), "");
    try {
      for (let attempt = 1; ; attempt++) {
        try {
          const message = await api("POST", "/messages", { auth: current, body: { text } });
          if (session !== current) return;
          if ($("send-text").value === text) $("send-text").value = "";
          $("log").scrollTop = $("log").scrollHeight;
          addAtEnd([message]);
          return;
        } catch (error) {
          if (error.status === 503 && attempt < SEND_ATTEMPTS) {
            await sleep(500 * attempt);
            continue;
          }
          if (error.status === 401) return sessionEnded();
          const messages = {
            503: "The gateway is busy: your Message was not recorded. Press Send to try again.",
            0: "Cannot reach the gateway: your Message may not have been sent. It appears above if it was; otherwise press Send again.",
          };
          show($("chat-error"), messages[error.status] || "Not sent: " + error.message);
          return;
        }
      }
    } finally {
      $("send").disabled = false;
      $("send-text").focus();
    }
  }

  // --- the Decision log, each Decision with its proof checked here ------------------------

  const DECISIONS_SHOWN = 20;

  function mark(item, state, text, title) {
    const badge = item.querySelector(".mark");
    badge.className = "mark " + state;
    badge.dataset.state = state;
    badge.textContent = text;
    badge.title = title;
  }

  // The newest Decisions; each gets its mark once its offline proof (tlog-proof) is checked against
  // the gateway's JWK Set and witnesses (window.agentGatewayProofs, verify.js).
  async function showDecisions() {
    const current = session;
    const panel = $("decisions");
    panel.hidden = !panel.hidden;
    $("show-decisions").setAttribute("aria-expanded", String(!panel.hidden));
    if (panel.hidden || !current) return;
    const list = $("decision-list");
    list.replaceChildren();
    show($("decisions-note"), "Loading…");
    let jwks, witnesses, page;
    try {
      [jwks, witnesses, page] = await Promise.all([
        api("GET", "/jwks.json"),
        api("GET", "/checkpoint/witnesses", { auth: current }),
        api("GET", "/decisions?limit=" + DECISIONS_SHOWN, { auth: current }),
      ]);
    } catch (error) {
      if (error.status === 401) return sessionEnded();
      return show($("decisions-note"), "Could not load the Decisions: " + error.message);
    }
    if (session !== current) return;
    const checkable = witnesses.quorum > 0 && (await window.agentGatewayProofs.supported(jwks));
    show($("decisions-note"), page.decisions.length === 0 ? "No Decision yet."
      : witnesses.quorum === 0 ? "This gateway has no witnesses: its Decisions are signed, but nobody else vouches that everyone sees the same log."
      : checkable ? "" : "This browser cannot check Ed25519 signatures: the Decisions are shown without their check.");
    const items = page.decisions.slice().reverse().map((decision) => {
      const item = document.createElement("li");
      item.className = "decision";
      item.dataset.seq = String(decision.seq);
      const meta = document.createElement("span");
      meta.className = "meta";
      meta.textContent = "#" + decision.seq + " · " + new Date(decision.createdAt).toLocaleString([], { dateStyle: "short", timeStyle: "short" });
      const badge = document.createElement("span");
      badge.className = "mark";
      item.append(meta, badge, document.createTextNode(decision.statement)); // text, never markup
      list.append(item);
      return [decision, item];
    });
    if (!checkable) return;
    for (const [decision, item] of items) {
      mark(item, "checking", "checking…", "");
      checkDecision(current, decision, item, jwks, witnesses);
    }
  }

  async function checkDecision(current, decision, item, jwks, witnesses) {
    let response;
    try {
      response = await request("GET", `/decisions/${decision.seq}/proof?format=tlog-proof`, { auth: current });
    } catch (error) {
      return mark(item, "unknown", "not checked", "The proof could not be fetched: " + error.message);
    }
    if (response.status === 404) {
      return mark(item, "pending", "not yet witnessed", "No checkpoint holding this Decision has been cosigned by the witnesses yet.");
    }
    if (!response.ok) return mark(item, "unknown", "not checked", "The proof could not be fetched: " + response.statusText);
    try {
      const proven = await window.agentGatewayProofs.verify(await response.text(), decision, jwks, witnesses);
      mark(item, "verified", "✓ verified",
        `Checked in this browser: signed by the gateway, in its log of ${proven.size} Decisions, ` +
        `which ${proven.cosigned} of ${witnesses.witnesses.length} witnesses cosigned.`);
    } catch (error) {
      if (!(error instanceof window.agentGatewayProofs.Refused)) throw error;
      mark(item, "failed", "✗ does not verify", error.message);
    }
  }

  // --- a Message's receipt, checked here -------------------------------------------------

  // The receipt of one of the User's Messages (GET /messages/{seq}/receipt), checked against the
  // JWK Set (window.agentGatewayProofs.verifyReceipt, verify.js) for the text the page shows; once
  // it verifies, the instructions in force open under the Message, and the mark toggles them.
  async function checkReceipt(current, message, item) {
    const opened = item.querySelector(".instructions");
    if (opened) {
      opened.open = !opened.open;
      return;
    }
    if (!current) return;
    mark(item, "checking", "checking…", "");
    let jwks, receipt;
    try {
      [jwks, receipt] = await Promise.all([
        api("GET", "/jwks.json"),
        api("GET", `/messages/${message.seq}/receipt`, { auth: current }),
      ]);
    } catch (error) {
      if (error.status === 401) return sessionEnded();
      return mark(item, "unknown", "not checked", "The receipt could not be fetched: " + error.message);
    }
    if (session !== current) return;
    const proofs = window.agentGatewayProofs;
    if (!(await proofs.supported(jwks))) {
      return mark(item, "unknown", "not checked", "This browser cannot check Ed25519 signatures: check the receipt with agent-gateway verify-receipt.");
    }
    let checked;
    try {
      checked = await proofs.verifyReceipt(receipt, { seq: message.seq, text: message.text, userId: current.userId }, jwks);
    } catch (error) {
      if (!(error instanceof proofs.Refused)) throw error;
      return mark(item, "failed", "✗ receipt does not verify", error.message);
    }
    if (checked.instructions.length === 0) {
      return mark(item, "pending", "not run yet", "No Run has started for this Message yet: check again later.");
    }
    const numbers = checked.instructions.map((entry) => "#" + entry.seq).join(", ");
    if (checked.promptsChecked) {
      mark(item, "verified", "✓ reached the agent as written",
        `Checked in this browser: the Run ledger, signed by the gateway, records a Run given exactly this text, ` +
        `in the Prompt the template of instructions ${numbers} makes of it.`);
    } else {
      mark(item, "unknown", "✓ text as written, Prompt not checked here",
        `The Run ledger records a Run given exactly this text, under instructions ${numbers}; its template is beyond ` +
        "what this page renders: check the Prompt with agent-gateway verify-receipt.");
    }
    const details = document.createElement("details");
    details.className = "instructions";
    details.open = true;
    const summary = document.createElement("summary");
    summary.textContent = `Instructions ${numbers} in force`;
    details.append(summary);
    for (const entry of checked.instructions) {
      const shown = document.createElement("pre");
      shown.dataset.seq = String(entry.seq);
      shown.textContent = JSON.stringify(entry.instructions, null, 2); // text, never markup
      details.append(shown);
    }
    item.append(details);
  }

  // --- the live stream ------------------------------------------------------------------

  function setStatus(text, lost) {
    const status = $("live-status");
    status.textContent = text;
    status.classList.toggle("lost", Boolean(lost));
  }

  // Keeps the stream open for as long as ``current`` is the session, reconnecting after
  // any failure with Last-Event-ID so that no Message is missed or shown twice.
  async function follow(current) {
    let failures = 0;
    while (session === current) {
      setStatus(failures ? "Reconnecting…" : "Connecting…");
      try {
        if (current.resumeAfter === null) await loadNewest(current);
        if (session !== current) return;
        await readStream(current, () => {
          failures = 0;
          show($("chat-error"), "");
          setStatus("Live");
        });
      } catch (error) {
        if (session !== current) return;
        if (error.status === 401) return sessionEnded();
      }
      if (session !== current) return;
      failures += 1;
      const delay = Math.min(1000 * 2 ** (failures - 1), RECONNECT_MAX_MS);
      setStatus(`Connection lost; reconnecting in ${Math.round(delay / 1000)} s`, true);
      await sleep(delay);
    }
  }

  // One stream connection: returns when it ends, throws when it cannot open or breaks.
  async function readStream(current, opened) {
    const controller = new AbortController();
    current.controller = controller;
    let silence;
    const quiet = () => {
      clearTimeout(silence);
      silence = setTimeout(() => controller.abort(), SILENCE_MS);
    };
    quiet();
    try {
      const response = await request("GET", "/messages/stream", {
        auth: current,
        signal: controller.signal,
        headers: { Accept: "text/event-stream", "Last-Event-ID": String(current.resumeAfter) },
      });
      if (!response.ok) {
        const data = await response.json().catch(() => null);
        throw new RequestFailed(response.status, (data && data.message) || response.statusText);
      }
      opened();
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      const parser = eventParser((event) => {
        if (event.type !== "message" || session !== current) return;
        const message = JSON.parse(event.data);
        addAtEnd([message]);
        // Resume after what the stream delivered, never after what a send returned:
        // an earlier Message may still be on its way.
        current.resumeAfter = Number(event.id);
      });
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        quiet();
        parser(value);
      }
    } finally {
      clearTimeout(silence);
      controller.abort();
    }
  }

  // text/event-stream, as the HTML standard parses it: lines, fields, a blank line ends an event.
  function eventParser(dispatch) {
    let buffer = "";
    let event = { type: "message", data: [], id: null };
    let skipLineFeed = false;
    return (chunk) => {
      // A chunk may end inside a line, or between the \r and \n of one line ending.
      if (skipLineFeed && chunk.startsWith("\n")) chunk = chunk.slice(1);
      skipLineFeed = chunk.endsWith("\r");
      buffer += chunk;
      const lines = buffer.split(/\r\n|\r|\n/);
      buffer = lines.pop();
      for (const line of lines) {
        if (line === "") {
          if (event.data.length) dispatch({ type: event.type, data: event.data.join("\n"), id: event.id });
          event = { type: "message", data: [], id: event.id };
        } else if (!line.startsWith(":")) {
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let value = colon < 0 ? "" : line.slice(colon + 1);
          if (value.startsWith(" ")) value = value.slice(1);
          if (field === "event") event.type = value;
          else if (field === "data") event.data.push(value);
          else if (field === "id") event.id = value;
        }
      }
    };
  }

  // --- wiring ---------------------------------------------------------------------------

  $("login-form").addEventListener("submit", logIn);
  $("login-nostr").addEventListener("click", logInWithNostr);
  $("send-form").addEventListener("submit", send);
  $("logout").addEventListener("click", logOut);
  $("show-decisions").addEventListener("click", showDecisions);
  $("older").addEventListener("click", loadOlder);
  $("log").addEventListener("scroll", () => {
    if ($("log").scrollTop === 0 && !$("older").hidden) loadOlder();
  });
  $("send-text").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("send-form").requestSubmit();
    }
  });

  // A reload keeps the tab's session: its Token, or its Nostr key once the extension is there.
  const token = sessionStorage.getItem(TOKEN_KEY);
  const nostr = sessionStorage.getItem(NOSTR_KEY);
  const userId = sessionStorage.getItem(USER_KEY) || "";
  if (token) begin({ token }, userId);
  $("login-nostr").hidden = !nostrAvailable();
  window.addEventListener("load", () => {
    if (!session) $("login-nostr").hidden = !nostrAvailable();
    if (nostr && !session) {
      if (nostrAvailable()) begin({ nostr }, userId);
      else end("Your Nostr extension is not available here. Log in again.", true);
    }
  });
})();
