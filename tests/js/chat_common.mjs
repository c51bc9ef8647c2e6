// What the two chat-transport scripts (chat_http.mjs, chat_ws.mjs) share: the AI SDK's
// `AbstractChat` (what `useChat` wraps) with an in-memory state, driven through a turn
// that ends in a tool approval request, answered as `addToolApprovalResponse` answers it.
import { AbstractChat, lastAssistantMessageIsCompleteWithApprovalResponses } from "ai";

export class State {
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

export async function until(check, what) {
  for (let waited = 0; waited < 15000; waited += 25) {
    if (check()) return;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  throw new Error(`timed out waiting for ${what}`);
}

// The refunds agent's turn in `session` over `transport`: it asks to approve its refund;
// the Chat approves (or denies) it and sends the next request itself.
export async function approvalTurn(session, transport, approved) {
  const errors = [];
  const chat = new (class extends AbstractChat {})({
    id: session,
    state: new State(),
    transport,
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    onError: (error) => errors.push(String(error)),
  });
  await chat.sendMessage({ text: "refund order A-1" });
  const asked = structuredClone(chat.lastMessage);
  const part = asked.parts.find((p) => p.type === "tool-refund");
  await chat.addToolApprovalResponse({ id: part.approval.id, approved, reason: "ann: ok" });
  const done = () => chat.lastMessage.parts.find((p) => p.type === "tool-refund");
  const settled = () => chat.status !== "submitted" && chat.status !== "streaming";
  await until(() => settled() && done().state !== "approval-responded", "the turn going on");
  return { asked, messages: chat.messages, status: chat.status, errors };
}
