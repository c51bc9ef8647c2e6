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
import { DefaultChatTransport, readUIMessageStream } from "ai";
import { approvalTurn } from "./chat_common.mjs";

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

const template = await templateTurn();
const refunds = (session) => transport(`/agents/refunds/sessions/${session}/chat`, newestOnly);
const approval = await approvalTurn("chat-refund", refunds("chat-refund"), true);
const denial = await approvalTurn("chat-deny", refunds("chat-deny"), false);
console.log(JSON.stringify({ template, approval, denial, sent }));
