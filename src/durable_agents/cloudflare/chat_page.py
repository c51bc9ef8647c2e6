"""The chat page the dev server serves at `GET /` (setting `CHAT_PAGE` = "on").

One self-contained HTML page (inline CSS and JS, nothing fetched but the API):
a person gives the API token (kept in sessionStorage; `#token=...` in the URL
fills it and is then removed from the address bar) and a session name (a fresh
random one by default), sends a message and watches the turn stream in.

How it talks to the API (the Worker's contract, `app.py`):
- `fetch()` with `Accept: text/event-stream` and `Authorization: Bearer ...`
  (EventSource cannot send headers), read incrementally from
  `response.body.getReader()` by a small SSE parser;
- `delta` text grows a live assistant bubble; each `message` is rendered by role
  once, keyed by its position (the event id): one already shown is skipped;
- `done` shows the status; `awaiting_approval` lists the pending calls with
  Approve / Deny buttons that POST the decision with its digest and stream the
  rest of the turn; `error` events and error answers are shown;
- Cancel (`POST .../cancel`) while a turn runs, Resume (`POST .../resume`).

The transcript and the last event id are kept in sessionStorage per session.
On load (so also on a reload mid-turn) the kept transcript is drawn and
`GET /sessions/{name}/events` is asked with `Last-Event-ID: <last id>`: the rest
is replayed and a running turn followed live. A session the page has nothing of
opens at its latest TAIL messages: `GET /sessions/{name}?limit=1` says how many
it holds (its `message_count`), the replay starts TAIL before the end, and a
note (`#older`) says how many older ones are not shown. Text from the API is
only ever inserted as text.

Stable hooks for tests: `#transcript` holds one `.msg` per stored message with
`data-position` and `data-role` (tool results also `data-kind` when they are an
error); `#live` is the streaming bubble; `#status` has `data-status`
(idle, running, complete, cancelled, error, awaiting_approval, ...);
`#older` (with `data-count`) while older messages are not shown;
`.approval[data-tool-call-id]` with `.approve` / `.deny` buttons.
"""

from __future__ import annotations

__all__ = ["CHAT_PAGE_HTML"]

CHAT_PAGE_HTML: str = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>durable-agents chat</title>
<link rel="icon" href="data:,">
<style>
  :root {
    --bg: #f6f7f9; --panel: #fff; --ink: #1d2330; --muted: #667085; --line: #d9dde5;
    --user: #dbeafe; --assistant: #fff; --tool: #f3f4f6; --accent: #2563eb;
    --bad: #b42318; --bad-bg: #fef3f2; --warn: #b54708; --warn-bg: #fffaeb; --ok: #067647;
  }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
         color: var(--ink); background: var(--bg); }
  header { display: flex; flex-wrap: wrap; gap: 8px 16px; align-items: end;
           padding: 10px 16px; background: var(--panel); border-bottom: 1px solid var(--line); }
  header h1 { font-size: 16px; margin: 0 12px 4px 0; }
  label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); }
  input, textarea, button { font: inherit; }
  input, textarea { border: 1px solid var(--line); border-radius: 6px; padding: 5px 8px;
                    color: var(--ink); background: #fff; }
  button { border: 1px solid var(--line); border-radius: 6px; padding: 5px 12px;
           background: #fff; cursor: pointer; }
  button.primary { background: var(--accent); border-color: var(--accent); color: #fff; }
  button:disabled { opacity: .45; cursor: default; }
  main { max-width: 880px; margin: 0 auto; padding: 16px 16px 170px; }
  #transcript { display: flex; flex-direction: column; gap: 10px; }
  .msg { border: 1px solid var(--line); border-radius: 10px; padding: 8px 12px;
         background: var(--assistant); max-width: 92%; }
  .msg .who { font-size: 11px; text-transform: uppercase; letter-spacing: .04em;
              color: var(--muted); margin-bottom: 2px; }
  .msg .who .name { text-transform: none; letter-spacing: 0; }
  .msg .text { white-space: pre-wrap; overflow-wrap: anywhere; }
  .msg-user { align-self: flex-end; background: var(--user); border-color: #bfd4f6; }
  .msg-system { align-self: center; background: transparent; font-size: 13px; color: var(--muted); }
  .msg-tool { background: var(--tool); font-size: 13px; }
  .msg-tool.tool-error { background: var(--warn-bg); border-color: #fedf89; }
  .msg-tool.tool-error .kind { color: var(--warn); font-weight: 600; }
  .msg-tool[data-kind="tool-durability-error"], .msg-tool[data-kind="tool-denied"] {
    background: var(--bad-bg); border: 2px solid var(--bad); }
  .msg-tool[data-kind="tool-durability-error"] .kind,
  .msg-tool[data-kind="tool-denied"] .kind { color: var(--bad); }
  .tool-call { margin-top: 6px; border-left: 3px solid var(--accent); padding-left: 8px;
               font-size: 13px; }
  .tool-call .name, .msg-tool .name { font-family: ui-monospace, monospace; font-weight: 600; }
  pre { margin: 4px 0 0; padding: 6px 8px; background: rgba(0,0,0,.04); border-radius: 6px;
        white-space: pre-wrap; overflow-wrap: anywhere; font: 12.5px/1.4 ui-monospace, monospace; }
  #older { align-self: center; font-size: 13px; color: var(--muted); }
  #live, #sent { border-style: dashed; }
  #live .text::after { content: "\258D"; color: var(--accent);
                       animation: blink 1s steps(1) infinite; }
  @keyframes blink { 50% { opacity: 0; } }
  #status { margin: 14px 0 0; font-size: 13px; color: var(--muted); }
  #status[data-status="complete"] { color: var(--ok); }
  #status[data-status="error"], #status[data-status="max_steps"] { color: var(--bad); }
  #status[data-status="cancelled"], #status[data-status="interrupted"] { color: var(--warn); }
  #errors .error { margin-top: 8px; padding: 6px 10px; border-radius: 6px; font-size: 13px;
                   background: var(--bad-bg); color: var(--bad); border: 1px solid #fecdca; }
  #approvals .approval { margin-top: 10px; padding: 8px 12px; border: 2px solid var(--warn);
                         border-radius: 10px; background: var(--warn-bg); }
  #approvals .approval .buttons { display: flex; gap: 8px; margin-top: 6px; align-items: center; }
  footer { position: fixed; left: 0; right: 0; bottom: 0; background: var(--panel);
           border-top: 1px solid var(--line); }
  #composer { max-width: 880px; margin: 0 auto; padding: 10px 16px; display: flex; gap: 8px;
              align-items: end; }
  #message { flex: 1; min-height: 44px; max-height: 140px; resize: vertical; }
  #composer .buttons { display: flex; gap: 6px; }
  #settings { display: contents; }
</style>
</head>
<body>
<header>
  <h1>durable-agents</h1>
  <form id="settings">
  <label>API token <input id="token" type="password" autocomplete="off" size="22"></label>
  <label>Session <input id="session" autocomplete="off" size="22"></label>
  <button id="new-session" type="button" title="Start a new session with a fresh name">
    New session</button>
  </form>
</header>
<main>
  <div id="transcript" aria-live="polite"></div>
  <div id="approvals"></div>
  <div id="errors"></div>
  <div id="status" data-status="idle">Idle.</div>
</main>
<footer>
  <form id="composer">
    <textarea id="message"
      placeholder="Message the agent (Enter sends, Shift+Enter for a new line)"></textarea>
    <div class="buttons">
      <button id="send" class="primary" type="submit">Send</button>
      <button id="cancel" type="button" disabled>Cancel</button>
      <button id="resume" type="button">Resume</button>
    </div>
  </form>
</footer>
<script>
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = "durable-agents:";
const TAIL = 200;  // a session this page has nothing of opens at its latest TAIL messages

// ---- state -------------------------------------------------------------------

let token = sessionStorage.getItem(STORE + "token") || "";
let session = sessionStorage.getItem(STORE + "session") || freshName();
let kept = loadKept(session);   // {messages: {position: message}, lastId: number|null,
                                //  first: the first position shown (older ones are not)}
let stream = null;              // {controller} of the stream being read, if any
let running = false;            // a turn is running (as far as this page knows)

function freshName() {
  const bytes = crypto.getRandomValues(new Uint8Array(6));
  return "chat-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function loadKept(name) {
  try {
    const data = JSON.parse(sessionStorage.getItem(STORE + "transcript:" + name) || "null");
    if (data && typeof data.messages === "object") return data;
  } catch (_) { /* a broken entry is dropped */ }
  return { messages: {}, lastId: null };
}

function saveKept() {
  try {
    sessionStorage.setItem(STORE + "transcript:" + session, JSON.stringify(kept));
  } catch (_) { /* over the storage quota: a reload replays from the last id saved */ }
}

// The last id is the end of the run of positions 0..N the page holds, so a gap
// (a message this page never got) is asked for again on the next reconnect.
function advanceLastId() {
  let next = kept.lastId === null ? 0 : kept.lastId + 1;
  while (Object.prototype.hasOwnProperty.call(kept.messages, String(next))) next += 1;
  kept.lastId = next === 0 ? null : next - 1;
}

// ---- rendering (text only: textContent, never HTML) -------------------------------

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function prettyJson(text) {
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch (_) { return text; }
}

function toolError(content) {
  try {
    const data = JSON.parse(content);
    if (data && typeof data === "object" && !Array.isArray(data) && "error" in data) return data;
  } catch (_) { /* not JSON: a plain result */ }
  return null;
}

function renderMessage(position, message) {
  const role = String(message.role || "unknown");
  const node = el("div", "msg msg-" + role);
  node.dataset.position = String(position);
  node.dataset.role = role;
  if (role === "tool") {
    const error = toolError(message.content || "");
    const head = el("div", "who");
    head.append("tool result · ", el("span", "name", String(message.tool_name || "?")));
    node.append(head);
    if (message.tool_call_id) node.dataset.toolCallId = String(message.tool_call_id);
    if (error) {
      const kind = String(error.kind || "error");
      node.classList.add("tool-error");
      node.dataset.kind = kind;
      node.append(el("div", "kind", kind));
    }
    node.append(el("pre", "result", prettyJson(String(message.content || ""))));
    return node;
  }
  node.append(el("div", "who", role));
  if (message.content) node.append(el("div", "text", String(message.content)));
  for (const call of message.tool_calls || []) {
    const callNode = el("div", "tool-call");
    callNode.dataset.toolCallId = String(call.id || "");
    const head = el("div", "call-head");
    head.append("calls ", el("span", "name", String(call.name || "?")));
    callNode.append(head);
    const args = call.arguments_error
      ? call.raw_arguments || ""
      : JSON.stringify(call.arguments || {}, null, 2);
    callNode.append(el("pre", "arguments", String(args)));
    if (call.arguments_error) callNode.append(el("div", "kind", String(call.arguments_error)));
    node.append(callNode);
  }
  return node;
}

// Inserted in position order; a position already shown is never shown again.
function showMessage(position, message, keep) {
  const transcript = $("transcript");
  if (transcript.querySelector('.msg[data-position="' + position + '"]')) return false;
  const node = renderMessage(position, message);
  const after = Array.from(transcript.querySelectorAll(".msg[data-position]"))
    .find((other) => Number(other.dataset.position) > position);
  transcript.insertBefore(node, after || $("sent") || $("live") || null);
  if (keep) {
    kept.messages[String(position)] = message;
    advanceLastId();
    saveKept();
  }
  return true;
}

function liveBubble() {
  let live = $("live");
  if (!live) {
    live = el("div", "msg msg-assistant");
    live.id = "live";
    live.append(el("div", "who", "assistant (streaming)"), el("div", "text", ""));
    $("transcript").append(live);
  }
  return live;
}

function dropLive() {
  const live = $("live");
  if (live) live.remove();
}

// What the person sent, shown until the stored user message arrives (the run may
// store it together with the model's first answer, after that answer's deltas).
function showSent(text) {
  dropSent();
  const node = el("div", "msg msg-user sent");
  node.id = "sent";
  node.append(el("div", "who", "user (sending)"), el("div", "text", text));
  $("transcript").append(node);
}

function dropSent() {
  const sent = $("sent");
  if (sent) sent.remove();
}

function setStatus(status, text) {
  const node = $("status");
  node.dataset.status = status;
  node.textContent = text;
}

function showError(text) {
  $("errors").append(el("div", "error", text));
}

function clearNotices() {
  $("errors").replaceChildren();
  $("approvals").replaceChildren();
}

function setRunning(value) {
  running = value;
  $("cancel").disabled = !value;
  $("resume").disabled = value;
  $("send").disabled = value;
}

function scrollDown() {
  window.scrollTo(0, document.body.scrollHeight);
}

function showOlder() {
  const first = Number(kept.first) || 0;
  if (first <= 0) return;
  const note = el("div", "", first.toLocaleString("en") + " older message" +
                  (first === 1 ? " is" : "s are") + " not shown here (GET /sessions/" +
                  session + "/view pages through the whole session).");
  note.id = "older";
  note.dataset.count = String(first);
  $("transcript").prepend(note);
}

function renderKept() {
  $("transcript").replaceChildren();
  showOlder();
  const positions = Object.keys(kept.messages).map(Number).sort((a, b) => a - b);
  for (const position of positions) showMessage(position, kept.messages[String(position)], false);
}

function showDone(result) {
  dropLive();
  dropSent();
  setRunning(false);
  const status = String(result.status || "unknown");
  let text = "Done: " + status + ".";
  if (status === "complete") text = "Complete.";
  if (status === "cancelled") text = "Cancelled. Resume finishes the turn.";
  if (status === "interrupted") {
    text = "Interrupted: the last turn did not finish. Resume finishes it.";
  }
  if (status === "max_steps") text = "Stopped: the agent reached its step limit.";
  if (status === "awaiting_approval") text = "Waiting for approval.";
  if (status === "error") {
    const error = result.error;
    const message = error && typeof error === "object"
      ? error.message || error.code
      : error || result.response;
    text = "Error: " + String(message || "the turn failed") + ".";
  }
  if (result.steps !== undefined) text += " Steps: " + result.steps + ".";
  setStatus(status, text);
  $("approvals").replaceChildren();
  if (status === "awaiting_approval") {
    if (Array.isArray(result.pending)) showPending(result.pending);
    else loadPending();
  }
}

function showPending(pending) {
  $("approvals").replaceChildren(...pending.map(approvalCard));
}

// A `done` that says awaiting_approval without the calls: ask the API for them.
async function loadPending() {
  try {
    const response = await fetch(sessionPath("/approvals"), { headers: headers() });
    const body = await response.json();
    if (response.ok && Array.isArray(body.pending)) showPending(body.pending);
  } catch (error) {
    showError("approvals: " + String(error));
  }
}

function approvalCard(call) {
  const card = el("div", "approval");
  card.dataset.toolCallId = String(call.tool_call_id);
  const head = el("div", "call-head");
  head.append("Approve ", el("span", "name", String(call.tool_name || "?")), "?");
  card.append(head, el("pre", "arguments", JSON.stringify(call.arguments || {}, null, 2)));
  const buttons = el("div", "buttons");
  const approve = el("button", "approve primary", "Approve");
  const deny = el("button", "deny", "Deny");
  const reason = el("input", "reason");
  reason.placeholder = "reason (optional)";
  approve.type = deny.type = "button";
  approve.addEventListener("click", () => decide(call, true, reason.value));
  deny.addEventListener("click", () => decide(call, false, reason.value));
  buttons.append(approve, deny, reason);
  card.append(buttons);
  return card;
}

// ---- the API ---------------------------------------------------------------------

function sessionPath(suffix) {
  return "/sessions/" + encodeURIComponent(session) + suffix;
}

function headers(extra) {
  return Object.assign({ Authorization: "Bearer " + token }, extra || {});
}

// One SSE parser over a byte stream: calls onEvent(type, data, id) per event.
async function readEvents(body, onEvent) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let type = "", data = [], id = null;
  const line = (text) => {
    if (text === "") {
      if (data.length) onEvent(type || "message", data.join("\n"), id);
      type = ""; data = []; id = null;
      return;
    }
    if (text.startsWith(":")) return;  // a comment (keep-alive)
    const colon = text.indexOf(":");
    const field = colon < 0 ? text : text.slice(0, colon);
    let value = colon < 0 ? "" : text.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") type = value;
    else if (field === "data") data.push(value);
    else if (field === "id") id = value;
  };
  for (;;) {
    const { value, done } = await reader.read();
    buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
    let match;
    while ((match = /\r\n|\r|\n/.exec(buffer)) !== null) {
      // A lone \r at the end may be the first half of \r\n: wait for more.
      if (match[0] === "\r" && match.index === buffer.length - 1 && !done) break;
      line(buffer.slice(0, match.index));
      buffer = buffer.slice(match.index + match[0].length);
    }
    if (done) {
      if (buffer) line(buffer);
      line("");
      return;
    }
  }
}

function handleEvent(type, data, id) {
  let payload;
  try { payload = JSON.parse(data); } catch (_) { payload = data; }
  if (type === "delta") {
    const text = liveBubble().querySelector(".text");
    text.textContent += String(payload && payload.text !== undefined ? payload.text : "");
  } else if (type === "message") {
    const position = Number(id);
    if (id === null || !Number.isInteger(position)) return;
    if (payload && payload.role === "assistant") dropLive();
    if (payload && payload.role === "user") dropSent();
    showMessage(position, payload, true);
    for (const last of [$("sent"), $("live")]) {  // the unsaved bubbles stay last
      if (last) $("transcript").append(last);
    }
  } else if (type === "done") {
    showDone(payload || {});
  } else if (type === "error") {
    const error = (payload && payload.error) || {};
    dropLive();
    dropSent();
    setRunning(false);
    setStatus("error", "Error: " + String(error.message || error.code || data) + ".");
    showError(String(error.code || "error") + ": " + String(error.message || ""));
  }
  scrollDown();
}

// Runs one request whose answer is a stream of events (or a JSON answer: an error,
// or a plain result) and renders it. Only one stream is read at a time.
async function streamRequest(method, path, options) {
  if (!token) {
    setStatus("error", "Enter the API token first.");
    $("token").focus();
    return;
  }
  if (stream) stream.controller.abort();
  const controller = new AbortController();
  const mine = { controller };
  stream = mine;
  const extra = Object.assign({ Accept: "text/event-stream" }, options.headers || {});
  const init = { method, headers: headers(extra), signal: controller.signal, cache: "no-store" };
  if (options.body !== undefined) {
    init.body = JSON.stringify(options.body);
    init.headers["Content-Type"] = "application/json";
  }
  setRunning(true);
  setStatus("running", options.label || "Running…");
  let finished = false;
  try {
    const response = await fetch(path, init);
    const type = response.headers.get("content-type") || "";
    if (!response.ok || !type.startsWith("text/event-stream")) {
      let body = null;
      try { body = await response.json(); } catch (_) { /* not JSON */ }
      finished = true;
      if (response.ok && body && body.status) { showDone(body); return; }
      if (response.status === 404 && options.quietNotFound) {
        // The server has no such session (a new name, or its state was wiped):
        // what this page kept of it is stale.
        kept = { messages: {}, lastId: null };
        saveKept();
        renderKept();
        setRunning(false);
        setStatus("idle", "New session: nothing sent yet.");
        return;
      }
      const error = (body && body.error) || {};
      dropSent();
      // A message the API refused was not stored: give it back to be sent again.
      const refused = options.body && options.body.message;
      if (refused && !$("message").value) $("message").value = refused;
      setRunning(false);
      setStatus("error", "Error " + response.status + ".");
      showError(String(error.code || "http-" + response.status) + ": " +
                String(error.message || response.statusText));
      return;
    }
    await readEvents(response.body, (event, data, id) => {
      if (stream !== mine) return;
      if (event === "done" || event === "error") finished = true;
      handleEvent(event, data, id);
    });
  } catch (error) {
    if (controller.signal.aborted) return;  // replaced by another stream, or left
    showError("connection: " + String(error && error.message ? error.message : error));
  } finally {
    if (stream === mine) {
      stream = null;
      if (!finished) {
        dropLive();
        dropSent();
        setRunning(false);
        setStatus("interrupted", "The stream ended early. Reload to catch up, or Resume.");
      }
    }
  }
}

// A session this page has nothing of: start the replay TAIL messages before its end.
async function skipToTail() {
  const mine = session;
  try {
    const init = { headers: headers(), cache: "no-store" };
    const response = await fetch(sessionPath("?limit=1"), init);
    if (!response.ok) return;  // a new session (404), or an error: /events says it too
    const count = Number((await response.json()).message_count);
    if (session !== mine || kept.lastId !== null || !Number.isInteger(count)) return;
    if (count <= TAIL) return;
    kept.first = count - TAIL;
    kept.lastId = kept.first - 1;
    saveKept();
    renderKept();
  } catch (_) { /* then the whole session is replayed */ }
}

async function follow() {
  const mine = session;
  if (kept.lastId === null && token) {
    setRunning(true);
    setStatus("running", "Loading the session…");
    await skipToTail();
    if (session !== mine) return;  // another session was opened meanwhile: it follows
  }
  const extra = {};
  if (kept.lastId !== null) extra["Last-Event-ID"] = String(kept.lastId);
  const label = kept.lastId === null ? "Loading the session…" : "Catching up…";
  const options = { headers: extra, label, quietNotFound: true };
  return streamRequest("GET", sessionPath("/events"), options);
}

function send(text) {
  $("errors").replaceChildren();  // the approvals stay: a refused message leaves them waiting
  showSent(text);
  const options = { body: { message: text }, label: "Running…" };
  return streamRequest("POST", sessionPath("/messages"), options);
}

function resume() {
  $("errors").replaceChildren();
  return streamRequest("POST", sessionPath("/resume"), { body: {}, label: "Resuming…" });
}

function decide(call, approved, reason) {
  const body = { approved, digest: call.digest };
  if (reason) body.reason = reason;
  clearNotices();
  return streamRequest("POST", sessionPath("/approvals/" + encodeURIComponent(call.tool_call_id)),
                       { body, label: approved ? "Approved; running…" : "Denied; running…" });
}

async function cancel() {
  $("cancel").disabled = true;
  setStatus("running", "Cancelling at the next step boundary…");
  try {
    const response = await fetch(sessionPath("/cancel"), { method: "POST", headers: headers() });
    if (!response.ok) {
      let body = null;
      try { body = await response.json(); } catch (_) { /* not JSON */ }
      const error = (body && body.error) || {};
      showError(String(error.code || "http-" + response.status) + ": " +
                String(error.message || ""));
      if (running) $("cancel").disabled = false;
    }
    // The stream being read ends with the turn's `done` (status cancelled).
  } catch (error) {
    showError("connection: " + String(error));
    if (running) $("cancel").disabled = false;
  }
}

// ---- wiring ----------------------------------------------------------------------

function switchSession(name) {
  if (stream) stream.controller.abort();
  stream = null;
  session = name;
  sessionStorage.setItem(STORE + "session", session);
  $("session").value = session;
  kept = loadKept(session);
  clearNotices();
  renderKept();
  setRunning(false);
  setStatus("idle", "Idle.");
  if (token) follow();
}

function takeTokenFromFragment() {
  const params = new URLSearchParams(location.hash.slice(1));
  const given = params.get("token");
  if (given === null) return;
  token = given;
  sessionStorage.setItem(STORE + "token", token);
  history.replaceState(null, "", location.pathname + location.search);
}

$("settings").addEventListener("submit", (event) => event.preventDefault());
$("token").addEventListener("change", () => {
  token = $("token").value.trim();
  sessionStorage.setItem(STORE + "token", token);
  if (token && !stream) follow();
});
$("session").addEventListener("change", () => {
  const name = $("session").value.trim();
  if (/^[A-Za-z0-9_-]{1,64}$/.test(name)) switchSession(name);
  else showError("A session name is 1 to 64 letters, digits, '_' or '-'.");
});
$("new-session").addEventListener("click", () => switchSession(freshName()));
$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("message").value;
  if (!text.trim() || running) return;
  $("message").value = "";
  send(text);
});
$("message").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});
$("cancel").addEventListener("click", cancel);
$("resume").addEventListener("click", resume);

takeTokenFromFragment();
$("token").value = token;
switchSession(session);
</script>
</body>
</html>
"""
