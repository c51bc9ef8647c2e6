// The AI SDK's own HTTP chat client against the kit's POST .../chat (scripts/dev), for
// tests/cloudflare/test_dev_server_chat_http.py, which reads the JSON this prints.
//
//   node tests/js/chat_http.mjs <dev server URL>      (the bearer token in CHAT_TOKEN)
//
// 1. `DefaultChatTransport` + `readUIMessageStream`: a turn of the template agent (two tool
//    calls), then the same user message sent again (its id is the turn's key: no new turn).
// 2. `AbstractChat` (what `useChat` wraps) on the refunds agent, sending its newest message
//    only: the turn ends with a tool approval request; `addToolApprovalResponse` answers it
//    and the Chat sends the next request itself (`sendAutomaticallyWhen`); the call runs.
//    Then another session's call, denied.
import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  readUIMessageStream,
} from "ai";

const base = process.argv[2];
const sent = []; // every request body the transports posted

function transport(path, options = {}) {
  return new DefaultChatTransport({
    api: `${base}${path}`,
    headers: { Authorization: `Bearer ${process.env.CHAT_TOKEN}` },
    fetch: async (url, init) => {
      sent.push({ path: new URL(url).pathname, body: JSON.parse(init.body) });
      return fetch(url, init);
    },
    ...options,
  });
}

// As docs/chat-clients.md advises: the kit keeps the history, so send the newest message only.
const newestOnly = {
  prepareSendMessagesRequest: ({ id, messages, trigger, messageId }) => ({
    body: { id, messages: messages.slice(-1), trigger, messageId },
  }),
};

async function lastMessage(stream) {
  let last;
  for await (const message of readUIMessageStream({ stream, terminateOnError: true })) {
    last = message;
  }
  return last;
}

async function templateTurn() {
  const chat = transport("/sessions/chat-triage/chat");
  const user = { id: "u-triage-1", role: "user", parts: [{ type: "text", text: "triage issue 7" }] };
  const ask = () =>
    chat.sendMessages({
      chatId: "chat-triage",
      messages: [user],
      trigger: "submit-message",
      messageId: undefined,
      abortSignal: undefined,
    });
  const first = await lastMessage(await ask());
  const again = await lastMessage(await ask());
  let refused;
  try {
    await chat.sendMessages({
      chatId: "chat-triage",
      messages: [user],
      trigger: "regenerate-message",
      messageId: undefined,
      abortSignal: undefined,
    });
  } catch (error) {
    refused = { status: error.statusCode, body: error.responseBody };
  }
  return { first, again, refused };
}

class State {
  constructor() {
    this.status = "ready";
    this.error = undefined;
    this.messages = [];
  }
  pushMessage(message) {
    this.messages = [...this.messages, message];
  }
  popMessage() {
    this.messages = this.messages.slice(0, -1);
  }
  replaceMessage(index, message) {
    this.messages = this.messages.map((m, i) => (i === index ? message : m));
  }
  snapshot(thing) {
    return structuredClone(thing);
  }
}

async function until(check, what) {
  for (let waited = 0; waited < 15000; waited += 25) {
    if (check()) return;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  throw new Error(`timed out waiting for ${what}`);
}

async function approvalTurn(session, approved) {
  const errors = [];
  const chat = new (class extends AbstractChat {})({
    id: session,
    state: new State(),
    transport: transport(`/agents/refunds/sessions/${session}/chat`, newestOnly),
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    onError: (error) => errors.push(String(error)),
  });
  await chat.sendMessage({ text: "refund order A-1" });
  const asked = structuredClone(chat.lastMessage);
  const part = asked.parts.find((p) => p.type === "tool-refund");
  await chat.addToolApprovalResponse({ id: part.approval.id, approved, reason: "ann: ok" });
  const done = () => chat.lastMessage.parts.find((p) => p.type === "tool-refund");
  await until(() => chat.status !== "submitted" && chat.status !== "streaming" && done().state !== "approval-responded", "the approved turn");
  return { asked, messages: chat.messages, status: chat.status, errors };
}

const template = await templateTurn();
const approval = await approvalTurn("chat-refund", true);
const denial = await approvalTurn("chat-deny", false);
console.log(JSON.stringify({ template, approval, denial, sent }));
