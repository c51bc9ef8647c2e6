// The AI SDK's own WebSocket chat client against the kit's GET .../ws (scripts/dev), for
// tests/cloudflare/test_dev_server_chat_ws.py, which reads the JSON this prints.
//
//   node tests/js/chat_ws.mjs <dev server URL> <held issues API URL>   (token: CHAT_TOKEN)
//
// The held issues API answers GET /issues/held-N only after POST /release/held-N, so a
// turn can be caught mid-tool.
// 1. `WebSocketChatTransport` (with npm `ws`) + `readUIMessageStream`: a turn of the
//    template agent (two tool calls) on one socket; its text arrives in pieces.
// 2. Mid-turn: client A sends; client B (another socket) follows the running turn with
//    `reconnectToStream` (a `resume` frame); A's socket goes away after some chunks and a
//    raw `resume` frame with its last sequence gets the rest; the hold is released. A's
//    chunks before and after, and B's, make the same message.
// 3. `abort`: a turn aborted while its tool waits ends cancelled; a follower sees it end.
// 4. `AbstractChat` (what `useChat` wraps) over the socket, on the refunds agent: the turn
//    ends with a tool approval request; `addToolApprovalResponse` answers it and the Chat
//    resubmits over the same socket (`sendAutomaticallyWhen`); the call runs (once, as the
//    test counts at its payments API). Then another session's call, denied.
import { WebSocketChatTransport, readUIMessageStream } from "ai";
import WebSocket from "ws";
import { approvalTurn } from "./chat_common.mjs";

const [base, issues] = process.argv.slice(2);
const wsBase = base.replace(/^http/, "ws");
const headers = { Authorization: `Bearer ${process.env.CHAT_TOKEN}` };
const out = {};

function transport(session, path = `/sessions/${session}/ws`) {
  return new WebSocketChatTransport({ url: `${wsBase}${path}`, headers, webSocket: WebSocket });
}

function userMessage(id, text) {
  return { id, role: "user", parts: [{ type: "text", text }] };
}

function send(chat, session, message, abortSignal) {
  return chat.sendMessages({
    chatId: session, messages: [message], trigger: "submit-message", messageId: undefined, abortSignal,
  });
}

async function lastMessage(stream) {
  let last;
  for await (const message of readUIMessageStream({ stream, terminateOnError: true })) last = message;
  return last;
}

function streamOf(chunks) {
  return new ReadableStream({ start(c) { for (const chunk of chunks) c.enqueue(chunk); c.close(); } });
}

// Reads `stream` chunk by chunk into `chunks`; resolves `seen` once `until(chunk)` holds.
function collect(stream, until) {
  const chunks = [];
  let markSeen;
  const seen = new Promise((resolve) => { markSeen = resolve; });
  const done = (async () => {
    const reader = stream.getReader();
    try {
      for (;;) {
        const { done: over, value } = await reader.read();
        if (over) return "end";
        chunks.push(value);
        if (until(value)) markSeen();
      }
    } catch (error) {
      return `error: ${error.message}`;
    } finally {
      markSeen();
    }
  })();
  return { chunks, seen, done };
}

const waitsOn = (tool) => (c) => c.type === "tool-input-available" && c.toolName === tool;
const release = (id) => fetch(`${issues}/release/${id}`, { method: "POST" });

async function oneTurn() {
  const chat = transport("chat-ws-turn");
  const stream = await send(chat, "chat-ws-turn", userMessage("u-turn-1", "triage issue 7"));
  const [forMessage, raw] = stream.tee();
  const read = collect(raw, () => false);
  out.turn = await lastMessage(forMessage);
  await read.done;
  // How many `text-delta` pieces each text part came in (the reply as the model writes it).
  out.turnPieces = Object.values(Object.groupBy(
    read.chunks.filter((c) => c.type === "text-delta"), (c) => c.id,
  )).map((pieces) => pieces.length);
  chat.close();
}

// A raw socket: `ask(frame)` sends a frame and resolves with its request's frames once it
// ends (`end`, `error` or `no-active`).
function rawSocket(path) {
  const socket = new WebSocket(`${wsBase}${path}`);
  const waiting = new Map();
  socket.on("message", (data) => {
    const frame = JSON.parse(data.toString());
    const request = waiting.get(frame.requestId);
    if (request === undefined) return;
    request.frames.push(frame);
    if (["end", "error", "no-active"].includes(frame.type)) request.resolve(request.frames);
  });
  const open = new Promise((resolve, reject) => { socket.on("open", resolve); socket.on("error", reject); });
  return {
    socket,
    async ask(frame) {
      await open;
      const frames = new Promise((resolve) => waiting.set(frame.requestId, { frames: [], resolve }));
      socket.send(JSON.stringify(frame));
      return frames;
    },
  };
}

function rawResume(session, lastSequence) {
  // A client that kept its last sequence: a `resume` frame with it, on a new socket.
  return new Promise((resolve, reject) => {
    const socket = new WebSocket(`${wsBase}/sessions/${session}/ws`);
    const frames = [];
    socket.on("open", () => socket.send(JSON.stringify({
      type: "resume", requestId: "raw-resume", id: session, lastSequence, headers, body: {},
    })));
    socket.on("message", (data) => {
      const frame = JSON.parse(data.toString());
      frames.push(frame);
      if (frame.type === "end" || frame.type === "error" || frame.type === "no-active") {
        socket.close(1000, "done");
        resolve(frames);
      }
    });
    socket.on("error", reject);
  });
}

async function midTurn() {
  const session = "chat-ws-two";
  const a = transport(session);
  const b = transport(session);
  const fromA = collect(await send(a, session, userMessage("u-two-1", "triage #held-1")), waitsOn("get_issue"));
  await fromA.seen; // get_issue is running, held
  const followed = await b.reconnectToStream({ chatId: session });
  const fromB = collect(followed, () => false);
  a.close(); // A's socket goes away mid-turn, holding chunks 0 .. n-1
  const held = fromA.chunks.length;
  const resumed = rawResume(session, held - 1);
  await new Promise((r) => setTimeout(r, 300)); // the resume is being served
  await release("held-1");
  const frames = await resumed;
  const rest = frames.filter((f) => f.type === "chunk");
  out.twoClients = {
    aEnded: await fromA.done,
    bEnded: await fromB.done,
    held,
    resumedSequences: rest.map((f) => f.sequence),
    resumedFrames: frames.map((f) => f.type),
    a: await lastMessage(streamOf([...fromA.chunks, ...rest.map((f) => f.chunk)])),
    b: await lastMessage(streamOf(fromB.chunks)),
  };
  b.close();
}

async function abortTurn() {
  const session = "chat-ws-abort";
  const a = transport(session);
  const b = transport(session);
  const controller = new AbortController();
  const fromA = collect(await send(a, session, userMessage("u-abort-1", "triage #held-2"), controller.signal), waitsOn("get_issue"));
  await fromA.seen;
  const fromB = collect(await b.reconnectToStream({ chatId: session }), () => false);
  controller.abort();
  await new Promise((r) => setTimeout(r, 300)); // the abort frame reaches the object first
  await release("held-2");
  await fromB.done;
  out.abort = { a: await fromA.done, b: await lastMessage(streamOf(fromB.chunks)), bChunks: fromB.chunks };
  const idle = await transport(session).reconnectToStream({ chatId: session });
  out.abort.afterwards = idle === null ? "no-active" : "a stream";
  a.close();
  b.close();
}

// 5. Eviction: a turn on a raw socket, which then stays idle past workerd's 10 s
//    inactivity timeout while the other steps run on other sessions' objects; workerd
//    evicts the object and keeps the socket (hibernated). Then frames without a token:
//    the new instance reads from the socket's attachment that it showed one.
const EVICT_AFTER_MS = 12_000;
async function evictionStart() {
  const session = "chat-ws-evict";
  const raw = rawSocket(`/sessions/${session}/ws`);
  const message = userMessage("u-evict-1", "triage issue 8");
  const first = await raw.ask({
    type: "send", requestId: "e1", id: session, trigger: "submit-message", messages: [message], headers, body: {},
  });
  return { raw, session, first, idleFrom: performance.now() };
}

async function evictionEnd({ raw, session, first, idleFrom }) {
  const wait = EVICT_AFTER_MS - (performance.now() - idleFrom);
  if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  const idleMs = Math.round(performance.now() - idleFrom);
  const resumed = await raw.ask({ type: "resume", requestId: "e2", id: session, body: {} });
  const message = userMessage("u-evict-2", "triage issue 9");
  const second = await raw.ask({
    type: "send", requestId: "e3", id: session, trigger: "submit-message", messages: [message], body: {},
  });
  raw.socket.close(1000, "done");
  out.eviction = {
    idleMs,
    first: first.map((f) => f.type).filter((t) => t !== "chunk"),
    resumed: resumed.map((f) => f.type),
    second: second.map((f) => f.type).filter((t) => t !== "chunk"),
    secondChunks: second.filter((f) => f.type === "chunk").length,
  };
}

const started = performance.now();
const eviction = await evictionStart();
await oneTurn();
await midTurn();
await abortTurn();
const approvalsFrom = performance.now();
async function refundsTurn(session, approved) {
  const socket = transport(session, `/agents/refunds/sessions/${session}/ws`);
  try {
    return await approvalTurn(session, socket, approved);
  } finally {
    socket.close();
  }
}
out.approval = await refundsTurn("chat-ws-refund", true);
out.denial = await refundsTurn("chat-ws-deny", false);
await evictionEnd(eviction);
out.approvalsMs = Math.round(performance.now() - approvalsFrom);
out.ms = Math.round(performance.now() - started);
console.log(JSON.stringify(out));
process.exit(0);
