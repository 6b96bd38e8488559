// The JS Agents SDK (@openai/agents-realtime, unmodified, Node WebSocket transport) with a hosted MCP tool: the
// gateway lists and calls the server's tools. Asks for the weather and waits until the answer after the call has
// been spoken, then a second more for anything that follows.
// Usage: node agent_mcp.mjs <ws://.../v1/realtime?model=...> <mcp server URL> <never|always>
// With "always" each approval request is approved with session.approve(), as the SDK's docs show.
// Prints one JSON report: each response.done's output types, the calls completed, the approvals asked, the audio
// after the call, the SDK's errors, and every server event the SDK's own zod schema knows but rejects.
import { hostedMcpTool } from '@openai/agents-core';
import { RealtimeAgent, RealtimeSession } from '@openai/agents-realtime';
// Not exported by the package: the schema its transport parses every server event with.
import { realtimeServerEventSchema } from './node_modules/@openai/agents-realtime/dist/openaiRealtimeEvents.mjs';

const [url, serverUrl, approval] = process.argv.slice(2);
const report = { responses: [], completed: [], approvals: [], audioBytesAfterCall: 0, errors: [], invalid: [] };

const weather = hostedMcpTool({ serverLabel: 'weather', serverUrl, requireApproval: approval });
const agent = new RealtimeAgent({ name: 'Weather agent', instructions: 'You tell the weather.', tools: [weather] });
const session = new RealtimeSession(agent, { transport: 'websocket' });
const known = new Set(realtimeServerEventSchema.options.map((s) => s.shape.type.value));
session.transport.on('*', (event) => {
  const parsed = realtimeServerEventSchema.safeParse(event);
  if (!parsed.success && known.has(event.type)) {
    report.invalid.push({ type: event.type, issues: parsed.error.issues });
  }
  if (event.type === 'response.done') report.responses.push(event.response.output.map((o) => o.type));
});
session.on('mcp_tool_call_completed', (_ctx, _agent, call) => report.completed.push([call.name, call.output]));
session.on('tool_approval_requested', async (_ctx, _agent, request) => {
  report.approvals.push(request.approvalItem.rawItem.name);
  await session.approve(request.approvalItem);
});
session.on('audio', (event) => {
  if (report.completed.length) report.audioBytesAfterCall += event.data.byteLength;
});
session.on('error', (event) => report.errors.push(String(event.error?.error?.message ?? event.error)));

const spoken = new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error('no spoken answer after the MCP call within 20 s')), 20000);
  session.on('audio_stopped', () => {
    if (report.audioBytesAfterCall) {
      clearTimeout(timer);
      resolve();
    }
  });
});
await session.connect({ apiKey: 'unused', url });
session.sendMessage('What is the weather in Paris?');
try {
  await spoken;
  await new Promise((resolve) => setTimeout(resolve, 1000));
} finally {
  session.close();
  console.log(JSON.stringify(report));
}
